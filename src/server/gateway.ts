/**
 * The HTTP gateway: an OpenAI-compatible routing proxy in front of the engines. Each request
 * is routed with KVAwareRouter.route() from its text or token ids and the metadata of
 * docs/architecture.md §5, forwarded to the chosen engine, and streamed back without buffering. This
 * module composes the pieces (metrics, circuit breaker, worker connections, request reading,
 * proxy, admin routes) and serves the small read-only endpoints itself.
 */
import { createServer as createHttpServer, STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import { Socket, type Server as NetServer } from 'node:net';
import { Transform, type Duplex, type TransformCallback } from 'node:stream';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Registry } from 'prom-client';
import type { KVAwareRouter } from '../core/router/index.js';
import { WorkerHealth } from '../engines/health.js';
import { KvEventApplier } from '../engines/kv-events/applier.js';
import { KvEventFormatError, readJsonEvents, type JsonEventsReader } from '../engines/kv-events/decode.js';
import { DEFAULT_METRICS_INTERVAL_MS } from '../engines/metrics/scraper.js';
import type { PromptTokenizer } from '../engines/chat-tokenizer.js';
import type { AsyncPromptTokenizer, TokenizerPoolStats } from '../engines/tokenizer-pool.js';
import { MemoryStateStore, type StateStore, type WorkerRecord } from '../state/state-store.js';
import { AdminToken, authorizationProblem, generateToken } from './admin-auth.js';
import { adminRoutes, requireAdmin, WorkerChangeRefused } from './admin-routes.js';
import type { ApiKeys } from './api-keys.js';
import {
  BODY_BUDGET_CODE,
  BODY_BUDGET_MESSAGE,
  BODY_BUDGET_RETRY_AFTER_S,
  BodyBudget,
  DEFAULT_BUFFERED_ANSWER_LIMIT,
  DEFAULT_BUFFERED_BODY_LIMIT,
  MAX_BODY_LIMIT,
  type BodyCharge,
} from './body-budget.js';
import { BodyRates, DEFAULT_MIN_BODY_RATE, DEFAULT_MIN_BODY_RATE_GRACE_MS, type WatchedBody } from './body-rate.js';
import { CircuitBreaker } from './circuit-breaker.js';
import { answerClosing, ShutdownCuts } from './forward.js';
import {
  capClientConnections,
  checkMaxClientConnections,
  DEFAULT_MAX_CLIENT_CONNECTIONS,
  IdleClosingCap,
  openConnections,
} from './client-connections.js';
import {
  CLIENT_REQUEST_LIMIT_CODE,
  CLIENT_REQUEST_LIMIT_RETRY_AFTER_S,
  clientAddressKey,
  ClientRequests,
} from './client-requests.js';
import {
  closedStatus,
  markAnsweredOnSocket,
  markCutByGateway,
  createGatewayMetrics,
  registerStateRefusalMetrics,
  registerTokenizeRefusalMetrics,
  registerTokenizerMetrics,
  registerAnswerBudgetMetrics,
  registerBodyBudgetMetrics,
  registerBodyRateMetrics,
  registerMediaUrlMetrics,
  registerClientConnectionMetrics,
  registerClientRequestMetrics,
  registerKvEventMetrics,
} from './metrics.js';
import {
  checkContentEncoding,
  createRequestParser,
  createRequestReader,
  openAiError,
  openAiErrorType,
  useJsonBodies,
  type ProxyReply,
  type RequestParser,
  type RequestReaderOptions,
} from './openai-request.js';
import { createFastPath } from './fast-path.js';
import { isValidHost } from './host-header.js';
import { MAX_PIPELINED_REQUESTS, PipelinedRequests } from './pipelining.js';
import { sharePrefillReads } from '../state/prefill-sharing.js';
import { PanicRouting } from './panic-routing.js';
import { PostedEvents } from './posted-events.js';
import { createProxyHandler, routeOr400, type ProxyDeps } from './proxy.js';
import {
  checkRequestLimits,
  clientMessage,
  RequestLimitError,
  longestPromptTokens,
  requestedOutputTokens,
  type RequestLimits,
} from './request-limits.js';
import { mediaDomains } from './media-domains.js';
import { checkTimeouts, FirstByteDeadlines, type GatewayTimeouts } from './timeouts.js';
import { carryRequestId, headBytes, requestIdLine } from './passed-headers.js';
import { forwardedVia, ownVia, viaPseudonym } from './via.js';
import { WorkerConnections } from './worker-connections.js';
import { EngineKeyEnvs } from './worker-input.js';
import { registerWorkerStateMetrics } from './worker-metrics.js';
import { methodNotAllowedMessage, RouteMethods, shownHeader } from './route-methods.js';
import { FailureLog } from './failure-log.js';

/** While closing, connections that have gone idle are closed this often. */
const IDLE_SWEEP_MS = 100;

/** The one transfer coding the gateway decodes (Node's parser does), alone. */
const CHUNKED_ONLY = /^[ \t]*chunked[ \t]*$/i;

/**
 * Model lists (GET /v1/models) gathered from the workers at once, each asked with its own Via;
 * clients asking with the same Via share one. Each asks every worker over a connection of its
 * own (not one of --engine-connections'): without a bound, a burst of clients would open as many
 * to every engine and take the descriptors the engines' requests need.
 */
export const MAX_MODEL_LISTS_GATHERED = 16;

/**
 * Most worker ids whose refusal (another replica's worker this one cannot take) is logged, once
 * each; past them refusals are only counted (contextforge_state_workers_not_added_total).
 */
export const MAX_REFUSED_WORKERS_LOGGED = 100;

/**
 * Longest wait, once the shutdown grace ends, for the error events of the streams under way to be
 * written before every connection is cut: they are a few hundred bytes, written at once to a
 * client that reads.
 */
const SHUTDOWN_FLUSH_MS = 1000;

/** A /v1/models list gathered from the workers: the models, how many workers were asked, those that gave none. */
interface GatheredModels {
  data: unknown[];
  asked: number;
  failed: Array<{ worker: string; failure: string }>;
}

/** Most workers named in a client's error message; the others are counted. */
const MAX_WORKERS_NAMED = 8;

/** The workers that gave no model list and why, a few named and the rest counted: bounded for any fleet. */
function failedWorkersText(failed: Array<{ worker: string; failure: string }>): string {
  const named = failed
    .slice(0, MAX_WORKERS_NAMED)
    .map((f) => `${f.worker.slice(0, 64)} ${f.failure}`)
    .join(', ');
  const more = failed.length - MAX_WORKERS_NAMED;
  return more > 0 ? `${named} and ${more} more` : named;
}

/**
 * Most header lines a request may have (Envoy's default is 100; clients send a few dozen). Node
 * keeps at most the server's maxHeadersCount and drops the rest without a word, so the server
 * keeps one more and a request that has it is refused: a Content-Length, a Host or a metadata
 * header past the bound would otherwise be dropped, and the body read without being taken from
 * the body budget.
 */
export const MAX_HEADER_LINES = 1000;

/** Idle keep-alive connections are kept this long (Fastify's default). */
const KEEP_ALIVE_TIMEOUT_MS = 72_000;

/** The header naming the tenant of an operator's /v1/route dry run (API keys, admin token). */
export const ROUTE_TENANT_HEADER = 'x-contextforge-tenant';

/** A worker as the gateway takes it (flags, config, admin API) and the replicas share it. */
export type GatewayWorker = WorkerRecord;

