import { AnchorTable } from './anchor-table.js';
import { createPolicy, resolveCostWeights, type CostWeights } from './policies/index.js';
import type { Candidate, RouteReason, RoutingPolicy } from './policies/types.js';
import { roundHalfEven3 } from './round.js';
import * as check from './validate.js';
import { WorkflowTable } from './workflow-table.js';
import { WorkerRegistry, type WorkerInfo, type WorkerState } from './worker-registry.js';

export interface KVAwareRouterOptions {
  /** Informational, as in the seed. */
  numWorkers?: number;
  /** Prefer workers that serve the request's CLA group (default true). */
  enableClaAffinity?: boolean;
  /** Prefer the worker that holds the request's anchor (default true). */
  enableAnchorLocality?: boolean;
  /** 'cost' (default) or 'seed'. */
  policy?: string;
  /** Most anchors remembered; the least recently used is evicted beyond it (default 100,000). */
  anchorCapacity?: number;
  /** Most workflows remembered for step continuity (default 10,000). */
  workflowCapacity?: number;
  /** Tokens per KV block, to turn recorded blocks into a cached fraction (default 16). */
  blockSize?: number;
  /** Weights of the 'cost' policy; unspecified ones keep their defaults. */
  costWeights?: Partial<CostWeights>;
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

/** The seed's RouteDecision. INVARIANT 10: decisions are made on metadata; preRope is always true. */
export interface RouteDecision {
  /** '' when no worker can take the request. */
  targetWorkerId: string;
  anchorHash: string;
  claGroup: number | null;
  /** 0-1. Seed: 0.9 / 0.75 / 0.5 by rule. Cost: estimated fraction of the KV already on the worker. */
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
  anchorCapacity: number;
  anchorEvictions: number;
  workflowsTracked: number;
  drainingWorkers: string[];
  /** Decisions made so far, by the rule that made them. */
  decisionsByReason: Record<RouteReason, number>;
}

const DEFAULT_ANCHOR_CAPACITY = 100_000;
const DEFAULT_WORKFLOW_CAPACITY = 10_000;
const DEFAULT_BLOCK_SIZE = 16;

/**
 * ContextForge's KV-aware router: the seed's API (`../shared/seed/kv_aware_router.py`) over
 * pluggable policies. Every method's work is synchronous, so state-changing calls are atomic
 * with respect to each other, which is what the seed's asyncio.Lock guaranteed; the seed's
 * coroutine methods stay async for compatibility.
 */
export class KVAwareRouter {
  readonly numWorkers: number;
  readonly claAffinityEnabled: boolean;
  readonly anchorLocalityEnabled: boolean;
  readonly policy: RoutingPolicy;
  readonly costWeights: Readonly<CostWeights>;
  readonly blockSize: number;

  private readonly workers = new WorkerRegistry();
  private readonly anchors: AnchorTable;
  private readonly workflows: WorkflowTable;
  /** The seed never counts blocks; under policy 'seed' activeBlocks stays 0 as there. */
  private readonly countsBlocks: boolean;
  private readonly decisions: Record<RouteReason, number> = { locality: 0, cla: 0, 'least-loaded': 0, cost: 0, none: 0 };
  /** Reused per decision: candidates are rebuilt in place. */
  private readonly candidates: Candidate[] = [];

  constructor(options: KVAwareRouterOptions = {}) {
    if (options === null || typeof options !== 'object') throw new TypeError('options must be an object');
    this.numWorkers = check.positiveInt(options.numWorkers, 'numWorkers', 1);
    this.claAffinityEnabled = optionalBool(options.enableClaAffinity, 'enableClaAffinity', true);
    this.anchorLocalityEnabled = optionalBool(options.enableAnchorLocality, 'enableAnchorLocality', true);
    const policyName = options.policy ?? 'cost';
    if (typeof policyName !== 'string') throw new TypeError('policy must be a string');
    this.costWeights = resolveCostWeights(options.costWeights);
    this.policy = createPolicy(policyName, { costWeights: this.costWeights });
    this.countsBlocks = policyName !== 'seed';
    this.anchors = new AnchorTable(check.positiveInt(options.anchorCapacity, 'anchorCapacity', DEFAULT_ANCHOR_CAPACITY));
    this.workflows = new WorkflowTable(check.positiveInt(options.workflowCapacity, 'workflowCapacity', DEFAULT_WORKFLOW_CAPACITY));
    this.blockSize = check.positiveInt(options.blockSize, 'blockSize', DEFAULT_BLOCK_SIZE);
  }

