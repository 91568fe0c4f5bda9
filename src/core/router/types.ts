/**
 * The router's public types: what route() takes and returns, what a decision shares with
 * other replicas, and what the stats and the seed's API report. Kept apart from the class so
 * that callers (gateway, state store, tokenizer) depend on the shapes, not the implementation.
 */
import type { ContentAnchor } from '../content-anchors.js';
import type { BlockIndexStats } from '../block-index.js';
import type { ChatMessage } from '../hashing.js';
import type { RouteReason } from '../policies/types.js';

/**
 * How the block index learns what workers hold. `precise`: from the engines' KV events
 * (applyStored / applyRemoved / applyCleared), plus short-lived speculative entries for each
 * decision. `approximate`: from the router's own decisions, expiring after a TTL.
 */
export type IndexMode = 'precise' | 'approximate';

/**
 * A request as route() takes it: one way to name its prompt (`tokens`, `blockHashes`, `messages`
 * or `text`; two are refused with a TypeError naming both, none routes a prompt of no blocks),
 * plus metadata.
 */
export interface RouteRequest {
  /** Prompt token ids (hashed per block of blockSize). */
  tokens?: ArrayLike<number>;
  /** Prompt text (completions), hashed in text mode. */
  text?: string;
  /** Chat messages, hashed in text mode over the canonical text of all of them. */
  messages?: readonly ChatMessage[];
  /** Precomputed, already prefix-chained block ids (e.g. a trace's hash_ids). */
  blockHashes?: ArrayLike<number | bigint>;
  /** Tokens per precomputed block (default blockSize). */
  blockTokens?: number;
  /** Prompt length in tokens when it cannot be read off `tokens`. */
  promptTokens?: number;
  /** Position-independent chunks the prompt contains. */
  contentAnchors?: readonly ContentAnchor[];
  /** A seed-style opaque anchor (what selectWorker routes on). */
  anchor?: string;
  claGroup?: number | null;
  workflowId?: string;
  workflowStep?: number | null;
  agentRole?: string;
  /** Never reuse other requests' KV: overlap is ignored and a private cache salt is set. */
  isolate?: boolean;
  lora?: string;
  cacheSalt?: string;
}

export interface RouteOptions {
  /** List every candidate's score terms in the result (allocates; off on the hot path). */
  explain?: boolean;
  /** Count the request as in-flight on the chosen worker until release() (default true). */
  track?: boolean;
  /** Decide without changing any state (the /v1/route dry run). */
  dryRun?: boolean;
  /**
   * Time in ms on the router's clock (default: the clock's reading): a finite number >= 0 (a
   * RangeError naming `now` otherwise), at most MAX_TIME_LEAD_MS (or the prediction lifetime,
   * if longer) past the latest time the router has taken, or its clock's reading if that is
   * later. The router's time never goes back: a `now` earlier than the latest it has taken is
   * read as that latest (see KVAwareRouter.time).
   */
  now?: number;
  /** Workers not to choose this time (e.g. one that just failed the request). */
  exclude?: ReadonlySet<string>;
  /**
   * Unhealthy workers that may be chosen this time as if healthy (never one that is draining,
   * nor one in `exclude`): the gateway's panic routing, which passes the workers held out only
   * by a health check or a metrics scrape that timed out when none is in rotation.
   */
  panicCandidates?: ReadonlySet<string>;
  /**
   * The worker already serving the request (a gateway sent it to a fallback it had been given):
   * the only candidate, taken whether or not it is available now (draining, unhealthy), so the
   * work is counted where it runs. `exclude` and `panicCandidates` do not apply; a worker not
   * registered is no worker.
   */
  servedBy?: string;
  /**
   * What an earlier route() of the same request answered when it found no worker, when this
   * call decides again for it (the gateway's panic routing asks again with `panicCandidates`):
   * that decision leaves getStats().decisionsByReason as this one is counted, so the request
   * counts once, as the decision taken. Nothing is withdrawn by a dry run (it counts nothing).
   * The router cannot tell a result it counted from one it did not: pass only the result of a
   * call that was not a dry run, and only once.
   */
  replaces?: NoWorkerResult;
  /** Put what the decision recorded in `result.shared`, for other router replicas (allocates). */
  share?: boolean;
  /**
   * The caller will report the request's first token with markPrefillDone() (default true).
   * False when it cannot, as for an answer that is not streamed and arrives whole: its prompt
   * would otherwise count as queued prefill until the end. The router then reads the end of
   * the prefill off the engine: the KV event storing the prompt's last full block, or, when the
   * worker already holds it, the scraped waiting queue (docs/routing.md §6).
   */
  firstTokenReported?: boolean;
}

