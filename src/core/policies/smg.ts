import * as check from '../validate.js';
import type { WorkerState } from '../worker-registry.js';
import { createRng } from '../rng.js';
import { ApproxTree, evictShared, totalChars } from './approx-tree.js';
import { BlockKeys } from './block-keys.js';
import { evictionIntervalMs, SGLANG_CHARS_PER_TOKEN, SGLANG_HARD_CAP_FACTOR } from './sglang.js';
import {
  NO_CHOICE,
  type Candidate,
  type PolicyChoice,
  type PolicyContext,
  type RouteFeatures,
  type RouteReason,
  type RoutingPolicy,
} from './types.js';

/**
 * The SGLang Model Gateway as spun out of SGLang (SMG, smg-project/smg, `smg launch`), policy
 * `cache_aware`, as of smg-project/smg@f8daa8835a8b4419b53125a837aaab2b3ce895c3 (2026-08-22),
 * model_gateway/src/policies/cache_aware.rs unless said otherwise. `sglang` models the gateway
 * as it was in SGLang's repository; since then:
 * - no request-count imbalance check over the fleet any more (smg#1621, edcbb353e): the only
 *   fleet-wide switch to the least-loaded worker is `is_kv_imbalanced`, on the engines'
 *   reported KV usage: the hottest worker's above overload_token_usage_threshold, or hottest
 *   − coldest above balance_token_usage_threshold; both 1.0 by default, so never (usage is
 *   at most 1). Here the usage is the worker's last scraped KV usage (WorkerState.load),
 *   workers not scraped yet left out as upstream leaves out workers without a snapshot.
 * - the least-loaded worker is the minimum of (load, processed, index) over the eligible
 *   workers (smg#1714, 823cbbf98): no random draw. `load` is the gateway's own count of its
 *   requests in flight on the worker (model_gateway/src/worker/worker.rs, `WorkerLoadGuard`,
 *   taken at dispatch and dropped with the response body; the mesh does not share it): here
 *   the router's in-flight requests less those other replicas reported. `processed` counts the
 *   decisions this policy credited to the worker (`increment_processed`, only cache_aware and
 *   least_load call it), kept here per worker from its registration.
 * - approximate tree, HTTP workers (`select_worker_with_text`, the default mode `text`): the
 *   request matched against one tree per model (crates/kv_index/src/string_tree.rs,
 *   `match_and_insert_with`); match rate = longest match any worker holds / whole prompt. Above
 *   cache_threshold, a hit: among the tenants of the deepest matched node
 *   (`matched_tenants`, at most MATCHED_TENANTS_CAP = 8 of them, crates/kv_index/src/common.rs,
 *   in the node's map order; here in worker registration order), the eligible one with the
 *   least load, ties at random (`select_matched_candidate`, `argmax_with_random_ties`,
 *   smg#2161, e19055424, and smg#2096, 352f77e19; the router's seeded random source here).
 *   None of them eligible: the first eligible worker, and nothing is inserted. At or below the
 *   threshold, a miss: the least-loaded worker. The match runs over every worker's entries,
 *   workers not eligible now (unhealthy, draining) included, as upstream's tree keeps them.
 * - the count-pressure gate (`gate_selected_candidate`, smg#2161): a hit's worker whose load
 *   exceeds both the mean load of the eligible workers × balance_rel_threshold and that mean +
 *   balance_abs_threshold gives the request to the least-loaded worker, which then becomes a
 *   holder of the prefix.
 * - the chosen worker's tree takes the prompt (every decision but the no-eligible-holder one).
 *   max_tree_size is one budget per model shared by all workers (smg#2137, 21c84ae4a,
 *   `evict_tenant_by_size`): every eviction_interval_secs, least recently used leaves of any
 *   worker go until the tree's total fits.
 * - mode `tokens` (`select_worker_with_tokens`, gRPC workers without KV events): the same over
 *   a token tree (crates/kv_index/src/token_tree.rs), its size counted in tokens.
 * - mode `events` (`select_worker_event_driven`, gRPC workers with KV events): the workers
 *   holding at least one leading block of the request by the engines' KV events (the router's
 *   overlap less predicted blocks, every tier: SMG's indexer ignores the medium,
 *   crates/kv_index/src/event_tree.rs), the most blocks first, then the lower load, then at
 *   random (`score_overlap`), gated as above; none: the least-loaded worker. The credited worker is the overlap winner even when
 *   the gate moves the request, as upstream increments before it gates. No tree insert; while
 *   the index is empty (no worker has an entry, `has_event_indexer`) the token tree decides,
 *   as upstream falls back to it. SMG keeps no predicted entries, so the router records none
 *   for this mode (`speculative`).
 * Defaults are `smg launch`'s (bindings/python/src/smg/router_args.py, `RouterArgs`):
 * cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5,
 * balance_token_usage_threshold and overload_token_usage_threshold 1.0, eviction_interval_secs
 * 60, max_tree_size 2^26 = 67,108,864. The Rust binary's own CLI (model_gateway/src/main.rs,
 * `--eviction-interval`) trims every 120 s; the library's `CacheAwareConfig::default`
 * (model_gateway/src/policies/mod.rs) differs: 0.5 / 32 / 1.1 / 30 s / 10,000. Ranges are
 * model_gateway/src/config/validation.rs's: balance_rel_threshold >= 1, the KV thresholds > 0.
 * The trees are kept over block hashes as `sglang`'s are, characters counted at 4 per token,
 * with its hard cap (twice max_tree_size, here over the shared total) bounding memory between
 * passes. Not modelled, all off by default: overlap_decay and selection_temperature (0), the
 * `cache_index = hash` placement map, the worker overload veto, and mesh tree sync.
 */
