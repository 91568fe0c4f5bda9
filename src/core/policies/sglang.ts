import * as check from '../validate.js';
import type { WorkerState } from '../worker-registry.js';
import { createRng } from '../rng.js';
import { outstanding } from './pick.js';
import { ApproxTree } from './approx-tree.js';
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
 * SGLang's router (sgl-project/sglang, sgl-model-gateway/src/policies/cache_aware.rs, formerly
 * sgl-router/src/policies/cache_aware.rs), policy `cache_aware`:
 * - the system is imbalanced when (max load − min load) > balance_abs_threshold AND
 *   max load > balance_rel_threshold · min load, a worker's load being the router's count of
 *   its outstanding requests; then the least-loaded worker wins;
 * - otherwise the worker with the longest prefix match in the router's *approximate tree*
 *   wins if the match rate (matched / whole prompt; upstream counts characters of the request
 *   text) exceeds cache_threshold;
 * - otherwise the least-loaded worker, ties drawn at random (`min_by_key(load)` over the
 *   healthy workers, sgl-project/sglang#14650, December 2025, which replaced the tenant with the
 *   smallest tree, `get_smallest_tenant`; a random draw among the least loaded since
 *   sgl-project/sglang#33138, July 2026). The draw uses the router's seeded random source, so a
 *   simulated run repeats; the imbalance branch keeps the first least-loaded worker, as
 *   upstream's `select_worker_min_load` does.
 * Every decision, balancing ones included, inserts the prompt into the chosen worker's tree.
 *
 * The approximate tree (sgl-model-gateway/src/policies/tree.rs) is fed only by routing
 * history, never by the engines: it never hears of evictions. Every eviction_interval
 * seconds, a tenant whose tree exceeds max_tree_size characters loses least-recently-used
 * leaves until it fits (`evict_tenant_by_size`). Here the tree is kept per worker over the
 * request's prefix-chained blocks (a block's hash names its whole path, so a set of hashes
 * is a radix tree); its size is counted in characters at 4 per token, the router's text-mode
 * estimate. Among workers matching equally deep, the one that touched the deepest matched
 * node last wins (upstream caches the last tenant per node).
 *
 * As upstream's, the tree takes a prompt when the decision is made, whatever becomes of the
 * request: one the engine refuses, or that is released unserved, keeps its blocks (the
 * gateway inserts in `select_worker`, before it sends the request, and never takes a prompt
 * back). What bounds memory is a cap upstream lacks: a tree never holds more than
 * SGLANG_HARD_CAP_FACTOR × max_tree_size characters, a decision past it evicting least
 * recently used blocks to make room for its own, so a flood of distinct prompts cannot grow
 * the tree for a whole interval.
 *
 * Defaults are those of the launcher SGLang's docs tell users to run,
 * `python -m sglang_router.launch_router` (docs/advanced_features/sgl_model_gateway.md; `smg
 * launch` parses the same arguments): `RouterArgs` in
 * sgl-model-gateway/bindings/python/src/sglang_router/router_args.py gives cache_threshold 0.3,
 * balance_abs_threshold 64, balance_rel_threshold 1.5, eviction_interval_secs 60,
 * max_tree_size 2^26 = 67,108,864. The Rust binary's own CLI (sgl-model-gateway/src/main.rs,
 * `--eviction-interval`) defaults the interval to 120 s, the figure those docs' tuning table
 * gives; its other defaults are the launcher's. (The library's `CacheAwareConfig::default`
 * differs: 0.5 / 32 / 1.1 / 30 s / 10,000.)
 */
export interface SglangOptions {
  cacheThreshold?: number;
  balanceAbsThreshold?: number;
  balanceRelThreshold?: number;
  /** Seconds between eviction passes over the approximate trees (default 60; see SGLANG_EVICTION_INTERVAL_SECS). */
  evictionIntervalSecs?: number;
  /** Characters a worker's tree may hold before eviction trims it (default 67,108,864). */
  maxTreeSize?: number;
}

