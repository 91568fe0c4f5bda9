import { AnchorTable } from './anchor-table.js';
import { BlockIndex, OverlapResult, Tier, type BlockIndexStats } from './block-index.js';
import { ContentAnchorIndex, type ContentAnchor } from './content-anchors.js';
import {
  BlockHashes,
  canonicalChatText,
  hashPrecomputedBlocks,
  hashString32,
  hashTextBlocks,
  hashTokenBlocks,
  type ChatMessage,
  type HashNamespace,
} from './hashing.js';
import { createPolicy, resolveCostWeights, type CostWeights, type PolicyOptions } from './policies/index.js';
import type { Candidate, RouteFeatures, RouteReason, RoutingPolicy } from './policies/types.js';
import { createRng } from './rng.js';
import { roundHalfEven3 } from './round.js';
import * as check from './validate.js';
import { WorkflowTable } from './workflow-table.js';
import { WorkerRegistry, type WorkerInfo, type WorkerState } from './worker-registry.js';

/**
 * How the block index learns what workers hold. `precise`: from the engines' KV events
 * (applyStored / applyRemoved / applyCleared), plus short-lived speculative entries for each
 * decision. `approximate`: from the router's own decisions, expiring after a TTL.
 */
export type IndexMode = 'precise' | 'approximate';

export interface KVAwareRouterOptions {
  /** Informational, as in the seed. */
  numWorkers?: number;
  /** Prefer workers that serve the request's CLA group (default true). */
  enableClaAffinity?: boolean;
  /** Prefer workers that hold the request's KV (default true). */
  enableAnchorLocality?: boolean;
  /** 'cost' (default), 'seed', or a baseline / peer policy (see POLICY_NAMES). */
  policy?: string;
  /** Most seed-API anchors remembered, least recently used evicted beyond (default 100,000). */
  anchorCapacity?: number;
  /** Most workflows remembered for step continuity (default 10,000). */
  workflowCapacity?: number;
  /** Tokens per KV block; must equal the engines' block size (default 16, vLLM's). */
  blockSize?: number;
  /** Bytes per chunk when hashing text (default 64, about 16 tokens of English). */
  textChunkBytes?: number;
  /** Default 'approximate'; 'precise' when engines' KV events feed the index. */
  indexMode?: IndexMode;
  /** Lifetime of the router's own block records: 120 s approximate, 5 s speculative (precise). */
  predictionTtlMs?: number;
  /**
   * Precise mode: speculative entries cover this many blocks past what the chosen worker
   * already holds (default 16). Enough to pull a burst of siblings to the same worker; the
   * engine's BlockStored events bring the rest moments later, so unique tails cost nothing.
   */
  speculativeBlocks?: number;
  /** Most (block, worker) entries in the block index (default 4,000,000). */
  maxIndexEntries?: number;
  /** Credit of an offloaded (CPU/disk) block relative to a GPU block (default 0.75). */
  offloadCredit?: number;
  /** Credit of a block known only from the router's own prediction (default 1). */
  predictedCredit?: number;
  /** Score content anchors a worker holds as cached tokens (default true); false scores the prefix only. */
  contentAnchorScoring?: boolean;
  /** Most content anchors remembered (default 100,000) and their TTL (default 600 s). */
  contentAnchorCapacity?: number;
  contentAnchorTtlMs?: number;
  /** Agent roles that never reuse other requests' KV (judges); default none. */
  judgeRoles?: readonly string[];
  /** Weights of the 'cost' policy; unspecified ones keep their defaults. */
  costWeights?: Partial<CostWeights>;
  /** Options of the peer policies (dynamo, sglang, llmd). */
  policyOptions?: Omit<PolicyOptions, 'costWeights'>;
  /** Seed of the random source sampling policies use (default 1). */
  randomSeed?: number;
  /** Clock in ms for TTLs (default Date.now); the simulator passes simulated time. */
  clock?: () => number;
  /** Distinguishes this router's isolation salts from other replicas' (default random). */
  instanceId?: string;
}

/** A request as route() takes it: one way to name its prompt, plus metadata. */
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
  /** Expected output tokens (for decode load); default 0. */
  outputTokens?: number;
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
  /** Time in ms (default: the router's clock). */
  now?: number;
  /** Workers not to choose this time (e.g. one that just failed the request). */
  exclude?: ReadonlySet<string>;
  /** Put what the decision recorded in `result.shared`, for other router replicas (allocates). */
  share?: boolean;
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
  /** Uncached prompt tokens the decision queued on the worker (0 when not tracked). */
  prefillTokens: number;
  tracked: boolean;
}

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

