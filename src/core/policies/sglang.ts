import * as check from '../validate.js';
import { resized } from '../typed-arrays.js';
import type { WorkerState } from '../worker-registry.js';
import { createRng } from '../rng.js';
import { outstanding } from './pick.js';
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

const INITIAL_TREE_SLOTS = 64;

/** A bucket of the tree's hash index: 32 well-mixed bits of a 53-bit block key. */
function mixKey(key: number): number {
  const h = Math.imul((key >>> 0) ^ Math.imul(Math.floor(key / 4294967296), 0x9e3779b1), 0x85ebca6b);
  return Math.imul(h ^ (h >>> 15), 0xc2b2ae35) ^ (h >>> 13);
}

/**
 * One worker's approximate tree: its blocks in least-recently-used order, kept as it changes
 * (a doubly linked list over slots of typed arrays) so that eviction costs what it removes.
 * An insert moves the request's blocks to the most recent end deepest first, so the list is
 * ordered by (last access, depth descending); a node is touched whenever a descendant is, so
 * that order is leaf-first: no node goes before its descendants and the tree stays
 * prefix-closed as it shrinks. Blocks are found through an open-addressing index over the
 * same slots (linear probing, deletion by backward shift): no per-block heap objects for the
 * collector to trace, and a delete as cheap as a lookup, where a Map of a million float keys
 * takes hundreds of milliseconds to empty.
 */
class ApproxTree {
  private keyAt = new Float64Array(INITIAL_TREE_SLOTS);
  private accessAt = new Float64Array(INITIAL_TREE_SLOTS);
  private prev = new Int32Array(INITIAL_TREE_SLOTS);
  private next = new Int32Array(INITIAL_TREE_SLOTS);
  /** Hash index: slot + 1 per bucket, 0 when empty; twice the slots, so at most half full. */
  private buckets = new Int32Array(2 * INITIAL_TREE_SLOTS);
  /** Each bucket's mixed key, so that probes and shifts read the index alone. */
  private bucketHash = new Int32Array(2 * INITIAL_TREE_SLOTS);
  /** Least recently used slot (evicted first), −1 when empty. */
  private oldest = -1;
  private newest = -1;
  /** Free slots, chained through `next`. */
  private freeSlot = -1;
  /** Slots handed out so far (the high-water mark). */
  private slotsUsed = 0;
  /** Characters the tree holds. */
  chars = 0;

  has(key: number): boolean {
    return this.find(key) >= 0;
  }

  /** The epoch of the block's last access; −1 when the tree lacks it. */
  lastAccess(key: number): number {
    const slot = this.find(key);
    return slot < 0 ? -1 : this.accessAt[slot];
  }

  insert(keys: Float64Array, n: number, epoch: number, charsPerBlock: number): void {
    for (let i = n - 1; i >= 0; i--) {
      const key = keys[i];
      let slot = this.find(key);
      if (slot < 0) {
        slot = this.allocate(key);
        this.chars += charsPerBlock;
      } else this.unlink(slot);
      this.accessAt[slot] = epoch;
      this.append(slot);
    }
  }

  /** Drops least-recently-used leaves until the tree holds at most `max` characters. */
  evict(max: number, charsPerBlock: number): void {
    while (this.chars > max && this.oldest >= 0) {
      const slot = this.oldest;
      this.unlink(slot);
      this.unindex(slot);
      this.next[slot] = this.freeSlot;
      this.freeSlot = slot;
      this.chars -= charsPerBlock;
    }
  }

  /** The key's slot, −1 when absent. */
  private find(key: number): number {
    const mask = this.buckets.length - 1;
    const hash = mixKey(key);
    for (let b = hash & mask; ; b = (b + 1) & mask) {
      const entry = this.buckets[b];
      if (entry === 0) return -1;
      if (this.bucketHash[b] === hash && this.keyAt[entry - 1] === key) return entry - 1;
    }
  }

  private index(slot: number): void {
    const mask = this.buckets.length - 1;
    const hash = mixKey(this.keyAt[slot]);
    let b = hash & mask;
    while (this.buckets[b] !== 0) b = (b + 1) & mask;
    this.buckets[b] = slot + 1;
    this.bucketHash[b] = hash;
  }

  /** Removes the slot from the index, shifting later entries of its probe run back (no tombstones). */
  private unindex(slot: number): void {
    const { buckets, bucketHash } = this;
    const mask = buckets.length - 1;
    let hole = mixKey(this.keyAt[slot]) & mask;
    while (buckets[hole] !== slot + 1) hole = (hole + 1) & mask;
    for (let b = (hole + 1) & mask; buckets[b] !== 0; b = (b + 1) & mask) {
      const home = bucketHash[b] & mask;
      // the entry at b may fill the hole unless its home lies cyclically in (hole, b]
      if (hole <= b ? home > hole && home <= b : home > hole || home <= b) continue;
      buckets[hole] = buckets[b];
      bucketHash[hole] = bucketHash[b];
      hole = b;
    }
    buckets[hole] = 0;
  }

  private allocate(key: number): number {
    let slot = this.freeSlot;
    if (slot >= 0) this.freeSlot = this.next[slot];
    else {
      if (this.slotsUsed === this.keyAt.length) this.grow();
      slot = this.slotsUsed++;
    }
    this.keyAt[slot] = key;
    this.index(slot);
    return slot;
  }

  /** Doubles the slots and rebuilds the index (only while the tree grows to its cap). */
  private grow(): void {
    const size = this.keyAt.length * 2;
    this.keyAt = resized(this.keyAt, size);
    this.accessAt = resized(this.accessAt, size);
    this.prev = resized(this.prev, size);
    this.next = resized(this.next, size);
    this.buckets = new Int32Array(2 * size);
    this.bucketHash = new Int32Array(2 * size);
    // every slot is live when the tree grows (none was free)
    for (let slot = 0; slot < this.slotsUsed; slot++) this.index(slot);
  }

  private unlink(slot: number): void {
    const before = this.prev[slot];
    const after = this.next[slot];
    if (before >= 0) this.next[before] = after;
    else this.oldest = after;
    if (after >= 0) this.prev[after] = before;
    else this.newest = before;
  }

  private append(slot: number): void {
    this.prev[slot] = this.newest;
    this.next[slot] = -1;
    if (this.newest >= 0) this.next[this.newest] = slot;
    else this.oldest = slot;
    this.newest = slot;
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
    const interval: unknown = options.evictionIntervalSecs ?? 60;
    if (typeof interval !== 'number')
      throw new TypeError(`sglang.evictionIntervalSecs must be a number, got ${typeof interval}`);
    const { min, max } = SGLANG_EVICTION_INTERVAL_SECS;
    if (!Number.isInteger(interval) || interval < min || interval > max)
      throw new RangeError(
        `sglang.evictionIntervalSecs must be a whole number of seconds from ${min} to ${max}, got ${interval}`,
      );
    this.evictionIntervalMs = interval * 1000;
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
      for (const t of this.trees) t?.evict(this.maxTreeSize, charsPerBlock);
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
    if (tree.chars + incoming > this.hardMaxTreeSize)
      tree.evict(Math.max(0, this.hardMaxTreeSize - incoming), charsPerBlock);
    tree.insert(this.request.keys, this.request.length, ++this.epoch, charsPerBlock);
    if (tree.chars > this.hardMaxTreeSize) tree.evict(this.hardMaxTreeSize, charsPerBlock);
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