export interface GatewayOptions {
  router: KVAwareRouter;
  workers?: GatewayWorker[];
  /**
   * Bearer token for /admin (and /v1/route unless `publicRouteApi`); without one a random token
   * is made, readable as `gateway.adminToken`. Loopback clients get no exemption.
   */
  adminToken?: string;
  /** Answer /v1/route without the admin token (it shows what is cached where). */
  publicRouteApi?: boolean;
  /** Client API keys → tenants: requests then need a key, and tenants never share KV. */
  apiKeys?: ApiKeys;
  /** Add `x-contextforge-cached-tokens` to proxied responses (it shows what is cached). */
  cachedTokensHeader?: boolean;
  /** Limits on what a client controls (ids, anchors, JSON depth and size, choices, stop sequences). */
  limits?: Partial<RequestLimits>;
  /**
   * The page `/metrics` answers, when it is not this gateway's registry alone: `serve --processes
   * N` merges every process's (process-metrics.ts). A rejection answers 503, a failed scrape,
   * rather than one process's counters, which would read as a reset.
   */
  metricsPage?: () => Promise<string>;
  /**
   * Told each router worker id (a data-parallel rank's too) whose series leave the registry as
   * its worker is removed: `serve --processes N` passes it to the primary, which drops what
   * stopped processes counted of it from the merged page.
   */
  workerMetricsForgotten?: (workerId: string) => void;
  /**
   * Forward the body fields that direct an engine's disaggregated prefill/decode KV transfer
   * (vLLM's `kv_transfer_params`, SGLang's `bootstrap_host`, `bootstrap_port`, `bootstrap_room`
   * and the others of request-limits.ts KV_TRANSFER_FIELDS) as a client sends them. Off by default: they are
   * removed, as a client could otherwise make an engine fetch KV from a host of its choosing.
   */
  forwardKvTransferParams?: boolean;
  /**
   * Forward the body fields that carry a client's code for an engine to run (SGLang's
   * `custom_logit_processor`, a pickled class an engine started with
   * `--enable-custom-logit-processor` unpickles; vLLM's `logits_processors`, names it imports and
   * constructs: request-limits.ts CLIENT_CODE_FIELDS) as a client sends them. Off by default: they
   * are removed, as the gateway's clients could otherwise run code on engines that allow it for
   * callers trusted with it. Forwarded, a `custom_logit_processor` is bounded as before.
   */
  forwardCustomLogitProcessor?: boolean;
  /**
   * The only hosts a chat's media URLs (image_url, audio_url, video_url, input_image) may name,
   * as vLLM's `--allowed-media-domains` (media-domains.ts): exact host names or IP addresses.
   * With a list, a URL naming another host, or of a scheme other than http, https and data, is a
   * 400 naming the field. Empty or unset: no restriction.
   */
  allowedMediaDomains?: readonly string[];
  /** Client-side and engine-side timeouts (timeouts.ts). */
  timeouts?: Partial<GatewayTimeouts>;
  /** Where workers' `apiKeyEnv` variables are read (default process.env). */
  env?: NodeJS.ProcessEnv;
  /**
   * Variables (names, `PREFIX*`, or `*`) that workers added while the gateway runs (the admin API,
   * another replica) may name in `apiKeyEnv`, besides those the configured workers name (EngineKeyEnvs).
   */
  engineKeyEnvs?: readonly string[];
  bodyLimit?: number;
  /**
   * Most request-body bytes held at once over all requests (default 256 MiB, at least
   * `bodyLimit`): a request whose body does not fit is refused with 503 and Retry-After.
   * Shared with the endpoint picker on this gateway (`gateway.bodyBudget`).
   */
  bufferedBodyLimit?: number;
  /**
   * Least average rate of a request body, bytes per second, once `minBodyRateGraceMs` have
   * passed since its headers (default 240; 0: none). A slower body is cut: 408, the connection
   * closed and its bytes given back to the budget, so that clients declaring large bodies and
   * trickling them cannot hold the budget until the request timeout.
   */
  minBodyRate?: number;
  /** Time a request body may take before its rate is checked (default 5000 ms). */
  minBodyRateGraceMs?: number;
  /**
   * Most client connections held at once (default 16,384, client-connections.ts): one more
   * takes the place of the connection idle the longest, or when none is idle it is closed as it
   * is accepted, unanswered; both counted.
   */
  maxClientConnections?: number;
  /**
   * Most requests one client holds in flight at once on the completion paths (default 0: no
   * limit; at most MAX_REQUESTS_PER_CLIENT, client-requests.ts): a client is its API key when the
   * request carries a valid one, else its address (IPv6 by its /64). One more is answered 429 with
   * Retry-After, its body unread.
   */
  maxRequestsPerClient?: number;
  /**
   * Most bytes of complete (non-streamed) answers gathered at once over all requests (default
   * 256 MiB). An answer is gathered so that a failure before its end can be retried; one that
   * does not fit passes through as it comes instead (`gateway.answerBudget`).
   */
  bufferedAnswerLimit?: number;
  /** Attempts on other workers after a connection failure or a 5xx before the first byte. */
  maxRetries?: number;
  /** Most connections to one engine (default 2048, worker-connections.ts); a stream holds one until it ends. */
  engineConnections?: number;
  /** The inter-chunk timeout (timeouts.interChunkTimeoutMs wins when both are given). */
  upstreamTimeoutMs?: number;
  /** Consecutive failures that open a worker's circuit (default 3), and for how long (5 s). */
  breakerFailures?: number;
  breakerCooldownMs?: number;
  /**
   * When no worker is in rotation for a request, route it over the workers held out only because
   * their health check or metrics scrape timed out, instead of answering 503 (default true;
   * panic-routing.ts), and keep /readyz ready meanwhile. Workers whose probe got an error status or
   * a refused connection, whose circuit is open, draining or removed are never used so.
   */
  panicRouting?: boolean;
  /** Applies KV events posted to /admin/events (the serve command shares it with the subscribers). */
  applier?: KvEventApplier;
  /**
   * How prompts are hashed: `text` (default; UTF-8 chunks of the canonical text), `tokenizer`
   * (token ids from the model's own tokenizer and chat template, in process: `promptTokenizer`)
   * or `engine` (token ids from an available worker's /tokenize). With token ids the blocks
   * match the engines' own, so KV events can feed the index.
   */
  tokenize?: 'text' | 'tokenizer' | 'engine';
  /** In process (blocks the event loop while it works) or a TokenizerPool on worker threads. */
  promptTokenizer?: PromptTokenizer | AsyncPromptTokenizer;
  /** Subscribe to the workers' KV events (their `events` endpoints); needs token ids, so not with `text`. */
  kvEvents?: boolean;
  /** Interval of the load-metrics scrape per worker (default 200 ms, DEFAULT_METRICS_INTERVAL_MS; 0: no scraping). */
  metricsIntervalMs?: number;
  /** Interval of the active health check, GET {url}/health (default 2000 ms; 0: none). */
  healthCheckIntervalMs?: number;
  /**
   * Longest wait for one health probe's answer (default 5000 ms, DEFAULT_HEALTH_CHECK_TIMEOUT_MS:
   * SGLang's /health generates a token first, and takes a second or more).
   */
  healthCheckTimeoutMs?: number;
  /**
   * How long an engine may show no progress in its metrics (its counters still) while requests of
   * the gateway wait on it and it reports requests running or waiting, before it is held out of
   * rotation until they move (default 60 s, DEFAULT_STALL_TIMEOUT_MS; 0: never; nothing without
   * scraping or on engines that export none of the counters).
   */
  stallTimeoutMs?: number;
  /** One line per notable event (health changes, event-stream gaps). */
  log?: (message: string) => void;
  /** Shared state for several replicas (default: in memory, this replica only). */
  state?: StateStore;
  /**
   * Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models; default true).
   * The endpoint picker turns it off: there clients reach the engines through their gateway.
   */
  openAiRoutes?: boolean;
}

export interface Gateway {
  app: FastifyInstance;
  router: KVAwareRouter;
  metrics: Registry;
  /** The admin bearer token (the configured one, or the one made at start; the last one `replaceAdminToken` took). */
  readonly adminToken: string;
  /**
   * Accepts `token` as the admin token from now on, and the previous one no more (SIGHUP re-reads
   * the token file). A token refused (RangeError) leaves the current one.
   */
  replaceAdminToken(token: string): void;
  /** Who holds which worker out of rotation (health check, metrics scrape, circuit breaker). */
  health: WorkerHealth;
  /**
   * Panic routing (panic-routing.ts), shared by the proxy and the endpoint picker so that
   * /readyz and contextforge_panic_routed_total see both; undefined with `panicRouting: false`.
   */
  panic: PanicRouting | undefined;
  /**
   * Whether /readyz answers ready: a worker is in rotation, or requests can be panic-routed (the
   * endpoint picker's gRPC readiness says the same).
   */
  ready(): boolean;
  addWorker(w: GatewayWorker): void;
  /**
   * Removes a worker (every rank of it) here and from the shared state; false when unknown.
   * `record` false (DNS discovery's removals): the shared state does not keep the removal for
   * replicas that start later (state-store.ts).
   */
  removeWorker(id: string, options?: { record?: boolean }): boolean;
  /** Whether an operator added the worker here: through the admin API, or configured at start. */
  addedByOperator(id: string): boolean;
  /** Drains (true) or resumes (false) a worker (every rank) here and in the shared state; false when unknown. */
  drainWorker(id: string, draining: boolean): boolean;
  /** Shared state for the replicas. */
  state: StateStore;
  /** The workers and what the gateway keeps per worker. */
  connections: WorkerConnections;
  /** This gateway's pseudonym in the Via header of what it forwards (random per gateway). */
  viaPseudonym: string;
  /** Reads an OpenAI request (body and headers) as the proxy does, for other front ends. */
  parseRequest: RequestParser;
  /** The limits on what a client controls, as the proxy applies them. */
  limits: Readonly<RequestLimits>;
  /** Whether the KV-transfer fields a client sends are forwarded (GatewayOptions.forwardKvTransferParams). */
  forwardKvTransferParams: boolean;
  /** Whether the code fields a client sends are forwarded (GatewayOptions.forwardCustomLogitProcessor). */
  forwardCustomLogitProcessor: boolean;
  /** The request-body bytes held now over all requests, and their limit (the endpoint picker's too). */
  bodyBudget: BodyBudget;
  /** Counts a request refused because its body did not fit in `bodyBudget` (the endpoint picker's too). */
  countBodyBudgetRefusal(): void;
  /** The bytes of complete answers gathered now over all requests, and their limit. */
  answerBudget: BodyBudget;
  /**
   * Caps another listener of this process (the endpoint picker's) at the gateway's
   * maxClientConnections; its connections show in /metrics under `listener`.
   */
  capClientConnections(server: NetServer, listener: string): void;
  /**
   * Stops taking requests (new ones are answered 503), lets those in flight finish for up to
   * `graceMs` (default: as long as they take), then ends them and cuts their connections
   * (ShutdownCuts): a stream under way gets an error event and data: [DONE], a request no engine
   * has answered (sent to one, or still waiting before its attempt) a 503 `gateway_shutdown`, and
   * its engine request, if any, is aborted; nothing more is started for them. Then closes the
   * workers' connections and the shared state.
   */
  close(graceMs?: number): Promise<void>;
}