export interface RouteResult {
  /** '' when no worker can take the request. */
  workerId: string;
  /** Prompt tokens predicted to be cached on the chosen worker. */
  cachedTokens: number;
  promptTokens: number;
  /** 0-1 (see RouteDecision). */
  confidence: number;
  policy: string;
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
  waitingRequests?: number;
  runningRequests?: number;
  /** KV-cache capacity in tokens (vLLM: num_gpu_blocks × block_size of cache_config_info). */
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
  /** Decisions made so far, by the rule that made them. */
  decisionsByReason: Partial<Record<RouteReason, number>>;
  index: BlockIndexStats;
}

/** Blocks hashed into a block sequence: what applyStored/applyRemoved take. */
export interface BlockSequence {
  readonly hi: ArrayLike<number>;
  readonly lo: ArrayLike<number>;
  readonly length: number;
}

interface Ticket {
  worker: WorkerState;
  /** Uncached prompt tokens still counted as queued prefill. */
  prefill: number;
  /** KV tokens counted as decoding once prefill is done. */
  kvTokens: number;
  prefilled: boolean;
}

const DEFAULTS = {
  anchorCapacity: 100_000,
  workflowCapacity: 10_000,
  blockSize: 16,
  textChunkBytes: 64,
  approximateTtlMs: 120_000,
  speculativeTtlMs: 5_000,
  maxIndexEntries: 4_000_000,
  contentAnchorCapacity: 100_000,
  contentAnchorTtlMs: 600_000,
};


/**
 * ContextForge's KV-aware router: the seed's API (`../shared/seed/kv_aware_router.py`) and
 * the request-level route() over a block index and pluggable policies. Every method's work
 * is synchronous, so state-changing calls are atomic with respect to each other, which is
 * what the seed's asyncio.Lock guaranteed; the seed's coroutine methods stay async.
 */
export class KVAwareRouter {
  readonly numWorkers: number;
  readonly claAffinityEnabled: boolean;
  readonly anchorLocalityEnabled: boolean;
  readonly policy: RoutingPolicy;
  readonly costWeights: Readonly<CostWeights>;
  readonly blockSize: number;
  readonly textChunkBytes: number;
  readonly indexMode: IndexMode;
  readonly index: BlockIndex;

  private readonly workers = new WorkerRegistry();
  private readonly anchors: AnchorTable;
  private readonly workflows: WorkflowTable;
  private readonly contentAnchors: ContentAnchorIndex;
  private readonly speculativeBlocks: number;
  private readonly contentAnchorScoring: boolean;
  private readonly offloadCredit: number;
  private readonly predictedCredit: number;
  private readonly judgeRoles: ReadonlySet<string>;
  private readonly clock: () => number;
  private readonly instanceId: string;
  /** The seed never counts blocks; under policy 'seed' activeBlocks stays 0 as there. */
  private readonly countsBlocks: boolean;
  private readonly decisions: Partial<Record<RouteReason, number>> = {};
  private readonly tickets = new Map<number, Ticket>();
  private nextTicket = 1;
  private isolationCounter = 0;

  // scratch reused by every route(): the route path allocates little
  private readonly candidates: Candidate[] = [];
  private readonly hashes = new BlockHashes(1024);
  private readonly overlap = new OverlapResult(32);
  private readonly hashNs: HashNamespace = {};

