/**
 * The OpenAI proxy: routes each completion request, forwards it to the chosen engine and
 * passes the answer back without buffering a stream. Nothing reaches the client before the
 * engine's first body byte, so until then a failure — a connection error, a 5xx, a 429 (the
 * engine overloaded for now), a 401/403 (the engine refusing the gateway's credentials), a
 * 408/421 (the engine gave up on the request, or does not serve it), a redirect (not
 * followed), a 204 or 205 or an empty 2xx (no answer), a 200 that is the engine's error for a server
 * error (its error object as the JSON, an error event before the stream's first), a streamed
 * answer's first byte overdue, the
 * worker leaving rotation, every connection the gateway keeps to the engine busy past the
 * deadline, the engine's model-not-found 404 when another worker's engine lists the model (an
 * adapter unloaded from one engine at run time) — is retried on another worker (and, except when
 * the worker was taken out, the gateway's connections to it were all busy, the engine said it is
 * busy — a 429, a request it will not queue — or does not serve the model, counted by the circuit
 * breaker: an engine's server error answer only once another worker answers the request, as the
 * request may be what fails; a first byte overdue only when the rest of the fleet served
 * meanwhile, else the worker's deadline learns the wait). A client that
 * goes away is not an engine failure: no breaker count, no failure metric, no retry. The router's in-flight ticket
 * follows the request: prefill until the first byte of a streamed answer that reaches the client
 * (a failed attempt's first byte is neither the end of the prefill nor the request's time to first
 * byte; an answer that is not streamed comes whole: the router reads the end of its prefill off
 * the engine),
 * decode until the end, released on completion, error or client disconnect. An engine that
 * answers with an error (4xx or 5xx), a redirect or a 204/205, or that the request never reached
 * (the connection failed before any answer), holds none of it: the blocks the router predicted
 * it would hold for it are withdrawn (markRefused), on the other replicas too (decisionRefused).
 * Once the answer starts reaching the client the request's body is needed no more: the proxy
 * lets go of it and its bytes go back to the body budget, however long the answer streams.
 * forward.ts holds one attempt on one engine and how its answer passes to the client.
 */
import type { IncomingMessage } from 'node:http';
import { PromptTooLongError, type KVAwareRouter, type RouteRequest, type RouteResult } from '../core/router/index.js';
import type { WorkerState } from '../core/worker-registry.js';
import type { StateStore } from '../state/state-store.js';
import type { BodyBudget } from './body-budget.js';
import type { CircuitBreaker } from './circuit-breaker.js';
import { answerShutdown, forward, type ShutdownCuts } from './forward.js';
import type { FailureReason, GatewayMetrics } from './metrics.js';
import type { PanicRouting } from './panic-routing.js';
import {
  editedBodyText,
  openAiError,
  type OpenAiPath,
  type ParsedRequest,
  type ProxyReply,
  type RequestReader,
  type RequestSource,
} from './openai-request.js';
import { clientMessage, longestPromptTokens, requestedOutputTokens } from './request-limits.js';
import type { FirstByteDeadlines } from './timeouts.js';
import { passedHeaders, PassedHeaderRejection } from './passed-headers.js';
import type { FailureLog } from './failure-log.js';
import { forwardedVia } from './via.js';
import { NO_WORKERS, type WorkerConnections } from './worker-connections.js';

export interface ProxyDeps {
  router: KVAwareRouter;
  /** The attempts under way, ended by the gateway when its shutdown grace ends. */
  streams?: ShutdownCuts;
  state: StateStore;
  connections: WorkerConnections;
  breaker: CircuitBreaker;
  metrics: GatewayMetrics;
  readRequest: RequestReader;
  /** Attempts on other workers after a failure before the first byte. */
  maxRetries: number;
  /** Log lines for engines failing requests, a few per worker and kind (failure-log.ts). */
  failureLog?: FailureLog;
  /** Longest gap between answer chunks, and longest wait for a non-streamed answer (ms). */
  interChunkTimeoutMs: number;
  /** Per-worker deadlines for the first byte of a streamed answer. */
  firstByte: FirstByteDeadlines;
  /** Add x-contextforge-cached-tokens to responses. */
  cachedTokensHeader: boolean;
  /** This gateway's pseudonym in the Via header (via.ts): a request whose Via holds it is a loop. */
  viaPseudonym: string;
  /**
   * The request's answer is committed to the client, so its body is held no more: its bytes go
   * back to the body budget (the gateway also gives them back when the response closes).
   */
  releaseBody: (req: IncomingMessage) => void;
  /** The bytes of complete answers gathered at once, over all requests (ForwardOptions.answerBudget). */
  answerBudget: BodyBudget;
  /** An answer passed through ungathered because the answer budget could not take it. */
  onAnswerBudgetFull: () => void;
  /**
   * Routes a request no worker in rotation can take over the workers held out only by probes
   * that timed out (panic-routing.ts); undefined: such a request is answered 503.
   */
  panic?: PanicRouting;
}

