/**
 * The gateway's workers and everything it keeps per worker: the undici pool the proxied
 * requests use, the KV-event subscriber, the metrics scrape and the active health check.
 * Adding a worker registers it with the router and starts all of them; removing it stops
 * them and forgets what the router and the event applier recorded about it.
 *
 * A worker with data-parallel ranks (`dpSize` K) is K router workers sharing its URL and
 * pool, one per rank (engine-deployments.ts workerRanks): each with its own KV-event subscriber
 * (the events port + rank), metrics series (vLLM's engine="r", SGLang's dp_rank="r") and index
 * entries; r is the global rank (from `dpStartRank`), the request header names it as vLLM's
 * API server does (r − dpStartRank). Connections are keyed by router worker id; admin operations take the worker's own id.
 */
import { Pool, request as upstreamRequest, type Dispatcher } from 'undici';
import type { KVAwareRouter, RouteRequest } from '../core/router/index.js';
import { MAX_WORKERS, type WorkerState } from '../core/worker-registry.js';
import { BodyTooLargeError, readBoundedText } from '../engines/bounded-body.js';
import {
  DEFAULT_HEALTH_CHECK_TIMEOUT_MS,
  HealthChecker,
  type HealthVerdictSource,
  type WorkerHealth,
} from '../engines/health.js';
import type { KvEventApplier } from '../engines/kv-events/applier.js';
import {
  KvEventSubscriber,
  SOCKETS_PER_SUBSCRIBER,
  subscriberRoom,
  type SubscriberStats,
} from '../engines/kv-events/subscriber.js';
import { MetricsScraper } from '../engines/metrics/scraper.js';
import { DEFAULT_STALL_TIMEOUT_MS, StallWatch } from '../engines/metrics/stall.js';
import { workerLimitRefusal, type WorkerRecord } from '../state/state-store.js';
import { ConnectionSlots, DEFAULT_ENGINE_CONNECTIONS, MAX_ENGINE_CONNECTIONS } from './connection-slots.js';
import { exceedsContext } from '../engine-model/limits.js';
import { adaptersFromModels, DP_RANK_HEADER, rankEndpoint, tokenizeBody, workerRanks } from './engine-deployments.js';
import { isTokenId } from './request-limits.js';
import { MAX_TIMER_MS } from './timeouts.js';
import {
  EngineKeyEnvs,
  engineAuthorization,
  KeyEnvError,
  parseWorkerRecord,
  splitCredentials,
} from './worker-input.js';

export interface WorkerConnection {
  record: WorkerRecord;
  /** The base URL without a trailing slash. */
  base: string;
  /** Keep-alive connections for the proxied requests. */
  pool: Pool;
  /** Its connections as the proxy takes them: a request waits here, not in the pool, for a free one (shared by the ranks, as the pool is). */
  slots: ConnectionSlots;
  /** The models it serves, when its operator says (`models=`). */
  models?: ReadonlySet<string>;
  /**
   * The ids its engine listed in the last /v1/models read that answered (its models and LoRA
   * adapters); undefined until one answers. Without `models=`, these decide which requests it
   * takes (withoutModel()).
   */
  listed?: ReadonlySet<string>;
  /**
   * The context length (max_model_len) of each model its engine's last /v1/models read listed
   * with one, an adapter taking its base model's (vLLM lists a LoRA adapter without one); empty
   * until a read answers with one. Shared by the ranks.
   */
  contextLengths: ReadonlyMap<string, number>;
  subscriber?: KvEventSubscriber;
  /** The worker's own id (its ranks share it). */
  workerId: string;
  /**
   * Its engine's /tokenize answers other than 200 and failures, by `${status} ${reason}` (the
   * status as tokenizeRefusalStatus gives it and reason `refused`, or status `none` and the
   * failure's kind): counted in contextforge_engine_tokenize_refusals_total under this router
   * worker's id.
   */
  tokenizeRefusals: Map<string, number>;
  /** The data-parallel rank this router worker is (vLLM's global rank), when the worker has ranks. */
  rank: number | null;
  /**
   * The X-data-parallel-rank value that puts a request on this rank (its index among the ranks
   * of the worker's API server: rank − dpStartRank), when the worker has ranks.
   */
  headerRank: number | null;
  /** LoRA adapters the engine lists in /v1/models (name → base model); shared by the ranks. */
  adapters: Map<string, string>;
  /** Headers of every request to the engine: its API key (or the credentials of its URL), its rank. */
  headers: Record<string, string>;
  /**
   * Its requests the engine has not started answering: no failure's status yet, no byte of an
   * answer's body (a whole answer's or a stream's). When it leaves rotation
   * and a worker that can take one is in rotation (or comes into it), that request moves there;
   * an answer under way is left to end where it is.
   */
  unanswered: Set<UnansweredRequest>;
}

/** An attempt whose engine has not started answering it: it can still move to another worker. */
export interface UnansweredRequest {
  /**
   * The request's `model` field as the client sent it: it moves only to a worker serving it when
   * the move is decided (withoutModel() read then: a worker may have come to list it since).
   */
  readonly model: unknown;
  /** The workers that failed the request, and the ranks of their engines that fail with them: it does not move to them. */
  readonly failedWorkers: ReadonlySet<string>;
  /**
   * An engine answered the request its model-not-found 404 and it was retried: it moves only to a
   * worker whose engine lists its model (notListing() read then), as its retries go.
   */
  readonly listedOnly: boolean;
  /**
   * Its prompt's token count when known, and the output tokens it asks for: it moves only to a
   * worker whose engine's context takes it (withoutRoom()).
   */
  readonly promptTokens: number | undefined;
  readonly outputTokens: number | undefined;
  /** No retry is left: moved, it would fail at once, where the engine may still answer it. */
  readonly lastAttempt: boolean;
  /** Gives the attempt up so the request goes to another worker (outcome 'worker-out'). */
  workerOut(): void;
}

/** No worker: the set of workers that nothing leaves out. */
export const NO_WORKERS: ReadonlySet<string> = new Set();

/**
 * Most model names whose workers not serving them are kept between changes of the workers' model
 * lists (withoutModel()): names past it are answered as they are asked, never kept.
 */
const MAX_KEPT_MODELS = 1024;

/**
 * How long an unhealthy engine counts as out for now, one whose context a prompt too long for the
 * rest waits for (withoutRoom: answered 503 to try again): past it, the engine is taken for gone
 * (a static worker on a lost node), and the short engine's 400 tells the client the truth.
 */
export const OUT_FOR_NOW_MS = 5 * 60_000;

/** Longest context length read from a /v1/models entry: one past it is no engine's (2^31 − 1 tokens). */
const MAX_CONTEXT_LENGTH = 2 ** 31 - 1;

/** No context length listed. */
const NO_CONTEXT_LENGTHS: ReadonlyMap<string, number> = new Map();

/**
 * The context length of each model `models` (a /v1/models list) gives one for: its
 * `max_model_len` (vLLM's and SGLang's model cards), a whole number from 1 to MAX_CONTEXT_LENGTH,
 * for a base model; each of `adapters` (name → base model) its base model's, which is what its
 * requests are checked against (vLLM lists an adapter without one).
 */
function contextLengthsOf(
  models: ReadonlyArray<{ id: string }>,
  adapters: ReadonlyMap<string, string>,
): ReadonlyMap<string, number> {
  let out: Map<string, number> | undefined;
  for (const m of models) {
    const length = (m as { max_model_len?: unknown }).max_model_len;
    if (adapters.has(m.id) || !Number.isSafeInteger(length)) continue;
    if ((length as number) < 1 || (length as number) > MAX_CONTEXT_LENGTH) continue;
    (out ??= new Map()).set(m.id, length as number);
  }
  if (out === undefined) return NO_CONTEXT_LENGTHS;
  for (const [name, base] of adapters) {
    const length = out.get(base);
    if (length !== undefined) out.set(name, length);
  }
  return out;
}