  constructor(options: KVAwareRouterOptions = {}) {
    if (options === null || typeof options !== 'object') throw new TypeError('options must be an object');
    this.numWorkers = check.positiveInt(options.numWorkers, 'numWorkers', 1);
    this.claAffinityEnabled = optionalBool(options.enableClaAffinity, 'enableClaAffinity', true);
    this.anchorLocalityEnabled = optionalBool(options.enableAnchorLocality, 'enableAnchorLocality', true);
    const policyName = options.policy ?? 'cost';
    if (typeof policyName !== 'string') throw new TypeError('policy must be a string');
    this.costWeights = resolveCostWeights(options.costWeights);
    const random = createRng(check.nonNegativeInt(options.randomSeed, 'randomSeed', 1));
    this.policy = createPolicy(policyName, { ...options.policyOptions, costWeights: this.costWeights }, { random });
    this.countsBlocks = policyName !== 'seed';
    this.anchors = new AnchorTable(check.positiveInt(options.anchorCapacity, 'anchorCapacity', DEFAULTS.anchorCapacity));
    this.workflows = new WorkflowTable(check.positiveInt(options.workflowCapacity, 'workflowCapacity', DEFAULTS.workflowCapacity));
    this.blockSize = check.positiveInt(options.blockSize, 'blockSize', DEFAULTS.blockSize);
    this.textChunkBytes = check.positiveInt(options.textChunkBytes, 'textChunkBytes', DEFAULTS.textChunkBytes);
    if (this.textChunkBytes % 4 !== 0) throw new RangeError(`textChunkBytes must be a multiple of 4, got ${this.textChunkBytes}`);
    const mode = options.indexMode ?? 'approximate';
    if (mode !== 'precise' && mode !== 'approximate') throw new RangeError(`indexMode must be 'precise' or 'approximate', got '${String(mode)}'`);
    this.indexMode = mode;
    const ttl = options.predictionTtlMs ?? (mode === 'precise' ? DEFAULTS.speculativeTtlMs : DEFAULTS.approximateTtlMs);
    check.finiteNonNegative(ttl, 'predictionTtlMs');
    this.index = new BlockIndex({
      maxEntries: check.positiveInt(options.maxIndexEntries, 'maxIndexEntries', DEFAULTS.maxIndexEntries),
      predictedTtlMs: Math.max(ttl, 1),
    });
    this.contentAnchorScoring = optionalBool(options.contentAnchorScoring, 'contentAnchorScoring', true);
    this.speculativeBlocks = check.nonNegativeInt(options.speculativeBlocks, 'speculativeBlocks', 16);
    this.offloadCredit = check.fraction(options.offloadCredit ?? 0.75, 'offloadCredit');
    this.predictedCredit = check.fraction(options.predictedCredit ?? 1, 'predictedCredit');
    this.contentAnchors = new ContentAnchorIndex(
      check.positiveInt(options.contentAnchorCapacity, 'contentAnchorCapacity', DEFAULTS.contentAnchorCapacity),
      check.finiteNonNegative(options.contentAnchorTtlMs ?? DEFAULTS.contentAnchorTtlMs, 'contentAnchorTtlMs'),
    );
    const roles = options.judgeRoles ?? [];
    if (!Array.isArray(roles)) throw new TypeError('judgeRoles must be an array of strings');
    this.judgeRoles = new Set(roles.map((r, i) => check.requireId(r, `judgeRoles[${i}]`)));
    if (options.clock !== undefined && typeof options.clock !== 'function') throw new TypeError('clock must be a function');
    this.clock = options.clock ?? Date.now;
    this.instanceId = check.optionalId(options.instanceId, 'instanceId') ?? globalThis.crypto.randomUUID().slice(0, 8);
  }

  // ------------------------------------------------------------------------- workers

  /** Registers a worker; registering a known id again changes nothing. */
  registerWorker(workerId: string, info?: WorkerInfo): void {
    this.workers.register(check.requireId(workerId, 'workerId'), info);
  }

  /** Forgets a worker and everything recorded on it. Returns whether it was known. */
  removeWorker(workerId: string): boolean {
    check.requireId(workerId, 'workerId');
    const state = this.workers.remove(workerId);
    if (!state) return false;
    this.anchors.dropWorker(workerId);
    this.workflows.dropWorker(workerId);
    this.index.applyCleared(state.slot);
    this.contentAnchors.remove(state.slot);
    return true;
  }

  /**
   * Stops sending new requests to a worker. What it holds stays recorded and is re-homed on
   * the next use. `resumeWorker` undoes it.
   */
  drainWorker(workerId: string): void {
    this.requireRegistered(workerId).draining = true;
  }

  resumeWorker(workerId: string): void {
    this.requireRegistered(workerId).draining = false;
  }

  /** Health from the gateway's checks: an unhealthy worker gets no requests but keeps its state. */
  setWorkerHealth(workerId: string, healthy: boolean): void {
    if (typeof healthy !== 'boolean') throw new TypeError('healthy must be a boolean');
    this.requireRegistered(workerId).healthy = healthy;
  }

  /** Engine-reported load, e.g. scraped from /metrics. */
  updateWorkerMetrics(workerId: string, metrics: WorkerMetrics): void {
    const w = this.requireRegistered(workerId);
    if (metrics.kvUsage !== undefined) w.load = check.load(metrics.kvUsage, 'kvUsage');
    if (metrics.waitingRequests !== undefined) w.waitingRequests = check.finiteNonNegative(metrics.waitingRequests, 'waitingRequests');
    if (metrics.runningRequests !== undefined) w.runningRequests = check.finiteNonNegative(metrics.runningRequests, 'runningRequests');
    if (metrics.kvCapacityTokens !== undefined) w.kvCapacityTokens = check.finiteNonNegative(metrics.kvCapacityTokens, 'kvCapacityTokens');
  }