/** The longest part of a client's value an error message repeats. */
const MAX_SHOWN_CHARS = 256;

/** A client's value as an error message shows it: cut to MAX_SHOWN_CHARS (a 16 MB model name is not echoed). */
function shown(value: string): string {
  return value.length <= MAX_SHOWN_CHARS ? value : `${value.slice(0, MAX_SHOWN_CHARS)}… (${value.length} characters)`;
}

/** route(), with its argument checks answered as 400 (never 500) and nothing internal shown. */
export function routeOr400(
  router: KVAwareRouter,
  reply: ProxyReply,
  request: RouteRequest,
  opts: Parameters<KVAwareRouter['route']>[1],
  path?: string,
): RouteResult | undefined {
  try {
    return router.route(request, opts);
  } catch (err) {
    if (err instanceof PromptTooLongError) {
      // a chat's prompt is its messages, tokenized or not (a tokenized one has only its ids left)
      const chat = path !== undefined ? path.endsWith('/chat/completions') : request.messages !== undefined;
      void openAiError(reply, 400, err.message, chat ? 'messages' : 'prompt');
      return undefined;
    }
    if (err instanceof TypeError || err instanceof RangeError) {
      void openAiError(reply, 400, clientMessage(err));
      return undefined;
    }
    throw err;
  }
}

