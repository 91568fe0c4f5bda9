import { isIP } from 'node:net';
import { Counter, Histogram, type Registry } from 'prom-client';
import {
  PromptTooLongError,
  type KVAwareRouter,
  type RoutedResult,
  type RouteRequest,
  type RouteResult,
} from '../core/router/index.js';
import type { StateStore } from '../state/state-store.js';
import type { EndpointPicker, InFlightRequest, PickInput, PickOutcome } from './ext-proc-handler.js';
import {
  checkContentEncoding,
  editedBodyText,
  forwardableBytes,
  parseRequestBody,
  METADATA_HEADERS,
  SINGLE_VALUE_HEADERS,
} from '../server/openai-request.js';
import {
  checkName,
  checkRequestLimits,
  deleteRemovedFields,
  removedFieldsIn,
  longestPromptTokens,
  requestedOutputTokens,
  RequestLimitError,
  type RequestLimits,
} from '../server/request-limits.js';
import type { PanicRouting } from '../server/panic-routing.js';
import { methodNotAllowedMessage } from '../server/route-methods.js';
import { DP_RANK_HEADER } from '../server/engine-deployments.js';
import {
  endpointOfUrl,
  inSubset,
  INFERENCE_OBJECTIVE_HEADER,
  MODEL_NAME_REWRITE_HEADER,
  splitEndpoint,
  SUBSET_HINT_KEY,
  SUBSET_HINT_NAMESPACE,
} from './protocol.js';

/** An OpenAI request read into what the router routes on (the gateway's own parsing and tokenization). */
export interface PreparedRequest {
  routeRequest: RouteRequest;
  /** The body without the router's metadata field. */
  body: Record<string, unknown>;
  /** Whether `body` is the request's body as received (nothing removed). */
  unchanged: boolean;
  /** The top-level fields removed from the body as received (default: `contextforge`). */
  removed?: readonly string[];
}

/** A client error while reading a request: the HTTP status, a message naming the field. */
export interface RequestRejection {
  status: number;
  message: string;
  param?: string | null;
  /** Seconds after which the client may try again (the tokenizer was busy). */
  retryAfterS?: number;
}

/** What the picker needs from the gateway it runs beside: the same router, workers, state and request parsing. */
export interface RoutingBackend {
  readonly router: KVAwareRouter;
  readonly state: StateStore;
  readonly metrics: Registry;
  /**
   * The gateway's request limits (DEFAULT_REQUEST_LIMITS for those not given): the JSON body's
   * nesting and size and the client's model name, read before `prepare`, which checks the rest
   * (SGLang's `/generate` bodies included) with the gateway's own.
   */
  readonly limits?: Partial<RequestLimits>;
  /**
   * Forward the KV-transfer fields a client sends (request-limits.ts KV_TRANSFER_FIELDS), as the
   * gateway's setting says; otherwise they are removed from every JSON object body (default).
   */
  readonly forwardKvTransferParams?: boolean;
  /**
   * Forward the code fields a client sends (request-limits.ts CLIENT_CODE_FIELDS), as the
   * gateway's setting says; otherwise they are removed from every JSON object body (default).
   */
  readonly forwardCustomLogitProcessor?: boolean;
  /**
   * The gateway's panic routing (panic-routing.ts): a request no worker in rotation can take is
   * picked among the workers held out only by a health check or metrics scrape that timed out,
   * counted and logged with the gateway's own, so /readyz and the metric tell of both. Absent
   * (--panic-routing false): such a request is answered 503.
   */
  readonly panic?: Pick<PanicRouting, 'decide' | 'routedInRotation'>;
  /**
   * Every registered worker's id and engine base URL, and its data-parallel rank when the
   * worker is one rank of an engine with several (they share the engine's URL): the value of
   * X-data-parallel-rank that the engine takes for it (vLLM's index among the ranks of that API
   * server, the global rank less --data-parallel-start-rank).
   */
  workers(): Iterable<{ id: string; url: string; rank?: number | null }>;
  /** Workers that list their models, `model` not among them. */
  workersWithoutModel(model: unknown): ReadonlySet<string>;
  /**
   * `without` and the workers whose engines' context length is too short for a prompt of
   * `promptTokens` asking for `outputTokens` of `model`, when another worker may take it
   * (WorkerConnections.withoutRoom); `without` itself when none is left out. Absent: none is.
   */
  workersWithoutRoom?(
    without: ReadonlySet<string>,
    model: unknown,
    promptTokens: number | undefined,
    outputTokens: number | undefined,
  ): ReadonlySet<string>;
  /**
   * Reads an OpenAI body (parsed JSON) and its headers as the gateway does, token ids included
   * when the gateway tokenizes; a RequestRejection for a malformed request. `/generate`: SGLang's
   * native body, read into the same route request as a completion of its prompt
   * (request-limits.ts readGenerateRouteRequest).
   */
  prepare(
    path: '/v1/completions' | '/v1/chat/completions' | '/generate',
    body: unknown,
    headers: Readonly<Record<string, string | string[]>>,
  ): Promise<PreparedRequest | RequestRejection>;
}

