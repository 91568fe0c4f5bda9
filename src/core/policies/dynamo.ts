import * as check from '../validate.js';
import { pickWithRandomTies } from './pick.js';
import type { WorkerState } from '../worker-registry.js';
import { BlockKeys } from './block-keys.js';
import {
  NO_CHOICE,
  type Candidate,
  type PolicyChoice,
  type PolicyContext,
  type RouteFeatures,
  type RoutingPolicy,
} from './types.js';

/**
 * NVIDIA Dynamo's KV router, as shipped (ai-dynamo/dynamo):
 *
 *   cost = prefill_load_scale · max(0, (active_prefill_tokens + prompt_tokens) / block_size − overlap_credit)
 *          + potential_decode_blocks + decode_active_request_weight · active_requests
 *
 * - lib/kv-router/src/scheduling/selector/default.rs (`worker_logit`): the formula; the
 *   lowest cost wins, ties at random; with temperature > 0 the worker is sampled by softmax
 *   over the costs normalised to [0, 1].
 * - lib/kv-router/src/scheduling/selector/mod.rs: raw prefill = the worker's active prefill
 *   tokens plus the whole prompt (uncached + cached), in blocks.
 * - overlap_credit = overlap_score_credit · device blocks + host_cache_hit_weight · host
 *   blocks (+ disk_cache_hit_weight · disk blocks; this router has one offload tier, scored
 *   as host).
 * - potential_decode_blocks (lib/kv-router/src/sequences/prompt_registry.rs,
 *   `WorkerLoadProjection`): the unique blocks of every request alive on the worker, from
 *   its routing to its end (prefilling ones included: lib/kv-router/src/sequences/single.rs
 *   frees them only at `free()`), deduplicated across requests that share a prefix, plus
 *   the new request's blocks that no live request on the worker already has. This policy
 *   keeps that set itself, per worker, from its own decisions (onRouted / onReleased), as
 *   Dynamo's ActiveSequences does.
 * - Defaults (lib/kv-router/src/scheduling/config.rs, `KvRouterConfig::default`):
 *   overlap_score_credit 1.0, prefill_load_scale 1.0, host_cache_hit_weight 0.75,
 *   router_temperature 0.0, router_predicted_ttl_secs None (predict-on-route off: the router
 *   records no speculative entries for this policy, see `speculative`), decode_active_request_weight
 *   0.0, router_track_output_blocks false (only prompt blocks are counted).
 * Not modelled: the router-side queue (`router_queue_threshold`), which holds requests in
 * the router while every worker's prefill backlog is over the threshold.
 */
export interface DynamoOptions {
  /** prefill_load_scale (default 1.0). */
  prefillLoadScale?: number;
  /** router_temperature (default 0: the lowest cost wins). */
  temperature?: number;
  /** overlap_score_credit: credit per device (GPU) block held (default 1.0). */
  gpuCredit?: number;
  /** host_cache_hit_weight: credit per CPU-offloaded block (default 0.75). */
  offloadCredit?: number;
  /** Credit per block known only from predict-on-route entries (default 0: off upstream). */
  predictedCredit?: number;
  /** decode_active_request_weight (default 0). */
  activeRequestWeight?: number;
}

export class DynamoPolicy implements RoutingPolicy {
  readonly name = 'dynamo';
  readonly readsBlocks = true; // active sequences: every block of every request
  readonly prefillLoadScale: number;
  readonly temperature: number;
  readonly gpuCredit: number;
  readonly offloadCredit: number;
  readonly predictedCredit: number;
  readonly activeRequestWeight: number;
  private costs = new Float64Array(64);
  private readonly ties: number[] = [];
  /** Per worker slot: a reference count per block of its live requests. */
  private readonly active: Array<Map<number, number> | undefined> = [];
  private readonly tickets = new Map<number, { slot: number; keys: Float64Array }>();
  private readonly request = new BlockKeys();

  constructor(
    private readonly ctx: PolicyContext,
    options: DynamoOptions = {},
  ) {
    this.prefillLoadScale = check.finiteNonNegative(options.prefillLoadScale ?? 1.0, 'dynamo.prefillLoadScale');
    this.temperature = check.finiteNonNegative(options.temperature ?? 0, 'dynamo.temperature');
    this.gpuCredit = check.fraction(options.gpuCredit ?? 1.0, 'dynamo.gpuCredit');
    this.offloadCredit = check.fraction(options.offloadCredit ?? 0.75, 'dynamo.offloadCredit');
    this.predictedCredit = check.fraction(options.predictedCredit ?? 0, 'dynamo.predictedCredit');
    this.activeRequestWeight = check.finiteNonNegative(options.activeRequestWeight ?? 0, 'dynamo.activeRequestWeight');
  }