/** The Fastify handler of one OpenAI completion path. */
export function createProxyHandler(deps: ProxyDeps, path: OpenAiPath) {
  const {
    router,
    state,
    connections,
    breaker,
    metrics,
    readRequest,
    maxRetries,
    interChunkTimeoutMs,
    firstByte,
    cachedTokensHeader,
    viaPseudonym,
    releaseBody,
    answerBudget,
    onAnswerBudgetFull,
    panic,
    streams,
  } = deps;
  return async (req: RequestSource, reply: ProxyReply): Promise<ProxyReply> => {
    // a request that has been here before is a routing loop: answered before any work is done
    const via = forwardedVia(req.headers.via, viaPseudonym, req.raw?.httpVersion);
    if (typeof via !== 'string') return openAiError(reply, via.status, via.message, 'via', via.code);
    // the client's request id and trace context go to every engine tried, as they came
    const passed = passedHeaders(req.headers, req.raw);
    if (passed instanceof PassedHeaderRejection) return openAiError(reply, 400, passed.message, passed.param);
    // every wait before the engine attempt is one the shutdown grace may end: the request is then
    // answered 503 (ShutdownCuts.wait), and found answered (reply.sent) once the wait is over
    streams?.wait(reply);
    let prepared: ParsedRequest | undefined;
    try {
      prepared = await readRequest(path, req, reply);
    } finally {
      streams?.unwait(reply);
    }
    /**
     * The body is needed while the request may be retried: until its answer is committed to the
     * client (nothing is retried after its first byte). Then every reference to it is dropped, so
     * a stream that lasts minutes does not keep it, and its bytes go back to the body budget (a
     * request that ends before that gives them back when its response closes). No local of this
     * function may hold the body, or the bytes forwarded, across an await: a suspended async
     * function keeps its locals.
     */
    const dropBody = () => {
      prepared = undefined;
      req.body = undefined;
      req.rawBody = undefined;
      if (req.raw !== undefined) releaseBody(req.raw);
    };
    if (!prepared) return reply;
    const started = performance.now();
    /**
     * Every request routed is observed once answered, whatever the answer: the engine's, or the
     * gateway's own when no engine could take it or every one tried failed (an outage must show
     * in the histogram's count, not vanish from it). A client that left first is not answered.
     */
    const answered = (answer: ProxyReply): ProxyReply => {
      metrics.latency.observe((performance.now() - started) / 1000);
      return answer;
    };
    // (the name is a string of its own, not part of the body's text: holding it holds no body bytes)
    const model = prepared.body.model;
    // what an engine's context length is checked against (connections.withoutRoom), when the
    // prompt's token ids are known
    const promptTokens = longestPromptTokens(prepared.body, path, prepared.routeRequest.tokens);
    const outputTokens = promptTokens === undefined ? undefined : requestedOutputTokens(prepared.body, path);
    let notServing = connections.withoutModel(model);
    // before answering that no worker serves the model, what the engines list is read again (at
    // most once a second, refreshModels()): an engine may have loaded the adapter, or restarted
    // with it, since its list was last read
    if (notServing.size > 0 && notServing.size === connections.size) {
      streams?.wait(reply);
      try {
        await connections.refreshModels();
      } finally {
        streams?.unwait(reply);
      }
      // answered by the shutdown (503) meanwhile: observed like every answer to a routed request
      if (reply.sent) return answered(reply);
      notServing = connections.withoutModel(model);
    }
    if (notServing.size > 0 && notServing.size === connections.size) {
      return answered(reply)
        .code(404)
        .send({
          error: {
            message: `The model '${shown(String(model))}' does not exist on any worker`,
            type: 'invalid_request_error',
            param: 'model',
            code: 'model_not_found',
          },
        });
    }
    const learning = state.beforeRoute(prepared.routeRequest);
    if (learning) {
      streams?.wait(reply);
      try {
        await learning;
      } finally {
        streams?.unwait(reply);
      }
      if (reply.sent) return answered(reply);
    }
    const share = state.sharesDecisions;
    const streaming = prepared.body.stream === true;
    // (a boolean of its own: holding it holds no body)
    const includeUsage = streaming && includesUsage(prepared.body.stream_options);
    const release = (decision: RouteResult) => {
      router.release(decision.ticket);
      if (decision.shared) state.decisionEnded(decision.shared);
    };
    let failedAttempts = 0;
    // attempts the engines refused as overloaded (429, or SGLang's 503 for a request it will not
    // queue), and the shortest wait those that named one asked for (clientRetryAfter())
    let overloaded = 0;
    let engineRetryAfterS: number | undefined;
    // attempts answered 508 Loop Detected: the worker's URL leads back to a gateway on the way
    let looped = 0;
    // attempts that found every connection the gateway keeps to the engine busy until their deadline
    let noConnection = 0;
    // attempts answered with JSON that is not a whole document (cut short, or not JSON at all)
    let incomplete = 0;
    // attempts answered 503 with a Retry-After: the engine cannot serve for now and says when to come back
    let unavailable = 0;
    /**
     * Workers that answered the request with a server error: counted by the breaker only once
     * another worker answers it (they failed where another did not). When every attempt ends so,
     * the request is the likely cause (an input that hits an engine bug), not the workers: a
     * client sending a few such requests must not open every circuit and leave every other
     * client without a worker (and a fleet that fails every request gains nothing from having its
     * circuits opened: its 502 would become a 503). One such answer that no other worker's answer
     * follows goes to the breaker as answered alone (exhausted()).
     */
    // (made at the first such answer: most requests have none)
    let answeredServerError: string[] | undefined;
    /** The answer once every attempt failed: what the attempts' outcomes say (answerExhausted). */
    const exhausted = (lastWorker?: string, lastReason?: FailureReason) => {
      // one worker answered with a server error and no other answered the request: whether that
      // counts depends on what the worker and the fleet did before (serverErrorAnswerAlone); two
      // or more such answers point at the request, and count against none of them
      if (answeredServerError?.length === 1) breaker.serverErrorAnswerAlone(answeredServerError[0]!);
      return answerExhausted(answered(reply), {
        failedAttempts,
        overloaded,
        retryAfterS: clientRetryAfter(engineRetryAfterS),
        looped,
        noConnection,
        incomplete,
        unavailable,
        lastWorker,
        lastReason,
      });
    };
    // the worker whose failure the next attempt retries: counted once another worker takes it
    let retryOf: string | undefined;
    /**
     * The workers that failed the request, and the ranks of their engines that fail with them: no
     * attempt goes to them again. Kept apart from the workers not serving its model, which each
     * attempt reads as they are then (connections.withoutModel): a worker may come to serve it
     * (list its LoRA adapter) while it waits or before its retry. Made at the first failure, as is
     * `excludedNow`, route()'s exclusions once there is one: most requests have none.
     */
    let failedWorkers: Set<string> | undefined;
    let excludedNow: Set<string> | undefined;
    // the workers out of rotation the attempt could be routed over (panic routing), when it was
    let panicCandidates: ReadonlySet<string> | undefined;
    /**
     * An engine answered the request with its model-not-found 404 and it was retried: from then on
     * it goes only to workers whose engines are known to serve its model (connections.notListing),
     * not to one whose list is unknown, which may answer the same.
     */
    let listedOnly = false;
    for (let attempt = 0; ; attempt++) {
      if (reply.raw.destroyed) {
        // the client left while the request waited for a retry
        reply.hijack();
        return reply;
      }
      // the workers route() leaves out: those not serving the model now and those that failed the
      // request (until one does, the set withoutModel() keeps for the model: nothing is made)
      const without = connections.withoutRoom(
        listedOnly ? connections.notListing(model) : connections.withoutModel(model),
        model,
        promptTokens,
        outputTokens,
      );
      const excluded =
        failedWorkers === undefined ? without : union((excludedNow ??= new Set()), without, failedWorkers);
      // a whole answer shows no first token: the router reads it off the engine's queue
      const first = routeOr400(
        router,
        reply,
        prepared.routeRequest,
        { exclude: excluded, share, firstTokenReported: streaming },
        path,
      );
      if (!first) return answered(reply);
      panicCandidates = undefined;
      let decision = first;
      // a request that found a worker allocates nothing more for panic routing (the closures
      // below are made only for one that found none)
      if (panic !== undefined && !first.noWorker) panic.routedInRotation();
      else if (panic !== undefined) {
        // no worker in rotation can take it: those held out only by slow probes may (panic
        // routing), among the workers serving its model (not `excluded`: the workers that failed
        // the request may not take it either, but route() leaves them out still)
        const panicked = panic.decide(
          first,
          // (the closures run now, before any await: the body is still held)
          () => without,
          (heldOut, replaces) =>
            routeOr400(
              router,
              reply,
              prepared!.routeRequest,
              { exclude: excluded, share, firstTokenReported: streaming, panicCandidates: heldOut, replaces },
              path,
            ),
        );
        if (!panicked.decision) return answered(reply);
        decision = panicked.decision;
        panicCandidates = panicked.panicCandidates;
      }
      if (decision.noWorker) {
        // engines tried and failed: 502 (429 when they were all overloaded); nothing to try at all: 503
        if (failedAttempts > 0) return exhausted();
        reply.header('retry-after', '1');
        return openAiError(
          answered(reply),
          503,
          `no worker can take the request now (${noWorkerSummary(router, connections, excluded, model)})`,
          null,
          'no_worker_available',
        );
      }
      // (each attempt that fails sets it again before the next one)
      // (a worker removed meanwhile has no series left to count in: counting would bring one back)
      if (retryOf !== undefined && connections.get(retryOf)) metrics.retries.inc({ worker: retryOf });
      metrics.countDecision(decision.policy, decision.reason);
      if (decision.shared) state.decisionMade(decision.shared);
      // what anchors claim is the client's word: no more of the prompt is cached than the prompt itself
      const cachedTokens = Math.min(decision.cachedTokens, decision.promptTokens);
      const target = connections.get(decision.workerId)!;
      let connectionLost = false;
      let serverErrorAnswer = false;
      // the engine said it is busy: a 429 (as the status, a 2xx's error object or a stream's first
      // error event), or a request it will not queue (ForwardOptions.onQueueFull)
      let busy = false;
      // a streamed answer's first byte did not come within the deadline (ForwardOptions.onFirstByteOverdue)
      let firstByteOverdue = false;
      // the engine answered its model-not-found 404, and another worker takes the request (ForwardOptions.onModelNotFound)
      let modelNotFound = false;
      // why the attempt failed, when it did (ForwardOptions.onFailed)
      let failure: FailureReason = 'reset';
      const firstByteTimeoutMs = streaming ? firstByte.deadlineMs(decision.workerId) : interChunkTimeoutMs;
      // the attempt's place among the attempts, should its connection break (CircuitBreaker.connectionLost)
      const startedAt = breaker.attemptStarted();
      // the bytes forwarded are an argument only: forward() lets go of them once they are sent
      const outcome = await forward(reply, target, path, forwardedBody(prepared, req, decision.cacheSalt), {
        // the worker's own id (a data-parallel rank's worker) and the rank, for the response headers
        workerId: target.workerId,
        rank: target.rank,
        cachedTokens: cachedTokensHeader ? cachedTokens : undefined,
        model,
        failedWorkers: failedWorkers ?? NO_WORKERS,
        listedOnly,
        promptTokens,
        outputTokens,
        lastAttempt: attempt >= maxRetries,
        streaming,
        includeUsage,
        via,
        passedHeaders: passed,
        firstByteTimeoutMs,
        interChunkTimeoutMs,
        onFirstByte: (seconds) => {
          metrics.ttft.observe(seconds);
          if (streaming) firstByte.observe(decision.workerId, seconds * 1000);
          router.markPrefillDone(decision.ticket);
          if (decision.shared) state.decisionPrefilled(decision.shared);
        },
        onFirstByteOverdue: () => (firstByteOverdue = streaming),
        onOverloaded: (retryAfterS) => {
          overloaded++;
          busy = true;
          if (retryAfterS !== undefined) engineRetryAfterS = Math.min(engineRetryAfterS ?? retryAfterS, retryAfterS);
        },
        onUnavailable: (retryAfterS) => {
          unavailable++;
          engineRetryAfterS = Math.min(engineRetryAfterS ?? retryAfterS, retryAfterS);
        },
        onLoop: () => looped++,
        onQueueFull: () => {
          overloaded++;
          busy = true;
        },
        onServerErrorAnswer: () => (serverErrorAnswer = true),
        onIncomplete: () => incomplete++,
        onRefused: () => {
          router.markRefused(decision.ticket);
          if (decision.shared) state.decisionRefused(decision.shared);
        },
        onConnectionLost: () => (connectionLost = true),
        // tried elsewhere only within the retries, and only when another worker whose engine lists
        // the model can take it (none of this engine's ranks: the engine serves the model on none)
        onModelNotFound: () =>
          (modelNotFound =
            attempt < maxRetries &&
            hasOtherCandidate(
              router,
              connections.notListing(model),
              failedWorkers,
              panicCandidates,
              connections.routerIdsOf(decision.workerId),
            )),
        onFailed: (reason) => (failure = reason),
        onCommitted: dropBody,
        streams,
        answerBudget,
        onAnswerBudgetFull,
        onWholeAnswerStreamed: () => metrics.wholeAnswersStreamed.inc({ worker: decision.workerId }),
      });
      release(decision);
      // a client that went away says nothing about the engine: no failure, no retry
      // (an attempt the shutdown grace ended: nothing the engine did wrong either)
      if (outcome === 'shut-down') return reply.sent ? reply : answerShutdown(answered(reply));
      if (outcome === 'client-gone') {
        if (!reply.sent) {
          reply.hijack();
          reply.raw.end();
        }
        return reply;
      }
      if (outcome === 'retry' || outcome === 'worker-out' || outcome === 'no-connection') {
        failedAttempts++;
        if (outcome === 'retry') {
          // a worker a probe of its engine holds out when its attempt fails (a request it kept,
          // timed out): the other ranks of its engine fail with it, as when it leaves rotation. An
          // open circuit, this failure's or earlier ones', is no verdict on the engine's other ranks
          if (connections.heldOutByProbes(decision.workerId))
            for (const id of connections.routerIdsOf(decision.workerId))
              if (id !== decision.workerId) (failedWorkers ??= new Set()).add(id);
          // a connection that failed, a broken answer count at once: they say nothing of the
          // request. An engine that says it is busy (a 429, a request it will not queue) is
          // serving, at its limit, and counts for nothing: opening its circuit would take its
          // capacity away while it works through its queue, and push its load onto the others.
          // Envoy's outlier detection counts only 5xx and local failures (consecutive_5xx,
          // consecutive_gateway_failure: 502/503/504), never a 429; SGLang's gateway counts every
          // status that is not a success, a 400 as a 429
          // (sgl-model-gateway/src/routers/http/router.rs, route_typed_request:
          // worker.record_outcome(response.status().is_success())), which this gateway does not
          // follow for either: a client's error is already no failure here. A streamed answer's
          // first byte overdue counts only when the rest of the fleet served meanwhile
          // (CircuitBreaker.firstByteOverdue); otherwise the fleet is slow, not this worker, and the
          // worker's deadline learns that it waited at least this long; counted, it drops what it
          // learned (FirstByteDeadlines.overdue)
          if (serverErrorAnswer) (answeredServerError ??= []).push(decision.workerId);
          else if (firstByteOverdue)
            firstByte.overdue(decision.workerId, firstByteTimeoutMs, breaker.firstByteOverdue(decision.workerId));
          // a connection that broke before any answer counts once for a burst of them broken together
          // (an engine restarted under the connections the gateway kept to it): only when the
          // attempt started after the worker's last counted one was seen (CircuitBreaker.connectionLost)
          else if (connectionLost) breaker.connectionLost(decision.workerId, startedAt);
          // an engine's model-not-found 404 is its word on the request's model (its list out of
          // date: an adapter unloaded), no failure: nothing for the breaker, as for a busy engine
          else if (!busy && !modelNotFound) breaker.failed(decision.workerId);
          if (connections.get(decision.workerId))
            metrics.upstreamFailures.inc({ worker: decision.workerId, reason: failure });
        } else if (outcome === 'no-connection') {
          // the gateway's own limit, not the engine's failure: no breaker count, no failure metric;
          // the engine's ranks share its connections, so none of them can take it either
          noConnection++;
          if (connections.get(decision.workerId)) metrics.connectionWaitTimeouts.inc({ worker: decision.workerId });
          failedWorkers = withEngine(failedWorkers, connections.routerIdsOf(decision.workerId));
        } else {
          // its worker left rotation (or was removed): the other ranks of its engine fail with it
          // (worker-connections.ts moves a request only when a worker of another engine can take it)
          failedWorkers = withEngine(failedWorkers, connections.routerIdsOf(decision.workerId));
        }
        // a connection that broke before any answer, with no other worker to take the request, is
        // what a connection gone stale in the pool looks like (the engine restarted, something on
        // the way closed it): the same worker is tried again, on another connection (undici drops
        // the broken one), within the retries; its failure still counts (toward the circuit once for
        // the attempts already under way when a counted one broke)
        // (the workers serving the model are read as they are now: the next attempt reads them so)
        if (modelNotFound) {
          // its engine serves the model on none of its ranks, and the workers whose engines list it
          // take the request from here; its list is read again for the next requests (as when its
          // 404 is passed on)
          failedWorkers = withEngine(failedWorkers, connections.routerIdsOf(decision.workerId));
          listedOnly = true;
          void connections.refreshModels();
        }
        const notServingNow = listedOnly ? connections.notListing(model) : connections.withoutModel(model);
        const sameAgain =
          connectionLost &&
          attempt < maxRetries &&
          !hasOtherCandidate(router, notServingNow, failedWorkers, panicCandidates, [decision.workerId]);
        if (!sameAgain) (failedWorkers ??= new Set()).add(decision.workerId);
        // the pause spaces attempts; with none left to try there is nothing to wait for
        const retrying =
          attempt < maxRetries &&
          (sameAgain || hasOtherCandidate(router, notServingNow, failedWorkers, panicCandidates));
        if (outcome === 'retry')
          deps.failureLog?.failed(
            decision.workerId,
            failure,
            'before-answer',
            passed?.['x-request-id'],
            retrying ? 'retried' : 'answered with an error',
          );
        if (retrying) {
          retryOf = decision.workerId;
          streams?.wait(reply);
          await new Promise((r) => setTimeout(r, 25 * (attempt + 1)));
          streams?.unwait(reply);
          if (reply.sent) return answered(reply);
          continue;
        }
        return exhausted(decision.workerId, outcome === 'retry' ? failure : undefined);
      }
      // an answer the engine broke off after it reached the client cannot be retried, but it is
      // the engine's failure: an engine that stalls or dies mid-answer opens its circuit too, and
      // it is counted apart from the failures before the first byte (the client got the status
      // already sent, which contextforge_requests_total counts)
      if (outcome === 'cut') {
        breaker.failed(decision.workerId);
        if (connections.get(decision.workerId))
          metrics.streamFailures.inc({ worker: decision.workerId, reason: failure });
        deps.failureLog?.failed(decision.workerId, failure, 'mid-answer', passed?.['x-request-id'], 'cut');
      } else {
        const served = reply.raw.statusCode < 400;
        breaker.answered(decision.workerId, served, startedAt);
        // an engine's 404 on a completion path is its model-not-found (vLLM: {"error": {"type":
        // "NotFoundError", …}}): requests go only to workers whose engines list the model, or whose
        // list was never read, so its list was unknown or is out of date; it is read again for the
        // next requests. A 404 that reaches the client here is the engine's word on the client's
        // name: it is retried (onModelNotFound) only on a worker whose engine lists the model (an
        // adapter unloaded from this engine at run time, still served by others), never on one
        // whose list is unknown (a name no engine serves would otherwise cost an attempt on every
        // such worker, up to the retries, and end as the gateway's 502 instead of the engine's
        // 404); a worker whose engine lists the model is chosen over it from the first read that answers
        if (reply.raw.statusCode === 404) void connections.refreshModels();
        // another worker answered (a client's error is no answer that clears the request)
        if (served && answeredServerError) for (const id of answeredServerError) breaker.failed(id);
      }
      metrics.cachedTokens.inc(cachedTokens);
      metrics.promptTokens.inc(decision.promptTokens);
      return answered(reply);
    }
  };
}