function sameEntries(a: ReadonlyMap<string, number>, b: ReadonlyMap<string, number>): boolean {
  if (a.size !== b.size) return false;
  for (const [k, v] of a) if (b.get(k) !== v) return false;
  return true;
}

/** Largest /v1/models answer read (vLLM lists each model and adapter in a few hundred bytes). */
const MAX_MODELS_BYTES = 4 * 1024 * 1024;
/** Most entries of one worker's /v1/models kept (an engine lists its model and its LoRA adapters). */
const MAX_MODEL_ENTRIES = 4096;
/** Longest model id kept (Hugging Face repository ids are at most 96 characters; adapter names are the operator's). */
const MAX_MODEL_ID_CHARS = 1024;

/** What a side request to an engine (/v1/models, /tokenize) failed of: no answer in time, an answer that is no answer, or no connection. */
export type SideRequestFailureKind = 'timeout' | 'malformed' | 'error';

/** The kind of a side request's failure, and a few words on it (no engine text: it is shown to clients). */
export function sideRequestFailure(err: unknown): { kind: SideRequestFailureKind; text: string } {
  const e = err as { name?: unknown; code?: unknown; cause?: { code?: unknown } } | null;
  const code = typeof e?.code === 'string' ? e.code : typeof e?.cause?.code === 'string' ? e.cause.code : '';
  if (e?.name === 'TimeoutError' || code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT')
    return { kind: 'timeout', text: 'timed out' };
  if (err instanceof BodyTooLargeError) return { kind: 'malformed', text: 'answered too large' };
  if (err instanceof SyntaxError) return { kind: 'malformed', text: 'answered with no JSON' };
  return { kind: 'error', text: code !== '' ? `failed (${code})` : 'failed' };
}

/** The well-formed entries of a /v1/models answer (`{data: [{id, …}, …]}`); undefined when it has no list. */
export function modelEntries(answer: unknown): Array<{ id: string }> | undefined {
  const data = (answer as { data?: unknown } | null)?.data;
  if (!Array.isArray(data)) return undefined;
  const out: Array<{ id: string }> = [];
  for (const m of data) {
    if (out.length >= MAX_MODEL_ENTRIES) break;
    if (m === null || typeof m !== 'object' || Array.isArray(m)) continue;
    const id = (m as { id?: unknown }).id;
    if (typeof id === 'string' && id !== '' && id.length <= MAX_MODEL_ID_CHARS) out.push(m as { id: string });
  }
  return out;
}

/**
 * Largest /tokenize answer read, per token of the longest prompt the router takes (token ids take
 * at most 7 bytes each with their comma: vocabularies have fewer than a million entries), plus
 * what the answer's other members take: an answer larger than that holds more tokens than any
 * prompt the router routes, and is no answer (maxPromptTokens' default allows about 12 MiB; a
 * fixed bound of tens of MiB would let a few such answers hold hundreds of MB).
 */
const TOKENIZE_BYTES_PER_TOKEN = 12;
const TOKENIZE_ANSWER_OVERHEAD_BYTES = 64 * 1024;
/** Largest /tokenize answer read whatever maxPromptTokens allows. */
const MAX_TOKENIZE_BYTES = 64 * 1024 * 1024;
/**
 * Least time between two re-reads of every worker's /v1/models asked by requests
 * (refreshModels()): a client's made-up model names must not become a stream of reads.
 */
const MODELS_REFRESH_MS = 1000;
/** The whole /v1/models or /tokenize exchange, body included, must end within this (ms). */
const SIDE_REQUEST_DEADLINE_MS = 4000;

/**
 * How long a connection to an engine is kept idle, when the engine does not say (a Keep-Alive
 * header's timeout, less 2 s, is used when it does). vLLM and SGLang serve through uvicorn,
 * which closes a connection idle for 5 s and says nothing: kept longer, a request the gateway
 * sends on it as the engine closes it is reset before the engine read it, and fails as if the
 * engine had. Below 5 s, the gateway always closes first.
 */
const ENGINE_KEEP_ALIVE_MS = 4000;

export interface WorkerConnectionsOptions {
  router: KVAwareRouter;
  applier: KvEventApplier;
  health: WorkerHealth;
  /** Subscribe to the workers' KV events (their `events` endpoints). */
  kvEvents?: boolean;
  /** Interval of the load-metrics scrape per worker (0: no scraping). */
  metricsIntervalMs: number;
  /** Interval of the active health check (0: none). */
  healthCheckIntervalMs: number;
  /** Longest wait for one health probe's answer (default DEFAULT_HEALTH_CHECK_TIMEOUT_MS). */
  healthCheckTimeoutMs?: number;
  /**
   * How long an engine may show no progress in its metrics while the gateway's requests wait on it
   * and it reports requests running or waiting, before it is held out of rotation (default
   * DEFAULT_STALL_TIMEOUT_MS; 0: never; nothing without scraping). metrics/stall.ts.
   */
  stallTimeoutMs?: number;
  /**
   * Interval of re-reading each worker's /v1/models for the models and LoRA adapters it serves
   * (default 30 s; 0: only when it is added or comes back into rotation, and refreshModels()).
   */
  modelsIntervalMs?: number;
  log: (message: string) => void;
  /** Most connections to one engine (default DEFAULT_ENGINE_CONNECTIONS; the ranks of a worker share them). */
  engineConnections?: number;
  /** Where workers' `apiKeyEnv` variables are read. */
  env: NodeJS.ProcessEnv;
  /** The variables a worker added while the router runs may name (default: those configured workers name). */
  keyEnvs?: EngineKeyEnvs;
  /**
   * The Via of the gateway's own requests to the workers (`1.1 <pseudonym>`, via.ts): a worker
   * URL that leads back to this gateway, directly or through another gateway, then shows the
   * loop on them too (the periodic /v1/models read would otherwise go round once more unseen).
   */
  via?: string;
}

/**
 * How long a worker whose health probes were only too slow keeps its unanswered requests: two
 * probe intervals, at least a second, and at least one probe round and a quarter second: its
 * next probe starts an interval after the one that took it out ended, and may take the whole
 * probe timeout (`healthCheckTimeoutMs`) to bring it back. Never past what a timer holds (twice
 * the longest interval would make the timer fire at once).
 */
export function slowProbeGraceMs(healthCheckIntervalMs: number, healthCheckTimeoutMs = 0): number {
  const probeRound =
    healthCheckIntervalMs > 0 && healthCheckTimeoutMs > 0 ? healthCheckIntervalMs + healthCheckTimeoutMs + 250 : 0;
  return Math.min(Math.max(1000, 2 * healthCheckIntervalMs, probeRound), MAX_TIMER_MS);
}

/** A worker refused because the router would hold more than MAX_WORKERS; `field` is the one at fault. */
export class WorkerLimitError extends RangeError {
  constructor(
    message: string,
    readonly field: 'id' | 'dpSize',
  ) {
    super(message);
    this.name = 'WorkerLimitError';
  }
}

/**
 * What `run` returns; a RangeError it throws (a refusal of the worker's input) names `field`,
 * the worker record's field at fault (workerErrorField: the `param` of the admin API's 400).
 */
function naming<T>(field: keyof WorkerRecord, run: () => T): T {
  try {
    return run();
  } catch (err) {
    if (err instanceof RangeError) Object.assign(err, { field });
    throw err;
  }
}

/**
 * A worker with KV events refused because ZeroMQ's socket limit (its context's max_sockets) has
 * no room for its subscribers: the request is sound, the process is out of sockets for now.
 */
export class SocketLimitError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SocketLimitError';
  }
}