  /** Workers in registration order (read-only views). */
  listWorkers(): readonly WorkerState[] {
    return [...this.workers.values()];
  }

  // --------------------------------------------------------------- KV events (precise)

  /** The worker stored these blocks (sequence hashes as from hashTokens). */
  applyStored(workerId: string, blocks: BlockSequence, tier: 'gpu' | 'offload' = 'gpu'): void {
    const w = this.requireRegistered(workerId);
    this.index.applyStored(w.slot, blocks.hi, blocks.lo, 0, blocks.length, tier === 'offload' ? Tier.Offload : Tier.Gpu);
  }

  /** The worker evicted these blocks; without a tier, from every tier. */
  applyRemoved(workerId: string, blocks: BlockSequence, tier?: 'gpu' | 'offload'): void {
    const w = this.requireRegistered(workerId);
    const t = tier === undefined ? undefined : tier === 'offload' ? Tier.Offload : Tier.Gpu;
    this.index.applyRemoved(w.slot, blocks.hi, blocks.lo, 0, blocks.length, t);
  }

  /** The worker dropped all its blocks (AllBlocksCleared), or its events can no longer be trusted. */
  applyCleared(workerId: string): void {
    const w = this.requireRegistered(workerId);
    this.index.applyCleared(w.slot);
  }

  /** Sequence hashes of token ids as this router computes them (a fresh copy). */
  hashTokens(tokens: ArrayLike<number>, ns?: HashNamespace): BlockHashes {
    return hashTokenBlocks(tokens, this.blockSize, ns, new BlockHashes(Math.max(1, Math.floor(tokens.length / this.blockSize))));
  }

  // ------------------------------------------------------------------------ routing

  /**
   * Routes one request: hash → index lookup → candidates → policy. Unless `dryRun`, the
   * decision is recorded (predicted blocks, content anchors, anchor home, workflow step) and,
   * unless `track: false`, counted as in-flight work until release().
   */
  route(request: RouteRequest, options: RouteOptions = {}): RouteResult {
    if (request === null || typeof request !== 'object') throw new TypeError('request must be an object');
    const now = options.now ?? this.clock();
    const claGroup = check.optionalNonNegativeInt(request.claGroup, 'claGroup');
    const workflowStep = check.optionalNonNegativeInt(request.workflowStep, 'workflowStep');
    const workflowId = check.optionalId(request.workflowId, 'workflowId');
    const anchor = check.optionalId(request.anchor, 'anchor');
    const contentAnchors = request.contentAnchors ? checkContentAnchors(request.contentAnchors) : undefined;
    if (request.isolate !== undefined && typeof request.isolate !== 'boolean') throw new TypeError('isolate must be a boolean');
    const isolated = request.isolate === true || (request.agentRole !== undefined && this.judgeRoles.has(request.agentRole));

    // isolated requests hash under a private salt: their blocks match nothing else
    const cacheSalt = isolated ? `cf-${this.instanceId}-${(++this.isolationCounter).toString(36)}` : check.optionalId(request.cacheSalt, 'cacheSalt');
    const ns = this.hashNs;
    ns.lora = check.optionalId(request.lora, 'lora') ?? null;
    ns.cacheSalt = cacheSalt ?? null;
    ns.claGroup = claGroup;
    const hashes = this.hashRequest(request, ns);
    const promptTokens = this.promptTokensOf(request, hashes);

    const overlap = this.overlap;
    if (!isolated && this.anchorLocalityEnabled && hashes.length > 0) {
      this.index.overlaps(hashes.hi, hashes.lo, hashes.length, overlap, now);
    } else {
      overlap.ensureSlots(this.workers.slotCount);
      overlap.blocks.fill(0);
      overlap.offloadBlocks.fill(0);
      overlap.predictedBlocks.fill(0);
      overlap.maxBlocks = 0;
    }

    const candidates = this.collectCandidates(anchor, claGroup, promptTokens, workflowId, contentAnchors, isolated, now, options.exclude);
    const features: RouteFeatures = {
      claGroup,
      promptTokens,
      requestBlocks: hashes.length,
      blockSize: hashes.tokensPerBlock || this.blockSize,
      routingKey: hashes.length > 0 ? hashes.lo[Math.min(hashes.length, 4) - 1] : anchor ? hashString32(anchor) : 0,
      sharedPrefixKey: overlap.maxBlocks > 0 ? hashes.lo[Math.min(overlap.maxBlocks, hashes.length) - 1] : anchor ? hashString32(anchor) : 0,
    };
    const choice = this.policy.choose(candidates, features);
    const chosen = choice.index >= 0 ? candidates[choice.index] : undefined;

    const result: RouteResult = {
      workerId: chosen ? chosen.worker.id : '',
      cachedTokens: chosen ? chosen.cachedTokens : 0,
      promptTokens,
      confidence: choice.confidence,
      policy: this.policy.name,
      reason: choice.reason,
      blocks: hashes.length,
      ticket: 0,
      preRope: true,
    };
    if (cacheSalt !== undefined && isolated) result.cacheSalt = cacheSalt;
    if (options.explain) result.explain = this.explain(candidates, features, choice.index);
    if (options.dryRun) return result;

    this.decisions[choice.reason] = (this.decisions[choice.reason] ?? 0) + 1;
    if (!chosen) return result;
    this.policy.commit?.(chosen, features);
    const worker = chosen.worker;
    let start = 0;
    let end = 0;
    if (!isolated) {
      if (hashes.length > 0) {
        // approximate: every block (refreshing the TTL); precise: a speculative stretch past
        // what the worker holds
        end = this.indexMode === 'precise' ? Math.min(hashes.length, chosen.overlapBlocks + this.speculativeBlocks) : hashes.length;
        start = this.indexMode === 'precise' ? chosen.overlapBlocks : 0;
        if (end > start) this.index.recordPredicted(worker.slot, hashes.hi, hashes.lo, start, end, now);
      }
      if (contentAnchors && contentAnchors.length > 0) this.contentAnchors.record(worker.slot, contentAnchors, now);
    }
    const tracked = options.track !== false;
    const uncached = Math.max(0, promptTokens - chosen.cachedTokens);
    if (options.share) {
      // the predicted range only: in precise mode what the worker holds comes from its own events
      const n = Math.max(0, end - start);
      result.shared = {
        workerId: worker.id, hi: hashes.hi.slice(start, start + n), lo: hashes.lo.slice(start, start + n),
        workflowId, workflowStep, anchor, claGroup, contentAnchors: isolated ? undefined : contentAnchors,
        prefillTokens: tracked ? uncached : 0, tracked,
      };
    }
    if (anchor !== undefined) this.anchors.home(anchor, worker.id, claGroup);
    if (workflowId !== undefined) this.workflows.record(workflowId, worker.id, workflowStep);
    if (tracked) {
      const ticket = this.nextTicket++;
      this.tickets.set(ticket, { worker, prefill: uncached, kvTokens: promptTokens, prefilled: false });
      worker.queuedPrefillTokens += uncached;
      worker.inFlightRequests++;
      result.ticket = ticket;
    }
    return result;
  }