/**
 * `failedWorkers` (made when there is none yet) with every router worker of an engine (`ranks`:
 * WorkerConnections.routerIdsOf) added: they fail the request with it.
 */
function withEngine(failedWorkers: Set<string> | undefined, ranks: readonly string[]): Set<string> {
  const out = failedWorkers ?? new Set<string>();
  for (const id of ranks) out.add(id);
  return out;
}

/**
 * Whether a worker neither in `notServing` nor in `failedWorkers` (nor among `besides`) is available, or one of
 * `panicCandidates` not draining: one the next attempt's route() could choose (route() takes its
 * candidates from the available workers outside its exclusions, and in panic routing from those
 * held out only by probes that timed out).
 */
function hasOtherCandidate(
  router: KVAwareRouter,
  notServing: ReadonlySet<string>,
  failedWorkers: ReadonlySet<string> | undefined,
  panicCandidates: ReadonlySet<string> | undefined,
  besides?: readonly string[],
): boolean {
  return router
    .listWorkers()
    .some(
      (w) =>
        (w.available || (panicCandidates?.has(w.id) === true && !w.draining)) &&
        !notServing.has(w.id) &&
        failedWorkers?.has(w.id) !== true &&
        besides?.includes(w.id) !== true,
    );
}

/** Whether a request's `stream_options` ask for a stream's usage chunk (`include_usage: true`, as the OpenAI API has it). */
function includesUsage(streamOptions: unknown): boolean {
  return (
    typeof streamOptions === 'object' &&
    streamOptions !== null &&
    (streamOptions as { include_usage?: unknown }).include_usage === true
  );
}