/**
 * What a routing decision taught the router, in a form another router replica can apply with
 * applySharedDecision(): the blocks recorded on the worker, the workflow's step and anchors.
 */
export interface SharedDecision {
  workerId: string;
  /** Hashes of the blocks recorded on the worker (high and low halves), in prompt order. */
  hi: Uint32Array;
  lo: Uint32Array;
  workflowId?: string;
  workflowStep: number | null;
  anchor?: string;
  claGroup: number | null;
  contentAnchors?: readonly ContentAnchor[];
  /**
   * The namespace the content anchors were made under (LoRA adapter, cache salt, CLA group), as
   * 16 hex digits: the root of the request's block chain (hashing.ts chainRoot(), spelt by
   * hashHex()), so every replica keys them as the deciding one did. Present with content
   * anchors; left out (a decision of an earlier release), they are taken as made under
   * `claGroup` alone.
   */
  anchorNamespace?: string;
  /** Uncached prompt tokens the decision queued on the worker (0 when not tracked). */
  prefillTokens: number;
  /** KV tokens the request holds on the worker once its prefill is done (0 when not tracked). */
  decodeTokens: number;
  tracked: boolean;
  /**
   * Names a tracked decision among the fleet's (the deciding router's instance id and its
   * ticket): the replicas that applied it withdraw what it added there if its engine refuses
   * it (KVAwareRouter.refuseSharedDecision()), until they hear of its prefill or end.
   */
  id?: string;
}

/** Hears of a prefill the router read off the engine: its ticket and the decision it shared, if any. */
export type PrefillReadListener = (ticket: number, shared: SharedDecision | undefined) => void;

/** In-flight work on a worker, as one router replica counts it. */
export interface InFlightLoad {
  inFlightRequests: number;
  queuedPrefillTokens: number;
  activeDecodeTokens: number;
}

export interface CandidateExplain {
  worker: string;
  chosen: boolean;
  overlapBlocks: number;
  offloadBlocks: number;
  predictedBlocks: number;
  anchorTokens: number;
  cachedTokens: number;
  kvUsage: number;
  queuedPrefillTokens: number;
  activeDecodeTokens: number;
  inFlightRequests: number;
  servesCla: boolean;
  continuity: boolean;
  terms: Record<string, number | boolean>;
}

/** What every route() result carries, whether or not a worker was chosen. */
export interface RouteResultFields {
  /** The chosen worker; '' when none (then `noWorker` says why). */
  workerId: string;
  /** Prompt tokens predicted to be cached on the chosen worker. */
  cachedTokens: number;
  promptTokens: number;
  /** 0-1 (see RouteDecision). */
  confidence: number;
  policy: string;
  /** The rule that chose; 'none' when no worker was chosen. */
  reason: RouteReason;
  /** Full blocks the prompt was cut into. */
  blocks: number;
  /** Set for isolated requests: pass it to the engine as `cache_salt`. */
  cacheSalt?: string;
  /** With RouteOptions.share: what this decision recorded, for other replicas. */
  shared?: SharedDecision;
  /** Handle for markPrefillDone()/release(); 0 when not tracked. */
  ticket: number;
  explain?: CandidateExplain[];
  preRope: true;
}

/** A request routed to a worker. */
export interface RoutedResult extends RouteResultFields {
  noWorker?: undefined;
}

