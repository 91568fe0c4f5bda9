/**
 * The KVAwareRouter class: state (workers, block index, anchor and workflow tables, in-flight
 * tickets) and the operations on it. Types, option handling, in-flight bookkeeping and
 * candidate collection live in the sibling modules of src/core/router/.
 */
import { AnchorTable } from '../anchor-table.js';
import type { BlockKeying } from '../block-keying.js';
import { BlockIndex, OverlapResult, Tier } from '../block-index.js';
import { ContentAnchorIndex, type ContentAnchor } from '../content-anchors.js';
import {
  BlockHashes,
  canonicalChatText,
  hashPrecomputedBlocks,
  hashString32,
  hashTextBlocks,
  TokenBlockKeys,
  type HashNamespace,
} from '../hashing.js';
import type { CostWeights } from '../policies/index.js';
import type { RouteFeatures, RouteReason, RoutingPolicy } from '../policies/types.js';
import { roundHalfEven3 } from '../round-half-even.js';
import * as check from '../validate.js';
import { WorkflowTable } from '../workflow-table.js';
import { WorkerRegistry, type WorkerInfo, type WorkerState } from '../worker-registry.js';
import { CandidateCollector, explainCandidates } from './candidates.js';
import { InFlightTickets, localLoad, setRemoteLoad } from './in-flight.js';
import { resolveRouterOptions, type KVAwareRouterOptions } from './options.js';
import type {
  BlockSequence,
  IndexMode,
  InFlightLoad,
  RouteDecision,
  RouteOptions,
  RouteRequest,
  RouteResult,
  RouterStats,
  SelectWorkerOptions,
  SharedDecision,
  UpdateWorkerStateOptions,
  WorkerLoadStats,
  WorkerMetrics,
} from './types.js';