export class WorkerConnections {
  /** Everything the gateway keeps per worker, by id. */
  private readonly connections = new Map<string, WorkerConnection>();
  private readonly scraper?: MetricsScraper;
  private readonly checker?: HealthChecker;
  /** Whether the engines make progress, judged from the scrapes (none without scraping). */
  private readonly stall?: StallWatch;
  /** Router worker ids of each worker (its ranks, or itself), by the worker's id. */
  private readonly groups = new Map<string, string[]>();
  /** Subscribers of removed workers, still closing (each leaves once closed: workers come and go for months). */
  private readonly closing = new Set<Promise<void>>();
  private readonly modelsTimer: NodeJS.Timeout | undefined;
  /** Workers their health check holds out: they may come back as a new process with an empty cache. */
  private readonly mayHaveRestarted = new Set<string>();
  private readonly slowProbeGraceMs: number;
  /**
   * The grace period of each worker held out only by slow probes, by router worker id: one per
   * worker, ended when it comes back or is removed, so an earlier outage's does not decide for a
   * later one.
   */
  private readonly graceTimers = new Map<string, NodeJS.Timeout>();
  /**
   * Workers out of rotation whose unanswered requests are decided by the rotation (past the grace
   * period for slow probes): each request still on them had no worker in rotation to move to, or no retry left.
   */
  private readonly keeping = new Set<string>();
  /**
   * withoutModel()'s answers, by model name, since the workers' model lists last changed (a worker
   * added or removed, a /v1/models read that lists other adapters): the proxy reads one at each
   * attempt, the rotation at each decision on a kept request. Only names some worker lists are
   * kept (at most MAX_KEPT_MODELS): a client's made-up names would grow it without bound.
   */
  private readonly withoutModelByName = new Map<string, ReadonlySet<string>>();
  /**
   * The workers whose operator lists their models (`models=`): those not serving a name no worker
   * lists (made when first asked).
   */
  private listing: ReadonlySet<string> | undefined;
  /** The workers whose models are known, from `models=` or their engine's /v1/models (made when first asked). */
  private known: ReadonlySet<string> | undefined;
  /**
   * The shortest context length an engine lists for each model asked about since the lists last
   * changed (Infinity: none lists one); at most MAX_KEPT_MODELS, started again when full.
   */
  private readonly shortestContextByModel = new Map<string, number>();
  /** Each worker's /v1/models read under way, by the worker's own id: reads asked meanwhile share it. */
  private readonly reading = new Map<string, Promise<void>>();
  /** The re-read of every worker's /v1/models under way (refreshModels()). */
  private refreshing: Promise<void> | undefined;
  /** When the last refreshModels() re-read began (performance.now()). */
  private refreshedAt = -Infinity;
  /** Workers (their own ids) whose engine's first /tokenize refusal was logged: one line per worker, not per request. */
  private readonly tokenizeRefusalLogged = new Set<string>();
  /** Workers (their own ids) whose engine's first /tokenize failure (timeout, malformed answer, error) was logged. */
  private readonly tokenizeFailureLogged = new Set<string>();

  private readonly engineConnections: number;
  private readonly keyEnvs: EngineKeyEnvs;

  constructor(private readonly options: WorkerConnectionsOptions) {
    this.keyEnvs = options.keyEnvs ?? new EngineKeyEnvs();
    const { router, health, log, metricsIntervalMs, healthCheckIntervalMs } = options;
    const engineConnections = options.engineConnections ?? DEFAULT_ENGINE_CONNECTIONS;
    if (!Number.isInteger(engineConnections) || engineConnections < 1 || engineConnections > MAX_ENGINE_CONNECTIONS)
      throw new RangeError(
        `engineConnections must be an integer from 1 to ${MAX_ENGINE_CONNECTIONS}, got ${engineConnections}`,
      );
    this.engineConnections = engineConnections;
    const healthCheckTimeoutMs = options.healthCheckTimeoutMs ?? DEFAULT_HEALTH_CHECK_TIMEOUT_MS;
    if (!Number.isInteger(healthCheckTimeoutMs) || healthCheckTimeoutMs < 1 || healthCheckTimeoutMs > MAX_TIMER_MS)
      throw new RangeError(
        `healthCheckTimeoutMs must be an integer from 1 to ${MAX_TIMER_MS}, got ${healthCheckTimeoutMs}`,
      );
    const headers = options.via === undefined ? undefined : { via: options.via };
    const stallTimeoutMs = options.stallTimeoutMs ?? DEFAULT_STALL_TIMEOUT_MS;
    if (!Number.isInteger(stallTimeoutMs) || stallTimeoutMs < 0 || stallTimeoutMs > MAX_TIMER_MS)
      throw new RangeError(`stallTimeoutMs must be an integer from 0 to ${MAX_TIMER_MS}, got ${stallTimeoutMs}`);
    this.stall =
      metricsIntervalMs > 0 && stallTimeoutMs > 0
        ? new StallWatch({
            timeoutMs: stallTimeoutMs,
            health,
            log,
            inFlight: (id) => (router.hasWorker(id) ? router.localLoad(id).inFlightRequests : 0),
          })
        : undefined;
    this.scraper =
      metricsIntervalMs > 0
        ? new MetricsScraper(router, [], {
            intervalMs: metricsIntervalMs,
            health,
            log,
            headers,
            stall: this.stall,
          }).start()
        : undefined;
    // a probe waits as long as a healthy engine may take to answer, whatever the interval (the
    // next round starts an interval after the last probe of this one ended)
    this.checker =
      healthCheckIntervalMs > 0
        ? new HealthChecker(health, {
            intervalMs: healthCheckIntervalMs,
            timeoutMs: healthCheckTimeoutMs,
            headers,
          }).start()
        : undefined;
    health.onChange((id, available) => (available ? this.backInRotation(id) : this.outOfRotation(id)));
    this.slowProbeGraceMs = slowProbeGraceMs(healthCheckIntervalMs, healthCheckTimeoutMs);
    const modelsMs = options.modelsIntervalMs ?? 30_000;
    if (modelsMs > 0) {
      this.modelsTimer = setInterval(() => {
        for (const id of this.groups.keys()) void this.readAdapters(id);
      }, modelsMs);
      this.modelsTimer.unref();
    }
  }

  /**
   * A worker left rotation: each request its engine has not started answering (unanswered:
   * nothing reached its client, and no answer is on its way) moves to another worker, but only
   * when it has a retry left and a worker serving the request's model is in rotation, other than
   * those that failed the request already (the retry leaves them out) and the ranks of the same
   * engine (they fail with it: the health check probes each rank, so they leave rotation one after
   * the other). With none, it stays where it is,
   * bounded by its first-byte deadline: a streamed request's (twice the worker's mean time to first
   * byte plus the first-byte timeout, timeouts.ts FirstByteDeadlines) or, not streamed, the
   * inter-chunk timeout (proxy.ts gives forward.ts either as firstByteTimeoutMs): the
   * engine may still answer it (when vLLM's engine core dies, its API server fails every request
   * in flight with an error of its own, vllm/v1/engine/async_llm.py's output_handler; SGLang's
   * /health answers 503 while it shuts down gracefully, finishing what it runs, or while a probe
   * waits behind its scheduler, sglang/srt/entrypoints/http_server.py), and a retry would find no
   * worker and turn it into an error at once. It is kept until a worker serving its model comes
   * into rotation (then it moves) or the worker returns itself. When only its probes timed out (a
   * busy engine answers /health late too), the decision waits a grace period, and is taken only if
   * the worker is still out then: a loaded engine must not have its whole queue thrown onto the
   * others. An answer the engine has begun stays: a whole answer whose body is arriving (moved, it
   * would be thrown away and computed again; the rest is due within the inter-chunk timeout, and
   * an engine that dies meanwhile fails the attempt then), and a failure's status, whose body is
   * read and dropped (the attempt ends as that failure, counted by the breaker, not as a move). A
   * connection that fails fails its request whatever the rotation (forward.ts). Draining is no
   * health verdict: it leaves a worker's requests alone. Engines announce no AllBlocksCleared when
   * they start, so one its health check holds out is remembered as possibly restarted.
   */
  private outOfRotation(id: string): void {
    const { health } = this.options;
    if (health.reasons(id).includes('health-check')) this.mayHaveRestarted.add(id);
    if (!health.heldOutBySlowProbesOnly(id)) return this.moveOrKeep(id);
    this.endGrace(id);
    const t = setTimeout(() => {
      this.graceTimers.delete(id);
      this.moveOrKeep(id);
    }, this.slowProbeGraceMs);
    t.unref();
    this.graceTimers.set(id, t);
  }