/** `into`, emptied and filled with the workers of `a` and of `b` (one set a request fills at each attempt). */
function union(into: Set<string>, a: ReadonlySet<string>, b: ReadonlySet<string>): Set<string> {
  into.clear();
  for (const id of a) into.add(id);
  for (const id of b) into.add(id);
  return into;
}

/**
 * The bytes an attempt forwards: the client's own when the body is unchanged, else the client's
 * text with the fields the gateway drops removed and the salt set (editedBodyText); the body serialised
 * only when its bytes are not kept (not UTF-8, or from the endpoint picker).
 */
function forwardedBody(prepared: ParsedRequest, req: RequestSource, cacheSalt: string | undefined): string | Buffer {
  if (!cacheSalt && prepared.unchanged && req.rawBody !== undefined) return req.rawBody;
  // the salt the body must carry: the isolated request's own, else the tenant's (or the client's, unchanged)
  const salt = cacheSalt || (typeof prepared.body.cache_salt === 'string' ? prepared.body.cache_salt : undefined);
  // the client's text edited, not the parsed body serialised again: that would round a 64-bit seed
  if (req.rawBody !== undefined) return editedBodyText(req.rawBody.toString('utf8'), salt, undefined, prepared.removed);
  return JSON.stringify(salt === undefined ? prepared.body : { ...prepared.body, cache_salt: salt });
}