  /** Registers a worker; registering a known id again changes nothing. */
  registerWorker(workerId: string, info?: WorkerInfo): void {
    this.workers.register(check.requireId(workerId, 'workerId'), info);
  }

  /** Forgets a worker and every anchor and workflow homed on it. Returns whether it was known. */
  removeWorker(workerId: string): boolean {
    check.requireId(workerId, 'workerId');
    if (!this.workers.remove(workerId)) return false;
    this.anchors.dropWorker(workerId);
    this.workflows.dropWorker(workerId);
    return true;
  }

  /**
   * Stops sending new requests to a worker. Its anchors stay recorded and are re-homed the
   * next time they are used. `resumeWorker` undoes it.
   */
  drainWorker(workerId: string): void {
    this.requireRegistered(workerId).draining = true;
  }

  resumeWorker(workerId: string): void {
    this.requireRegistered(workerId).draining = false;
  }

  async selectWorker(anchorHash: string, opts: SelectWorkerOptions = {}): Promise<RouteDecision> {
    check.requireId(anchorHash, 'anchorHash');
    if (opts === null || typeof opts !== 'object') throw new TypeError('opts must be an object');
    const claGroup = check.optionalNonNegativeInt(opts.claGroup, 'claGroup');
    const workflowStep = check.optionalNonNegativeInt(opts.workflowStep, 'workflowStep');
    const tokenLength = check.nonNegativeInt(opts.tokenLength, 'tokenLength', 0);
    const workflowId = check.optionalId(opts.workflowId, 'workflowId');

    const candidates = this.collectCandidates(anchorHash, claGroup, tokenLength, workflowId);
    const choice = this.policy.choose(candidates, { claGroup, tokenLength });
    this.decisions[choice.reason]++;
    if (choice.index < 0) {
      return { targetWorkerId: '', anchorHash, claGroup, confidence: 0, preRope: true };
    }
    const workerId = candidates[choice.index].worker.id;
    this.anchors.home(anchorHash, workerId, claGroup);
    if (workflowId !== undefined) this.workflows.record(workflowId, workerId, workflowStep);
    return { targetWorkerId: workerId, anchorHash, claGroup, confidence: choice.confidence, preRope: true };
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
        activeBlocks: this.countsBlocks ? this.anchors.blocksOn(w.id) : 0,
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
      anchorCapacity: this.anchors.capacity,
      anchorEvictions: this.anchors.evictions,
      workflowsTracked: this.workflows.size,
      drainingWorkers,
      decisionsByReason: { ...this.decisions },
    };
  }

  /** Available workers (registered, not draining) in registration order, with their features. */
  private collectCandidates(
    anchorHash: string,
    claGroup: number | null,
    tokenLength: number,
    workflowId: string | undefined,
  ): readonly Candidate[] {
    const anchor = this.anchorLocalityEnabled ? this.anchors.peek(anchorHash) : undefined;
    const previousStepWorker = workflowId !== undefined ? this.workflows.peek(workflowId)?.workerId : undefined;
    const candidates = this.candidates;
    let n = 0;
    for (const worker of this.workers.values()) {
      if (worker.draining) continue;
      const holdsAnchor = anchor !== undefined && anchor.workerId === worker.id;
      let cachedFraction = 0;
      if (holdsAnchor && (claGroup === null || anchor.claGroup === null || anchor.claGroup === claGroup)) {
        const blocks = anchor.blocks?.size ?? 0;
        cachedFraction = tokenLength > 0 && blocks > 0 ? Math.min(1, (blocks * this.blockSize) / tokenLength) : 1;
      }
      const c = candidates[n] as Candidate | undefined;
      const servesCla = this.claAffinityEnabled && claGroup !== null && worker.claGroups.has(claGroup);
      const continuity = previousStepWorker === worker.id;
      if (c && c.worker === worker) {
        c.holdsAnchor = holdsAnchor;
        c.cachedFraction = cachedFraction;
        c.servesCla = servesCla;
        c.continuity = continuity;
      } else {
        candidates[n] = { worker, holdsAnchor, cachedFraction, servesCla, continuity };
      }
      n++;
    }
    candidates.length = n;
    return candidates;
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