/**
 * The range of `evictionIntervalSecs`: whole seconds from 1, as upstream takes them (the
 * gateway's `--eviction-interval` is a u64 and its config validation refuses 0,
 * sgl-model-gateway/src/main.rs and src/config/validation.rs). Upstream has no top short of
 * u64; 2^32 − 1 s (136 years, in practice never) is the bound the same validation puts on its
 * other interval, `bucket_adjust_interval_secs`, and keeps the interval in ms an exact integer.
 */
export const SGLANG_EVICTION_INTERVAL_SECS = Object.freeze({ min: 1, max: 4_294_967_295 });

/**
 * An `evictionIntervalSecs` option (default 60) in milliseconds, refused outside
 * SGLANG_EVICTION_INTERVAL_SECS; `name` is the option as errors name it.
 */
export function evictionIntervalMs(secs: number | undefined, name: string): number {
  const interval: unknown = secs ?? 60;
  if (typeof interval !== 'number') throw new TypeError(`${name} must be a number, got ${typeof interval}`);
  const { min, max } = SGLANG_EVICTION_INTERVAL_SECS;
  if (!Number.isInteger(interval) || interval < min || interval > max)
    throw new RangeError(`${name} must be a whole number of seconds from ${min} to ${max}, got ${interval}`);
  return interval * 1000;
}

/** Characters per token when sizing the tree (the router's text mode: 64-byte chunks ≈ 16 tokens). */
export const SGLANG_CHARS_PER_TOKEN = 4;

/**
 * How far past max_tree_size a tree may grow between eviction passes. Upstream lets a tree
 * grow freely for the whole interval; at 2× the cap is reached only when a worker takes in a
 * whole further budget of new prompt text (64 Mi characters by default) within one interval,
 * far more than an engine's cache holds, so under normal load which prefixes survive is
 * upstream's, yet memory stays bounded whatever the request rate.
 */
export const SGLANG_HARD_CAP_FACTOR = 2;

export class SglangPolicy implements RoutingPolicy {
  readonly name = 'sglang';
  readonly readsBlocks = true; // the approximate tree: every block of every request
  readonly cacheThreshold: number;
  readonly balanceAbsThreshold: number;
  readonly balanceRelThreshold: number;
  readonly evictionIntervalMs: number;
  readonly maxTreeSize: number;
  /** Characters past which a decision trims its worker's tree at once (SGLANG_HARD_CAP_FACTOR). */
  readonly hardMaxTreeSize: number;
  private readonly trees: Array<ApproxTree | undefined> = [];
  private readonly request = new BlockKeys();
  /** Scratch for the least-loaded workers a cache miss draws from. */
  private readonly ties: number[] = [];
  private epoch = 0;
  private nextEviction = Number.NaN;

  constructor(
    options: SglangOptions = {},
    private readonly ctx: PolicyContext = { random: createRng(1) },
  ) {
    this.cacheThreshold = check.fraction(options.cacheThreshold ?? 0.3, 'sglang.cacheThreshold');
    this.balanceAbsThreshold = check.finiteNonNegative(options.balanceAbsThreshold ?? 64, 'sglang.balanceAbsThreshold');
    this.balanceRelThreshold = check.finiteNonNegative(
      options.balanceRelThreshold ?? 1.5,
      'sglang.balanceRelThreshold',
    );
    this.evictionIntervalMs = evictionIntervalMs(options.evictionIntervalSecs, 'sglang.evictionIntervalSecs');
    this.maxTreeSize = check.finiteNonNegative(options.maxTreeSize ?? 67_108_864, 'sglang.maxTreeSize');
    this.hardMaxTreeSize = this.maxTreeSize * SGLANG_HARD_CAP_FACTOR;
  }

  /** Characters in a worker's approximate tree. */
  treeSize(slot: number): number {
    return this.trees[slot]?.chars ?? 0;
  }