export async function createGateway(options: GatewayOptions): Promise<Gateway> {
  const { router } = options;
  const applier = options.applier ?? new KvEventApplier(router);
  const postedEvents = new PostedEvents(applier);
  /** Lists of KV events relayed by other replicas refused because too many of their worker's were waiting. */
  let relayedListsRefused = 0;
  const tokenizeMode = options.tokenize ?? 'text';
  if (tokenizeMode === 'tokenizer' && !options.promptTokenizer)
    throw new TypeError("tokenize 'tokenizer' needs a promptTokenizer");
  if (options.kvEvents && tokenizeMode === 'text')
    throw new RangeError('kvEvents needs token ids: tokenize must be tokenizer or engine');
  const log = options.log ?? (() => {});
  const limits = checkRequestLimits(options.limits);
  const allowedMediaDomains = mediaDomains(options.allowedMediaDomains);
  const timeouts = checkTimeouts({ interChunkTimeoutMs: options.upstreamTimeoutMs, ...options.timeouts });
  const bodyLimit = options.bodyLimit ?? 16 * 1024 * 1024;
  if (!Number.isSafeInteger(bodyLimit) || bodyLimit < 1 || bodyLimit > MAX_BODY_LIMIT)
    throw new RangeError(`bodyLimit must be an integer from 1 to ${MAX_BODY_LIMIT} (got ${bodyLimit})`);
  const maxClientConnections = checkMaxClientConnections(
    options.maxClientConnections ?? DEFAULT_MAX_CLIENT_CONNECTIONS,
  );
  const clientRequests = new ClientRequests(options.maxRequestsPerClient ?? 0);
  let adminTokenText = options.adminToken ?? generateToken();
  const adminToken = new AdminToken(adminTokenText);
  const health = new WorkerHealth(router, log);
  const via = viaPseudonym();
  const connections = new WorkerConnections({
    router,
    applier,
    health,
    log,
    env: options.env ?? process.env,
    keyEnvs: new EngineKeyEnvs(options.engineKeyEnvs),
    kvEvents: options.kvEvents,
    engineConnections: options.engineConnections,
    metricsIntervalMs: options.metricsIntervalMs ?? DEFAULT_METRICS_INTERVAL_MS,
    healthCheckIntervalMs: options.healthCheckIntervalMs ?? 2000,
    healthCheckTimeoutMs: options.healthCheckTimeoutMs,
    stallTimeoutMs: options.stallTimeoutMs,
    // what the gateway asks the workers on its own (health, metrics, models, /tokenize) carries its Via
    via: ownVia(via),
  });
  const state: StateStore = options.state ?? new MemoryStateStore();
  const bodyBudget = new BodyBudget(options.bufferedBodyLimit ?? Math.max(DEFAULT_BUFFERED_BODY_LIMIT, bodyLimit));
  if (bodyBudget.limit < bodyLimit)
    throw new RangeError(
      `bufferedBodyLimit (${bodyBudget.limit}) must be at least bodyLimit (${bodyLimit}): a body at the limit could never be read`,
    );
  const answerBudget = new BodyBudget(
    options.bufferedAnswerLimit ?? DEFAULT_BUFFERED_ANSWER_LIMIT,
    'bufferedAnswerLimit',
  );
  /**
   * Cuts a body that arrives too slowly. Its bytes go back at once: they are what it was
   * holding from the other clients. It is answered 408 and its connection closed; the rest of
   * the body is read and dropped (lingeringClose), so it never ends and never reaches an engine.
   * Pipelined behind an answer still being written, it is answered in its turn, after that
   * answer: the rest of its body is dropped from now on, not read into memory meanwhile.
   */
  const cutSlowBody = ({ req, res }: WatchedBody): void => {
    bodyCharges.get(req)?.release();
    bodyTooSlow.inc();
    const socket = req.socket;
    if (res.headersSent) {
      // its answer has begun (never so for a body still being read, but a second answer
      // cannot follow the first): the connection is cut
      res.statusCode = 408;
      markCutByGateway(res);
      return void socket.destroy();
    }
    const message = `the request body arrived slower than ${bodyRates.bytesPerSecond} bytes per second`;
    // pipelined behind answers still being written: a refusal of the parser's (its request
    // timeout) would be a second answer to it
    if (res.socket !== socket) return refuseInTurn(res, 408, message, 'body');
    answerMalformed(res, 408, message, 'body');
  };
  const bodyRates = new BodyRates(
    options.minBodyRate ?? DEFAULT_MIN_BODY_RATE,
    options.minBodyRateGraceMs ?? DEFAULT_MIN_BODY_RATE_GRACE_MS,
    cutSlowBody,
  );
  /**
   * Each request's share of the budget: for the chunk-by-chunk charge of a body of undeclared
   * length, and for the proxy to give it back once the answer is committed.
   */
  const bodyCharges = new WeakMap<IncomingMessage, BodyCharge>();
  /** The charges of each connection's requests whose answers have not closed yet. */
  const socketCharges = new WeakMap<Duplex, Set<BodyCharge>>();
  /**
   * Takes a request's body bytes from the budget before any of them is read: the whole
   * Content-Length at once (a body without one is charged as Fastify reads it, below). Given
   * back once the body is no longer held: by the proxy when the answer is committed to the
   * client (its first byte goes out: no retry needs the body after that), else when the
   * response closes (answered, failed, or the client gone). False when they do not fit: the
   * request has been answered 503.
   */
  const admitBody = (req: IncomingMessage, res: ServerResponse): boolean => {
    const length = req.headers['content-length'];
    const chunked = req.headers['transfer-encoding'] !== undefined;
    if (length === undefined && !chunked) return true;
    const size = Number(length);
    // nothing to hold, or refused 413 by the body limit without being read
    if (!chunked && !(size > 0 && size <= bodyLimit)) return true;
    const socket = req.socket;
    // a client already gone sends nothing more: nothing to hold
    if (socket.destroyed) return true;
    const charge = bodyBudget.charge();
    // given back when the answer closes, or when the connection does: a pipelined request's
    // answer waits behind the one before it, and if the client leaves meanwhile it never
    // gets the connection, so it never closes
    let held = socketCharges.get(socket);
    if (held === undefined) {
      const charges = new Set<BodyCharge>();
      socketCharges.set(socket, (held = charges));
      socket.once('close', () => {
        for (const c of charges) c.release();
        charges.clear();
      });
    }
    const charges = held;
    charges.add(charge);
    // a body that fits is read: from now on it must arrive at the minimum rate
    let watched: WatchedBody | undefined;
    res.once('close', () => {
      charges.delete(charge);
      charge.release();
      bodyRates.forget(watched);
    });
    bodyCharges.set(req, charge);
    if (chunked || charge.take(size)) {
      watched = bodyRates.watch(req, res);
      return true;
    }
    bodyBudgetRefusals.inc();
    answerBodyBudgetExceeded(res);
    return false;
  };
  /**
   * Counts a completion request against its client's requests in flight (client-requests.ts),
   * until its response closes: answered, refused later, failed on every engine, cut, or its
   * client gone (a response queued behind another on its connection closes with the connection:
   * pipelined.closeWithConnection), as the body budget gives a request's bytes back. False when
   * its client has the limit in flight already: nothing is counted, and it is to be answered 429.
   * Health, metrics, admin, /v1/models and /v1/route are not counted.
   */
  const admitClientRequest = (req: IncomingMessage, res: ServerResponse): boolean => {
    if (clientRequests.limit === 0 || req.method !== 'POST') return true;
    const path = routeMethods.patternOf(req.url ?? '');
    if (path !== '/v1/completions' && path !== '/v1/chat/completions') return true;
    // a client already gone sends nothing more, and its response may have closed already
    if (req.socket.destroyed) return true;
    // a key that is not valid is refused 401 before its body is read: it counts by address meanwhile
    const keyId = options.apiKeys?.keyIdOf(req.headers.authorization);
    const release = clientRequests.admit(
      keyId === undefined ? clientAddressKey(req.socket.remoteAddress) : `api key ${keyId}`,
    );
    if (release === undefined) {
      clientRequestRefusals.inc({ client: keyId === undefined ? 'address' : 'api_key' });
      return false;
    }
    res.once('close', release);
    return true;
  };
  /**
   * A client connection's idle timer fired while `res` was its current response. A request read
   * whole whose answer has not begun is not idle: the gateway is working on it (waiting for an
   * engine, retrying on another, keeping it on a worker out of rotation), which can take several
   * times the upstream timeout, and the timer starts again. Otherwise the connection is closed,
   * and the request counts with what the gateway did, never as a client that left: a body that
   * stopped arriving is answered 408, an answer the client stopped reading is cut with its status.
   */
  const idleWithResponse = (req: IncomingMessage, res: ServerResponse): void => {
    const socket = req.socket;
    if (res.writableEnded) return void socket.destroy();
    if (res.headersSent) {
      markCutByGateway(res);
      return void socket.destroy();
    }
    if (req.complete) return void socket.setTimeout(timeouts.connectionTimeoutMs);
    bodyCharges.get(req)?.release();
    answerMalformed(res, 408, `the request body stopped arriving for ${timeouts.connectionTimeoutMs} ms`, 'body');
  };
  /** The OpenAI routes' common case before Fastify (set once the routes exist), and whether the gateway is closing. */
  let fastPath: ((req: IncomingMessage, res: ServerResponse) => boolean) | undefined;
  let closing = false;
  /** The methods each path is served with (filled in as the routes are declared), for 405's Allow. */
  const routeMethods = new RouteMethods();
  /** How many requests each connection has served at once (pipelining.ts). */
  const pipelined = new PipelinedRequests();
  const metrics = createGatewayMetrics(router);
  const clientConnectionMetrics = registerClientConnectionMetrics(metrics.registry);
  const app = Fastify({
    bodyLimit,
    logger: false,
    // a request arriving while the gateway closes is answered by the onRequest hook below, in the
    // OpenAI shape and counted, not with Fastify's own body
    return503OnClosing: false,
    connectionTimeout: timeouts.connectionTimeoutMs,
    // what the HTTP layer refuses before a route runs is answered in the OpenAI shape too
    clientErrorHandler: (err, socket) =>
      answerClientError(
        err,
        socket,
        (req) => bodyCharges.get(req)?.release(),
        (status) => metrics.countRequest(NO_ROUTE, status),
      ),
    frameworkErrors: (err, _req, reply) =>
      void openAiError(
        reply as FastifyReply,
        err.code === 'FST_ERR_MAX_PARAM_LENGTH' ? 414 : 400,
        err.code === 'FST_ERR_MAX_PARAM_LENGTH'
          ? 'a path segment of the URL is longer than allowed'
          : 'the URL is not valid (a percent-encoding that does not decode)',
        'url',
      ),
    // slow clients: the headers and the whole request must arrive in time (checked every second);
    // Fastify leaves a factory-made server's idle timeouts alone, so they are set here
    serverFactory: (handler) => {
      const server = createHttpServer(
        {
          headersTimeout: Math.min(timeouts.headersTimeoutMs, timeouts.requestTimeoutMs),
          requestTimeout: timeouts.requestTimeoutMs,
          connectionsCheckingInterval: Math.min(1000, timeouts.headersTimeoutMs),
          // checked below: Node's own answer is a 400 without a body
          requireHostHeader: false,
        },
        (req, res) => serve(req, res, false),
      );
      // the HTTP listener's cap makes room for a new connection by closing the one idle the longest
      const counted = clientConnectionMetrics.listen('http', {
        limit: maxClientConnections,
        open: () => openConnections(server),
      });
      const connectionCap = new IdleClosingCap(server, maxClientConnections, {
        refused: () => counted.refused.inc(),
        idleClosed: () => counted.idleClosed.inc(),
      });
      /**
       * Every request, before the fast path or Fastify: the refusals on its headers alone come
       * first. `expectsContinue`: the client waits for a 100 before it sends the body (Expect:
       * 100-continue); it is told to go on only once none of them applies, and not when the body
       * is over the limit (Fastify refuses it, 413, on its Content-Length): a body about to be
       * refused is not asked for (RFC 9110 §10.1.1). Nor is one a route refuses on the headers
       * (no route, another method, a compressed body, no valid API key): the 100 goes once the
       * body is read (continueOnRead), and a refusal before that is the only answer.
       */
      const serve = (req: IncomingMessage, res: ServerResponse, expectsContinue: boolean): void => {
        // sent after the connection's last answer (Connection: close): Node parsed it, but it is
        // not a request of this connection any more (RFC 9112 §9.6); its response may even hold
        // the connection being closed, which ending it would write on
        if (pipelined.closedAfterLastAnswer(req.socket)) return;
        // every answer the gateway writes itself carries the client's x-request-id back
        carryRequestId(req, res);
        // a response queued behind another on its connection closes when the connection does
        pipelined.closeWithConnection(req, res);
        // its connection is not idle until the answer closes: the cap does not close it meanwhile
        connectionCap.requestStarted(req, res);
        // the response a refusal on the socket (answerClientError: a body too slow) belongs to
        responseOnSocket.set(req.socket, res);
        // a connection closed after an answer while its request's body comes in reads it on
        // (lingeringClose), and serves nothing sent after that answer
        if (req.socket.destroySoon !== lingeringClose) {
          req.socket.destroySoon = lingeringClose;
          afterLastAnswer.set(req.socket, pipelined);
        }
        // the connection's idle timer fires while this response is its current one: the gateway decides
        res.on('timeout', () => idleWithResponse(req, res));
        // Node's parser hands over HTTP/2.0 and HTTP/0.9 (a request line without a version too)
        // as if they were HTTP/1.x; RFC 9110 §15.6.6: a major version not supported is a 505
        if (req.httpVersionMajor !== 1) {
          countOnClose(req, res);
          return answerVersionNotSupported(res, req.httpVersion);
        }
        // then: what Node dropped past the bound may be the Host or the Content-Length
        if (req.rawHeaders.length > 2 * MAX_HEADER_LINES) {
          countOnClose(req, res);
          return answerMalformed(res, 431, `the request has more than ${MAX_HEADER_LINES} header lines`, 'headers');
        }
        if (req.headers.host === undefined && req.httpVersion === '1.1') {
          countOnClose(req, res);
          return answerMalformed(res, 400, 'an HTTP/1.1 request needs a Host header', 'host');
        }
        // Node keeps the first Host and drops the others; a proxy in front may have read
        // another one. RFC 9112 §3.2: a request with more than one Host line is refused
        if (hostLines(req.rawHeaders) > 1) {
          countOnClose(req, res);
          return answerMalformed(res, 400, 'the request has more than one Host header', 'host');
        }
        // RFC 9112 §3.2: an invalid Host value is refused too (the empty one, sent for a target
        // without an authority, is not invalid)
        const host = req.headers.host;
        if (host !== undefined && host !== '' && !isValidHost(host)) {
          countOnClose(req, res);
          return answerMalformed(
            res,
            400,
            `the Host header '${shownHeader(host)}' is not a valid host name or address with an optional port`,
            'host',
          );
        }
        // Node's parser takes other codings before chunked ("gzip, chunked") and hands the
        // body over still coded: refused, as a compressed body is (a 400, the client's to fix,
        // where RFC 9112 §6.1 suggests 501), rather than read as if it were JSON. HTTP/1.0 has
        // no transfer codings: its framing is faulty (RFC 9112 §6.1), whatever Node made of it
        const coding = req.headers['transfer-encoding'];
        if (coding !== undefined && (!CHUNKED_ONLY.test(coding) || req.httpVersion === '1.0')) {
          countOnClose(req, res);
          return answerMalformed(
            res,
            400,
            req.httpVersion === '1.0'
              ? 'an HTTP/1.0 request cannot be sent with a Transfer-Encoding: send it with a Content-Length'
              : `the transfer coding '${shownHeader(coding)}' is not supported: send the body chunked alone, or with a Content-Length`,
            'transfer-encoding',
          );
        }
        // before its body is taken from the budget: a refused request holds none of it
        if (!pipelined.admit(req, res)) {
          countOnClose(req, res);
          return answerPipelineFull(res);
        }
        if (!admitClientRequest(req, res)) {
          countOnClose(req, res);
          return answerClientRequestLimit(res, clientRequests.limit);
        }
        if (!admitBody(req, res)) return countOnClose(req, res);
        if (expectsContinue && !(Number(req.headers['content-length']) > bodyLimit)) continueOnRead(req, res);
        if (fastPath === undefined || !fastPath(req, res)) handler(req, res);
      };
      // without this listener Node says 100 Continue before any check has run
      server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => serve(req, res, true));
      // an Expect other than 100-continue: Node's own answer is a 417 without a body
      server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
        if (pipelined.closedAfterLastAnswer(req.socket)) return;
        pipelined.closeWithConnection(req, res);
        connectionCap.requestStarted(req, res);
        carryRequestId(req, res);
        countOnClose(req, res);
        answerMalformed(res, 417, `the expectation '${shownHeader(req.headers.expect)}' is not supported`, 'expect');
      });
      // CONNECT comes to this event, not to the routes; without a listener Node drops the socket unanswered
      server.on('connect', (req: IncomingMessage, socket: Duplex) => {
        if (answerMethodNotAllowed(socket, req, routeMethods.allowed(req.url ?? '')))
          metrics.countRequest(routeMethods.patternOf(req.url ?? '') ?? NO_ROUTE, 405);
      });
      // one more than a request may have: a request that has it is refused, not read without the rest
      server.maxHeadersCount = MAX_HEADER_LINES + 1;
      server.setTimeout(timeouts.connectionTimeoutMs);
      // longer than clients keep idle connections (undici: 4 s), so the server is never the one
      // closing a connection a client is about to reuse
      server.keepAliveTimeout = KEEP_ALIVE_TIMEOUT_MS;
      return server;
    },
  });
  registerKvEventMetrics(metrics.registry, () => connections.subscriberStats());
  registerTokenizeRefusalMetrics(metrics.registry, () => connections.tokenizeRefusalCounts());
  const threads = options.promptTokenizer;
  if (tokenizeMode === 'tokenizer' && threads !== undefined && 'stats' in threads)
    registerTokenizerMetrics(metrics.registry, threads as { stats(): TokenizerPoolStats });
  const bodyBudgetRefusals = registerBodyBudgetMetrics(metrics.registry, bodyBudget);
  const bodyTooSlow = registerBodyRateMetrics(metrics.registry);
  const mediaUrlRefusals = registerMediaUrlMetrics(metrics.registry);
  const clientRequestRefusals = registerClientRequestMetrics(metrics.registry, clientRequests);
  /** Caps `server`'s connections at maxClientConnections, its connections and refusals shown as `listener`'s. */
  const capListener = (server: NetServer, listener: string) => {
    const { refused } = clientConnectionMetrics.listen(listener, {
      limit: maxClientConnections,
      open: () => openConnections(server),
    });
    capClientConnections(server, maxClientConnections, () => refused.inc());
  };
  const answerBudgetPassthroughs = registerAnswerBudgetMetrics(metrics.registry, answerBudget);
  registerWorkerStateMetrics(metrics.registry, {
    router,
    health,
    eventLagSeconds: (id) => connections.get(id)?.subscriber?.stats.lagSeconds,
    stallCounts: () => connections.stallCounts(),
  });
  const breaker = new CircuitBreaker(
    { failures: options.breakerFailures, cooldownMs: options.breakerCooldownMs },
    health,
    (id) => connections.has(id),
  );
  // each worker's deadline for a streamed answer's first byte, learned from its answers
  const firstByte = new FirstByteDeadlines(timeouts.firstByteTimeoutMs, timeouts.interChunkTimeoutMs);

  const addWorker = (w: GatewayWorker) => state.workerAdded(connections.add(w));
  /** Workers added here through the admin API or configured at start: DNS discovery leaves them alone. */
  const operatorWorkers = new Set<string>();
  const removeWorkerLocally = (id: string) => {
    if (!connections.has(id)) return false;
    operatorWorkers.delete(connections.get(id)?.workerId ?? id);
    // the breaker counts by router worker id: each data-parallel rank has its own streak, and its
    // own series and first-byte deadline: a worker added again under the id (another engine, or
    // the same one restarted) starts from the allowance, not from what the last one taught
    for (const rid of connections.routerIdsOf(id)) {
      breaker.forget(rid);
      metrics.forgetWorker(rid);
      options.workerMetricsForgotten?.(rid);
      firstByte.forget(rid);
    }
    return connections.remove(id);
  };
  /** The worker a router worker id belongs to (a data-parallel rank's `ID#r`), or the id itself: what the shared state knows. */
  const workerIdOf = (id: string) => connections.get(id)?.workerId ?? id;
  const removeWorker = (id: string, options?: { record?: boolean }) => {
    const workerId = workerIdOf(id);
    const removed = removeWorkerLocally(id);
    if (removed) state.workerRemoved(workerId, options);
    return removed;
  };
  /** Drains (or resumes) every rank of a worker here; false when unknown. */
  const drainWorkerLocally = (id: string, draining: boolean) => {
    if (!connections.has(id)) return false;
    for (const rid of connections.routerIdsOf(id)) {
      if (draining) router.drainWorker(rid);
      else router.resumeWorker(rid);
    }
    // back in rotation unless a health verdict holds it out: requests kept elsewhere may move to it
    if (!draining) connections.rotationGained();
    return true;
  };
  const drainWorker = (id: string, draining: boolean) => {
    const known = drainWorkerLocally(id, draining);
    // the other replicas know the worker, not its ranks: a rank's id drains the whole worker here too
    if (known) state.workerDrained(workerIdOf(id), draining);
    return known;
  };
  /**
   * The admin API's worker changes when the shared state decides them (the cluster store; the
   * Redis store while Redis is up): each is sent to be decided in one order with every
   * process's (replica's), and applied here as its verdict arrives (the state then applies it
   * in the others; state.workerAdded() and the like are not called). While the state does not
   * decide (Redis out of reach) the change is decided here, as without it.
   */
  const orderWorkerChange = state.orderWorkerChange?.bind(state);
  const decidedHere = () => state.decidesWorkerChanges?.() === false;
  /** The admin API's addition decided against this replica's own view. */
  const addWorkerHere = (w: WorkerRecord) => {
    if (connections.has(w.id)) throw new WorkerChangeRefused(409, `worker '${w.id}' exists`, 'id');
    addWorker(w);
    operatorWorkers.add(w.id);
  };
  const orderedAdmin = orderWorkerChange && {
    addWorker: async (w: WorkerRecord) => {
      if (decidedHere()) return addWorkerHere(w);
      const failedHere = await orderWorkerChange({ op: 'add', worker: w }, (v) => {
        if (!v.ok) throw new WorkerChangeRefused(v.status, v.message, v.param);
        // the shared state's order wins: a worker of this id held here is one it no longer has
        if (connections.has(w.id)) removeWorkerLocally(w.id);
        try {
          connections.add(w);
        } catch (err) {
          return err as Error;
        }
        operatorWorkers.add(w.id);
        return undefined;
      });
      if (failedHere === undefined) return;
      // made in the shared state but refused here (out of ZeroMQ sockets, a pool or subscriber
      // that would not start): taken back, in the same order, and the refusal answered
      if (decidedHere()) state.workerRemoved(w.id);
      else await orderWorkerChange({ op: 'remove', id: w.id }, () => undefined).catch(() => undefined);
      throw failedHere;
    },
    removeWorker: (id: string) =>
      decidedHere()
        ? removeWorker(id)
        : orderWorkerChange({ op: 'remove', id }, (v) => {
            if (!v.ok) {
              if (v.status === 404) return false;
              throw new WorkerChangeRefused(v.status, v.message, v.param);
            }
            removeWorkerLocally(v.id);
            return true;
          }),
    drainWorker: (id: string, draining: boolean) =>
      decidedHere()
        ? drainWorker(id, draining)
        : orderWorkerChange({ op: 'drain', id, draining }, (v) => {
            if (!v.ok) {
              if (v.status === 404) return false;
              throw new WorkerChangeRefused(v.status, v.message, v.param);
            }
            // every rank of it (the verdict names the worker)
            drainWorkerLocally(v.id, draining);
            return true;
          }),
    syncWorkers: () => state.syncWorkerChanges!(),
  };
  for (const w of options.workers ?? []) {
    connections.add(w, true);
    operatorWorkers.add(w.id);
  }
  // the worker ids whose refusal (addWorkerFromState) was logged; '' once the bound was said
  const refusedWorkersLogged = new Set<string>();
  const workersNotAdded = registerStateRefusalMetrics(metrics.registry);
  try {
    await state.attach({
      router,
      listWorkers: () => connections.records(),
      addWorkerFromState: (w, from = 'replica') => {
        // a worker read from the registry may be any replica's, one long stopped too
        const source =
          from === 'registry'
            ? 'from the shared registry'
            : from === 'replaced'
              ? "replaced by the shared registry's record"
              : 'added by another replica';
        try {
          connections.add(w);
        } catch (err) {
          // another replica's worker this one cannot take (an engine-key variable it may not read
          // or does not have, a full router): said here, where the operator looks for it, once
          // per worker id (a peer may send the same message, or garbage, thousands of times);
          // every refusal is counted
          workersNotAdded.inc();
          const id = String(w?.id).slice(0, 64);
          if (refusedWorkersLogged.has(id)) return;
          if (refusedWorkersLogged.size >= MAX_REFUSED_WORKERS_LOGGED) {
            if (refusedWorkersLogged.size === MAX_REFUSED_WORKERS_LOGGED) {
              refusedWorkersLogged.add('');
              log(
                `${MAX_REFUSED_WORKERS_LOGGED} workers added by another replica were not added here: more are counted in contextforge_state_workers_not_added_total, not logged`,
              );
            }
            return;
          }
          refusedWorkersLogged.add(id);
          log(
            from === 'replaced'
              ? `worker '${id}' removed: the shared registry holds another record of it, not added here: ${(err as Error).message}`
              : `worker '${id}' ${source} not added here: ${(err as Error).message}`,
          );
          return;
        }
        refusedWorkersLogged.delete(w.id);
        log(`worker '${w.id}' ${source}`);
      },
      removeWorkerFromState: (id, from = 'replica') => {
        refusedWorkersLogged.delete(String(id).slice(0, 64));
        removeWorkerLocally(id);
        // a replacement is said as its addition
        if (from === 'replaced') return;
        log(
          from === 'registry'
            ? `worker '${id}' removed: the shared registry records its removal through the admin API`
            : `worker '${id}' removed by another replica`,
        );
      },
      drainWorkerFromState: (id, draining) => {
        if (!connections.has(id)) return;
        // a worker added is also announced as not draining (a replica that missed its removal may
        // hold it drained): said only where it changes something
        const ranks = new Set(connections.routerIdsOf(id));
        const changes = router.listWorkers().some((w) => ranks.has(w.id) && w.draining !== draining);
        drainWorkerLocally(id, draining);
        if (changes) log(`worker '${id}' ${draining ? 'drained' : 'resumed'} by another replica`);
      },
      applyKvEventsFromState: (id, events) => {
        const connection = connections.get(id);
        if (connection === undefined) return;
        let reader: JsonEventsReader;
        try {
          reader = readJsonEvents(events);
        } catch (err) {
          // checked by the replica that took them: a newer one's format, or a message garbled
          if (!(err instanceof KvEventFormatError)) throw err;
          return;
        }
        // in slices, as where they were posted
        void postedEvents
          .apply(id, reader, () => connections.get(id) === connection)
          .then(
            (out) => {
              // the posting replica bounds its own lists alike: this is a burst from several of them
              if ('refusedWaiting' in out && relayedListsRefused++ === 0)
                log(
                  `KV events for '${id}' from another replica not applied: ${out.refusedWaiting} lists of it are waiting (further ones are not logged)`,
                );
            },
            (err: Error) => log(`KV events for '${id}' from another replica not applied: ${err.message}`),
          );
      },
      log,
    });
  } catch (err) {
    // a start the shared state refused leaves nothing running: the workers' health checks and
    // scrapes would otherwise go on polling for good
    await connections.close();
    throw err;
  }

  app.addHook('onRoute', (route) => routeMethods.add(route.method, route.url));
  useJsonBodies(app, limits);
  /** An error a route threw, answered: a client's mistake as a 4xx naming it, anything else a 500 (logged). */
  const answerError = (err: Error & { statusCode?: number }, where: string, reply: ProxyReply) => {
    if (err instanceof BodyBudgetError) {
      bodyBudgetRefusals.inc();
      // the rest of the body is not read: the connection cannot carry another request
      reply.header('retry-after', String(BODY_BUDGET_RETRY_AFTER_S)).header('connection', 'close');
      return void openAiError(reply, 503, BODY_BUDGET_MESSAGE, null, BODY_BUDGET_CODE);
    }
    // a check's TypeError/RangeError is the client's; anything else is ours, and its message stays in the log
    const clientError =
      err instanceof RequestLimitError ||
      ((err instanceof TypeError || err instanceof RangeError) && clientMessage(err, '') !== '');
    const status =
      err instanceof RequestLimitError
        ? err.status
        : err.statusCode && err.statusCode >= 400 && err.statusCode < 500
          ? err.statusCode
          : clientError
            ? 400
            : 500;
    if (status >= 500) {
      log(`internal error on ${where}: ${err.stack ?? err.message}`);
      return void openAiError(reply, 500, 'internal error');
    }
    // Fastify's refusal of a Content-Type that is not a media type at all ("json", ";"): any
    // media type is read as JSON, so that header is what the client has to fix
    if ((err as { code?: unknown }).code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE')
      return void openAiError(
        reply,
        415,
        'the Content-Type header is not a media type: send application/json',
        'content-type',
      );
    const message = status === 413 ? `request body too large: ${err.message}` : err.message;
    void openAiError(
      reply,
      status,
      message,
      err instanceof RequestLimitError ? err.param : status === 413 ? 'body' : null,
    );
  };
  const notFound = (req: FastifyRequest, reply: FastifyReply) => {
    // a path served with other methods (TRACE, PUT… on /v1/completions): 405 naming them
    const allowed = routeMethods.allowed(req.url);
    if (allowed.length === 0) return void openAiError(reply, 404, `no route ${req.method} ${shownHeader(req.url)}`);
    reply.header('allow', allowed.join(', '));
    void openAiError(reply, 405, methodNotAllowedMessage(req.method, req.url, allowed), 'method');
  };
  app.setErrorHandler((err: Error & { statusCode?: number }, req, reply) =>
    // the body of a request to no route is read before the not-found handler runs: whatever is
    // wrong with it (not JSON, too deep, compressed, too large), the path is what to fix
    req.is404 && (err instanceof RequestLimitError ? err.status : (err.statusCode ?? 500)) < 500
      ? notFound(req, reply)
      : answerError(err, `${req.method} ${req.routeOptions.url ?? 'unknown'}`, reply),
  );
  app.setNotFoundHandler(notFound);
  // a body of undeclared length (chunked) takes its bytes from the budget as they are read; a
  // callback hook, not an async one: no promise per request
  app.addHook('preParsing', (req, _reply, payload, done) => {
    // a client waiting for its 100 (continueOnRead) has sent no body: what its headers alone
    // refuse is answered without asking for it (the error handler answers a path with no route
    // 404 or 405, as it does whatever is wrong with the body)
    if (awaitingContinue.has(req.raw)) {
      if (req.is404) return done(Object.assign(new Error('no route'), { statusCode: 404 }));
      try {
        checkContentEncoding(req.headers['content-encoding']);
      } catch (err) {
        return done(err as Error);
      }
    }
    const charge = req.headers['transfer-encoding'] === undefined ? undefined : bodyCharges.get(req.raw);
    done(null, charge === undefined ? payload : chargedBody(payload, charge, bodyLimit));
  });
  /**
   * Counts a request answered before the fast path or Fastify saw it (a refusal) once its
   * response closes, under the route its path matches, as Fastify's hook below counts the rest.
   */
  const countOnClose = (req: IncomingMessage, res: ServerResponse): void => {
    const path = routeMethods.patternOf(req.url ?? '') ?? NO_ROUTE;
    res.once('close', () => metrics.countRequest(path, statusOnClose(req, res)));
  };
  /**
   * The status a request counts with once its response closes: closedStatus, except for one
   * answered whole but queued behind an answer after which the gateway closed the connection (a
   * pipelining refusal, any answer saying Connection: close; pipelining.ts): it never went out,
   * but its client did not leave.
   */
  const statusOnClose = (req: IncomingMessage, res: ServerResponse): number =>
    res.writableEnded && !res.writableFinished && pipelined.refusedOn(req.socket) ? res.statusCode : closedStatus(res);
  // counted once its response closes, answered or not (a client that left first counts as 499;
  // onResponse runs only for a response written whole); a callback hook, not an async one: no
  // promise per request
  app.addHook('onRequest', (req, reply, done) => {
    const res = reply.raw;
    res.once('close', () => metrics.countRequest(req.routeOptions.url ?? NO_ROUTE, statusOnClose(req.raw, res)));
    // one that reaches a closing gateway (pipelined, or on a connection kept alive) is sent
    // elsewhere by its client or load balancer: the 503 a shutdown's unanswered requests get
    // (Fastify has set Connection: close on it); replied here, the route never runs
    if (closing) return void answerClosing(reply);
    done();
  });

  // ------------------------------------------------------------------ OpenAI API

  /** With API keys, the OpenAI routes need one; its tenant goes with the request. */
  const requireApiKey = async (req: FastifyRequest, reply: FastifyReply) => {
    if (!options.apiKeys) return;
    const problem = authorizationProblem(req.raw);
    if (problem) return openAiError(reply, problem.status, problem.message, problem.param);
    const tenant = options.apiKeys.tenantOf(req.headers.authorization);
    if (tenant === undefined)
      return openAiError(
        reply,
        401,
        'a valid API key is required (Authorization: Bearer KEY)',
        null,
        'invalid_api_key',
      );
    req.tenant = tenant;
  };

  /** The OpenAI routes' hook: none without API keys (a hook that does nothing still costs a promise per request). */
  const apiKeyHook = options.apiKeys ? { onRequest: requireApiKey } : {};

  const readerOptions: RequestReaderOptions = {
    tokenize: tokenizeMode,
    promptTokenizer: options.promptTokenizer,
    tokenizeOnEngine: (r, body) => connections.tokenizeOnEngine(r, body),
    loraOf: (model) => connections.loraOf(model),
    limits,
    forwardKvTransferParams: options.forwardKvTransferParams === true,
    forwardCustomLogitProcessor: options.forwardCustomLogitProcessor === true,
    allowedMediaDomains,
    onMediaUrlRefusal: (reason) => mediaUrlRefusals.inc({ reason }),
  };
  const readRequest = createRequestReader(readerOptions);
  // for every front end on this router: the proxy and the endpoint picker
  const stopSharingPrefills = sharePrefillReads(router, state);
  const openAi = options.openAiRoutes ?? true;
  // the requests under way, ended by the gateway when the shutdown grace ends (a stream with an
  // error event and data: [DONE], a request not yet answered, or still waiting before its engine
  // attempt, with a 503)
  const streams = new ShutdownCuts();
  const proxyDeps: ProxyDeps = {
    router,
    streams,
    state,
    connections,
    breaker,
    metrics,
    readRequest,
    maxRetries: options.maxRetries ?? 2,
    failureLog: new FailureLog(log),
    interChunkTimeoutMs: timeouts.interChunkTimeoutMs,
    firstByte,
    cachedTokensHeader: options.cachedTokensHeader === true,
    viaPseudonym: via,
    releaseBody: (req) => bodyCharges.get(req)?.release(),
    answerBudget,
    onAnswerBudgetFull: () => answerBudgetPassthroughs.inc(),
    // one for every front end (the proxy, /v1/route, the endpoint picker): one state, one count
    panic:
      options.panicRouting === false
        ? undefined
        : new PanicRouting({ router, health, log, onRouted: () => metrics.panicRouted.inc() }),
  };
  if (openAi) {
    const completions = createProxyHandler(proxyDeps, '/v1/completions');
    const chat = createProxyHandler(proxyDeps, '/v1/chat/completions');
    app.post('/v1/completions', apiKeyHook, completions);
    app.post('/v1/chat/completions', apiKeyHook, chat);
    // without API keys, the common case skips Fastify (fast-path.ts); with them Fastify's hook checks each request
    if (!options.apiKeys)
      fastPath = createFastPath({
        handlers: new Map([
          ['/v1/completions', completions],
          ['/v1/chat/completions', chat],
        ]),
        bodyLimit,
        jsonLimits: limits,
        answerError: (err, path, reply) => answerError(toError(err), `POST ${path}`, reply),
        countRequest: (path, status) => metrics.countRequest(path, status),
        statusOnClose: (res) => statusOnClose(res.req, res),
        closing: () => closing,
      });
  }

  /**
   * The operator's dry run of a tenant's request (admin token, API keys): no tenant key is sent,
   * so `x-contextforge-tenant` names the tenant whose cache salt and ids the request is routed
   * under; without it the prompt is routed as no client's (no client request is, under API keys).
   */
  const adminRouteTenant = async (req: FastifyRequest, reply: FastifyReply) => {
    const header = req.headers[ROUTE_TENANT_HEADER];
    if (header === undefined) return;
    if (!options.apiKeys)
      return openAiError(reply, 400, `${ROUTE_TENANT_HEADER}: no tenants without --api-keys-file`, ROUTE_TENANT_HEADER);
    if (typeof header !== 'string' || !options.apiKeys.hasTenant(header))
      return openAiError(
        reply,
        400,
        `${ROUTE_TENANT_HEADER} must name one tenant of the API keys file`,
        ROUTE_TENANT_HEADER,
      );
    req.tenant = header;
  };
  // the dry run shows what is cached where: operators only, unless made public (its clients'
  // tenant is then their key's, and the tenant header is not read)
  app.post(
    '/v1/route',
    { onRequest: options.publicRouteApi ? requireApiKey : [requireAdmin(adminToken), adminRouteTenant] },
    async (req, reply) => {
      const path =
        (req.body as { messages?: unknown } | null)?.messages !== undefined
          ? '/v1/chat/completions'
          : '/v1/completions';
      // a wait the shutdown grace may end, as a completion's (ShutdownCuts.wait)
      streams.wait(reply);
      let prepared;
      try {
        prepared = await readRequest(path, req, reply);
      } finally {
        streams.unwait(reply);
      }
      if (!prepared) return reply;
      const { routeRequest } = prepared;
      const exclude = connections.withoutRoom(
        connections.withoutModel(prepared.body.model),
        prepared.body.model,
        longestPromptTokens(prepared.body, path, routeRequest.tokens),
        routeRequest.tokens === undefined ? undefined : requestedOutputTokens(prepared.body, path),
      );
      let r = routeOr400(router, reply, routeRequest, { dryRun: true, explain: true, exclude }, path);
      if (!r) return reply;
      // what a completion would do: with no worker in rotation for it, panic routing asks again
      // over the workers held out only by probes that timed out (proxy.ts), and so does the dry run
      let panic = false;
      const heldOut = r.noWorker ? proxyDeps.panic?.candidates(exclude) : undefined;
      if (heldOut !== undefined) {
        const again = routeOr400(
          router,
          reply,
          routeRequest,
          { dryRun: true, explain: true, exclude, panicCandidates: heldOut },
          path,
        );
        if (!again) return reply;
        if (!again.noWorker) {
          r = again;
          panic = true;
        }
      }
      // a data-parallel rank is answered as the worker and its rank
      const c = connections.get(r.workerId);
      const target = c && c.rank !== null ? { worker: c.workerId, rank: c.rank } : { worker: r.workerId };
      return {
        ...target,
        cachedTokens: r.cachedTokens,
        confidence: r.confidence,
        policy: r.policy,
        reason: r.reason,
        promptTokens: r.promptTokens,
        explain: r.explain,
        ...(r.noWorker ? { noWorker: r.noWorker } : {}),
        // as /readyz says it: present only while panic-routed
        ...(panic ? { panic: true } : {}),
      };
    },
  );

  /** The model lists being gathered now, by the Via their reads carry (MAX_MODEL_LISTS_GATHERED). */
  const modelLists = new Map<string, Promise<GatheredModels>>();
  /**
   * Every available worker's models, each listed once, its reads carrying `forwarded` as their
   * Via; with how many workers were asked and those that gave no list, and why. The lists are
   * merged in the workers' order, whichever answers first; a model that engines list with
   * different context lengths (`max_model_len`) is listed with the longest: the gateway sends a
   * prompt to an engine whose context takes it (WorkerConnections.withoutRoom).
   */
  const gatherModels = async (forwarded: string): Promise<GatheredModels> => {
    const seen = new Map<string, ModelCard>();
    const failed: Array<{ worker: string; failure: string }> = [];
    const asked = router.listWorkers().filter((w) => w.available);
    const reads = await Promise.all(
      asked.map(async (w) => {
        const c = connections.get(w.id);
        return c ? await connections.readModels(c, forwarded) : { failure: 'removed' };
      }),
    );
    reads.forEach((read, i) => {
      if ('failure' in read) return void failed.push({ worker: asked[i].id, failure: read.failure });
      for (const m of read.models as readonly ModelCard[]) {
        const kept = seen.get(m.id);
        if (kept === undefined || longerContext(m.max_model_len, kept.max_model_len)) seen.set(m.id, m);
      }
    });
    return { data: [...seen.values()], asked: asked.length, failed };
  };
  if (openAi)
    app.get('/v1/models', apiKeyHook, async (req, reply) => {
      // the list is gathered from the workers: one whose URL leads back here would ask again and again
      const forwarded = forwardedVia(req.headers.via, via, req.raw.httpVersion);
      if (typeof forwarded !== 'string')
        return openAiError(reply, forwarded.status, forwarded.message, 'via', forwarded.code);
      // clients asking at once with the same Via share one read of each worker
      let models = modelLists.get(forwarded);
      if (models === undefined) {
        if (modelLists.size >= MAX_MODEL_LISTS_GATHERED) {
          reply.header('retry-after', '1');
          return openAiError(
            reply,
            503,
            `${MAX_MODEL_LISTS_GATHERED} model lists are being gathered from the workers already; retry shortly`,
            null,
            'model_lists_busy',
          );
        }
        const gathering = gatherModels(forwarded).finally(() => modelLists.delete(forwarded));
        modelLists.set(forwarded, gathering);
        models = gathering;
      }
      // a wait the shutdown grace may end, as a completion's (ShutdownCuts.wait)
      streams.wait(reply);
      let gathered;
      try {
        gathered = await models;
      } finally {
        streams.unwait(reply);
      }
      if (reply.sent) return reply;
      // an empty list would say no model is served, when the gateway only could not ask: an error
      // (some workers answering is a list: the models of those that did not are left out)
      if (gathered.asked === 0) {
        reply.header('retry-after', '1');
        return openAiError(reply, 503, 'no worker is available to list its models', null, 'no_worker_available');
      }
      if (gathered.failed.length === gathered.asked)
        return openAiError(
          reply,
          502,
          `no worker answered with its model list: ${failedWorkersText(gathered.failed)}`,
          null,
          'engine_models_failed',
        );
      return { object: 'list', data: gathered.data };
    });

  // --------------------------------------------------------------- health, metrics

  app.get('/healthz', async () => ({ status: 'ok' }));
  const availableWorkers = () => router.listWorkers().filter((w) => w.available).length;
  const inRotation = (reply: FastifyReply, available: number) =>
    reply
      .code(available > 0 ? 200 : 503)
      .send({ status: available > 0 ? 'ready' : 'no available worker', availableWorkers: available });
  /** The workers requests can be panic-routed over when none is in rotation (0 while one is). */
  const panicEligible = (available: number) => (available === 0 ? (proxyDeps.panic?.eligibleWorkers() ?? 0) : 0);
  // ready too while requests are panic-routed: a readiness probe that failed then would take the
  // gateway out of its Service exactly when it serves over workers whose probes only time out
  app.get('/readyz', async (_req, reply) => {
    const available = availableWorkers();
    const panicWorkers = panicEligible(available);
    if (panicWorkers === 0) return inRotation(reply, available);
    return reply.code(200).send({ status: 'ready', availableWorkers: 0, panic: true, panicWorkers });
  });
  // what a router polls on its engines (vLLM's and SGLang's /health): a gateway that is another
  // gateway's worker is in rotation while one of its workers is, out of it while none is, panic
  // routing or not: the gateway above may have workers in rotation to prefer to one whose
  // engines' probes all time out
  app.get('/health', async (_req, reply) => inRotation(reply, availableWorkers()));
  const metricsPage = options.metricsPage;
  app.get('/metrics', async (_req, reply) => {
    if (metricsPage === undefined)
      return reply.type(metrics.registry.contentType).send(await metrics.registry.metrics());
    let page: string;
    try {
      page = await metricsPage();
    } catch (err) {
      return openAiError(reply, 503, (err as Error).message);
    }
    return reply.type(metrics.registry.contentType).send(page);
  });

  app.register(adminRoutes, {
    router,
    connections,
    firstByteDeadlineMs: (id) => firstByte.deadlineMs(id),
    health,
    state,
    postedEvents,
    adminToken,
    ...(orderedAdmin ?? { addWorker: addWorkerHere, removeWorker, drainWorker }),
  });

  await app.ready();
  return {
    app,
    router,
    metrics: metrics.registry,
    health,
    panic: proxyDeps.panic,
    ready: () => {
      const available = availableWorkers();
      return available > 0 || panicEligible(available) > 0;
    },
    addWorker,
    removeWorker,
    addedByOperator: (id) => operatorWorkers.has(id),
    drainWorker,
    get adminToken() {
      return adminTokenText;
    },
    replaceAdminToken: (token) => {
      adminToken.replace(token);
      adminTokenText = token;
    },
    state,
    connections,
    viaPseudonym: via,
    parseRequest: createRequestParser(readerOptions),
    limits,
    forwardKvTransferParams: readerOptions.forwardKvTransferParams === true,
    forwardCustomLogitProcessor: readerOptions.forwardCustomLogitProcessor === true,
    bodyBudget,
    countBodyBudgetRefusal: () => bodyBudgetRefusals.inc(),
    capClientConnections: capListener,
    answerBudget,
    close: async (graceMs?: number) => {
      if (graceMs !== undefined && !(graceMs >= 0)) throw new RangeError(`graceMs must be >= 0, got ${graceMs}`);
      closing = true;
      breaker.close();
      stopSharingPrefills();
      connections.stopPolling();
      const closed = app.close();
      // a client's keep-alive connection that goes idle after its answer would hold the close
      // for the keep-alive timeout (72 s): closed as soon as it is idle
      const sweep = setInterval(() => app.server.closeIdleConnections(), IDLE_SWEEP_MS);
      // a stream a client keeps open (or an engine that never ends) must not hold the process
      // past its grace: Kubernetes kills it at terminationGracePeriodSeconds anyway, uncleanly. A
      // stream under way gets the error event and data: [DONE] an engine's failure mid-stream
      // gets, and a request the engine has not answered a 503, first (within SHUTDOWN_FLUSH_MS:
      // a client that does not read is cut without them)
      const cutAll = () => app.server.closeAllConnections();
      const cut =
        graceMs === undefined
          ? undefined
          : setTimeout(() => {
              const flushed = setTimeout(cutAll, SHUTDOWN_FLUSH_MS).unref();
              void streams.endAll().then(() => {
                clearTimeout(flushed);
                cutAll();
              });
            }, graceMs);
      try {
        await closed;
      } finally {
        clearInterval(sweep);
        if (cut) clearTimeout(cut);
        bodyRates.close();
      }
      await connections.close();
      await state.close();
    },
  };
}