  /**
   * Applies another replica's decision (see RouteOptions.share): its blocks become predicted
   * entries on the worker, and the workflow and anchors follow it. False when the worker is
   * not registered here (yet), so nothing was applied.
   */
  applySharedDecision(d: Omit<SharedDecision, 'prefillTokens' | 'tracked'>, now: number = this.clock()): boolean {
    const worker = this.workers.get(d.workerId);
    if (!worker) return false;
    if (d.hi.length !== d.lo.length) throw new RangeError('shared decision: hi and lo differ in length');
    if (d.hi.length > 0) this.index.recordPredicted(worker.slot, d.hi, d.lo, 0, d.hi.length, now);
    if (d.contentAnchors && d.contentAnchors.length > 0) this.contentAnchors.record(worker.slot, checkContentAnchors(d.contentAnchors), now);
    if (d.anchor !== undefined) this.anchors.home(d.anchor, worker.id, d.claGroup);
    if (d.workflowId !== undefined) this.workflows.record(d.workflowId, worker.id, d.workflowStep);
    return true;
  }

  /** The worker a workflow's latest step ran on, as far as this router knows. */
  workflowAffinity(workflowId: string): { workerId: string; step: number | null } | undefined {
    return this.workflows.peek(workflowId);
  }

  /** Sets a workflow's worker (the shared state's word for it, which wins); ignored for unknown workers. */
  setWorkflowAffinity(workflowId: string, workerId: string, step: number | null = null): void {
    if (!this.workers.get(workerId)) return;
    this.workflows.set(check.requireId(workflowId, 'workflowId'), workerId, step);
  }

  /** Every workflow this router remembers, least recently used first. */
  workflowAffinities(): IterableIterator<[string, { workerId: string; step: number | null }]> {
    return this.workflows.all();
  }