  /** Ends the grace period of a worker held out by slow probes, if one runs. */
  private endGrace(id: string): void {
    const t = this.graceTimers.get(id);
    if (t === undefined) return;
    clearTimeout(t);
    this.graceTimers.delete(id);
  }

  /**
   * Each unanswered request of a worker out of rotation moves if a worker that can take it is in
   * rotation (movable); the others are kept on it, and the worker decides again when one comes
   * into rotation (rotationGained). A worker back in rotation, or removed, is no longer followed.
   */
  private moveOrKeep(id: string): void {
    const c = this.connections.get(id);
    if (!c || this.options.health.reasons(id).length === 0) {
      this.keeping.delete(id);
      return;
    }
    this.keeping.add(id);
    if (c.unanswered.size === 0) return;
    // the fleet is read once per call, and the workers not serving a model as they are now (kept
    // per model by withoutModel(); after a model-not-found 404, those whose engines do not list
    // it): the rest of the decision is the request's own (the workers that failed it, its retries left)
    const workers = this.options.router.listWorkers();
    const ranks = this.routerIdsOf(c.workerId);
    for (const req of [...c.unanswered]) {
      if (req.lastAttempt) continue;
      const notServing = this.withoutRoom(
        req.listedOnly ? this.notListing(req.model) : this.withoutModel(req.model),
        req.model,
        req.promptTokens,
        req.outputTokens,
        true,
      );
      if (movable(workers, notServing, ranks, req.failedWorkers)) req.workerOut();
    }
  }

  /**
   * A worker may have come into rotation (back from its health verdicts, added, resumed from
   * draining) or to serve a model it did not (a LoRA adapter its /v1/models lists now): the
   * workers out of rotation keeping unanswered requests decide again.
   */
  rotationGained(): void {
    for (const id of [...this.keeping]) this.moveOrKeep(id);
  }

  /**
   * Back in rotation: requests kept on workers out may move to it; after its health check held it
   * out, what the index says it holds is forgotten.
   */
  private backInRotation(id: string): void {
    this.endGrace(id);
    this.rotationGained();
    // what it serves is read again: an engine that was not up when the worker was added (vLLM
    // loading its weights), or that restarted with other adapters, lists them now
    const workerId = this.connections.get(id)?.workerId;
    if (workerId !== undefined) void this.readAdapters(workerId);
    if (!this.mayHaveRestarted.delete(id) || !this.connections.has(id)) return;
    this.options.applier.clearWorker(id);
    this.options.log(`${id}: index entries dropped (it was unreachable and may have restarted)`);
  }

  /** Router workers (a worker with ranks counts once per rank). */
  get size(): number {
    return this.connections.size;
  }

  /** A router worker id, or a worker's own id. */
  has(id: string): boolean {
    return this.connections.has(id) || this.groups.has(id);
  }

  /** The router worker ids of a worker (its ranks), or of the worker a router worker id belongs to. */
  routerIdsOf(id: string): string[] {
    return this.groups.get(id) ?? this.groups.get(this.connections.get(id)?.workerId ?? '') ?? [];
  }

  /**
   * The adapter a model name selects (undefined: a base model or unknown): an adapter some worker
   * lists (vLLM's form: the adapter's own name), else SGLang's `base:adapter`, the adapter being
   * what follows the first colon, both parts stripped, none when empty (SGLang's
   * _parse_model_parameter in python/sglang/srt/entrypoints/openai/serving_base.py; SGLang refuses
   * a bare adapter name). SGLang takes that adapter whether its /v1/models lists it or not (one
   * loaded since the last read), so it is not looked up; a name with a colon that a worker lists as
   * its own (`--served-model-name llama3:8b`, or `models=`) is that model.
   */
  loraOf(model: unknown): string | undefined {
    if (typeof model !== 'string') return undefined;
    for (const c of this.connections.values()) if (c.adapters.has(model)) return model;
    const colon = model.indexOf(':');
    if (colon < 0) return undefined;
    for (const c of this.connections.values()) if (serves(c, model)) return undefined;
    const adapter = model.slice(colon + 1).trim();
    return adapter === '' ? undefined : adapter;
  }

  get(id: string): WorkerConnection | undefined {
    return this.connections.get(id);
  }

  /** Each router worker's KV-event subscriber counters. */
  *subscriberStats(): IterableIterator<[string, SubscriberStats]> {
    for (const [id, c] of this.connections) if (c.subscriber) yield [id, c.subscriber.stats];
  }

  /** /tokenize refusals counted so far, per router worker and status (the metric's series). */
  *tokenizeRefusalCounts(): IterableIterator<{ worker: string; status: string; reason: string; count: number }> {
    for (const [worker, c] of this.connections)
      for (const [key, count] of c.tokenizeRefusals) {
        const [status, reason] = key.split(' ') as [string, string];
        yield { worker, status, reason, count };
      }
  }

  /** The workers as configured (once each, whatever their ranks), for the shared state. */
  records(): WorkerRecord[] {
    return [...this.groups.values()].map((ids) => this.connections.get(ids[0])!.record);
  }