  /** Unique blocks of the live requests on a worker (Dynamo's active_decode_blocks). */
  activeBlocks(slot: number): number {
    return this.active[slot]?.size ?? 0;
  }

  /** potential_decode_blocks: the worker's live blocks plus the request's blocks they lack. */
  private potentialDecodeBlocks(c: Candidate): number {
    const a = this.active[c.worker.slot];
    if (!a) return this.request.length;
    return a.size + this.request.length - this.request.presentPrefix(a);
  }

  private costOf(c: Candidate, r: RouteFeatures, decodeBlocks: number): number {
    const bs = r.blockSize;
    const promptBlocks = r.promptTokens > 0 ? r.promptTokens / bs : r.requestBlocks;
    const device = c.overlapBlocks - c.offloadBlocks - c.predictedBlocks;
    const credit =
      device * this.gpuCredit + c.offloadBlocks * this.offloadCredit + c.predictedBlocks * this.predictedCredit;
    const rawPrefillBlocks = c.worker.queuedPrefillTokens / bs + promptBlocks;
    return (
      this.prefillLoadScale * Math.max(rawPrefillBlocks - credit, 0) +
      decodeBlocks +
      this.activeRequestWeight * c.worker.inFlightRequests
    );
  }

  /** Predict-on-route entries exist only when they earn credit (router_predicted_ttl_secs set). */
  get speculative(): boolean {
    return this.predictedCredit > 0;
  }

  cost(c: Candidate, r: RouteFeatures): number {
    this.request.load(r.blocks);
    return this.costOf(c, r, this.potentialDecodeBlocks(c));
  }

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    const n = candidates.length;
    if (n === 0) return NO_CHOICE;
    if (this.costs.length < n) this.costs = new Float64Array(n * 2);
    this.request.load(request.blocks);
    let min = Infinity;
    let max = -Infinity;
    for (let i = 0; i < n; i++) {
      const cost = this.costOf(candidates[i], request, this.potentialDecodeBlocks(candidates[i]));
      this.costs[i] = cost;
      if (cost < min) min = cost;
      if (cost > max) max = cost;
    }
    let index: number;
    if (this.temperature > 0 && max > min) {
      let total = 0;
      for (let i = 0; i < n; i++) total += Math.exp(-(this.costs[i] - min) / (max - min) / this.temperature);
      let x = this.ctx.random() * total;
      index = n - 1;
      for (let i = 0; i < n; i++) {
        x -= Math.exp(-(this.costs[i] - min) / (max - min) / this.temperature);
        if (x <= 0) {
          index = i;
          break;
        }
      }
    } else {
      index = pickWithRandomTies(this.costs, n, -1, this.ctx.random, this.ties);
    }
    if (index < 0) return NO_CHOICE;
    return { index, confidence: candidates[index].cachedFraction, reason: 'cost' };
  }

  onRouted(worker: WorkerState, request: RouteFeatures, ticket: number): void {
    if (ticket === 0) return; // an untracked decision never runs on the worker as far as the router knows
    this.request.load(request.blocks);
    const keys = this.request.keys.slice(0, this.request.length);
    const a = (this.active[worker.slot] ??= new Map());
    for (let i = 0; i < keys.length; i++) a.set(keys[i], (a.get(keys[i]) ?? 0) + 1);
    this.tickets.set(ticket, { slot: worker.slot, keys });
  }

  onReleased(ticket: number): void {
    const t = this.tickets.get(ticket);
    if (!t) return;
    this.tickets.delete(ticket);
    const a = this.active[t.slot];
    if (!a) return;
    for (let i = 0; i < t.keys.length; i++) {
      const k = t.keys[i];
      const left = (a.get(k) ?? 1) - 1;
      if (left <= 0) a.delete(k);
      else a.set(k, left);
    }
  }

  onWorkerRemoved(worker: WorkerState): void {
    this.active[worker.slot] = undefined;
    for (const [ticket, t] of this.tickets) if (t.slot === worker.slot) this.tickets.delete(ticket);
  }

  scoreTerms(c: Candidate, r: RouteFeatures): Record<string, number> {
    this.request.load(r.blocks);
    const decode = this.potentialDecodeBlocks(c);
    return {
      cost: this.costOf(c, r, decode),
      overlapBlocks: c.overlapBlocks,
      offloadBlocks: c.offloadBlocks,
      predictedBlocks: c.predictedBlocks,
      activePrefillBlocks: c.worker.queuedPrefillTokens / r.blockSize,
      potentialDecodeBlocks: decode,
    };
  }
}