  /** This replica's own in-flight work on a worker (what it shares with the others). */
  localLoad(workerId: string): InFlightLoad {
    const w = this.requireRegistered(workerId);
    return {
      inFlightRequests: Math.max(0, w.inFlightRequests - w.remoteInFlightRequests),
      queuedPrefillTokens: Math.max(0, w.queuedPrefillTokens - w.remoteQueuedPrefillTokens),
      activeDecodeTokens: Math.max(0, w.activeDecodeTokens - w.remoteActiveDecodeTokens),
    };
  }

  /**
   * The in-flight work other replicas have on a worker (their sum): policies then see the
   * whole fleet's load, not just this replica's, and replicas do not pile onto one worker.
   */
  setRemoteLoad(workerId: string, load: InFlightLoad): void {
    const w = this.requireRegistered(workerId);
    const requests = check.finiteNonNegative(load.inFlightRequests, 'inFlightRequests');
    const prefill = check.finiteNonNegative(load.queuedPrefillTokens, 'queuedPrefillTokens');
    const decode = check.finiteNonNegative(load.activeDecodeTokens, 'activeDecodeTokens');
    w.inFlightRequests += requests - w.remoteInFlightRequests;
    w.queuedPrefillTokens += prefill - w.remoteQueuedPrefillTokens;
    w.activeDecodeTokens += decode - w.remoteActiveDecodeTokens;
    w.remoteInFlightRequests = requests;
    w.remoteQueuedPrefillTokens = prefill;
    w.remoteActiveDecodeTokens = decode;
  }

  /** The request's prefill finished (first token seen): its work moves from prefill to decode. */
  markPrefillDone(ticket: number): void {
    const t = this.tickets.get(ticket);
    if (!t || t.prefilled) return;
    t.worker.queuedPrefillTokens = Math.max(0, t.worker.queuedPrefillTokens - t.prefill);
    t.worker.activeDecodeTokens += t.kvTokens;
    t.prefilled = true;
    t.prefill = 0;
  }

  /** The request completed, failed or was abandoned: its work leaves the worker. Idempotent. */
  release(ticket: number): void {
    const t = this.tickets.get(ticket);
    if (!t) return;
    this.tickets.delete(ticket);
    const w = t.worker;
    w.queuedPrefillTokens = Math.max(0, w.queuedPrefillTokens - t.prefill);
    if (t.prefilled) w.activeDecodeTokens = Math.max(0, w.activeDecodeTokens - t.kvTokens);
    w.inFlightRequests = Math.max(0, w.inFlightRequests - 1);
  }

  // --------------------------------------------------------------- the seed's API

  async selectWorker(anchorHash: string, opts: SelectWorkerOptions = {}): Promise<RouteDecision> {
    check.requireId(anchorHash, 'anchorHash');
    if (opts === null || typeof opts !== 'object') throw new TypeError('opts must be an object');
    const tokenLength = check.nonNegativeInt(opts.tokenLength, 'tokenLength', 0);
    const r = this.route(
      { anchor: anchorHash, claGroup: opts.claGroup, workflowStep: opts.workflowStep, workflowId: opts.workflowId, promptTokens: tokenLength },
      { track: false },
    );
    const claGroup = opts.claGroup ?? null;
    return { targetWorkerId: r.workerId, anchorHash, claGroup, confidence: r.confidence, preRope: true };
  }

  async updateWorkerState(workerId: string, load: number, opts: UpdateWorkerStateOptions = {}): Promise<void> {
    check.requireId(workerId, 'workerId');
    const clamped = check.load(load, 'load');
    if (opts === null || typeof opts !== 'object') throw new TypeError('opts must be an object');
    const claGroup = check.optionalNonNegativeInt(opts.claGroup, 'claGroup');
    const workflowStep = check.optionalNonNegativeInt(opts.workflowStep, 'workflowStep');
    const state = this.workers.register(workerId);
    state.load = clamped;
    if (claGroup !== null) state.claGroups.add(claGroup);
    if (workflowStep !== null) state.lastUsedStep = workflowStep;
  }

  /** Records that `targetWorkerId` now holds the anchor's blocks (registered or not, as the seed). */
  async broadcastNewBlocks(anchorHash: string, blockIds: string[], targetWorkerId: string): Promise<void> {
    check.requireId(anchorHash, 'anchorHash');
    check.idList(blockIds, 'blockIds');
    check.requireId(targetWorkerId, 'targetWorkerId');
    this.anchors.recordBlocks(anchorHash, blockIds, targetWorkerId);
  }

  getWorkerForAnchor(anchorHash: string): string | undefined {
    check.requireId(anchorHash, 'anchorHash');
    return this.anchors.peek(anchorHash)?.workerId;
  }