  /**
   * Checks a worker's settings, registers it (each rank) and starts its pool, subscribers, scrapes
   * and checks. `configured`: given at start (flags, config file), not added while running (the
   * admin API, DNS discovery, another replica, the shared registry), which may name only the
   * engine-key variables EngineKeyEnvs allows, and, with health checks on, stays out of rotation
   * until its first health check passes (each rank on its own), that check sent at once: until
   * then nothing shows it can serve, and an engine that refuses or fails, or a URL leading back
   * to the gateway, would draw requests first (policies prefer an idle newcomer). A configured
   * worker takes requests from the start, the gateway ready with it (its first round runs at once).
   */
  add(input: WorkerRecord, configured = false): WorkerRecord {
    const { router, applier, log } = this.options;
    const untilChecked = !configured && this.checker !== undefined;
    // ids: letters, digits and . _ : - ('#' is reserved for data-parallel ranks, ID#r)
    const w = parseWorkerRecord(input, `worker ${typeof input?.id === 'string' ? input.id.slice(0, 64) : '(no id)'}`);
    let apiKey: string | undefined;
    if (w.apiKeyEnv !== undefined) {
      if (configured) this.keyEnvs.permit(w.apiKeyEnv);
      else if (!this.keyEnvs.allows(w.apiKeyEnv))
        throw new KeyEnvError(
          `worker ${w.id}: apiKeyEnv ${w.apiKeyEnv} is not a variable a worker added while the router runs may read (list it in --engine-key-envs)`,
        );
      apiKey = this.options.env[w.apiKeyEnv];
      if (!apiKey)
        throw new KeyEnvError(
          `worker ${w.id}: the environment variable ${w.apiKeyEnv} (its engine API key) is not set`,
        );
    }
    const dpSize = w.dpSize ?? 1;
    if (this.has(w.id)) throw new RangeError(`worker '${w.id}' exists`);
    const ranks = workerRanks(w);
    const ids = ranks.map((r) => r.id);
    for (const id of ids) if (this.connections.has(id)) throw new RangeError(`worker '${id}' exists`);
    if (this.connections.size + dpSize > MAX_WORKERS) {
      const { message, param } = workerLimitRefusal(w.id, dpSize, this.connections.size);
      throw new WorkerLimitError(message, param);
    }
    // every rank's endpoints first: a bad one refuses the worker before anything starts
    const events =
      w.events === undefined
        ? undefined
        : naming('events', () => ranks.map((r) => rankEndpoint(w.events!, r.portOffset)));
    const replays =
      w.replay === undefined
        ? undefined
        : naming('replay', () => ranks.map((r) => rankEndpoint(w.replay!, r.portOffset)));
    // ZeroMQ refuses sockets past its max_sockets, a replay's included: a worker whose subscribers
    // would leave another subscriber no room for its replay is refused, not the others' replays
    const socketLimit = (open: number, maxSockets: number) =>
      new SocketLimitError(
        `worker '${w.id}' not added: ZeroMQ's socket limit (max_sockets ${maxSockets}) has no room for its KV-event subscriber${dpSize > 1 ? `s (one per rank, ${dpSize})` : ''}: ` +
          `each may hold ${SOCKETS_PER_SUBSCRIBER} sockets and ${open} are open. Remove a worker with events first, or add this one without events`,
      );
    if (this.options.kvEvents && events) {
      const { open, room, maxSockets } = subscriberRoom();
      if (room < dpSize) throw socketLimit(open, maxSockets);
    }
    // credentials in the URL travel as a Basic authorization header (an engine key wins)
    const plain = splitCredentials(w.url);
    // the origin alone (the URL has no path: checkWorkerUrl), as the parser writes it
    const base = new URL(plain.url).origin;
    const record: WorkerRecord = {
      id: w.id,
      url: w.url,
      claGroups: w.claGroups,
      models: w.models,
      events: w.events,
      replay: w.replay,
      metrics: w.metrics,
    };
    if (w.dpSize !== undefined) record.dpSize = w.dpSize;
    if (w.dpStartRank !== undefined) record.dpStartRank = w.dpStartRank;
    if (w.blockSize !== undefined) record.blockSize = w.blockSize;
    if (w.apiKeyEnv !== undefined) record.apiKeyEnv = w.apiKeyEnv;
    const authorization = engineAuthorization(apiKey) ?? plain.authorization;
    // answers without a content coding: the gateway reads them (whole JSON, events, model lists)
    const headers: Record<string, string> = authorization
      ? { 'content-type': 'application/json', 'accept-encoding': 'identity', authorization }
      : { 'content-type': 'application/json', 'accept-encoding': 'identity' };
    // with ranks, each rank's endpoint (port + rank) takes its rank's batches only; without, the
    // endpoint is the worker's own and every batch of it is the worker's whatever its rank (vLLM
    // stamps its global rank: an engine serving one rank behind its own API server,
    // --data-parallel-rank R, stamps R)
    // the pool, the subscribers and the router's registration can still refuse the worker (undici
    // and ZeroMQ have the last word on an origin and an endpoint), and so can anything started
    // after: then nothing of it may stay, neither a worker the router routes to without a
    // connection nor a socket. Whatever throws, everything started so far is undone.
    let pool: Pool | undefined;
    const subscribers: Array<KvEventSubscriber | undefined> = [];
    const registered: string[] = [];
    const connected: string[] = [];
    const undo = () => {
      for (const id of connected) {
        this.connections.delete(id);
        this.scraper?.remove(id);
        this.checker?.remove(id);
        this.options.health.forget(id);
      }
      if (pool) void pool.destroy().catch(() => {});
      for (const s of subscribers) if (s) this.closeRemoved(s);
      for (const id of registered) router.removeWorker(id);
    };
    try {
      pool = new Pool(base, { connections: this.engineConnections, keepAliveTimeout: ENGINE_KEEP_ALIVE_MS });
      ids.forEach((id, r) => {
        subscribers.push(
          this.options.kvEvents && events
            ? // ZeroMQ has the last word on the endpoint: its refusal is the events field's
              naming('events', () =>
                new KvEventSubscriber({
                  workerId: id,
                  endpoint: events[r],
                  replayEndpoint: replays?.[r],
                  applier,
                  log,
                  dataParallel:
                    ranks[r].rank === null ? undefined : { rank: ranks[r].rank, start: ranks[0].rank!, size: dpSize },
                }).start(),
              )
            : undefined,
        );
      });
      // events are handled on later turns of the event loop: registered before the first
      for (const id of ids) {
        router.registerWorker(id, { url: w.url, claGroups: w.claGroups, blockSize: w.blockSize });
        registered.push(id);
      }
      const slots = new ConnectionSlots(this.engineConnections);
      const adapters = new Map<string, string>();
      const models = w.models ? new Set(w.models) : undefined;
      ids.forEach((id, r) => {
        connected.push(id);
        this.connections.set(id, {
          record,
          base,
          contextLengths: NO_CONTEXT_LENGTHS,
          pool: pool!,
          slots,
          models,
          adapters,
          workerId: w.id,
          tokenizeRefusals: new Map(),
          rank: ranks[r].rank,
          headerRank: ranks[r].header,
          headers: ranks[r].header === null ? headers : { ...headers, [DP_RANK_HEADER]: String(ranks[r].header) },
          unanswered: new Set(),
          subscriber: subscribers[r],
        });
        this.scraper?.add({
          workerId: id,
          url: w.metrics ?? `${base}/metrics`,
          engine: ranks[r].rank === null ? undefined : String(ranks[r].rank),
        });
        this.checker?.add(id, base, untilChecked);
        if (untilChecked) this.options.health.holdUntilChecked(id);
      });
    } catch (err) {
      undo();
      // out of sockets or descriptors all the same (the process's open-file limit): a ZeroMQ EMFILE
      if ((err as { code?: unknown } | null)?.code === 'EMFILE') {
        const { open, maxSockets } = subscriberRoom();
        throw socketLimit(open, maxSockets);
      }
      throw err;
    }
    this.groups.set(w.id, ids);
    this.modelsChanged();
    void this.readAdapters(w.id);
    if (untilChecked) for (const id of ids) this.checker!.checkNow(id);
    this.rotationGained();
    return record;
  }

  /**
   * Reads what a worker serves from its /v1/models: the ids it lists, and among them its LoRA
   * adapters (entries with a parent, as vLLM lists them). A worker that lists a model or an
   * adapter it did not serves its requests from now: those kept on workers out of rotation may
   * move there, as when a worker comes into rotation. Reads asked while one is under way share it.
   */
  readAdapters(workerId: string): Promise<void> {
    let read = this.reading.get(workerId);
    if (read === undefined) {
      const reading = this.readModelList(workerId).finally(() => {
        if (this.reading.get(workerId) === reading) this.reading.delete(workerId);
      });
      this.reading.set(workerId, (read = reading));
    }
    return read;
  }

  private async readModelList(workerId: string): Promise<void> {
    const ids = this.groups.get(workerId) ?? [];
    const first = this.connections.get(ids[0] ?? '');
    const models = first && (await this.listModels(first));
    // an engine that does not answer keeps what it listed before; one removed meanwhile serves nothing
    if (!models || this.connections.get(ids[0]!) !== first) return;
    const adapters = adaptersFromModels(models);
    const listed = new Set(models.map((m) => m.id));
    const contextLengths = contextLengthsOf(models, adapters);
    let gained = first.listed === undefined;
    for (const name of adapters.keys()) if (!first.adapters.has(name)) gained = true;
    for (const id of listed) if (!first.listed?.has(id)) gained = true;
    const changed =
      gained ||
      adapters.size !== first.adapters.size ||
      listed.size !== first.listed?.size ||
      !sameEntries(contextLengths, first.contextLengths);
    first.adapters.clear();
    for (const [name, parent] of adapters) first.adapters.set(name, parent);
    // the ranks share the engine's answer
    for (const id of ids) {
      const c = this.connections.get(id);
      if (c) {
        c.listed = listed;
        c.contextLengths = contextLengths;
      }
    }
    if (changed) this.modelsChanged();
    if (gained) this.rotationGained();
  }