/** How the attempts on the engines tried went, for the answer when all of them failed. */
interface ExhaustedAttempts {
  failedAttempts: number;
  /** Attempts the engines refused as overloaded (429, or an engine's queue-full refusal). */
  overloaded: number;
  /** The longest Retry-After the engines asked for (s), at least 1. */
  retryAfterS: number;
  /** Attempts answered 508 Loop Detected. */
  looped: number;
  /** Attempts that found every connection the gateway keeps to the engine busy until their deadline. */
  noConnection: number;
  /** Attempts answered with JSON that is not a whole document. */
  incomplete: number;
  /** Attempts answered 503 with a Retry-After. */
  unavailable: number;
  /** The worker of the last attempt, when the retries ran out. */
  lastWorker?: string;
  /** Why the last attempt failed, when it was the engine's failure (not a move, nor a busy connection). */
  lastReason?: FailureReason;
}

/**
 * The answer when every engine tried failed: 429 with the longest Retry-After they asked for
 * when each of them refused as overloaded (the client should back off, not report a fault),
 * 503 with the longest Retry-After when each was overloaded, had no free connection from the
 * gateway (the gateway is overloaded: as when no worker can take the request) or answered 503
 * with a Retry-After (the engine cannot serve for now and said when to come back; the code
 * engines_unavailable when one did), 508 when each of them
 * answered 508 (a routing loop: retrying cannot help), else 502 with Retry-After: 1 (with the
 * code engine_answer_incomplete when each of them answered JSON that is not a whole document).
 */
