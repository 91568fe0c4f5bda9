/**
 * The OpenAI proxy: routes each completion request, forwards it to the chosen engine and
 * passes the answer back without buffering a stream. Nothing reaches the client before the
 * engine's first body byte, so until then a failure — a connection error, a 5xx, a streamed
 * answer's first byte overdue, the worker leaving rotation — is retried on another worker
 * (and, except when the worker was taken out, counted by the circuit breaker). A client that
 * goes away is not an engine failure: no breaker count, no failure metric, no retry. The
 * router's in-flight ticket follows the request: prefill until the first upstream byte,
 * decode until the end, released on completion, error or client disconnect.
 */
import { EventEmitter } from 'node:events';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { KVAwareRouter, RouteRequest, RouteResult } from '../core/router/index.js';
import type { StateStore } from '../state/state-store.js';
import type { CircuitBreaker } from './circuit-breaker.js';
import type { GatewayMetrics } from './metrics.js';
import { openAiError, type OpenAiPath, type RequestReader } from './openai-request.js';
import { clientMessage } from './request-limits.js';
import type { FirstByteDeadlines } from './timeouts.js';
import type { WorkerConnection, WorkerConnections } from './worker-connections.js';

export interface ProxyDeps {
  router: KVAwareRouter;
  state: StateStore;
  connections: WorkerConnections;
  breaker: CircuitBreaker;
  metrics: GatewayMetrics;
  readRequest: RequestReader;
  /** Attempts on other workers after a failure before the first byte. */
  maxRetries: number;
  /** Longest gap between answer chunks, and longest wait for a non-streamed answer (ms). */
  interChunkTimeoutMs: number;
  /** Per-worker deadlines for the first byte of a streamed answer. */
  firstByte: FirstByteDeadlines;
  /** Add x-contextforge-cached-tokens to responses. */
  cachedTokensHeader: boolean;
}