/** No worker could take the request: `workerId` is '', `reason` 'none', `noWorker` says why. */
export interface NoWorkerResult extends RouteResultFields {
  workerId: '';
  noWorker: NoWorker;
}

/** What route() returns; branch on `noWorker` (set only when no worker was chosen). */
export type RouteResult = RoutedResult | NoWorkerResult;

/**
 * Why no worker was chosen. `no-workers`: none is registered. `none-available`: every
 * registered worker is draining or unhealthy. `all-excluded`: every available worker is in
 * RouteOptions.exclude. `policy-declined`: there were candidates and the policy chose none.
 */
export type NoWorkerReason = 'no-workers' | 'none-available' | 'all-excluded' | 'policy-declined';

export interface NoWorker {
  reason: NoWorkerReason;
  /** Registered workers. */
  workers: number;
  /** Of those, draining or unhealthy. */
  unavailable: number;
  /** Of the available ones, excluded by RouteOptions.exclude. */
  excluded: number;
}

export interface SelectWorkerOptions {
  claGroup?: number | null;
  workflowStep?: number | null;
  /** Prompt length in tokens; with recorded blocks it sharpens the cached-fraction estimate. */
  tokenLength?: number;
  /** Identifies a multi-agent workflow; consecutive steps prefer the same worker. */
  workflowId?: string;
}

export interface UpdateWorkerStateOptions {
  claGroup?: number | null;
  workflowStep?: number | null;
}

/** Engine-reported load (from /metrics). Omitted fields keep their values. */
export interface WorkerMetrics {
  kvUsage?: number;
  /**
   * Requests in the engine's waiting queue (vllm:num_requests_waiting, sglang:num_queue_reqs);
   * a count above MAX_ENGINE_REQUESTS (10^9) is taken as that many, as is runningRequests.
   */
  waitingRequests?: number;
  /**
   * When the engine was read, on the router's clock (default: now): a finite number >= 0, at
   * most as far past the router's time as a route()'s `now`. Requests routed after it are not
   * in `waitingRequests`.
   */
  sampledAt?: number;
  runningRequests?: number;
  /**
   * KV-cache capacity in tokens, a whole number (vLLM: kv_cache_size_tokens of cache_config_info, else
   * num_gpu_blocks × block_size; SGLang: max_total_num_tokens).
   */
  kvCapacityTokens?: number;
}

/** The seed's RouteDecision. INVARIANT 10: decisions are made on metadata; preRope is always true. */
export interface RouteDecision {
  /** '' when no worker can take the request. */
  targetWorkerId: string;
  anchorHash: string;
  claGroup: number | null;
  /** 0-1. Seed: 0.9 / 0.75 / 0.5 by rule. Others: estimated fraction of the KV already on the worker. */
  confidence: number;
  preRope: true;
}

export interface WorkerLoadStats {
  /** Rounded to 3 decimals, as the seed. */
  load: number;
  claGroups: number;
  activeBlocks: number;
}

export interface RouterStats {
  numWorkers: number;
  anchorsTracked: number;
  claAffinityEnabled: boolean;
  anchorLocalityEnabled: boolean;
  workerLoads: Record<string, WorkerLoadStats>;
  policy: string;
  indexMode: IndexMode;
  anchorCapacity: number;
  anchorEvictions: number;
  workflowsTracked: number;
  contentAnchorsTracked: number;
  drainingWorkers: string[];
  inFlightRequests: number;
  /**
   * Decisions made so far, by the rule that made them (the policy's `reason`): at most 64
   * reasons count under their own key (MAX_DECISION_REASONS), decisions of any further one
   * under 'other'.
   */
  decisionsByReason: Partial<Record<RouteReason, number>>;
  index: BlockIndexStats;
}

/** Blocks hashed into a block sequence: what applyStored/applyRemoved take. */
export interface BlockSequence {
  readonly hi: ArrayLike<number>;
  readonly lo: ArrayLike<number>;
  /** Blocks given: the first `length` of `hi` and `lo` (at most their length). */
  readonly length: number;
}
