import * as check from '../validate.js';
import type { WorkerState } from '../worker-registry.js';
import { outstanding } from './pick.js';
import { BlockKeys } from './block-keys.js';
import { NO_CHOICE, type Candidate, type PolicyChoice, type RouteFeatures, type RoutingPolicy } from './types.js';

/**
 * SGLang's router (sgl-project/sglang, sgl-model-gateway/src/policies/cache_aware.rs, formerly
 * sgl-router/src/policies/cache_aware.rs), policy `cache_aware`:
 * - the system is imbalanced when (max load − min load) > balance_abs_threshold AND
 *   max load > balance_rel_threshold · min load, a worker's load being the router's count of
 *   its outstanding requests; then the least-loaded worker wins;
 * - otherwise the worker with the longest prefix match in the router's *approximate tree*
 *   wins if the match rate (matched / whole prompt; upstream counts characters of the request
 *   text) exceeds cache_threshold;
 * - otherwise the tenant with the smallest tree (`get_smallest_tenant`: fewest characters).
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
 * Defaults are the gateway CLI's (sgl-model-gateway/src/main.rs, what `sglang-router` /
 * `smg launch` run with): cache_threshold 0.3, balance_abs_threshold 64,
 * balance_rel_threshold 1.5, eviction_interval 120 s, max_tree_size 67,108,864. (The
 * library's `CacheAwareConfig::default` differs: 0.5 / 32 / 1.1 / 30 s / 10,000.)
 */
export interface SglangOptions {
  cacheThreshold?: number;
  balanceAbsThreshold?: number;
  balanceRelThreshold?: number;
  /** Seconds between eviction passes over the approximate trees (default 120; see SGLANG_EVICTION_INTERVAL_SECS). */
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

/** Characters per token when sizing the tree (the router's text mode: 64-byte chunks ≈ 16 tokens). */
export const SGLANG_CHARS_PER_TOKEN = 4;

/** One worker's approximate tree: block → (last access epoch, depth). */
class ApproxTree {
  readonly lastAccess = new Map<number, number>();
  readonly depth = new Map<number, number>();
  /** Characters the tree holds. */
  chars = 0;

  insert(keys: Float64Array, n: number, epoch: number, charsPerBlock: number): void {
    for (let i = 0; i < n; i++) {
      const k = keys[i];
      if (!this.lastAccess.has(k)) {
        this.depth.set(k, i);
        this.chars += charsPerBlock;
      }
      this.lastAccess.set(k, epoch);
    }
  }

  /** Drops least-recently-used leaves until the tree holds at most `max` characters. */
  evict(max: number, charsPerBlock: number): void {
    if (this.chars <= max) return;
    // a node is touched whenever a descendant is, so (oldest access, deepest first) is a
    // leaf-first order: no node goes before its descendants
    const entries = [...this.lastAccess.entries()];
    entries.sort((a, b) => a[1] - b[1] || this.depth.get(b[0])! - this.depth.get(a[0])!);
    for (const [k] of entries) {
      if (this.chars <= max) break;
      this.lastAccess.delete(k);
      this.depth.delete(k);
      this.chars -= charsPerBlock;
    }
  }
}

export class SglangPolicy implements RoutingPolicy {
  readonly name = 'sglang';
  readonly readsBlocks = true; // the approximate tree: every block of every request
  readonly cacheThreshold: number;
  readonly balanceAbsThreshold: number;
  readonly balanceRelThreshold: number;
  readonly evictionIntervalMs: number;
  readonly maxTreeSize: number;
  private readonly trees: Array<ApproxTree | undefined> = [];
  private readonly request = new BlockKeys();
  private epoch = 0;
  private nextEviction = Number.NaN;

  constructor(options: SglangOptions = {}) {
    this.cacheThreshold = check.fraction(options.cacheThreshold ?? 0.3, 'sglang.cacheThreshold');
    this.balanceAbsThreshold = check.finiteNonNegative(options.balanceAbsThreshold ?? 64, 'sglang.balanceAbsThreshold');
    this.balanceRelThreshold = check.finiteNonNegative(
      options.balanceRelThreshold ?? 1.5,
      'sglang.balanceRelThreshold',
    );
    const interval: unknown = options.evictionIntervalSecs ?? 120;
    if (typeof interval !== 'number')
      throw new TypeError(`sglang.evictionIntervalSecs must be a number, got ${typeof interval}`);
    const { min, max } = SGLANG_EVICTION_INTERVAL_SECS;
    if (!Number.isInteger(interval) || interval < min || interval > max)
      throw new RangeError(
        `sglang.evictionIntervalSecs must be a whole number of seconds from ${min} to ${max}, got ${interval}`,
      );
    this.evictionIntervalMs = interval * 1000;
    this.maxTreeSize = check.finiteNonNegative(options.maxTreeSize ?? 67_108_864, 'sglang.maxTreeSize');
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
      const m = tree ? this.request.presentPrefix(tree.lastAccess) : 0;
      if (m === 0) continue;
      const access = tree!.lastAccess.get(this.request.keys[m - 1])!;
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
    let smallest = 0;
    for (let i = 1; i < n; i++)
      if (this.treeSize(candidates[i].worker.slot) < this.treeSize(candidates[smallest].worker.slot)) smallest = i;
    return { index: smallest, confidence: candidates[smallest].cachedFraction, reason: 'least-loaded' };
  }

  onRouted(worker: WorkerState, request: RouteFeatures, _ticket: number, now: number): void {
    if (Number.isNaN(this.nextEviction)) this.nextEviction = now + this.evictionIntervalMs;
    const charsPerBlock = request.blockSize * SGLANG_CHARS_PER_TOKEN;
    if (now >= this.nextEviction) {
      for (const t of this.trees) t?.evict(this.maxTreeSize, charsPerBlock);
      this.nextEviction = now + this.evictionIntervalMs;
    }
    this.request.load(request.blocks);
    const tree = (this.trees[worker.slot] ??= new ApproxTree());
    tree.insert(this.request.keys, this.request.length, ++this.epoch, charsPerBlock);
  }

  /** Upstream's `remove_tenant`: the worker's tree goes with it. */
  onWorkerRemoved(worker: WorkerState): void {
    this.trees[worker.slot] = undefined;
  }

  scoreTerms(c: Candidate, r: RouteFeatures): Record<string, number> {
    this.request.load(r.blocks);
    const tree = this.trees[c.worker.slot];
    const m = tree ? this.request.presentPrefix(tree.lastAccess) : 0;
    return { outstanding: outstanding(c), matchRate: this.matchRate(m, r), treeSize: this.treeSize(c.worker.slot) };
  }
}