  getStats(): RouterStats {
    const workerLoads: Record<string, WorkerLoadStats> = {};
    const drainingWorkers: string[] = [];
    for (const w of this.workers.values()) {
      workerLoads[w.id] = {
        load: roundHalfEven3(w.load),
        claGroups: w.claGroups.size,
        activeBlocks: this.countsBlocks ? this.anchors.blocksOn(w.id) + this.index.entriesFor(w.slot) : 0,
      };
      if (w.draining) drainingWorkers.push(w.id);
    }
    return {
      numWorkers: this.workers.size,
      anchorsTracked: this.anchors.size,
      claAffinityEnabled: this.claAffinityEnabled,
      anchorLocalityEnabled: this.anchorLocalityEnabled,
      workerLoads,
      policy: this.policy.name,
      indexMode: this.indexMode,
      anchorCapacity: this.anchors.capacity,
      anchorEvictions: this.anchors.evictions,
      workflowsTracked: this.workflows.size,
      contentAnchorsTracked: this.contentAnchors.size,
      drainingWorkers,
      inFlightRequests: this.tickets.size,
      decisionsByReason: { ...this.decisions },
      index: this.index.stats(),
    };
  }

  // ------------------------------------------------------------------------ internals

  /** Prompt length: counted from tokens, else as given, else estimated from the blocks. */
  private promptTokensOf(request: RouteRequest, hashes: BlockHashes): number {
    if (request.tokens !== undefined) return request.tokens.length;
    const given = check.nonNegativeInt(request.promptTokens, 'promptTokens', 0);
    if (given > 0 || hashes.length === 0) return given;
    // text: about 4 bytes of UTF-8 per token; half a chunk for the unhashed tail
    const textTail = request.text !== undefined || request.messages !== undefined ? hashes.tokensPerBlock / 2 : 0;
    return Math.round(hashes.length * hashes.tokensPerBlock + textTail);
  }

  private hashRequest(request: RouteRequest, ns: HashNamespace): BlockHashes {
    const hashes = this.hashes;
    if (request.tokens !== undefined) {
      if (typeof request.tokens !== 'object' || typeof request.tokens.length !== 'number') throw new TypeError('tokens must be an array of token ids');
      hashTokenBlocks(request.tokens, this.blockSize, ns, hashes);
    } else if (request.blockHashes !== undefined) {
      if (typeof request.blockHashes !== 'object' || typeof request.blockHashes.length !== 'number') throw new TypeError('blockHashes must be an array');
      hashPrecomputedBlocks(request.blockHashes, check.positiveInt(request.blockTokens, 'blockTokens', this.blockSize), ns, hashes);
    } else if (request.messages !== undefined) {
      if (!Array.isArray(request.messages)) throw new TypeError('messages must be an array');
      request.messages.forEach((m, i) => {
        if (m === null || typeof m !== 'object' || typeof m.role !== 'string') throw new TypeError(`messages[${i}] must be an object with a string role`);
      });
      hashTextBlocks(canonicalChatText(request.messages), this.textChunkBytes, ns, hashes);
      hashes.tokensPerBlock = this.textChunkBytes / 4;
    } else if (request.text !== undefined) {
      if (typeof request.text !== 'string') throw new TypeError('text must be a string');
      hashTextBlocks(request.text, this.textChunkBytes, ns, hashes);
      hashes.tokensPerBlock = this.textChunkBytes / 4;
    } else {
      hashes.length = 0;
      hashes.tokensPerBlock = this.blockSize;
    }
    return hashes;
  }