export interface SmgOptions {
  /** Which of upstream's three selections runs: 'text' (HTTP workers, default), 'tokens' or 'events' (gRPC). */
  mode?: SmgMode;
  /** Match rate (0-1) above which the tree's longest match is a hit (default 0.3). */
  cacheThreshold?: number;
  /** Requests past the mean load a hit's worker must exceed to be passed over (default 64). */
  balanceAbsThreshold?: number;
  /** Multiple (>= 1) of the mean load a hit's worker must exceed to be passed over (default 1.5). */
  balanceRelThreshold?: number;
  /** KV usage spread (hottest − coldest) above which the least-loaded worker wins (default 1: off). */
  balanceTokenUsageThreshold?: number;
  /** KV usage of the hottest worker above which the least-loaded worker wins (default 1: off). */
  overloadTokenUsageThreshold?: number;
  /** Seconds between eviction passes over the trees (default 60). */
  evictionIntervalSecs?: number;
  /** Characters ('text') or tokens the trees may hold together before eviction trims them (default 67,108,864). */
  maxTreeSize?: number;
}

/** Upstream's three selections, by the workers' connection and whether they send KV events. */
export const SMG_MODES = Object.freeze(['text', 'tokens', 'events'] as const);
export type SmgMode = (typeof SMG_MODES)[number];

/** Tenants a match reports for the deepest matched node (kv_index `MATCHED_TENANTS_CAP`). */
export const SMG_MATCHED_TENANTS_CAP = 8;