  /**
   * Reads every worker's /v1/models again, at most once per MODELS_REFRESH_MS: before the gateway
   * answers that no worker serves a model (an engine may list it since its last read: an adapter
   * loaded, an engine restarted with others), and after an engine answered a request 404. Callers
   * during a re-read share it; between re-reads nothing is read, so clients asking for names no
   * engine serves cost the engines one read each per interval, however many they send.
   */
  refreshModels(): Promise<void> {
    if (this.refreshing) return this.refreshing;
    const now = performance.now();
    if (now - this.refreshedAt < MODELS_REFRESH_MS) return Promise.resolve();
    this.refreshedAt = now;
    const refreshing = Promise.all([...this.groups.keys()].map((id) => this.readAdapters(id))).then(
      () => {},
      () => {},
    );
    this.refreshing = refreshing;
    void refreshing.finally(() => (this.refreshing = undefined));
    return refreshing;
  }

  /**
   * The entries of a worker's /v1/models (objects with a non-empty string `id`, at most
   * MAX_MODEL_ENTRIES), read within the side requests' bounds of size and time; undefined when
   * it does not answer with a list. `via`: the Via header to send (a client's, with this
   * gateway's entry; default: this gateway's own).
   */
  async listModels(c: WorkerConnection, via = this.options.via): Promise<Array<{ id: string }> | undefined> {
    const read = await this.readModels(c, via);
    return 'models' in read ? read.models : undefined;
  }

  /**
   * As listModels, with why a worker gave no list when it did not (a few words, for a client's
   * error message): its headers are waited for 2 s, the whole answer SIDE_REQUEST_DEADLINE_MS.
   */
  async readModels(
    c: WorkerConnection,
    via = this.options.via,
  ): Promise<{ models: Array<{ id: string }> } | { failure: string }> {
    try {
      const res = await upstreamRequest(`${c.base}/v1/models`, {
        // the Via goes on (a worker URL that leads back is a routing loop)
        headers: via === undefined ? c.headers : { ...c.headers, via },
        headersTimeout: 2000,
        bodyTimeout: 2000,
        // bodyTimeout bounds the gaps between chunks, not a body that trickles forever
        signal: AbortSignal.timeout(SIDE_REQUEST_DEADLINE_MS),
      });
      if (res.statusCode !== 200) {
        await res.body.dump();
        return { failure: `answered ${res.statusCode}` };
      }
      const models = modelEntries(JSON.parse(await readBoundedText(res.body, MAX_MODELS_BYTES, '/v1/models')));
      return models ? { models } : { failure: 'answered with no model list' };
    } catch (err) {
      return { failure: sideRequestFailure(err).text };
    }
  }

  /** Stops everything kept for the worker (every rank) and removes it from the router. False when unknown. */
  remove(id: string): boolean {
    const ids = this.routerIdsOf(id);
    if (ids.length === 0) return false;
    const first = this.connections.get(ids[0])!;
    this.groups.delete(first.workerId);
    // a worker added under its id again reads its own list, not the end of this one's read
    this.reading.delete(first.workerId);
    this.tokenizeRefusalLogged.delete(first.workerId);
    this.tokenizeFailureLogged.delete(first.workerId);
    void first.pool.close().catch(() => {}); // lets its in-flight requests finish
    let removed = false;
    for (const rid of ids) {
      const c = this.connections.get(rid);
      if (!c) continue;
      this.connections.delete(rid);
      // close() stops it at once (a replay under way is cancelled): from here it applies and
      // drops nothing, so the worker's entries cleared below stay cleared, whatever is added under its id
      if (c.subscriber) this.closeRemoved(c.subscriber);
      this.scraper?.remove(rid);
      this.checker?.remove(rid);
      this.options.health.forget(rid);
      this.mayHaveRestarted.delete(rid);
      this.keeping.delete(rid);
      this.endGrace(rid);
      this.options.applier.clearWorker(rid);
      removed = this.options.router.removeWorker(rid) || removed;
    }
    this.modelsChanged();
    // requests waiting for one of its connections move to other workers now (worker-out), not
    // when one of its streams ends, onto the closed pool (as an engine failure of a removed worker)
    first.slots.withdrawAll();
    return removed;
  }

  /** Stalls found so far, per router worker watched (metrics/stall.ts). */
  *stallCounts(): IterableIterator<[string, number]> {
    if (this.stall) yield* this.stall.stallCounts();
  }

  /**
   * Whether a probe of its engine (health check, metrics scrape) holds the router worker out of
   * rotation now: an open circuit alone does not (it is no verdict on the engine's other ranks),
   * nor does draining.
   */
  heldOutByProbes(id: string): boolean {
    return this.options.health.heldOutByProbes(id);
  }

  /** What holds the router worker out of rotation now (its circuit, its health check, its metrics scrape); none while it is in. */
  outOfRotationReasons(id: string): HealthVerdictSource[] {
    return this.options.health.reasons(id);
  }

  /** Whether the worker, added while the gateway runs, waits for its first health check (WorkerHealth.awaitingFirstCheck). */
  awaitingFirstCheck(id: string): boolean {
    return this.options.health.awaitingFirstCheck(id);
  }

  /**
   * Workers whose models are known and `model` is not among them, as they are now. A worker's
   * models are those its operator lists (`models=`) and the LoRA adapters its engine lists, or
   * without `models=`, every id its engine listed in its last /v1/models read: a fleet of engines
   * serving different models needs no `models=` for requests to go to the right ones. A worker
   * whose engine never answered that read is left out of nothing (nothing is refused on
   * information the gateway does not have). A name no worker serves leaves out only the workers
   * with `models=`: the others' engines have the last word on it (SGLang takes `base:adapter`
   * names it does not list; an adapter may be loaded since the last read), and answer it, with
   * vLLM's 404 when they do not serve it. Kept per model until the model lists change (the same
   * set is answered until then, a new one after): the proxy asks at each attempt, and most
   * requests ask for a model the workers list.
   */
  withoutModel(model: unknown): ReadonlySet<string> {
    if (typeof model !== 'string') return NO_WORKERS;
    // no worker's models are known: every worker serves every model, and no name costs a look at
    // each worker
    const known = (this.known ??= this.knownWorkers());
    if (known.size === 0) return NO_WORKERS;
    const kept = this.withoutModelByName.get(model);
    if (kept !== undefined) return kept;
    let listed = false;
    for (const c of this.connections.values())
      if (serves(c, model)) {
        listed = true;
        break;
      }
    if (!listed) return (this.listing ??= this.listingWorkers());
    const out = new Set<string>();
    for (const [id, c] of this.connections) if (serves(c, model) === false) out.add(id);
    // full (clients cycling through more adapters than are kept): started again, so the names
    // asked for now are kept, not only the first ones ever asked for
    if (this.withoutModelByName.size >= MAX_KEPT_MODELS) this.withoutModelByName.clear();
    this.withoutModelByName.set(model, out);
    return out;
  }

  /**
   * Workers whose engines are not known to serve `model` as they are now: those withoutModel()
   * leaves out, and those whose engine's /v1/models did not list it, or was never read. A worker's
   * `models=` is the operator's word, not its engine's: it counts only to leave a worker out.
   * After an engine answered a request with its model-not-found 404, the request goes on only to
   * workers whose engines list its model (the proxy): another may answer the same. Made at each
   * call: asked only after such a 404.
   */
  notListing(model: unknown): Set<string> {
    const out = new Set<string>();
    for (const [id, c] of this.connections)
      if (typeof model !== 'string' || serves(c, model) !== true || !engineLists(c, model)) out.add(id);
    return out;
  }