export interface RouterPickerOptions {
  /** Fallback endpoints listed after the chosen one (default 2, the gateway's retries). */
  fallbacks?: number;
  /**
   * Priority of each inference objective (x-gateway-inference-objective); unknown or absent
   * objectives have priority 0. Requests with a negative priority are sheddable.
   */
  objectives?: ReadonlyMap<string, number>;
  /**
   * Saturation thresholds (the Gateway API Inference Extension's utilization detector and its
   * defaults, 5 waiting requests and 0.8 KV-cache usage): a worker's saturation is the larger
   * of waiting/queueDepth and kvUsage/kvUsage threshold; when the eligible workers' mean
   * reaches 1, sheddable requests get a 429.
   */
  shedQueueDepth?: number;
  shedKvUsage?: number;
  /**
   * Age (ms, router clock) past which a worker's last metrics reading is stale: such a worker,
   * or one not read yet, counts as saturated (saturation 1), as in the utilization detector.
   * Absent: readings are used however old (the engines' metrics are not scraped).
   */
  shedMetricsStaleMs?: number;
  /** Where a worker named by host name (Envoy is sent the name, not ip:port) is reported, once. */
  log?: (message: string) => void;
}

const CHAT = '/v1/chat/completions';
const COMPLETIONS = '/v1/completions';
/** SGLang's native generation API. */
const GENERATE = '/generate';
/** No worker excluded. */
const NO_WORKERS: ReadonlySet<string> = new Set();
/** The methods the inference APIs are served with (the gateway's routes for them). */
const INFERENCE_METHODS: readonly string[] = ['POST'];

/**
 * The endpoint picker's decisions, made by the gateway's KVAwareRouter: the same parsing,
 * policy, in-flight accounting and shared state as `serve`, so EPP replicas and gateway
 * replicas on one Redis route as one. Endpoints are the workers' host:port.
 */
export class RouterPicker implements EndpointPicker {
  private readonly fallbacks: number;
  private readonly objectives: ReadonlyMap<string, number>;
  private readonly shedQueueDepth: number;
  private readonly shedKvUsage: number;
  private readonly shedMetricsStaleMs: number | undefined;
  /** The backend's limits, for what is read before `prepare` (the JSON body, a rewritten model). */
  private readonly limits: RequestLimits;
  private readonly outcomes: Counter<'outcome'>;
  private readonly responseTimeouts: Counter;
  private readonly servedElsewhere: Counter;
  private readonly decisions?: Counter<'policy' | 'reason'>;
  private readonly cachedTokens?: Counter;
  private readonly promptTokens?: Counter;
  private readonly ttft?: Histogram;
  /**
   * endpoint (host:port) → the workers there (the ranks of a data-parallel engine, in the order
   * registered) and back, rebuilt when the worker set changes
   */
  private endpointCache = new Map<string, Array<{ id: string; rank: number | null }>>();
  private endpointOfWorker = new Map<string, { url: string; endpoint: string; rank: number | null }>();
  /** Counts the rebuilds of the endpoints: a pick that waited tells whether they changed meanwhile. */
  private endpointsVersion = 0;
  /** The workers named by host name that were reported (see refreshEndpoints). */
  private namedHostsReported = new Set<string>();
  private readonly log?: (message: string) => void;