export class SmgPolicy implements RoutingPolicy {
  readonly name = 'smg';
  readonly mode: SmgMode;
  /** The trees read every block of every request; the event-driven mode reads them only while its index is empty. */
  readonly readsBlocks: boolean;
  readonly speculative: boolean;
  readonly cacheThreshold: number;
  readonly balanceAbsThreshold: number;
  readonly balanceRelThreshold: number;
  readonly balanceTokenUsageThreshold: number;
  readonly overloadTokenUsageThreshold: number;
  readonly evictionIntervalMs: number;
  readonly maxTreeSize: number;
  /** Total past which a decision trims the trees at once (SGLANG_HARD_CAP_FACTOR). */
  readonly hardMaxTreeSize: number;
  /** Tree units per token: characters for the string tree, tokens for the token tree. */
  private readonly unitsPerToken: number;
  private readonly trees: Array<ApproxTree | undefined> = [];
  /** Per worker slot: decisions credited to the worker (upstream's processed counter). */
  private readonly processed: number[] = [];
  private readonly request = new BlockKeys();
  private readonly ties: number[] = [];
  /** Slots of the workers holding the deepest match, at most SMG_MATCHED_TENANTS_CAP. */
  private readonly holders = new Int32Array(SMG_MATCHED_TENANTS_CAP);
  /** What the last choose() asks of onRouted(): insert the prompt, credit a worker's slot. */
  private insertPrompt = false;
  private creditSlot = -1;
  private epoch = 0;
  private nextEviction = Number.NaN;

  constructor(
    options: SmgOptions = {},
    private readonly ctx: PolicyContext = { random: createRng(1) },
  ) {
    const mode: unknown = options.mode ?? 'text';
    if (!(SMG_MODES as readonly unknown[]).includes(mode))
      throw new RangeError(`smg.mode must be 'text', 'tokens' or 'events', got '${String(mode)}'`);
    this.mode = mode as SmgMode;
    this.readsBlocks = this.mode !== 'events';
    this.speculative = this.mode !== 'events';
    this.unitsPerToken = this.mode === 'text' ? SGLANG_CHARS_PER_TOKEN : 1;
    this.cacheThreshold = check.fraction(options.cacheThreshold ?? 0.3, 'smg.cacheThreshold');
    this.balanceAbsThreshold = check.finiteNonNegative(options.balanceAbsThreshold ?? 64, 'smg.balanceAbsThreshold');
    this.balanceRelThreshold = check.finiteNonNegative(options.balanceRelThreshold ?? 1.5, 'smg.balanceRelThreshold');
    if (this.balanceRelThreshold < 1)
      throw new RangeError(`smg.balanceRelThreshold must be >= 1, got ${this.balanceRelThreshold}`);
    this.balanceTokenUsageThreshold = positive(options.balanceTokenUsageThreshold, 'smg.balanceTokenUsageThreshold');
    this.overloadTokenUsageThreshold = positive(options.overloadTokenUsageThreshold, 'smg.overloadTokenUsageThreshold');
    this.evictionIntervalMs = evictionIntervalMs(options.evictionIntervalSecs, 'smg.evictionIntervalSecs');
    this.maxTreeSize = check.positiveInt(options.maxTreeSize, 'smg.maxTreeSize', 67_108_864);
    this.hardMaxTreeSize = this.maxTreeSize * SGLANG_HARD_CAP_FACTOR;
  }

  /** Units (characters or tokens) in a worker's part of the tree. */
  treeSize(slot: number): number {
    return this.trees[slot]?.chars ?? 0;
  }

  /** Units in the whole tree, every worker's part together (the budget max_tree_size bounds). */
  totalTreeSize(): number {
    return totalChars(this.trees);
  }

  /** Decisions credited to the worker in `slot` (upstream's processed counter). */
  processedCount(slot: number): number {
    return this.processed[slot] ?? 0;
  }

  /** The gateway's own count of its requests in flight on the worker. */
  private load(c: Candidate): number {
    const w = c.worker;
    return Math.max(0, w.inFlightRequests - w.remoteInFlightRequests);
  }