/**
 * ContextForge's KV-aware router: the seed's API (`reference/seed/kv_aware_router.py`) and
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
  /** How token blocks are keyed (the router's hash or vLLM's). */
  readonly keying: BlockKeying;
  readonly indexMode: IndexMode;
  readonly index: BlockIndex;

  private readonly workers = new WorkerRegistry();
  private readonly anchors: AnchorTable;
  private readonly workflows: WorkflowTable;
  private readonly contentAnchors: ContentAnchorIndex;
  private readonly speculativeBlocks: number;
  private readonly judgeRoles: ReadonlySet<string>;
  private readonly clock: () => number;
  private readonly instanceId: string;
  /** The seed never counts blocks; under policy 'seed' activeBlocks stays 0 as there. */
  private readonly countsBlocks: boolean;
  private readonly decisions: Partial<Record<RouteReason, number>> = {};
  private readonly inFlight = new InFlightTickets();
  private readonly candidates: CandidateCollector;
  private isolationCounter = 0;

  // scratch reused by every route(): the route path allocates little
  private readonly hashes = new BlockHashes(1024);
  /** Token ids under the router's own keying: keys computed only as far as a route reads them. */
  private readonly tokenKeys = new TokenBlockKeys();
  private readonly overlap = new OverlapResult(32);
  private readonly hashNs: HashNamespace = {};
  /** Workers whose block size is not the router's, by block size (their slots); rebuilt on (un)registration. */
  private otherBlockSizes = new Map<number, number[]>();
  /** Per other block size, the request's keys and overlap (scratch, reused). */
  private readonly sizedHashes = new Map<number, BlockHashes>();
  private readonly sizedOverlap = new OverlapResult(32);

  constructor(options: KVAwareRouterOptions = {}) {
    const o = resolveRouterOptions(options);
    this.numWorkers = o.numWorkers;
    this.claAffinityEnabled = o.claAffinityEnabled;
    this.anchorLocalityEnabled = o.anchorLocalityEnabled;
    this.costWeights = o.costWeights;
    this.policy = o.policy;
    this.countsBlocks = o.countsBlocks;
    this.anchors = new AnchorTable(o.anchorCapacity);
    this.workflows = new WorkflowTable(o.workflowCapacity);
    this.blockSize = o.blockSize;
    this.textChunkBytes = o.textChunkBytes;
    this.keying = o.keying;
    this.indexMode = o.indexMode;
    this.index = new BlockIndex({ maxEntries: o.maxIndexEntries, predictedTtlMs: o.predictedTtlMs });
    // a policy that, like its upstream, predicts nothing gets no speculative entries
    this.speculativeBlocks = this.policy.speculative === false ? 0 : o.speculativeBlocks;
    this.contentAnchors = new ContentAnchorIndex(o.contentAnchorCapacity, o.contentAnchorTtlMs);
    this.judgeRoles = o.judgeRoles;
    this.clock = o.clock;
    this.instanceId = o.instanceId;
    this.candidates = new CandidateCollector(
      {
        workers: this.workers,
        anchors: this.anchors,
        workflows: this.workflows,
        contentAnchors: this.contentAnchors,
        index: this.index,
      },
      o,
    );
  }

  // ------------------------------------------------------------------------- workers

  /** Registers a worker; registering a known id again changes nothing. */
  registerWorker(workerId: string, info?: WorkerInfo): void {
    this.workers.register(check.requireId(workerId, 'workerId'), info);
    this.groupBlockSizes();
  }

  /** The block size a worker's KV is made of (its own, or the router's). */
  blockSizeOf(workerId: string): number {
    return this.requireRegistered(workerId).info.blockSize ?? this.blockSize;
  }

  private groupBlockSizes(): void {
    const groups = new Map<number, number[]>();
    for (const w of this.workers.values()) {
      const bs = w.info.blockSize;
      if (bs === undefined || bs === this.blockSize) continue;
      let slots = groups.get(bs);
      if (!slots) groups.set(bs, (slots = []));
      slots.push(w.slot);
    }
    this.otherBlockSizes = groups;
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
    this.groupBlockSizes();
    this.policy.onWorkerRemoved?.(state);
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
    if (metrics.waitingRequests !== undefined)
      w.waitingRequests = check.finiteNonNegative(metrics.waitingRequests, 'waitingRequests');
    if (metrics.runningRequests !== undefined)
      w.runningRequests = check.finiteNonNegative(metrics.runningRequests, 'runningRequests');
    if (metrics.kvCapacityTokens !== undefined)
      w.kvCapacityTokens = check.finiteNonNegative(metrics.kvCapacityTokens, 'kvCapacityTokens');
  }

  /** Workers in registration order (read-only views). */
  listWorkers(): readonly WorkerState[] {
    return [...this.workers.values()];
  }

  // --------------------------------------------------------------- KV events (precise)

  /** The worker stored these blocks (sequence hashes as from hashTokens). */
  applyStored(workerId: string, blocks: BlockSequence, tier: 'gpu' | 'offload' = 'gpu'): void {
    const w = this.requireRegistered(workerId);
    this.index.applyStored(
      w.slot,
      blocks.hi,
      blocks.lo,
      0,
      blocks.length,
      tier === 'offload' ? Tier.Offload : Tier.Gpu,
    );
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

  /** Block keys of token ids as this router computes them (a fresh copy); `blockSize` default: the router's. */
  hashTokens(tokens: ArrayLike<number>, ns?: HashNamespace, blockSize: number = this.blockSize): BlockHashes {
    return this.keying.hashTokens(
      tokens,
      blockSize,
      ns,
      new BlockHashes(Math.max(1, Math.floor(tokens.length / blockSize))),
    );
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
    if (request.isolate !== undefined && typeof request.isolate !== 'boolean')
      throw new TypeError('isolate must be a boolean');
    const isolated =
      request.isolate === true || (request.agentRole !== undefined && this.judgeRoles.has(request.agentRole));

    // isolated requests hash under a private salt: their blocks match nothing else
    const cacheSalt = isolated
      ? `cf-${this.instanceId}-${(++this.isolationCounter).toString(36)}`
      : check.optionalId(request.cacheSalt, 'cacheSalt');
    const ns = this.hashNs;
    ns.lora = check.optionalId(request.lora, 'lora') ?? null;
    ns.cacheSalt = cacheSalt ?? null;
    ns.claGroup = claGroup;
    const hashes = this.hashRequest(request, ns);
    // keys of token ids are computed on demand (TokenBlockKeys): `hashes` holds those computed so far
    const lazyKeys = hashes === this.tokenKeys.computed ? this.tokenKeys : undefined;
    const requestBlocks = lazyKeys ? lazyKeys.total : hashes.length;
    const promptTokens = this.promptTokensOf(request, hashes);

    const overlap = this.overlap;
    if (!isolated && this.anchorLocalityEnabled && requestBlocks > 0) {
      this.index.overlaps(hashes.hi, hashes.lo, requestBlocks, overlap, now, lazyKeys, hashes.length);
      // engine-native keys: a block held deeper in the chain implies its prefix (vLLM caches
      // prefixes), even where the router never saw those ancestors stored
      if (this.keying.mode === 'vllm' && request.tokens !== undefined && overlap.maxBlocks < hashes.length)
        this.index.extendToDeepestHeld(hashes.hi, hashes.lo, hashes.length, overlap);
      if (this.otherBlockSizes.size > 0 && request.tokens !== undefined)
        this.overlapOtherBlockSizes(request.tokens, ns, overlap, now);
    } else {
      overlap.ensureSlots(this.workers.slotCount);
      overlap.blocks.fill(0);
      overlap.offloadBlocks.fill(0);
      overlap.predictedBlocks.fill(0);
      overlap.maxBlocks = 0;
    }

    const candidates = this.candidates.collect(
      overlap,
      hashes.tokensPerBlock,
      anchor,
      claGroup,
      promptTokens,
      workflowId,
      contentAnchors,
      isolated,
      now,
      options.exclude,
    );
    lazyKeys?.ensure(4); // the routing key's block
    const features: RouteFeatures = {
      claGroup,
      promptTokens,
      requestBlocks,
      blockSize: hashes.tokensPerBlock || this.blockSize,
      routingKey: requestBlocks > 0 ? hashes.lo[Math.min(requestBlocks, 4) - 1] : anchor ? hashString32(anchor) : 0,
      // a policy reading them gets every key (TokenBlockKeys computes the rest on first read)
      blocks: lazyKeys ?? hashes,
      sharedPrefixKey:
        overlap.maxBlocks > 0
          ? hashes.lo[Math.min(overlap.maxBlocks, requestBlocks) - 1]
          : anchor
            ? hashString32(anchor)
            : 0,
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
      blocks: requestBlocks,
      ticket: 0,
      preRope: true,
    };
    if (cacheSalt !== undefined && isolated) result.cacheSalt = cacheSalt;
    if (options.explain) result.explain = explainCandidates(candidates, features, choice.index, this.policy);
    if (options.dryRun) return result;

    this.decisions[choice.reason] = (this.decisions[choice.reason] ?? 0) + 1;
    if (!chosen) return result;
    const worker = chosen.worker;
    let start = 0;
    let end = 0;
    let recorded = hashes;
    if (!isolated) {
      if (requestBlocks > 0) {
        // approximate: every block (refreshing the TTL); precise: a speculative stretch past
        // what the worker holds
        end =
          this.indexMode === 'precise'
            ? Math.min(requestBlocks, chosen.overlapBlocks + this.speculativeBlocks)
            : requestBlocks;
        lazyKeys?.ensure(end);
        start = this.indexMode === 'precise' ? chosen.overlapBlocks : 0;
        // a worker of another block size records the request's keys in its size
        if (
          worker.info.blockSize !== undefined &&
          worker.info.blockSize !== this.blockSize &&
          request.tokens !== undefined
        ) {
          recorded = this.sizedHashes.get(worker.info.blockSize) ?? hashes;
          end =
            this.indexMode === 'precise'
              ? Math.min(recorded.length, chosen.overlapBlocks + this.speculativeBlocks)
              : recorded.length;
        }
        if (end > start) this.index.recordPredicted(worker.slot, recorded.hi, recorded.lo, start, end, now);
      }
      if (contentAnchors && contentAnchors.length > 0) this.contentAnchors.record(worker.slot, contentAnchors, now);
    }
    const tracked = options.track !== false;
    const uncached = Math.max(0, promptTokens - chosen.cachedTokens);
    if (options.share) {
      // the predicted range only: in precise mode what the worker holds comes from its own events
      const n = Math.max(0, end - start);
      result.shared = {
        workerId: worker.id,
        hi: recorded.hi.slice(start, start + n),
        lo: recorded.lo.slice(start, start + n),
        workflowId,
        workflowStep,
        anchor,
        claGroup,
        contentAnchors: isolated ? undefined : contentAnchors,
        prefillTokens: tracked ? uncached : 0,
        tracked,
      };
    }
    if (anchor !== undefined) this.anchors.home(anchor, worker.id, claGroup);
    if (workflowId !== undefined) this.workflows.record(workflowId, worker.id, workflowStep);
    if (tracked) {
      result.ticket = this.inFlight.open(worker, uncached, promptTokens);
    }
    this.policy.onRouted?.(worker, features, result.ticket, now);
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
    if (d.contentAnchors && d.contentAnchors.length > 0)
      this.contentAnchors.record(worker.slot, checkContentAnchors(d.contentAnchors), now);
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
    return localLoad(this.requireRegistered(workerId));
  }

  /**
   * The in-flight work other replicas have on a worker (their sum): policies then see the
   * whole fleet's load, not just this replica's, and replicas do not pile onto one worker.
   */
  setRemoteLoad(workerId: string, load: InFlightLoad): void {
    setRemoteLoad(this.requireRegistered(workerId), load);
  }

  /** The request's prefill finished (first token seen): its work moves from prefill to decode. */
  markPrefillDone(ticket: number): void {
    this.inFlight.markPrefillDone(ticket);
  }

  /** The request completed, failed or was abandoned: its work leaves the worker. Idempotent. */
  release(ticket: number): void {
    this.policy.onReleased?.(ticket);
    this.inFlight.release(ticket);
  }

  // --------------------------------------------------------------- the seed's API

  async selectWorker(anchorHash: string, opts: SelectWorkerOptions = {}): Promise<RouteDecision> {
    check.requireId(anchorHash, 'anchorHash');
    if (opts === null || typeof opts !== 'object') throw new TypeError('opts must be an object');
    const tokenLength = check.nonNegativeInt(opts.tokenLength, 'tokenLength', 0);
    const r = this.route(
      {
        anchor: anchorHash,
        claGroup: opts.claGroup,
        workflowStep: opts.workflowStep,
        workflowId: opts.workflowId,
        promptTokens: tokenLength,
      },
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
      inFlightRequests: this.inFlight.size,
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

  /**
   * Workers whose KV blocks are of another size (a worker's `blockSize`, e.g. SGLang with page
   * size 1): the prompt's keys in that size, looked up in the index, give those workers'
   * overlaps, which replace what the router-size lookup found for them.
   */
  private overlapOtherBlockSizes(
    tokens: ArrayLike<number>,
    ns: HashNamespace,
    overlap: OverlapResult,
    now: number,
  ): void {
    const o = this.sizedOverlap;
    for (const [blockSize, slots] of this.otherBlockSizes) {
      let h = this.sizedHashes.get(blockSize);
      if (!h) this.sizedHashes.set(blockSize, (h = new BlockHashes(64)));
      this.keying.hashTokens(tokens, blockSize, ns, h);
      if (h.length > 0) this.index.overlaps(h.hi, h.lo, h.length, o, now);
      if (h.length > 0 && this.keying.mode === 'vllm' && o.maxBlocks < h.length)
        this.index.extendToDeepestHeld(h.hi, h.lo, h.length, o);
      for (const slot of slots) {
        const found = h.length > 0 && slot < o.blocks.length;
        overlap.blocks[slot] = found ? o.blocks[slot] : 0;
        overlap.offloadBlocks[slot] = found ? o.offloadBlocks[slot] : 0;
        overlap.predictedBlocks[slot] = found ? o.predictedBlocks[slot] : 0;
      }
    }
  }

  private hashRequest(request: RouteRequest, ns: HashNamespace): BlockHashes {
    const hashes = this.hashes;
    if (request.tokens !== undefined) {
      if (typeof request.tokens !== 'object' || typeof request.tokens.length !== 'number')
        throw new TypeError('tokens must be an array of token ids');
      if (this.keying.mode === 'router') {
        this.tokenKeys.reset(request.tokens, this.blockSize, ns);
        return this.tokenKeys.computed;
      }
      this.keying.hashTokens(request.tokens, this.blockSize, ns, hashes);
    } else if (request.blockHashes !== undefined) {
      if (typeof request.blockHashes !== 'object' || typeof request.blockHashes.length !== 'number')
        throw new TypeError('blockHashes must be an array');
      hashPrecomputedBlocks(
        request.blockHashes,
        check.positiveInt(request.blockTokens, 'blockTokens', this.blockSize),
        ns,
        hashes,
      );
    } else if (request.messages !== undefined) {
      if (!Array.isArray(request.messages)) throw new TypeError('messages must be an array');
      request.messages.forEach((m, i) => {
        if (m === null || typeof m !== 'object' || typeof m.role !== 'string')
          throw new TypeError(`messages[${i}] must be an object with a string role`);
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

  private requireRegistered(workerId: string): WorkerState {
    check.requireId(workerId, 'workerId');
    const state = this.workers.get(workerId);
    if (!state) throw new RangeError(`workerId '${workerId}' is not registered`);
    return state;
  }
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