  constructor(
    private readonly backend: RoutingBackend,
    options: RouterPickerOptions = {},
  ) {
    this.fallbacks = options.fallbacks ?? 2;
    if (!Number.isInteger(this.fallbacks) || this.fallbacks < 0)
      throw new RangeError('fallbacks must be a non-negative integer');
    this.objectives = options.objectives ?? new Map();
    this.shedQueueDepth = options.shedQueueDepth ?? 5;
    this.shedKvUsage = options.shedKvUsage ?? 0.8;
    if (!(this.shedQueueDepth > 0)) throw new RangeError('shedQueueDepth must be positive');
    if (!(this.shedKvUsage > 0 && this.shedKvUsage <= 1)) throw new RangeError('shedKvUsage must be in (0, 1]');
    this.shedMetricsStaleMs = options.shedMetricsStaleMs;
    this.log = options.log;
    if (this.shedMetricsStaleMs !== undefined && !(this.shedMetricsStaleMs > 0))
      throw new RangeError('shedMetricsStaleMs must be positive');
    this.limits = checkRequestLimits(backend.limits ?? {});
    const m = backend.metrics;
    this.outcomes =
      (m.getSingleMetric('contextforge_epp_requests_total') as Counter<'outcome'> | undefined) ??
      new Counter({
        name: 'contextforge_epp_requests_total',
        help: 'Endpoint-picker streams by outcome: routed, the status of the local reply, the gRPC status the stream was ended with (failed_precondition, internal…), or cancelled by Envoy.',
        labelNames: ['outcome'],
        registers: [m],
      });
    this.responseTimeouts =
      (m.getSingleMetric('contextforge_epp_response_timeouts_total') as Counter | undefined) ??
      new Counter({
        name: 'contextforge_epp_response_timeouts_total',
        help: 'Routed endpoint-picker streams on which no response began in time: their workers no longer count them in flight.',
        registers: [m],
      });
    this.servedElsewhere =
      (m.getSingleMetric('contextforge_epp_served_by_fallback_total') as Counter | undefined) ??
      new Counter({
        name: 'contextforge_epp_served_by_fallback_total',
        help: 'Requests the gateway served on a fallback endpoint instead of the chosen one.',
        registers: [m],
      });
    // the gateway's own series, so dashboards read one set of metrics in both modes
    this.decisions = m.getSingleMetric('contextforge_route_decisions_total') as
      Counter<'policy' | 'reason'> | undefined;
    this.cachedTokens = m.getSingleMetric('contextforge_predicted_cached_tokens_total') as Counter | undefined;
    this.promptTokens = m.getSingleMetric('contextforge_prompt_tokens_total') as Counter | undefined;
    this.ttft = m.getSingleMetric('contextforge_time_to_first_byte_seconds') as Histogram | undefined;
  }

  /** Counts an outcome (the ext_proc handler reports each request's). */
  countOutcome(outcome: string | number): void {
    this.outcomes.inc({ outcome: String(outcome) });
  }

  /** Counts a routed stream whose response did not begin in time (the ext_proc handler reports each). */
  countResponseTimeout(): void {
    this.responseTimeouts.inc();
  }

  /**
   * The worker id serving an endpoint (host:port), if any. An engine with data-parallel ranks is
   * several workers at one endpoint: the one of `rank` when given and there, else the first
   * registered (the engine picks the rank of a request that names none).
   */
  workerAt(endpoint: string, rank?: number | null): string | undefined {
    this.refreshEndpoints();
    const there = this.endpointCache.get(endpoint.toLowerCase());
    if (there === undefined) return undefined;
    if (rank !== undefined && rank !== null) for (const w of there) if (w.rank === rank) return w.id;
    return there[0].id;
  }