/** route(), with its argument checks answered as 400 (never 500) and nothing internal shown. */
export function routeOr400(
  router: KVAwareRouter,
  reply: FastifyReply,
  request: RouteRequest,
  opts: Parameters<KVAwareRouter['route']>[1],
): RouteResult | undefined {
  try {
    return router.route(request, opts);
  } catch (err) {
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
  } = deps;
  return async (req: FastifyRequest, reply: FastifyReply) => {
    const prepared = await readRequest(path, req, reply);
    if (!prepared) return reply;
    const { routeRequest, body, unchanged } = prepared;
    const started = performance.now();
    const excluded = connections.withoutModel(body.model);
    if (excluded.size > 0 && excluded.size === connections.size) {
      return reply.code(404).send({
        error: {
          message: `The model '${String(body.model)}' does not exist on any worker`,
          type: 'invalid_request_error',
          param: 'model',
          code: 'model_not_found',
        },
      });
    }
    const learning = state.beforeRoute(routeRequest);
    if (learning) await learning;
    const share = state.sharesDecisions;
    const streaming = body.stream === true;
    const release = (decision: RouteResult) => {
      router.release(decision.ticket);
      if (decision.shared) state.decisionEnded(decision.shared);
    };
    let failedAttempts = 0;
    for (let attempt = 0; ; attempt++) {
      if (reply.raw.destroyed) {
        // the client left while the request waited for a retry
        reply.hijack();
        return reply;
      }
      const decision = routeOr400(router, reply, routeRequest, { exclude: excluded, share });
      if (!decision) return reply;
      if (decision.noWorker) {
        reply.header('retry-after', '1');
        // engines tried and failed: 502; nothing to try at all: 503
        if (failedAttempts > 0) return openAiError(reply, 502, 'the engines failed to answer');
        return openAiError(reply, 503, 'no worker can take the request now');
      }
      metrics.decisions.inc({ policy: decision.policy, reason: decision.reason });
      if (decision.shared) state.decisionMade(decision.shared);
      const forwarded = decision.cacheSalt
        ? JSON.stringify({ ...body, cache_salt: decision.cacheSalt })
        : unchanged && req.rawBody !== undefined
          ? req.rawBody
          : JSON.stringify(body);
      const target = connections.get(decision.workerId)!;
      const outcome = await forward(reply, target, path, forwarded, {
        // the worker's own id (a data-parallel rank's worker) and the rank, for the response headers
        workerId: target.workerId,
        rank: target.rank,
        cachedTokens: cachedTokensHeader ? decision.cachedTokens : undefined,
        streaming,
        firstByteTimeoutMs: streaming ? firstByte.deadlineMs(decision.workerId) : interChunkTimeoutMs,
        interChunkTimeoutMs,
        onFirstByte: (seconds) => {
          metrics.ttft.observe(seconds);
          if (streaming) firstByte.observe(decision.workerId, seconds * 1000);
          router.markPrefillDone(decision.ticket);
          if (decision.shared) state.decisionPrefilled(decision.shared);
        },
      });
      release(decision);
      // a client that went away says nothing about the engine: no failure, no retry
      if (outcome === 'client-gone') {
        if (!reply.sent) {
          reply.hijack();
          reply.raw.end();
        }
        return reply;
      }
      if (outcome === 'retry' || outcome === 'worker-out') {
        failedAttempts++;
        if (outcome === 'retry') {
          breaker.failed(decision.workerId);
          metrics.upstreamFailures.inc({ worker: decision.workerId });
        }
        excluded.add(decision.workerId);
        if (attempt < maxRetries) {
          metrics.retries.inc({ worker: decision.workerId });
          await new Promise((r) => setTimeout(r, 25 * (attempt + 1)));
          continue;
        }
        reply.header('retry-after', '1');
        return openAiError(reply, 502, `the engines failed to answer (last: ${decision.workerId})`);
      }
      breaker.answered(decision.workerId);
      metrics.cachedTokens.inc(decision.cachedTokens);
      metrics.promptTokens.inc(decision.promptTokens);
      metrics.latency.observe((performance.now() - started) / 1000);
      return reply;
    }
  };
}

/** How one attempt on one engine ended. */
type ForwardOutcome =
  /** answered (or failed after its first byte reached the client, and was ended cleanly) */
  | 'done'
  /** the engine failed before anything reached the client: another worker can take it */
  | 'retry'
  /** the worker left rotation before answering anything: another worker can take it */
  | 'worker-out'
  /** the client went away: nothing to retry, and nothing the engine did wrong */
  | 'client-gone';

interface ForwardOptions {
  /** The worker's own id, for the response header. */
  workerId: string;
  /** The data-parallel rank the request ran on (the connection's headers name it to the engine), or null. */
  rank: number | null;
  /** Predicted cached tokens for the response header, when it is enabled. */
  cachedTokens: number | undefined;
  /** The client asked for a stream. */
  streaming: boolean;
  firstByteTimeoutMs: number;
  interChunkTimeoutMs: number;
  onFirstByte: (seconds: number) => void;
}

/**
 * Sends the request to one engine and passes its answer to the client: a stream chunk by
 * chunk, a complete JSON answer in one write with its length. Nothing is sent to the client
 * before the engine's first body byte, so until then a failure (connection error, 5xx, first-
 * byte timeout, the worker leaving rotation) can be retried on another worker. A failure after
 * the first byte ends an SSE stream with an OpenAI-style error event.
 */