function answerExhausted(
  reply: ProxyReply,
  {
    failedAttempts,
    overloaded,
    retryAfterS,
    looped,
    noConnection,
    incomplete,
    unavailable,
    lastWorker,
    lastReason,
  }: ExhaustedAttempts,
): ProxyReply {
  if (looped === failedAttempts)
    return openAiError(
      reply,
      508,
      'the request came back to a gateway it had passed: a worker URL leads back to a gateway on the way (a routing loop)',
      'via',
      'loop_detected',
    );
  if (overloaded === failedAttempts) {
    reply.header('retry-after', String(retryAfterS));
    return openAiError(reply, 429, 'every engine tried is overloaded; retry later', null, 'rate_limit_exceeded');
  }
  // the engines cannot serve for now and said when to come back, or every connection the gateway
  // keeps to them was busy (the gateway is overloaded), or a mix of both with overloaded engines
  if (unavailable + noConnection > 0 && unavailable + noConnection + overloaded === failedAttempts) {
    reply.header('retry-after', String(retryAfterS));
    return unavailable > 0
      ? openAiError(
          reply,
          503,
          'every engine tried is unavailable for now or busy; retry later',
          null,
          'engines_unavailable',
        )
      : openAiError(
          reply,
          503,
          'every connection the router keeps to the engines that could take the request is busy; retry later',
          null,
          'engine_connections_busy',
        );
  }
  reply.header('retry-after', '1');
  const last =
    lastWorker === undefined ? '' : ` (last: ${lastWorker}${lastReason === undefined ? '' : `, ${lastReason}`})`;
  if (incomplete === failedAttempts)
    return openAiError(
      reply,
      502,
      `the engines answered with JSON that is not a whole JSON document: cut short, or not JSON${last}`,
      null,
      'engine_answer_incomplete',
    );
  return openAiError(reply, 502, `the engines failed to answer${last}`);
}