/** Requests whose client waits for a 100 Continue the gateway has not said yet (continueOnRead). */
const awaitingContinue = new WeakSet<IncomingMessage>();

/** An answer's 100 Continue, unless its head is written (the answer needs none then). */
function sayContinueIfUnanswered(this: ServerResponse): void {
  if (!this.headersSent && !this.writableEnded) this.writeContinue();
}

/**
 * Says 100 Continue to a client that waits for it before it sends the body only once the body is
 * read (the fast path's, Fastify's read): an answer given before that (a 401, 404, 405, 415) is
 * given without a 100, and the client never sends a body that would not be read (RFC 9110
 * §10.1.1). Node's checkContinue leaves the 100 to the server; a stream asks for data with _read.
 * A request pipelined behind another gets its 100 once the answers before its own are written.
 */
function continueOnRead(req: IncomingMessage, res: ServerResponse): void {
  awaitingContinue.add(req);
  const read = req._read;
  req._read = function (this: IncomingMessage, size: number) {
    req._read = read;
    awaitingContinue.delete(req);
    if (res.headersSent || res.writableEnded) return read.call(this, size);
    if (res.socket !== null) res.writeContinue();
    // an answer queued behind another on the connection (pipelined) has no socket yet, and Node
    // holds what is written to it: for a body given as a Buffer it puts the answer's head before
    // what it held, so a 100 said now would come out inside the span the Content-Length gives.
    // It is said when the answer gets the socket, before what was held is written; an answer
    // written whole by then (its client sent the body unasked) needs none
    else res.once('socket', sayContinueIfUnanswered);
    return read.call(this, size);
  };
}