async function forward(
  reply: FastifyReply,
  connection: WorkerConnection,
  path: string,
  body: string,
  o: ForwardOptions,
): Promise<ForwardOutcome> {
  // undici takes an EventEmitter as the abort signal: cheaper per request than an AbortController
  const abort = new EventEmitter();
  let why: 'client' | 'first-byte' | 'worker-out' | undefined;
  const giveUp = (reason: 'client' | 'first-byte' | 'worker-out') => {
    if (why !== undefined) return;
    why = reason;
    abort.emit('abort');
  };
  const res = reply.raw;
  // the response closing before it finished means the client went away (a request's own
  // 'close' only says its body was read)
  const onClientGone = () => {
    if (!res.writableFinished) giveUp('client');
  };
  res.once('close', onClientGone);
  const onWorkerOut = () => giveUp('worker-out');
  connection.unanswered.add(onWorkerOut);
  // a streamed answer's first byte is due a few seconds past the worker's usual queue; a
  // non-streamed answer's first byte is the whole answer (undici's timeouts bound it)
  const timer = o.streaming ? setTimeout(() => giveUp('first-byte'), o.firstByteTimeoutMs) : undefined;
  const failed = (): ForwardOutcome =>
    why === 'client' ? 'client-gone' : why === 'worker-out' ? 'worker-out' : 'retry';
  const started = performance.now();
  let sent = false;
  let eventStream = false;
  try {
    const upstream = await connection.pool.request({
      path,
      method: 'POST',
      body,
      headers: connection.headers,
      signal: abort,
      headersTimeout: o.streaming ? o.firstByteTimeoutMs + 1000 : o.interChunkTimeoutMs,
      bodyTimeout: o.interChunkTimeoutMs,
    });
    if (upstream.statusCode >= 500) {
      await upstream.body.dump().catch(() => {});
      return failed();
    }
    const contentType = String(upstream.headers['content-type'] ?? 'application/json');
    eventStream = contentType.includes('event-stream');
    const headers: Record<string, string> = { 'content-type': contentType, 'x-contextforge-worker': o.workerId };
    if (o.rank !== null) headers['x-contextforge-rank'] = String(o.rank);
    if (o.cachedTokens !== undefined) headers['x-contextforge-cached-tokens'] = String(Math.round(o.cachedTokens));
    const chunks = upstream.body[Symbol.asyncIterator]();
    const first = await chunks.next();
    if (timer) clearTimeout(timer);
    if (why !== undefined) return failed();
    o.onFirstByte((performance.now() - started) / 1000);
    if (!eventStream && upstream.headers['content-length'] !== undefined) {
      // a complete JSON answer of known size: sent in one write with its length, not chunked
      const parts: Buffer[] = first.done ? [] : [first.value as Buffer];
      for (let next = await chunks.next(); !next.done; next = await chunks.next()) parts.push(next.value as Buffer);
      if (why !== undefined) return failed();
      const payload = parts.length === 1 ? parts[0] : Buffer.concat(parts);
      headers['content-length'] = String(payload.length);
      connection.unanswered.delete(onWorkerOut);
      reply.hijack();
      sent = true;
      res.writeHead(upstream.statusCode, headers);
      res.end(payload);
      return 'done';
    }
    if (eventStream) headers['cache-control'] = 'no-cache';
    connection.unanswered.delete(onWorkerOut);
    reply.hijack();
    sent = true;
    res.writeHead(upstream.statusCode, headers);
    if (!first.done && !res.write(first.value)) await new Promise((r) => res.once('drain', r));
    for (let next = await chunks.next(); !next.done; next = await chunks.next()) {
      if (!res.write(next.value)) await new Promise((r) => res.once('drain', r));
    }
    res.end();
    return 'done';
  } catch {
    if (!sent) return failed();
    // after the first byte: end the stream cleanly; the cause stays out of the client's view
    if (why !== 'client' && eventStream) {
      res.write(
        `data: ${JSON.stringify({ error: { message: 'the engine failed mid-stream', type: 'server_error', code: null } })}\n\n`,
      );
    }
    res.end();
    return why === 'client' ? 'client-gone' : 'done';
  } finally {
    if (timer) clearTimeout(timer);
    res.off('close', onClientGone);
    connection.unanswered.delete(onWorkerOut);
  }
}