/**
 * Longest Retry-After given to a client (s). An engine's Retry-After speaks for that engine alone,
 * while the client's retry may go to any of them, and which are in rotation changes within
 * seconds (health checks, circuit cooldowns): one engine asking for a day (a misconfigured rate
 * limiter, a hostile or broken proxy) must not tell every client to wait a day.
 */
export const MAX_CLIENT_RETRY_AFTER_S = 60;

/**
 * The Retry-After given to a client when the engines tried were busy or unavailable: the shortest
 * wait among those that named one (the request may go through once any of them frees), within 1
 * and MAX_CLIENT_RETRY_AFTER_S; 1 when none named one.
 */
function clientRetryAfter(engineRetryAfterS: number | undefined): number {
  if (engineRetryAfterS === undefined) return 1;
  return Math.min(Math.max(engineRetryAfterS, 1), MAX_CLIENT_RETRY_AFTER_S);
}

/**
 * Why a worker takes no request now, as the 503 no_worker_available counts it (the first that
 * applies); a worker left out that serves `model` was left out for its context length.
 */
function workerOutReason(
  w: WorkerState,
  connections: WorkerConnections,
  excluded: ReadonlySet<string>,
  model: unknown,
): string {
  if (w.draining) return 'draining';
  if (!w.healthy) {
    const reasons = connections.outOfRotationReasons(w.id);
    if (reasons.includes('breaker')) return 'circuit breaker open';
    if (reasons.includes('health-check'))
      return connections.awaitingFirstCheck(w.id) ? 'first health check pending' : 'health check failing';
    if (reasons.includes('metrics')) return 'metrics scrape failing';
    // an engine asleep is still: it says so itself, so that is the reason named
    if (reasons.includes('sleep')) return 'engine asleep';
    if (reasons.includes('stall')) return 'engine stalled';
    return 'unhealthy';
  }
  if (excluded.has(w.id))
    return model !== undefined && !connections.withoutModel(model).has(w.id)
      ? 'context too short for the prompt'
      : 'not serving the model';
  return 'not chosen by the policy';
}

/**
 * Why no worker can take a request, as a count of workers per reason ("3 workers: 2 circuit
 * breaker open, 1 draining"): as long for a fleet of thousands as for one (GET /admin/workers
 * lists each worker's).
 */
export function noWorkerSummary(
  router: KVAwareRouter,
  connections: WorkerConnections,
  excluded: ReadonlySet<string>,
  model?: unknown,
): string {
  const counts = new Map<string, number>();
  let workers = 0;
  for (const w of router.listWorkers()) {
    workers++;
    const reason = workerOutReason(w, connections, excluded, model);
    counts.set(reason, (counts.get(reason) ?? 0) + 1);
  }
  if (workers === 0) return 'no worker is registered';
  const parts = [...counts].sort((a, b) => b[1] - a[1]).map(([reason, n]) => `${n} ${reason}`);
  return `${workers} worker${workers === 1 ? '' : 's'}: ${parts.join(', ')}`;
}