/**
 * Answers a request Node's HTTP parser refused (malformed framing, headers over the limit, a
 * request that did not arrive in time) with an OpenAI error body, then closes the connection:
 * Fastify's own answer has another shape. A refusal is never written in the middle of an
 * answer: when the connection's latest request was received whole, the fault is in what came
 * after it (a request pipelined behind it that does not parse, bytes after a `Connection:
 * close`, headers that do not arrive in time), not in it: its answer, and those before it, are
 * written first, then the refusal. When the latest request was not received whole (its body
 * did not arrive in time) but is pipelined behind answers still being written, it is refused
 * in its turn, after them. Closing at once would cut answers the client asked for properly,
 * and writing the refusal at once would put it in the middle of one. While the refusal waits,
 * what the client sends is read and dropped: nothing more is a request, and a body is not held.
 * A client whose input ends in the middle of a request's body gave that request up: it is not
 * answered, and counts as a client that left (499). `release` gives the refused request's body
 * bytes back to the budget. A refusal that answers no request of the routes (what the parser
 * could not read as one: an unknown method, a control character in the target or a header,
 * another version, headers over the limit) is counted with `count`, once written.
 */
function answerClientError(
  err: Error & { code?: string },
  socket: Duplex,
  release: (req: IncomingMessage) => void,
  count: (status: number) => void,
): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  // each chunk read after the error fails to parse again: what to do was decided at the first
  if (refusedAfterAnswers.has(socket)) return;
  // what follows the connection's last answer is no request: not answered (RFC 9112 §9.6)
  if (closedAfterLastAnswer(socket)) return;
  const res = responseOnSocket.get(socket);
  const inFlight = res !== undefined && !res.writableFinished && res.req.complete;
  if (err.code === 'HPE_CLOSED_CONNECTION') {
    // bytes after a request that asked to close the connection are no request (RFC 9112 §9.6):
    // not answered; the connection closes after that request's answer, as it asked
    refusedAfterAnswers.add(socket);
    if (!inFlight) socket.end();
    return;
  }
  // the latest request's response has not got the connection yet: answers before it are
  // still being written (pipelining)
  const queued = res !== undefined && !res.writableFinished && res.socket !== socket;
  // the request has its answer already (refused on its headers) and the fault is in the body it
  // is still sending: no second answer; what it sends is read and dropped until the connection
  // closes, after that answer when it waits its turn
  if (res !== undefined && res.writableEnded && !res.req.complete) {
    refusedAfterAnswers.add(socket);
    if (!queued) return lingeringClose.call(socket as Socket);
    stopReading(socket);
    res.once('close', () => lingeringClose.call(socket as Socket));
    return;
  }
  if (err.code === 'HPE_INVALID_EOF_STATE' && res !== undefined && !res.req.complete && !queued) {
    // the client ended its input in the middle of a request's body: it gave the request up. Its
    // FIN says as much whether it closed the connection whole (no answer can reach it) or only
    // its sending side: no answer is written, and the request counts as a client that left (499)
    socket.destroy();
    return;
  }
  const [status, message, param, code] = clientErrorAnswer(err);
  if (queued && !res.req.complete) {
    // its body did not arrive: it holds no budget from now on, and its refusal goes out as its
    // answer, in its turn, closing the connection after it (lingeringClose)
    release(res.req);
    return refuseInTurn(res, status, message, param, code);
  }
  // the refusal answers the request still being read on the socket, when there is one (the
  // client's x-request-id goes back with it); else what follows the answers, no request yet
  const reading = res !== undefined && !inFlight && !res.writableEnded;
  const answer = clientErrorBytes(status, message, param, code, reading ? requestIdLine(res.req) : '');
  if (inFlight) {
    refusedAfterAnswers.add(socket);
    stopReading(socket);
    // once the answer closes, written whole (a client gone by then is not written to, nor is a
    // connection the server is closing after it); end, not destroy: the answer's last bytes
    // may still be on their way out
    res.once('close', () => {
      // unless that answer, or one before it, was the connection's last
      if (closedAfterLastAnswer(socket)) return;
      if (socket.destroyed || !socket.writable) return;
      count(status);
      socket.end(answer, () => socket.destroy());
    });
    return;
  }
  // a request still being read (its body too slow, or malformed) counts with this status when
  // its response closes, not as a client that left
  if (reading) markAnsweredOnSocket(res, status);
  if (!socket.writable) return void socket.destroy();
  if (!reading) count(status);
  socket.write(answer);
  // the client may still be sending what the parser refused (a chunk extension past Node's
  // bound, a body behind a bad chunk size): closed with those bytes unread, the connection
  // would be reset, and a client still writing could meet the reset before the answer
  refusedAfterAnswers.add(socket);
  lingerThenClose(socket);
}