  /** Available workers (registered, not draining, healthy) in registration order, with their features. */
  private collectCandidates(
    anchorHash: string | undefined,
    claGroup: number | null,
    promptTokens: number,
    workflowId: string | undefined,
    contentAnchors: readonly ContentAnchor[] | undefined,
    isolated: boolean,
    now: number,
    exclude: ReadonlySet<string> | undefined,
  ): readonly Candidate[] {
    const locality = this.anchorLocalityEnabled && !isolated;
    const anchor = locality && anchorHash !== undefined ? this.anchors.peek(anchorHash) : undefined;
    const previousStepWorker = workflowId !== undefined ? this.workflows.peek(workflowId)?.workerId : undefined;
    const o = this.overlap;
    const tokensPerBlock = this.hashes.tokensPerBlock || this.blockSize;
    const candidates = this.candidates;
    let n = 0;
    for (const worker of this.workers.values()) {
      if (!worker.available || exclude?.has(worker.id)) continue;
      const slot = worker.slot;
      const overlapBlocks = slot < o.blocks.length ? o.blocks[slot] : 0;
      const offloadBlocks = overlapBlocks > 0 ? o.offloadBlocks[slot] : 0;
      const predictedBlocks = overlapBlocks > 0 ? o.predictedBlocks[slot] : 0;
      const anchorTokens = locality && contentAnchors && this.contentAnchorScoring ? this.contentAnchors.heldTokens(slot, contentAnchors, now) : 0;
      const credit = overlapBlocks - offloadBlocks - predictedBlocks + offloadBlocks * this.offloadCredit + predictedBlocks * this.predictedCredit;
      let cachedTokens = credit * tokensPerBlock + anchorTokens;
      if (promptTokens > 0 && cachedTokens > promptTokens) cachedTokens = promptTokens;
      let holdsAnchor: boolean;
      let cachedFraction = promptTokens > 0 ? cachedTokens / promptTokens : 0;
      if (anchorHash !== undefined) {
        // the seed's anchor: its home in the anchor table, KV reusable within its CLA group
        holdsAnchor = anchor !== undefined && anchor.workerId === worker.id;
        if (holdsAnchor && cachedTokens === 0 && (claGroup === null || anchor!.claGroup === null || anchor!.claGroup === claGroup)) {
          const blocks = anchor!.blocks?.size ?? 0;
          cachedFraction = promptTokens > 0 && blocks > 0 ? Math.min(1, (blocks * this.blockSize) / promptTokens) : 1;
          cachedTokens = cachedFraction * promptTokens;
        }
      } else {
        // without one, the anchor's home is the worker holding the longest cached prefix
        holdsAnchor = overlapBlocks > 0 && overlapBlocks === o.maxBlocks;
      }
      const servesCla = this.claAffinityEnabled && claGroup !== null && worker.claGroups.has(claGroup);
      const continuity = previousStepWorker === worker.id;
      const indexEntries = this.index.entriesFor(slot);
      const c = candidates[n] as Candidate | undefined;
      if (c && c.worker === worker) {
        c.holdsAnchor = holdsAnchor;
        c.overlapBlocks = overlapBlocks;
        c.offloadBlocks = offloadBlocks;
        c.predictedBlocks = predictedBlocks;
        c.anchorTokens = anchorTokens;
        c.cachedTokens = cachedTokens;
        c.cachedFraction = cachedFraction;
        c.servesCla = servesCla;
        c.continuity = continuity;
        c.indexEntries = indexEntries;
      } else {
        candidates[n] = {
          worker, holdsAnchor, overlapBlocks, offloadBlocks, predictedBlocks, anchorTokens,
          cachedTokens, cachedFraction, servesCla, continuity, indexEntries,
        };
      }
      n++;
    }
    candidates.length = n;
    return candidates;
  }

  private explain(candidates: readonly Candidate[], features: RouteFeatures, chosen: number): CandidateExplain[] {
    return candidates.map((c, i) => ({
      worker: c.worker.id,
      chosen: i === chosen,
      overlapBlocks: c.overlapBlocks,
      offloadBlocks: c.offloadBlocks,
      predictedBlocks: c.predictedBlocks,
      anchorTokens: c.anchorTokens,
      cachedTokens: c.cachedTokens,
      kvUsage: c.worker.load,
      queuedPrefillTokens: c.worker.queuedPrefillTokens,
      activeDecodeTokens: c.worker.activeDecodeTokens,
      inFlightRequests: c.worker.inFlightRequests,
      servesCla: c.servesCla,
      continuity: c.continuity,
      terms: this.policy.scoreTerms ? this.policy.scoreTerms(c, features) : {},
    }));
  }

  private requireRegistered(workerId: string): WorkerState {
    check.requireId(workerId, 'workerId');
    const state = this.workers.get(workerId);
    if (!state) throw new RangeError(`workerId '${workerId}' is not registered`);
    return state;
  }
}

function optionalBool(value: unknown, name: string, fallback: boolean): boolean {
  if (value === undefined) return fallback;
  if (typeof value !== 'boolean') throw new TypeError(`${name} must be a boolean`);
  return value;
}

function checkContentAnchors(anchors: unknown): ContentAnchor[] {
  if (!Array.isArray(anchors)) throw new TypeError('contentAnchors must be an array of { id, tokens }');
  anchors.forEach((a, i) => {
    if (a === null || typeof a !== 'object') throw new TypeError(`contentAnchors[${i}] must be an object`);
    check.requireId((a as ContentAnchor).id, `contentAnchors[${i}].id`);
    check.nonNegativeInt((a as ContentAnchor).tokens, `contentAnchors[${i}].tokens`, 0);
  });
  return anchors as ContentAnchor[];
}