  async pick(input: PickInput): Promise<PickOutcome> {
    const { router, state } = this.backend;
    // HTTP/2 and HTTP/3 give each pseudo-header once (RFC 9113 §8.3): repeated, it would read as
    // one comma-joined value (a path no API has), and the refusal would name some other field
    for (const name of input.repeatedHeaders?.keys() ?? [])
      if (name.startsWith(':'))
        return { ok: false, status: 400, message: `the pseudo-header ${name} must be given once`, param: name };
    // the path as the engine's server matches it: percent-decoded (apiPath, isGenerate)
    const target = routedPath(input.headers.get(':path'));
    const method = input.headers.get(':method');
    // the inference APIs take POST, as the gateway serves them; a CORS preflight (OPTIONS) goes
    // on to the engine, which may answer it (vLLM allows every origin by default)
    if (apiPath(target, {}) !== undefined && method !== undefined && method !== 'POST' && method !== 'OPTIONS') {
      return {
        ok: false,
        status: 405,
        message: methodNotAllowedMessage(method, target ?? '', INFERENCE_METHODS),
        param: 'method',
        headers: { allow: INFERENCE_METHODS.join(', ') },
      };
    }
    const preflight = method === 'OPTIONS';
    this.refreshEndpoints();
    const endpointsRead = this.endpointsVersion;
    // workers outside the subset hint are not eligible
    const excluded = new Set<string>();
    if (input.subset !== undefined) {
      this.excludeOutsideSubset(input.subset, excluded);
      if (excluded.size === this.endpointOfWorker.size) return outsideSubset(input.subsetProblem);
    }

    let routeRequest: RouteRequest = {};
    let forwarded: Buffer | undefined;
    let preparedBody: Record<string, unknown> | undefined;
    /** The API path the body was read as (what its engine checks its prompt and output against), when it was. */
    let promptPath: string | undefined;
    /** The client's body bytes and the edits they take (editedBodyText), when they were kept. */
    let edit: { bytes: Buffer; model: string | undefined; removed: readonly string[] | undefined } | undefined;
    let model: unknown;
    /** Only the workers serving `model` are eligible. */
    let modelNarrows = false;
    let modelRewrite: { engine: string; client: string } | undefined;
    // the first response byte is the first token only for a streamed answer
    let firstTokenReported = true;
    /** The field a prompt's length is refused on, as the gateway names it: a chat's messages, else the prompt. */
    let promptField = 'prompt';
    // read as UTF-8, bytes that are not would reach the engine (the rewrite) or the router (the
    // metadata headers: ids, roles, anchors) as U+FFFD, with a body or without: refused as the
    // gateway refuses a metadata header that is not UTF-8
    const notUtf8 = input.notUtf8Headers;
    if (notUtf8 !== undefined && notUtf8.size > 0) {
      for (const name of [MODEL_NAME_REWRITE_HEADER, ...METADATA_HEADERS])
        if (notUtf8.has(name)) return { ok: false, status: 400, message: `${name} is not UTF-8`, param: name };
    }
    if (preflight) {
      // nothing to read: routed as a request without a body
    } else if (input.body !== undefined && input.body.length > 0) {
      let parsed: unknown;
      try {
        // as the gateway reads a body: no compressed body, the nesting depth checked before parsing
        checkContentEncoding(input.headers.get('content-encoding'));
        parsed = parseRequestBody(input.body, this.limits);
      } catch (err) {
        return limitRefusal(err);
      }
      if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
        return { ok: false, status: 400, message: 'the body must be a JSON object', param: 'body' };
      const body = parsed as Record<string, unknown>;
      // a streamed answer's first token is seen only when Envoy sends the response body as it comes
      firstTokenReported = body.stream === true && input.responseBodyStreamed !== false;
      let rewritten = false;
      const rewrite = input.headers.get(MODEL_NAME_REWRITE_HEADER);
      if (rewrite && body.model !== rewrite) {
        // the client's name is bounded as the gateway bounds it (and given back in the response),
        // though the engine's name replaces it before the gateway reads the body
        try {
          checkName(body.model, 'model', this.limits.maxIdBytes, 'the name of a model the workers serve');
        } catch (err) {
          return limitRefusal(err);
        }
        // the engine's name is the gateway's (its configuration sets the header), bounded as a
        // model name: past the bound it is no fault of the client's, answered as the gateway's
        try {
          checkName(
            rewrite,
            MODEL_NAME_REWRITE_HEADER,
            this.limits.maxIdBytes,
            'the name the workers serve the model by',
          );
        } catch (err) {
          if (!(err instanceof RequestLimitError)) throw err;
          return {
            ok: false,
            status: 503,
            message: `the gateway's header ${err.message}`,
            param: MODEL_NAME_REWRITE_HEADER,
          };
        }
        // the reference picker gives the client its own name back in the response
        if (typeof body.model === 'string' && body.model !== '') modelRewrite = { engine: rewrite, client: body.model };
        body.model = rewrite;
        rewritten = true;
      }
      model = body.model;
      // a /generate body is SGLang's, whatever fields it carries: checked against the limits on
      // the fields where SGLang takes them (some inside sampling_params) and routed on the prompt
      // SGLang computes, as a completion of it; a `prompt` or `messages` in it is nothing SGLang
      // reads, so it is never routed on, nor are SGLang's per-prompt lists counted by it
      const generate = isGenerate(target);
      const path = generate ? GENERATE : apiPath(target, body);
      if (path === CHAT) promptField = 'messages';
      if (path) {
        const prepared = await this.backend.prepare(path, body, requestHeaders(input));
        if ('status' in prepared)
          return {
            ok: false,
            status: prepared.status,
            message: prepared.message,
            param: prepared.param ?? null,
            retryAfterSeconds: prepared.retryAfterS,
          };
        routeRequest = prepared.routeRequest;
        preparedBody = prepared.body;
        promptPath = path;
        // an unchanged body is forwarded as received, byte for byte, unless it is not UTF-8: then
        // the engine gets what the router read (invalid sequences replaced), as from the gateway. A
        // changed one is the client's text edited, not the body serialised again (editedBodyText)
        const bytes = forwardableBytes(input.body);
        if (bytes === undefined) forwarded = Buffer.from(JSON.stringify(prepared.body));
        else {
          const newModel = rewritten && typeof body.model === 'string' ? body.model : undefined;
          // kept for an isolated request, whose private salt is known only once it is routed;
          // decoded only when edited
          edit = { bytes, model: newModel, removed: prepared.removed };
          if (!prepared.unchanged || rewritten) {
            const salt = typeof prepared.body.cache_salt === 'string' ? prepared.body.cache_salt : undefined;
            forwarded = Buffer.from(editedBodyText(bytes.toString('utf8'), salt, newModel, prepared.removed));
          }
        }
        // SGLang's /generate names no model (GenerateReqInput has none; `lora_path` names the
        // adapter): it is not narrowed to a model's workers
        modelNarrows = !generate;
        const withoutModel = generate ? NO_WORKERS : this.backend.workersWithoutModel(model);
        for (const id of withoutModel) excluded.add(id);
        if (withoutModel.size > 0 && withoutModel.size === this.endpointOfWorker.size) {
          return {
            ok: false,
            status: 404,
            message: `The model '${String(model)}' does not exist on any worker`,
            param: 'model',
          };
        }
      } else {
        // another API (/v1/responses, a path with a trailing slash): not routed on its body, nor
        // checked against the request limits, but an engine reads the KV-transfer and code fields
        // from it all the same
        const removed = removedFieldsIn(body, this.backend);
        if (removed !== undefined || rewritten) {
          const bytes = forwardableBytes(input.body);
          if (bytes === undefined) {
            deleteRemovedFields(body, removed ?? []);
            forwarded = Buffer.from(JSON.stringify(body));
          } else {
            const newModel = rewritten && typeof body.model === 'string' ? body.model : undefined;
            forwarded = Buffer.from(editedBodyText(bytes.toString('utf8'), undefined, newModel, removed ?? []));
          }
        }
      }
    } else if (input.headersOnly === true || input.body !== undefined) {
      // no body at all (end_of_stream on the headers, or an empty one): a request to an
      // inference API is refused as the gateway refuses it, not sent to an engine with nothing
      // to compute; a request without a body by nature (a GET of the model list) is routed
      const path = apiPath(target, {});
      if (path) {
        const prepared = await this.backend.prepare(path, undefined, requestHeaders(input));
        if ('status' in prepared)
          return { ok: false, status: prepared.status, message: prepared.message, param: prepared.param ?? null };
      }
    }

    // sheddable requests (negative priority) give way when the eligible workers are saturated
    const objective = input.headers.get(INFERENCE_OBJECTIVE_HEADER);
    const priority = objective === undefined ? 0 : (this.objectives.get(objective) ?? 0);
    if (priority < 0 && this.saturation(excluded) >= 1) {
      return {
        ok: false,
        status: 429,
        message: `the pool is saturated; objective '${objective}' (priority ${priority}) is shed`,
        retryAfterSeconds: 1,
      };
    }

    const learning = state.beforeRoute(routeRequest);
    if (learning) await learning;
    // workers may have come, gone or moved while the request was read and the state learnt:
    // the endpoints are those the router routes to now, and which are eligible is decided again
    this.refreshEndpoints();
    if (this.endpointsVersion !== endpointsRead) {
      excluded.clear();
      if (input.subset !== undefined) {
        this.excludeOutsideSubset(input.subset, excluded);
        if (excluded.size === this.endpointOfWorker.size) return outsideSubset(input.subsetProblem);
      }
      if (modelNarrows) for (const id of this.backend.workersWithoutModel(model)) excluded.add(id);
    }
    // an engine whose context is too short for the prompt is left out when another can take it
    if (
      modelNarrows &&
      this.backend.workersWithoutRoom !== undefined &&
      routeRequest.tokens !== undefined &&
      promptPath !== undefined
    ) {
      const body = preparedBody ?? {};
      const withoutRoom = this.backend.workersWithoutRoom(
        excluded,
        model,
        longestPromptTokens(body, promptPath, routeRequest.tokens) ?? routeRequest.tokens.length,
        requestedOutputTokens(body, promptPath),
      );
      if (withoutRoom !== excluded) for (const id of withoutRoom) excluded.add(id);
    }
    let decision: RouteResult;
    /** The workers the request was panic-routed over, when it was: its fallbacks may be among them too. */
    let panicCandidates: ReadonlySet<string> | undefined;
    try {
      const first = router.route(routeRequest, { exclude: excluded, share: state.sharesDecisions, firstTokenReported });
      decision = first;
      const { panic } = this.backend;
      // a request that found a worker allocates nothing more for panic routing
      if (panic !== undefined && !first.noWorker) panic.routedInRotation();
      else if (panic !== undefined) {
        // no worker in rotation can take it: those held out only by slow probes may, among the
        // workers it may go to (its model's, in the subset hint), as in the gateway's proxy
        const panicked = panic.decide(
          first,
          () => excluded,
          (heldOut, replaces) =>
            router.route(routeRequest, {
              exclude: excluded,
              share: state.sharesDecisions,
              firstTokenReported,
              panicCandidates: heldOut,
              replaces,
            }),
        );
        decision = panicked.decision;
        panicCandidates = panicked.panicCandidates;
      }
    } catch (err) {
      // a prompt longer than the router takes, refused on its field as the gateway refuses it
      if (err instanceof PromptTooLongError)
        return { ok: false, status: 400, message: err.message, param: promptField };
      // metadata the router refuses (a malformed anchor list, say) is the client's to fix
      if (err instanceof RangeError || err instanceof TypeError)
        return { ok: false, status: 400, message: err.message };
      throw err;
    }
    if (decision.noWorker)
      return {
        ok: false,
        status: 503,
        message: 'no worker can take the request now',
        retryAfterSeconds: 1,
        code: 'no_worker_available',
      };
    if (decision.shared) state.decisionMade(decision.shared);
    try {
      return this.routed(decision, routeRequest, excluded, panicCandidates, firstTokenReported, {
        forwarded,
        edit,
        preparedBody,
        modelRewrite,
      });
    } catch (err) {
      // the decision counts the request in flight: nothing will end it if the pick fails now
      router.release(decision.ticket);
      if (decision.shared) state.decisionEnded(decision.shared);
      throw err;
    }
  }