  private matchRate(matchedBlocks: number, r: RouteFeatures): number {
    const total = r.promptTokens > 0 ? r.promptTokens : r.requestBlocks * r.blockSize;
    return total > 0 ? Math.min(1, (matchedBlocks * r.blockSize) / total) : 0;
  }

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    const n = candidates.length;
    this.insertPrompt = false;
    this.creditSlot = -1;
    if (n === 0) return NO_CHOICE;
    // one pass: the load sum for the gate and the least-loaded worker by (load, processed, index)
    let loadSum = 0;
    let least = 0;
    let leastLoad = Infinity;
    let leastProcessed = Infinity;
    let indexed = false;
    for (let i = 0; i < n; i++) {
      const c = candidates[i];
      const load = this.load(c);
      const processed = this.processedCount(c.worker.slot);
      loadSum += load;
      if (load < leastLoad || (load === leastLoad && processed < leastProcessed)) {
        least = i;
        leastLoad = load;
        leastProcessed = processed;
      }
      if (c.indexEntries > 0) indexed = true;
    }
    const meanLoad = loadSum / n;
    if (this.kvImbalanced(candidates)) return this.decide(candidates, least, least, true, 'balance');
    if (this.mode === 'events' && indexed) return this.chooseByOverlap(candidates, least, meanLoad);
    return this.chooseByTree(candidates, request, least, meanLoad);
  }

  /** `is_kv_imbalanced`: the hottest scraped worker's KV usage, or the spread, past its threshold. */
  private kvImbalanced(candidates: readonly Candidate[]): boolean {
    let lo = Infinity;
    let hi = -Infinity;
    for (const c of candidates) {
      if (c.worker.metricsAt === undefined) continue;
      if (c.worker.load < lo) lo = c.worker.load;
      if (c.worker.load > hi) hi = c.worker.load;
    }
    if (hi < lo) return false;
    return hi > this.overloadTokenUsageThreshold || hi - lo > this.balanceTokenUsageThreshold;
  }

  /** The approximate tree: a hit goes to the least-loaded holder, gated; a miss to the least-loaded worker. */
  private chooseByTree(
    candidates: readonly Candidate[],
    request: RouteFeatures,
    least: number,
    meanLoad: number,
  ): PolicyChoice {
    this.request.load(request.blocks);
    let depth = 0;
    for (const tree of this.trees) {
      if (!tree) continue;
      const m = this.request.presentPrefix(tree);
      if (m > depth) depth = m;
    }
    if (depth === 0 || !(this.matchRate(depth, request) > this.cacheThreshold))
      return this.decide(candidates, least, least, true, 'least-loaded');
    // the deepest matched node's tenants (a tree holding its block holds the whole prefix)
    const key = this.request.keys[depth - 1];
    let holders = 0;
    for (let slot = 0; slot < this.trees.length && holders < SMG_MATCHED_TENANTS_CAP; slot++)
      if (this.trees[slot]?.has(key)) this.holders[holders++] = slot;
    let ties = 0;
    let bestLoad = Infinity;
    for (let i = 0; i < candidates.length; i++) {
      if (!this.holds(candidates[i].worker.slot, holders)) continue;
      const load = this.load(candidates[i]);
      if (load < bestLoad) {
        bestLoad = load;
        ties = 0;
      }
      if (load === bestLoad) this.ties[ties++] = i;
    }
    // no holder is eligible: the first eligible worker, with nothing inserted or credited
    if (ties === 0) return this.decide(candidates, 0, -1, false, 'cache-match');
    const pick = this.draw(ties);
    if (this.gated(candidates[pick], meanLoad)) return this.decide(candidates, least, least, true, 'balance');
    return this.decide(candidates, pick, pick, true, 'cache-match');
  }

  /** The event-driven mode: most leading blocks held, then the lower load, then at random; gated. */
  private chooseByOverlap(candidates: readonly Candidate[], least: number, meanLoad: number): PolicyChoice {
    let ties = 0;
    let bestOverlap = 0;
    let bestLoad = Infinity;
    for (let i = 0; i < candidates.length; i++) {
      // what the engines reported: SMG's index holds no prediction (another replica's, shared)
      const overlap = candidates[i].overlapBlocks - candidates[i].predictedBlocks;
      if (overlap <= 0) continue;
      const load = this.load(candidates[i]);
      if (overlap > bestOverlap || (overlap === bestOverlap && load < bestLoad)) {
        bestOverlap = overlap;
        bestLoad = load;
        ties = 0;
      }
      if (overlap === bestOverlap && load === bestLoad) this.ties[ties++] = i;
    }
    if (ties === 0) return this.decide(candidates, least, least, false, 'least-loaded');
    const pick = this.draw(ties);
    // upstream credits the overlap winner before the gate moves the request
    if (this.gated(candidates[pick], meanLoad)) return this.decide(candidates, least, pick, false, 'balance');
    return this.decide(candidates, pick, pick, false, 'cache-match');
  }

  private holds(slot: number, holders: number): boolean {
    for (let h = 0; h < holders; h++) if (this.holders[h] === slot) return true;
    return false;
  }

  /** One of the first `ties` indices in this.ties, uniformly (no draw for one). */
  private draw(ties: number): number {
    return ties === 1 ? this.ties[0] : this.ties[Math.floor(this.ctx.random() * ties)];
  }

  /** `gate_selected_candidate`: past both margins over the mean load, the request spills. */
  private gated(c: Candidate, meanLoad: number): boolean {
    const load = this.load(c);
    return load > meanLoad * this.balanceRelThreshold && load > meanLoad + this.balanceAbsThreshold;
  }

  private decide(
    candidates: readonly Candidate[],
    index: number,
    credit: number,
    insert: boolean,
    reason: RouteReason,
  ): PolicyChoice {
    this.insertPrompt = insert;
    this.creditSlot = credit >= 0 ? candidates[credit].worker.slot : -1;
    return { index, confidence: candidates[index].cachedFraction, reason };
  }

  onRouted(worker: WorkerState, request: RouteFeatures, _ticket: number, now: number): void {
    const insert = this.insertPrompt;
    const credit = this.creditSlot;
    this.insertPrompt = false;
    this.creditSlot = -1;
    if (credit >= 0) this.processed[credit] = this.processedCount(credit) + 1;
    if (Number.isNaN(this.nextEviction)) this.nextEviction = now + this.evictionIntervalMs;
    const unitsPerBlock = request.blockSize * this.unitsPerToken;
    if (now >= this.nextEviction) {
      evictShared(this.trees, this.maxTreeSize);
      this.nextEviction = now + this.evictionIntervalMs;
    }
    if (!insert) return;
    this.request.load(request.blocks);
    const tree = (this.trees[worker.slot] ??= new ApproxTree());
    // past the hard cap, the least recently used blocks of any worker make room first (as
    // `sglang` does for one worker's tree); the interval pass still trims to max_tree_size
    const incoming = (this.request.length - this.request.presentPrefix(tree)) * unitsPerBlock;
    if (totalChars(this.trees) + incoming > this.hardMaxTreeSize)
      evictShared(this.trees, Math.max(0, this.hardMaxTreeSize - incoming));
    tree.insert(this.request.keys, this.request.length, ++this.epoch, unitsPerBlock);
    if (totalChars(this.trees) > this.hardMaxTreeSize) evictShared(this.trees, this.hardMaxTreeSize);
  }

  /** `remove_worker`: its entries and its counters go with it. */
  onWorkerRemoved(worker: WorkerState): void {
    this.trees[worker.slot] = undefined;
    this.processed[worker.slot] = 0;
  }

  scoreTerms(c: Candidate, r: RouteFeatures): Record<string, number> {
    const terms: Record<string, number> = {
      load: this.load(c),
      processed: this.processedCount(c.worker.slot),
      treeSize: this.treeSize(c.worker.slot),
    };
    if (this.mode === 'events') terms.overlap = c.overlapBlocks - c.predictedBlocks;
    this.request.load(r.blocks);
    const tree = this.trees[c.worker.slot];
    terms.matchRate = this.matchRate(tree ? this.request.presentPrefix(tree) : 0, r);
    return terms;
  }
}

/** A KV-usage threshold: finite and > 0, as upstream validates (1 or more turns it off). */
function positive(value: number | undefined, name: string): number {
  const v = check.finiteNonNegative(value ?? 1, name);
  if (v === 0) throw new RangeError(`${name} must be > 0, got 0`);
  return v;
}