  /** The workers whose operator lists their models. */
  private listingWorkers(): Set<string> {
    const out = new Set<string>();
    for (const [id, c] of this.connections) if (c.models) out.add(id);
    return out;
  }

  /** The workers whose models are known (from `models=` or their engine's list). */
  private knownWorkers(): Set<string> {
    const out = new Set<string>();
    for (const [id, c] of this.connections) if (c.models || c.listed) out.add(id);
    return out;
  }

  /** The workers' model lists changed: withoutModel() and withoutRoom() answer from them again. */
  private modelsChanged(): void {
    this.withoutModelByName.clear();
    this.listing = undefined;
    this.known = undefined;
    this.shortestContextByModel.clear();
  }

  /**
   * `without` and the workers whose engines list a context length for `model` too short for the
   * request (exceedsContext: `promptTokens` at or past it, or `maxTokens` not fitting in what is
   * left), when a worker in rotation outside them may take it: one whose engine lists a longer
   * context, or none. In a fleet whose engines were started with different --max-model-len (GPUs
   * of several sizes serving one model) a long prompt goes to one that takes it, not to one that
   * answers it 400. When none in rotation would, the short ones are still left out if an engine
   * out of rotation for now (unhealthy for under OUT_FOR_NOW_MS: a failing health check, an open
   * breaker; not draining) lists a context that takes the prompt: the client is answered 503 to try again, not told by
   * the short engine's 400 that the prompt is too long for the fleet. Otherwise `without` is
   * answered, and the engine's 400 says why; with `evenWhenNoneLeft` (a request kept on a worker
   * out of rotation, whose engine may still answer it, deciding whether to move) the short ones
   * are left out even then.
   * Without the prompt's token count (token ids not known before routing) nothing is left out; a
   * prompt shorter than every listed context costs one comparison.
   */
  withoutRoom(
    without: ReadonlySet<string>,
    model: unknown,
    promptTokens: number | undefined,
    maxTokens: number | undefined,
    evenWhenNoneLeft = false,
  ): ReadonlySet<string> {
    if (promptTokens === undefined || typeof model !== 'string') return without;
    if (!exceedsContext(this.shortestContext(model), promptTokens, maxTokens)) return without;
    let tooShort: Set<string> | undefined;
    let roomLeft = false;
    let roomOutOfRotation = false;
    for (const w of this.options.router.listWorkers()) {
      if (without.has(w.id)) continue;
      const length = this.connections.get(w.id)?.contextLengths.get(model);
      if (length !== undefined && exceedsContext(length, promptTokens, maxTokens))
        (tooShort ??= new Set(without)).add(w.id);
      else if (w.available) roomLeft = true;
      else if (length !== undefined && !w.draining && (this.options.health.outFor(w.id) ?? 0) < OUT_FOR_NOW_MS)
        roomOutOfRotation = true;
    }
    return tooShort !== undefined && (roomLeft || roomOutOfRotation || evenWhenNoneLeft) ? tooShort : without;
  }

  /** The shortest context length an engine lists for `model`; Infinity when none lists one. */
  private shortestContext(model: string): number {
    const kept = this.shortestContextByModel.get(model);
    if (kept !== undefined) return kept;
    let shortest = Infinity;
    for (const c of this.connections.values()) shortest = Math.min(shortest, c.contextLengths.get(model) ?? Infinity);
    if (this.shortestContextByModel.size >= MAX_KEPT_MODELS) this.shortestContextByModel.clear();
    this.shortestContextByModel.set(model, shortest);
    return shortest;
  }

  /**
   * Token ids of the prompt from the /tokenize of an available engine serving the request's
   * model, given everything that shapes the prompt (tokenizeBody); undefined if none answers
   * within SIDE_REQUEST_DEADLINE_MS (one deadline for all the engines asked, in turn). An engine
   * whose connections are all taken is asked only once no engine with a free one answered.
   */
  async tokenizeOnEngine(r: RouteRequest, request: Record<string, unknown> = {}): Promise<number[] | undefined> {
    if (r.tokens) return r.tokens as number[];
    const body = tokenizeBody(request, r);
    const skip = this.withoutModel(request.model);
    const seen = new Set<string>();
    // one deadline for all the engines asked: the client waits on them one after the other, and
    // engines that each stall until their own deadline would hold it for as many deadlines
    const deadline = AbortSignal.timeout(SIDE_REQUEST_DEADLINE_MS);
    // engines whose connections were all taken when their turn came (streams hold them until
    // they end): waiting behind one of them while another engine has a free connection would
    // hold the request for a stream, or the whole deadline, and lose its token ids
    let busy: WorkerConnection[] = [];
    for (const w of this.options.router.listWorkers()) {
      if (deadline.aborted) return undefined;
      if (!w.available || skip.has(w.id)) continue;
      const c = this.connections.get(w.id);
      // removed while an earlier engine was asked: the list is the one read before the first ask
      if (!c) continue;
      if (seen.has(c.base)) continue; // the ranks of one engine answer alike
      seen.add(c.base);
      if (!c.slots.tryTake()) {
        busy.push(c);
        continue;
      }
      const tokens = await this.askTokenize(c, body, deadline);
      if (tokens) return tokens;
    }
    // none with a free connection answered: wait, within the deadline, for the first connection
    // that frees on any of the others (in each one's queue, as a proxied request would)
    while (busy.length > 0 && !deadline.aborted) {
      let c: WorkerConnection | undefined;
      try {
        c = await firstFreeConnection(busy, deadline);
      } catch {
        return undefined; // the deadline passed while waiting
      }
      if (!c) return undefined; // every one of them was removed meanwhile
      busy = busy.filter((b) => b !== c);
      const tokens = await this.askTokenize(c, body, deadline);
      if (tokens) return tokens;
    }
    return undefined;
  }

  /**
   * Asks the engine of `c` for the token ids of `body` on the connection the caller took for it
   * (one of its slots: --engine-connections bounds these calls and the proxied requests
   * together), and gives the connection back. Undefined when it fails or answers without them.
   */
  private async askTokenize(
    c: WorkerConnection,
    body: Record<string, unknown>,
    deadline: AbortSignal,
  ): Promise<number[] | undefined> {
    const via = this.options.via;
    try {
      const res = await c.pool.request({
        path: '/tokenize',
        method: 'POST',
        body: JSON.stringify(body),
        // with this gateway's Via: a worker URL that leads back here shows as a loop
        headers: via === undefined ? c.headers : { ...c.headers, via },
        headersTimeout: 2000,
        bodyTimeout: 2000,
        // the client waits on it: a body that trickles must not hold the request forever
        signal: deadline,
      });
      try {
        if (res.statusCode !== 200)
          return void (await this.tokenizeRefused(c, res.statusCode, res.body).catch(() => {}));
        const maxTokens = this.options.router.maxPromptTokens;
        const maxBytes = Math.min(
          MAX_TOKENIZE_BYTES,
          maxTokens * TOKENIZE_BYTES_PER_TOKEN + TOKENIZE_ANSWER_OVERHEAD_BYTES,
        );
        const out = JSON.parse(await readBoundedText(res.body, maxBytes, '/tokenize')) as {
          tokens?: unknown;
        } | null;
        // an engine's answer is checked like a client's token ids: a bad one is the engine's fault,
        // not the client's. More tokens than the longest prompt the router takes is a bad one (the
        // router would refuse the client's request for it): the request goes without token ids,
        // and an engine that finds the prompt too long says so itself
        const tokens = out?.tokens;
        if (Array.isArray(tokens) && tokens.length <= maxTokens && isTokenIdList(tokens)) return tokens;
        this.tokenizeFailed(c, { kind: 'malformed', text: 'answered without a list of token ids the router takes' });
        return undefined;
      } finally {
        // an answer left unread would keep its connection busy after the slot is given back
        if (!res.body.readableEnded) res.body.destroy();
      }
    } catch (err) {
      // the next engine is asked (the deadline is the request's, for every engine asked in turn)
      this.tokenizeFailed(c, deadline.aborted ? { kind: 'timeout', text: 'timed out' } : sideRequestFailure(err));
      return undefined;
    } finally {
      c.slots.release();
    }
  }