  /** The outcome of a request the router decided on: its endpoints, the body to forward and its accounting. */
  private routed(
    decision: RoutedResult,
    routeRequest: RouteRequest,
    excluded: ReadonlySet<string>,
    panicCandidates: ReadonlySet<string> | undefined,
    firstTokenReported: boolean,
    body: {
      forwarded: Buffer | undefined;
      edit: { bytes: Buffer; model: string | undefined; removed: readonly string[] | undefined } | undefined;
      preparedBody: Record<string, unknown> | undefined;
      modelRewrite: { engine: string; client: string } | undefined;
    },
  ): PickOutcome {
    const { router } = this.backend;
    const { edit, preparedBody, modelRewrite } = body;
    let { forwarded } = body;
    this.decisions?.inc({ policy: decision.policy, reason: decision.reason });
    this.cachedTokens?.inc(decision.cachedTokens);
    this.promptTokens?.inc(decision.promptTokens);
    // an isolated request carries its private salt to the engine: the client's text edited when
    // it was kept (serialising the parsed body again would round a 64-bit seed)
    if (decision.cacheSalt && edit !== undefined)
      forwarded = Buffer.from(
        editedBodyText(edit.bytes.toString('utf8'), decision.cacheSalt, edit.model, edit.removed),
      );
    else if (decision.cacheSalt && preparedBody !== undefined)
      forwarded = Buffer.from(JSON.stringify({ ...preparedBody, cache_salt: decision.cacheSalt }));

    const endpoints = [this.endpointOf(decision.workerId)];
    // a rank of a data-parallel engine is named to it in X-data-parallel-rank (as the gateway
    // names it); a client's own never reaches an engine the router did not choose a rank of
    const rank = this.endpointOfWorker.get(decision.workerId)?.rank ?? null;
    // ordered fallbacks: the policy's next choices, without changing any state
    const tried = new Set(excluded);
    tried.add(decision.workerId);
    if (rank !== null) {
      // Envoy sends a fallback the same header: only an engine where that rank exists can take
      // it (vLLM refuses a rank outside its --data-parallel-size; every engine has rank 0)
      for (const [id, e] of this.endpointOfWorker)
        if (e.rank !== rank && !(rank === 0 && e.rank === null)) tried.add(id);
    }
    while (endpoints.length <= this.fallbacks && tried.size < this.endpointOfWorker.size) {
      const next = router.route(routeRequest, { exclude: tried, dryRun: true, panicCandidates });
      if (next.noWorker) break;
      tried.add(next.workerId);
      const endpoint = this.endpointOf(next.workerId);
      if (!endpoints.includes(endpoint)) endpoints.push(endpoint);
    }
    return {
      ok: true,
      endpoints,
      body: forwarded,
      modelRewrite,
      ...(rank === null ? { removeHeaders: [DP_RANK_HEADER] } : { headers: { [DP_RANK_HEADER]: String(rank) } }),
      inFlight: this.track(decision, routeRequest, firstTokenReported, rank),
    };
  }