/**
 * The version `DIGIT "." DIGIT` (RFC 9112 §2.3) at the end of the request line in `rawPacket`,
 * the bytes the parser refused, or undefined when the line ends in none (a version such as
 * `HTTP/1.10`, no version at all, or no whole line).
 */
function refusedVersion(rawPacket: unknown): string | undefined {
  if (!Buffer.isBuffer(rawPacket)) return undefined;
  const lineEnd = rawPacket.indexOf('\r\n');
  if (lineEnd < 0) return undefined;
  const line = rawPacket.toString('latin1', 0, lineEnd);
  return /^\S+ \S+ HTTP\/(\d\.\d)$/.exec(line)?.[1];
}

/** The status, message, field and error code of the answer to a request the parser refused. */
function clientErrorAnswer(
  err: Error & { code?: string; rawPacket?: unknown },
): [number, string, string | null, string | null] {
  // a well-formed version Node's parser does not take (HTTP/3.0, HTTP/1.2): one the gateway does
  // not speak, answered as an HTTP/2.0 request line is (RFC 9110 §15.6.6)
  const version = err.code === 'HPE_INVALID_VERSION' ? refusedVersion(err.rawPacket) : undefined;
  if (version !== undefined) return [505, VERSION_NOT_SUPPORTED_MESSAGE(version), null, VERSION_NOT_SUPPORTED_CODE];
  return err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
    ? [408, 'the request did not arrive in time', null, null]
    : err.code === 'HPE_HEADER_OVERFLOW'
      ? [431, 'the request headers are larger than allowed', 'headers', null]
      : // HTTP/2's connection preface (PRI * HTTP/2.0), which a client speaking HTTP/2 with prior
        // knowledge sends first: a version the gateway does not speak, as an HTTP/2.0 request line is
        err.code === 'HPE_PAUSED_H2_UPGRADE'
        ? [505, VERSION_NOT_SUPPORTED_MESSAGE('2'), null, VERSION_NOT_SUPPORTED_CODE]
        : [400, 'the request is not valid HTTP/1.1', null, null];
}