  private matchRate(matchedBlocks: number, r: RouteFeatures): number {
    const total = r.promptTokens > 0 ? r.promptTokens : r.requestBlocks * r.blockSize;
    return total > 0 ? Math.min(1, (matchedBlocks * r.blockSize) / total) : 0;
  }

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    const n = candidates.length;
    if (n === 0) return NO_CHOICE;
    let minLoad = Infinity;
    let maxLoad = -Infinity;
    let shortest = 0;
    for (let i = 0; i < n; i++) {
      const load = outstanding(candidates[i]);
      if (load < minLoad) {
        minLoad = load;
        shortest = i;
      }
      if (load > maxLoad) maxLoad = load;
    }
    this.request.load(request.blocks);
    let best = -1;
    let bestMatch = 0;
    let bestAccess = -1;
    for (let i = 0; i < n; i++) {
      const tree = this.trees[candidates[i].worker.slot];
      const m = tree ? this.request.presentPrefix(tree) : 0;
      if (m === 0) continue;
      const access = tree!.lastAccess(this.request.keys[m - 1]);
      if (m > bestMatch || (m === bestMatch && access > bestAccess)) {
        best = i;
        bestMatch = m;
        bestAccess = access;
      }
    }
    if (maxLoad - minLoad > this.balanceAbsThreshold && maxLoad > minLoad * this.balanceRelThreshold) {
      return { index: shortest, confidence: candidates[shortest].cachedFraction, reason: 'balance' };
    }
    if (best >= 0 && this.matchRate(bestMatch, request) > this.cacheThreshold) {
      return { index: best, confidence: candidates[best].cachedFraction, reason: 'cache-match' };
    }
    let ties = 0;
    for (let i = 0; i < n; i++) if (outstanding(candidates[i]) === minLoad) this.ties[ties++] = i;
    const least = ties === 1 ? this.ties[0] : this.ties[Math.floor(this.ctx.random() * ties)];
    return { index: least, confidence: candidates[least].cachedFraction, reason: 'least-loaded' };
  }

  onRouted(worker: WorkerState, request: RouteFeatures, _ticket: number, now: number): void {
    if (Number.isNaN(this.nextEviction)) this.nextEviction = now + this.evictionIntervalMs;
    const charsPerBlock = request.blockSize * SGLANG_CHARS_PER_TOKEN;
    if (now >= this.nextEviction) {
      for (const t of this.trees) t?.evict(this.maxTreeSize);
      this.nextEviction = now + this.evictionIntervalMs;
    }
    this.request.load(request.blocks);
    const tree = (this.trees[worker.slot] ??= new ApproxTree());
    // Past the cap, the least recently used blocks make room for the request's new blocks
    // before the insert (so the tree, and the slots behind it, stay within the cap) and what a
    // prompt larger than the cap brings goes after it. Trimming to the cap, not to
    // max_tree_size, costs each decision what it inserts, where a trim to max_tree_size would
    // stall one decision for a whole budget's worth of evictions; the interval pass still
    // trims to max_tree_size.
    const incoming = (this.request.length - this.request.presentPrefix(tree)) * charsPerBlock;
    if (tree.chars + incoming > this.hardMaxTreeSize) tree.evict(Math.max(0, this.hardMaxTreeSize - incoming));
    tree.insert(this.request.keys, this.request.length, ++this.epoch, charsPerBlock);
    if (tree.chars > this.hardMaxTreeSize) tree.evict(this.hardMaxTreeSize);
  }

  /** Upstream's `remove_tenant`: the worker's tree goes with it. */
  onWorkerRemoved(worker: WorkerState): void {
    this.trees[worker.slot] = undefined;
  }

  scoreTerms(c: Candidate, r: RouteFeatures): Record<string, number> {
    this.request.load(r.blocks);
    const tree = this.trees[c.worker.slot];
    const m = tree ? this.request.presentPrefix(tree) : 0;
    return { outstanding: outstanding(c), matchRate: this.matchRate(m, r), treeSize: this.treeSize(c.worker.slot) };
  }
}