  /**
   * Mean saturation of the eligible workers (1 when none is eligible); a worker whose metrics
   * are stale or not read yet counts as saturated.
   */
  private saturation(excluded: ReadonlySet<string>): number {
    const { router } = this.backend;
    const staleBefore = this.shedMetricsStaleMs === undefined ? undefined : router.now() - this.shedMetricsStaleMs;
    let sum = 0;
    let n = 0;
    for (const w of router.listWorkers()) {
      if (excluded.has(w.id) || !w.available) continue;
      n++;
      if (staleBefore !== undefined && (w.metricsAt === undefined || w.metricsAt < staleBefore)) {
        sum += 1;
        continue;
      }
      sum += Math.max(w.waitingRequests / this.shedQueueDepth, w.load / this.shedKvUsage);
    }
    return n === 0 ? 1 : sum / n;
  }

  /**
   * `rank`: the data-parallel rank named to the engine, if any. A request the gateway serves on
   * a fallback is counted there, whether that worker is in rotation or not (a panic candidate,
   * drained or found unhealthy since).
   */
  private track(
    first: RouteResult,
    routeRequest: RouteRequest,
    firstTokenReported: boolean,
    rank: number | null,
  ): InFlightRequest {
    const { router, state } = this.backend;
    let decision: RouteResult | undefined = first;
    /** The endpoint of the decision: the ranks of an engine share it. */
    let decidedEndpoint = this.endpointOf(first.workerId);
    const started = performance.now();
    // the engine may yet be found to hold none of the request: until its first byte or a refusal
    let withdrawable = true;
    const release = () => {
      if (!decision) return;
      router.release(decision.ticket);
      if (decision.shared) state.decisionEnded(decision.shared);
      decision = undefined;
    };
    return {
      served: (endpoint) => {
        if (!decision) return undefined;
        if (endpoint === undefined) return decision.workerId;
        // served where it was sent: the decision stands, whichever of the engine's ranks it is
        if (endpoint.toLowerCase() === decidedEndpoint) return decision.workerId;
        // elsewhere: on the rank the request named, which a fallback has (see pick)
        const id = this.workerAt(endpoint, rank);
        if (id === undefined || id === decision.workerId) return decision.workerId;
        // the gateway fell back: the work (and the blocks it caches) moved to that worker, which
        // counts it while it runs even if it has been drained or found unhealthy since
        this.servedElsewhere.inc();
        release();
        const moved = router.route(routeRequest, { servedBy: id, share: state.sharesDecisions, firstTokenReported });
        if (moved.workerId === id) {
          if (moved.shared) state.decisionMade(moved.shared);
          decision = moved;
          decidedEndpoint = endpoint.toLowerCase();
        } else if (moved.ticket) router.release(moved.ticket);
        return id;
      },
      refused: () => {
        if (!decision || !withdrawable) return;
        withdrawable = false;
        router.markRefused(decision.ticket);
        if (decision.shared) state.decisionRefused(decision.shared);
      },
      firstByte: () => {
        if (!decision) return;
        withdrawable = false;
        router.markPrefillDone(decision.ticket);
        if (decision.shared) state.decisionPrefilled(decision.shared);
        this.ttft?.observe((performance.now() - started) / 1000);
      },
      end: release,
    };
  }