  /**
   * Counts a /tokenize answer other than 200 and, for the first of its worker, logs it with the
   * start of the engine's message (SGLang releases whose /tokenize takes only a `prompt` refuse
   * a chat's `messages` with 400, entrypoints/openai/serving_tokenize.py): without it, requests
   * were routed without token ids, their cached prefix unseen, and nothing said why.
   */
  private async tokenizeRefused(
    c: WorkerConnection,
    statusCode: number,
    body: Dispatcher.ResponseData['body'],
  ): Promise<void> {
    const key = `${tokenizeRefusalStatus(statusCode)} refused`;
    c.tokenizeRefusals.set(key, (c.tokenizeRefusals.get(key) ?? 0) + 1);
    if (this.tokenizeRefusalLogged.has(c.workerId)) return void (await body.dump());
    this.tokenizeRefusalLogged.add(c.workerId);
    // an error answer is a short JSON object: a longer one is logged without it
    const said = refusalMessage(await readBoundedText(body, MAX_REFUSAL_BYTES, '/tokenize').catch(() => ''));
    this.options.log(
      `worker '${c.workerId}': its engine's /tokenize answered ${statusCode}${said === '' ? '' : ` ${JSON.stringify(said)}`}; ` +
        'the request was asked of another engine or routed without token ids, its cached prefix unseen ' +
        '(SGLang releases whose /tokenize takes only a prompt refuse chats: docs/engines.md). Its further refusals are not logged: /metrics counts them in contextforge_engine_tokenize_refusals_total',
    );
  }

  /**
   * Counts a /tokenize that gave no answer in time, an answer that is no list of token ids, or a
   * connection that failed, and logs the first of its worker: the request was routed without
   * token ids, and nothing said why.
   */
  private tokenizeFailed(c: WorkerConnection, failure: { kind: SideRequestFailureKind; text: string }): void {
    const key = `none ${failure.kind}`;
    c.tokenizeRefusals.set(key, (c.tokenizeRefusals.get(key) ?? 0) + 1);
    if (this.tokenizeFailureLogged.has(c.workerId)) return;
    this.tokenizeFailureLogged.add(c.workerId);
    this.options.log(
      `worker '${c.workerId}': its engine's /tokenize ${failure.text} (${failure.kind}); ` +
        'the request was asked of another engine or routed without token ids, its cached prefix unseen. ' +
        'Its further failures are not logged: /metrics counts them in contextforge_engine_tokenize_refusals_total{reason}',
    );
  }

  /** Stops the metrics scrapes and health checks (first step of closing the gateway). */
  stopPolling(): void {
    this.scraper?.stop();
    this.checker?.stop();
    clearInterval(this.modelsTimer);
    for (const t of this.graceTimers.values()) clearTimeout(t);
    this.graceTimers.clear();
  }

  /** Closes a removed worker's subscriber; close() waits for it while it is closing. */
  private closeRemoved(subscriber: { close(): Promise<void> }): void {
    const closed: Promise<void> = subscriber.close().then(
      () => void this.closing.delete(closed),
      () => void this.closing.delete(closed),
    );
    this.closing.add(closed);
  }

  /** Stops polling, drops every pool and waits for the subscribers to close. */
  async close(): Promise<void> {
    this.stopPolling();
    await Promise.all([...new Set([...this.connections.values()].map((c) => c.pool))].map((p) => p.destroy()));
    await Promise.all([...this.connections.values()].map((c) => c.subscriber?.close()));
    await Promise.all([...this.closing]);
  }
}

/**
 * A /tokenize refusal's status label: the HTTP status, or `other` for a code outside 100-599
 * (the label takes a few hundred values at most per worker).
 */
export function tokenizeRefusalStatus(statusCode: number): string {
  return Number.isInteger(statusCode) && statusCode >= 100 && statusCode <= 599 ? String(statusCode) : 'other';
}

/** The most of a /tokenize refusal's body read for its log line. */
const MAX_REFUSAL_BYTES = 4096;

/**
 * What an engine's error answer says, for a log line: the `message` of an OpenAI-style error
 * (`{"message"}`, SGLang's and vLLM's `{"error": {"message"}}`) or FastAPI's `detail`, else the
 * text; at most 200 characters.
 */
function refusalMessage(text: string): string {
  let said: unknown = text;
  try {
    const e = JSON.parse(text) as { message?: unknown; detail?: unknown; error?: { message?: unknown } } | null;
    said = e?.message ?? e?.error?.message ?? e?.detail ?? text;
  } catch {
    // not JSON: the text itself
  }
  return (typeof said === 'string' ? said : JSON.stringify(said)).trim().slice(0, 200);
}

/**
 * Whether the worker serves `model`: with `models=`, those and its engine's adapters; without, what
 * its engine listed; undefined when its engine never answered (nothing is known).
 */
function serves(c: WorkerConnection, model: string): boolean | undefined {
  if (c.models) return c.models.has(model) || c.adapters.has(model);
  return c.listed?.has(model);
}

/** Whether the worker's engine listed `model` in its last /v1/models read that answered (a model or a LoRA adapter). */
function engineLists(c: WorkerConnection, model: string): boolean {
  return c.listed?.has(model) === true || c.adapters.has(model);
}

/**
 * Whether a request on a worker out of rotation has a worker in rotation to move to: one serving
 * its model now (not in `withoutModel`), not a rank of the same engine (`ranks`: they fail with it, the
 * health check probing each rank in turn), and not one that failed the request already
 * (`failedWorkers`: the retry would leave it out, and find no worker).
 */
function movable(
  workers: readonly WorkerState[],
  withoutModel: ReadonlySet<string>,
  ranks: readonly string[],
  failedWorkers: ReadonlySet<string>,
): boolean {
  return workers.some(
    (w) => w.available && !withoutModel.has(w.id) && !failedWorkers.has(w.id) && !ranks.includes(w.id),
  );
}

/**
 * Waits for the first of the connections the gateway keeps to the engines of `cs` to be free (in
 * each engine's slots, behind the requests already waiting there) and takes it: the caller must
 * release it. Resolves with the connection taken, leaving every other wait at once; undefined
 * when every engine was removed meanwhile; rejects, taking nothing, when `signal` aborts first.
 */
function firstFreeConnection(
  cs: readonly WorkerConnection[],
  signal: AbortSignal,
): Promise<WorkerConnection | undefined> {
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise((resolve, reject) => {
    let done = false;
    let waiting = cs.length;
    const withdrawals: Array<() => boolean> = [];
    const finish = () => {
      done = true;
      for (const withdraw of withdrawals) withdraw();
      signal.removeEventListener('abort', onAbort);
    };
    const onAbort = () => {
      if (done) return;
      finish();
      reject(signal.reason as Error);
    };
    for (const c of cs) {
      if (done) break; // one was free at once
      withdrawals.push(
        c.slots.take(
          () => {
            finish();
            resolve(c);
          },
          () => {
            if (!done && --waiting === 0) {
              finish();
              resolve(undefined);
            }
          },
        ),
      );
    }
    if (!done) signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** A non-empty list of token ids (integers in [0, 2^32)). */
function isTokenIdList(value: unknown): value is number[] {
  if (!Array.isArray(value) || value.length === 0) return false;
  return value.every(isTokenId);
}