/** A whole refusal as written on the socket (headBytes): status line, headers closing the connection, OpenAI error body. */
function clientErrorBytes(
  status: number,
  message: string,
  param: string | null,
  code: string | null,
  idLine = '',
): Buffer {
  const body = clientErrorBody(message, param, code);
  return headBytes(
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nConnection: close\r\n${idLine}Content-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n`,
    body,
  );
}

/** The `path` of contextforge_requests_total for a request no route matches (bounded: one value for them all). */
const NO_ROUTE = 'unknown';

/** Connections whose refusal waits for the answers in flight on them (answerClientError). */
const refusedAfterAnswers = new WeakSet<Duplex>();

/** The pipelined requests of each connection lingeringClose may close, by the gateway serving it. */
const afterLastAnswer = new WeakMap<Duplex, PipelinedRequests>();

/** Whether `socket` had its last answer written (PipelinedRequests.closeAfterLastAnswer). */
function closedAfterLastAnswer(socket: Duplex): boolean {
  return afterLastAnswer.get(socket)?.closedAfterLastAnswer(socket) === true;
}

/** Each connection's latest request's response (answerClientError). */
const responseOnSocket = new WeakMap<Duplex, ServerResponse>();

/**
 * How long a connection closed after an answer to a request whose body was not read goes on
 * reading (and dropping) what its client sends, unless the client closes first. The bound is in
 * time alone: the bytes are dropped as they come, never held. 2 s take 16 MiB (a body at the
 * default limit) at 70 Mbit/s; a client still sending after them (a larger body, a slower link)
 * meets the close, a reset, while it writes.
 */
const LINGER_MS = 2000;

/**
 * What Node calls to close a connection once its last answer is out (Connection: close), in
 * place of net.Socket's destroySoon. When that answer's request was not read whole (refused on
 * its headers: the body budget full, a body over the limit, too many header lines), its client
 * is likely still sending the body: closing with those bytes unread resets the connection, and a
 * client that meets the reset while writing (undici does) reports a connection error in place of
 * the answer. So the rest is read and dropped, no longer parsed, until the client closes its
 * side or LINGER_MS have passed (RFC 9112 §9.6: a server closes in stages, reading on after it
 * has answered), whether the body came before the answer or after it (readHandle). A
 * connection whose request was read whole closes as before.
 */
function lingeringClose(this: Socket): void {
  // nothing after this answer is served: the requests behind it close unanswered
  afterLastAnswer.get(this)?.closeAfterLastAnswer(this);
  const res = responseOnSocket.get(this);
  if (res === undefined || res.req.complete || this.destroyed) return Socket.prototype.destroySoon.call(this);
  lingerThenClose(this);
}

/**
 * Reads and drops what the client still sends, no longer parsed, and closes the connection once
 * the client closes its side or LINGER_MS have passed (RFC 9112 §9.6: a server closes in stages).
 */
function lingerThenClose(socket: Duplex): void {
  // closing already (called again by a refusal that waited for this answer)
  if (lingering.has(socket)) return;
  lingering.add(socket);
  stopReading(socket);
  const close = () => socket.destroy();
  const timer = setTimeout(close, LINGER_MS);
  socket.once('end', close);
  socket.once('close', () => clearTimeout(timer));
}

function dropBytes(): void {}

/**
 * Answers `res`, whose request was not read whole and waits behind answers still being written
 * on its connection, with a refusal that goes out in its turn, after them; from now on nothing
 * the client sends is read as a request or held (stopReading), and no refusal of the parser's
 * follows it.
 */
function refuseInTurn(
  res: ServerResponse,
  status: number,
  message: string,
  param: string | null,
  code: string | null = null,
): void {
  const socket = res.req.socket;
  refusedAfterAnswers.add(socket);
  stopReading(socket);
  answerMalformed(res, status, message, param, code);
}

/** Connections closing in lingeringClose. */
const lingering = new WeakSet<Duplex>();

/**
 * Takes Node's parser off a connection: nothing the client sends from now on is a request,
 * and it is read and dropped as it comes, neither parsed nor held (a body left unread would
 * wait in memory, and one that came whole would be served). Answers already made go on being
 * written.
 */
function stopReading(socket: Duplex): void {
  socket.removeAllListeners('data');
  // adding a 'data' listener detaches the parser from the socket's handle (Node's server does)
  socket.on('data', dropBytes);
  socket.resume();
  readHandle(socket);
}

/**
 * Makes the socket's handle read again. Node's server stops the handle while a request's body
 * waits to be read (the request stream full: a body sent whole with its headers, refused
 * before it is read) and starts it again on the socket's 'resume', by a listener that goes with
 * the parser (lib/_http_server.js, onSocketResume). Detached from the parser then, the socket
 * would never read again: the stream takes the handle for reading still (it waits for data
 * the parser took), so resume() does not start it, and what the client sends is never read.
 */
function readHandle(socket: Duplex): void {
  const handle = (socket as unknown as { _handle?: { reading?: boolean; readStart?: () => number } | null })._handle;
  if (handle?.reading !== false || typeof handle.readStart !== 'function') return;
  handle.reading = true;
  handle.readStart();
}

/** The OpenAI error body of an answer written before any route runs (openAiError's, for a client's fault). */
function clientErrorBody(message: string, param: string | null, code: string | null = null): string {
  return JSON.stringify({ error: { message, type: 'invalid_request_error', param, code } });
}

/**
 * Answers a request refused before any route runs with an OpenAI error body, and closes the
 * connection (what the client sent after it is not read as a request).
 */
function answerMalformed(
  res: ServerResponse,
  status: number,
  message: string,
  param: string | null,
  code: string | null = null,
): void {
  const body = clientErrorBody(message, param, code);
  res.writeHead(status, {
    connection: 'close',
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

/**
 * Answers a request in an HTTP version other than 1.x (RFC 9110 §15.6.6: 505, with a body
 * saying which versions the gateway speaks) and closes the connection, the body unread: what
 * follows it on the connection cannot be read as HTTP/1.1.
 */
function answerVersionNotSupported(res: ServerResponse, version: string): void {
  answerMalformed(res, 505, VERSION_NOT_SUPPORTED_MESSAGE(version), null, VERSION_NOT_SUPPORTED_CODE);
}

const VERSION_NOT_SUPPORTED_CODE = 'http_version_not_supported';
const VERSION_NOT_SUPPORTED_MESSAGE = (version: string) =>
  `HTTP/${version} is not supported: send the request as HTTP/1.1 (or HTTP/1.0)`;

/** How many of a request's header lines are Host lines (any case). */
function hostLines(rawHeaders: readonly string[]): number {
  let n = 0;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i];
    if (name.length === 4 && name.toLowerCase() === 'host') n++;
  }
  return n;
}

/** A body of undeclared length that grew past what the budget had left (statusCode: Fastify keeps it). */
class BodyBudgetError extends Error {
  readonly statusCode = 503;
  constructor() {
    super(BODY_BUDGET_MESSAGE);
    this.name = 'BodyBudgetError';
  }
}

/**
 * `payload` as Fastify reads it, each chunk taken from the budget first; one that does not fit
 * fails the read, unless the body is past `bodyLimit` with it (Fastify then refuses it, 413).
 */
function chargedBody(payload: NodeJS.ReadableStream, charge: BodyCharge, bodyLimit: number): Transform {
  let read = 0;
  const charged = new Transform({
    transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback) {
      read += chunk.length;
      // a body past the limit is refused 413 by Fastify as this chunk reaches it: never a 503
      // telling the client to send again what can never fit, as a budget short of room would
      if (read > bodyLimit || charge.take(chunk.length)) callback(null, chunk);
      else callback(new BodyBudgetError());
    },
  });
  // a client gone mid-body fails the read (pipe() would leave it waiting for an end)
  payload.on('error', (err: Error) => charged.destroy(err));
  payload.pipe(charged);
  return charged;
}

/**
 * Answers a request refused on its headers alone, before any route runs and before its body is
 * read, with an OpenAI error body (openAiError's type for the status) and, when given, a
 * Retry-After; the connection is closed after it (the body that follows is not read as a request).
 */
function answerRefusedOnHeaders(
  res: ServerResponse,
  status: number,
  message: string,
  code: string,
  retryAfterS?: number,
): void {
  const body = JSON.stringify({ error: { message, type: openAiErrorType(status), param: null, code } });
  res.writeHead(status, {
    connection: 'close',
    ...(retryAfterS === undefined ? {} : { 'retry-after': String(retryAfterS) }),
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

/**
 * Answers a request whose declared body does not fit in the budget, before any of it is read:
 * 503 with Retry-After, and the connection closed (the body that follows is not read).
 */
function answerBodyBudgetExceeded(res: ServerResponse): void {
  answerRefusedOnHeaders(res, 503, BODY_BUDGET_MESSAGE, BODY_BUDGET_CODE, BODY_BUDGET_RETRY_AFTER_S);
}

/**
 * Answers a request pipelined on a connection that has MAX_PIPELINED_REQUESTS served already
 * (pipelining.ts): 503, in its turn after the answers before it, and the connection closed
 * after it (the client sends what came after it again, on a new connection).
 */
function answerPipelineFull(res: ServerResponse): void {
  answerRefusedOnHeaders(
    res,
    503,
    `more than ${MAX_PIPELINED_REQUESTS} requests pipelined on one connection at once; send the rest on a new connection`,
    'pipelining_depth_exceeded',
  );
}

/**
 * Answers a request whose client has `limit` requests in flight already (client-requests.ts):
 * 429 with Retry-After, before its body is read, and the connection closed (the body that follows
 * is not read).
 */
function answerClientRequestLimit(res: ServerResponse, limit: number): void {
  answerRefusedOnHeaders(
    res,
    429,
    `this client has ${limit} requests in flight already, the most it may have at once (--max-requests-per-client ${limit}); send this one again once one of them has ended`,
    CLIENT_REQUEST_LIMIT_CODE,
    CLIENT_REQUEST_LIMIT_RETRY_AFTER_S,
  );
}

/**
 * Answers a CONNECT (handed over by Node outside the routes, with the raw socket) with 405, an
 * Allow header and an OpenAI error body, then closes the connection: the gateway tunnels nothing.
 * False when the client is gone already: nothing is written.
 */
function answerMethodNotAllowed(socket: Duplex, req: IncomingMessage, allowed: readonly string[]): boolean {
  socket.on('error', () => {});
  if (!socket.writable) {
    socket.destroy();
    return false;
  }
  const body = clientErrorBody(methodNotAllowedMessage(req.method ?? 'CONNECT', req.url ?? '', allowed), 'method');
  socket.end(
    headBytes(
      `HTTP/1.1 405 ${STATUS_CODES[405]}\r\nConnection: close\r\n${requestIdLine(req)}Allow: ${allowed.join(', ')}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n`,
      body,
    ),
    () => socket.destroy(),
  );
  return true;
}

/** What a route threw, as an Error (anything else thrown is wrapped). */
function toError(err: unknown): Error & { statusCode?: number } {
  return err instanceof Error ? err : new Error(String(err));
}

/** An engine's entry of its /v1/models list, as far as the gateway reads it. */
interface ModelCard {
  id: string;
  max_model_len?: unknown;
}

/** `length` is a context length longer than `than` (a model card's `max_model_len`, either maybe absent or not a number). */
function longerContext(length: unknown, than: unknown): boolean {
  return typeof length === 'number' && (typeof than !== 'number' || length > than);
}