  private endpointOf(workerId: string): string {
    const e = this.endpointOfWorker.get(workerId);
    if (!e) throw new Error(`worker '${workerId}' has no endpoint`);
    return e.endpoint;
  }

  /** Adds the workers whose endpoint is outside the subset hint to `excluded`. */
  private excludeOutsideSubset(subset: readonly string[], excluded: Set<string>): void {
    for (const [id, e] of this.endpointOfWorker) if (!inSubset(e.endpoint, subset)) excluded.add(id);
  }

  /** Checks the cached endpoints against the backend's workers (no allocation when nothing changed). */
  private refreshEndpoints(): void {
    let n = 0;
    let same = true;
    for (const w of this.backend.workers()) {
      n++;
      const known = this.endpointOfWorker.get(w.id);
      if (known?.url !== w.url || known.rank !== (w.rank ?? null)) {
        same = false;
        break;
      }
    }
    if (same && n === this.endpointOfWorker.size) return;
    const byEndpoint = new Map<string, Array<{ id: string; rank: number | null }>>();
    const byWorker = new Map<string, { url: string; endpoint: string; rank: number | null }>();
    for (const w of this.backend.workers()) {
      const endpoint = endpointOfUrl(w.url).toLowerCase();
      const rank = w.rank ?? null;
      byWorker.set(w.id, { url: w.url, endpoint, rank });
      // workers sharing a host:port (data-parallel ranks behind one API server) are one endpoint
      const there = byEndpoint.get(endpoint);
      if (there) there.push({ id: w.id, rank });
      else byEndpoint.set(endpoint, [{ id: w.id, rank }]);
    }
    this.endpointCache = byEndpoint;
    this.endpointOfWorker = byWorker;
    this.endpointsVersion++;
    this.reportNamedHosts();
  }

  /**
   * Reports, once per worker, one whose URL names its host by name: the protocol's endpoints are
   * ip:port, which Envoy's original-destination and override-host load balancing need. Those
   * given at start are refused there; these came later (the admin API, another replica's state).
   */
  private reportNamedHosts(): void {
    if (this.log === undefined) return;
    const reported = new Set<string>();
    for (const [id, e] of this.endpointOfWorker) {
      const { host } = splitEndpoint(e.endpoint);
      if (isIP(host) !== 0) continue;
      reported.add(id);
      if (!this.namedHostsReported.has(id))
        this.log(
          `endpoint picker: worker ${id}'s URL names the host '${host}', no IP address: Envoy is sent ${e.endpoint}, where the protocol wants ip:port (give the engine's IP address, or find engines with --discover)`,
        );
    }
    this.namedHostsReported = reported;
  }
}

/**
 * The answer when no endpoint of the subset hint is a worker (503, as the protocol asks when
 * none is eligible or the list is empty), naming what in the hint could not be read.
 */
function outsideSubset(problem: string | undefined): PickOutcome {
  return {
    ok: false,
    status: 503,
    message:
      problem === undefined
        ? 'no endpoint in the subset hint is a worker of this picker'
        : `no endpoint in the subset hint is a worker of this picker: ${SUBSET_HINT_NAMESPACE} ${SUBSET_HINT_KEY} ${problem}`,
    retryAfterSeconds: 1,
  };
}

/**
 * The headers as the gateway's checks read them: a metadata header that takes one value and
 * is repeated is given as the list of its values, which the checks refuse (as the gateway
 * does), rather than as one comma-joined value that would pass for an id.
 */
function requestHeaders(input: PickInput): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = Object.fromEntries(input.headers);
  for (const [name, values] of input.repeatedHeaders ?? [])
    if (SINGLE_VALUE_HEADERS.includes(name)) out[name] = [...values];
  return out;
}

/** A percent-encoded octet of a path. */
const PERCENT_OCTET = /%([0-9A-Fa-f]{2})/g;

/**
 * The request path as vLLM's and SGLang's servers match it against their routes: uvicorn hands
 * Starlette the path percent-decoded (urllib.parse.unquote: `%XX` by its octet, `%2F` a slash
 * too; a `%` not followed by two hex digits kept as it is), and Envoy passes `:path` on as the
 * client wrote it unless told to normalise it. Read raw, `/v1/%63ompletions` would name no API
 * here while the engine serves it as a completion: its body would go unchecked (a chat read as a
 * completion, a thousand prompts uncounted). Only the path is decoded, not the query; an octet
 * past ASCII is decoded to a character no API path holds, which is all the comparison needs.
 */
function routedPath(path: string | undefined): string | undefined {
  if (path === undefined || !path.includes('%')) return path;
  const query = path.indexOf('?');
  const head = query < 0 ? path : path.slice(0, query);
  const decoded = head.replace(PERCENT_OCTET, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)));
  return query < 0 ? decoded : decoded + path.slice(query);
}

/**
 * Whether the request is for SGLang's native `/generate` (python/sglang/srt/entrypoints/http_server.py),
 * a query string allowed. Not with a trailing slash, which SGLang answers with a redirect (see
 * apiPath). No string is made for the comparison.
 */
function isGenerate(path: string | undefined): boolean {
  return (
    path !== undefined &&
    (path === GENERATE || (path.startsWith(GENERATE) && path.charCodeAt(GENERATE.length) === 0x3f))
  );
}

/**
 * Which OpenAI API a body is for: the request path when it names one, else the body's shape
 * (`messages` a chat, `prompt` or vLLM's `prompt_embeds` a completion).
 * A path with a trailing slash (`/v1/completions/`) names none: vLLM and SGLang serve the APIs
 * with FastAPI, whose router (Starlette, redirect_slashes) answers it 307 with the path without
 * the slash, and never runs the API on it; a client that follows the redirect comes back through
 * the picker on the API's own path and is read then. Its body still loses the KV-transfer and
 * code fields.
 */
function apiPath(
  path: string | undefined,
  body: Record<string, unknown>,
): typeof CHAT | typeof COMPLETIONS | undefined {
  const p = path?.split('?')[0];
  if (p?.endsWith(CHAT)) return CHAT;
  if (p?.endsWith(COMPLETIONS)) return COMPLETIONS;
  if (Array.isArray(body.messages)) return CHAT;
  // a completion's prompt is a string or a list (vLLM's completions take prompt_embeds in its
  // place); another API's `prompt` (the Responses API's template object) or a null one is not
  const { prompt, prompt_embeds: embeds } = body;
  if (typeof prompt === 'string' || Array.isArray(prompt)) return COMPLETIONS;
  if (typeof embeds === 'string' || Array.isArray(embeds)) return COMPLETIONS;
  return undefined;
}

/** A request limit's refusal as the picker answers it (400 naming the field); anything else is rethrown. */
function limitRefusal(err: unknown): PickOutcome {
  if (err instanceof RequestLimitError)
    return { ok: false, status: err.status, message: err.message, param: err.param };
  throw err;
}
