import * as check from '../validate.js';
import { LLMD_SCRAPE_INTERVAL_MS, LLMD_SCRAPE_INTERVAL_RANGE } from './llmd.js';
import { pickWithRandomTies } from './pick.js';
import {
  NO_CHOICE,
  type Candidate,
  type PolicyChoice,
  type PolicyContext,
  type RouteFeatures,
  type RoutingPolicy,
} from './types.js';

/**
 * llm-d's routing as its deployment guides configure it since mid-2026: a prefix-affinity
 * filter, then the token-load scorer alone, then the max-score picker. The guides:
 * - optimized-baseline (llm-d/llm-d#1651; guides/optimized-baseline/router/
 *   optimized-baseline.values.yaml at llm-d/llm-d@0a3b0c939d50576e91adddf8add79441c29957d1):
 *   approx-prefix-cache-producer, inflight-load-producer, prefix-cache-affinity-filter
 *   (affinityThreshold 0.80, maxTTFTPenaltyMs 0: always stick) and token-load-scorer;
 * - precise-prefix-cache-routing (llm-d/llm-d#2071, #2148; guides/precise-prefix-cache-routing/
 *   router/precise-prefix-cache-routing.values.yaml at
 *   llm-d/llm-d@8052f2209e2976ba5213e56bde50255fc73badce): the same profile fed by the
 *   precise-prefix-cache-producer (KV events, `speculativeIndexing: true`), the filter with
 *   `peakPrefillThroughput: 15926` and its other parameters left at their defaults, so its
 *   TTFT load gate is on (maxTTFTPenaltyMs 18000), and one EPP replica.
 * This router scores prefixes from the engines' KV events, so this policy is the precise
 * guide's, and its defaults are that guide's. The plugins (llm-d/llm-d-router at
 * ebab687927f5331c1b39defcb579a07951bce56c, under pkg/epp/framework/plugins/):
 * - prefix score (scheduling/filter/prefixcacheaffinity/plugin.go, `prefixCacheScore`):
 *   MatchBlocks / TotalBlocks, 0 without full blocks. The precise producer's MatchBlocks
 *   (requestcontrol/dataproducer/preciseprefixcache/producer.go) is the longest consecutive
 *   prefix held, each block weighted by its tier and the sum truncated to a whole number
 *   (pkg/kvcache/kvblock_scorer.go, `LongestPrefixScorer`; pkg/kvcache/backend.go: gpu 1.0,
 *   cpu 0.8, a speculative entry, which has no tier, 1.0); TotalBlocks the prompt's full blocks.
 * - prefix-cache-affinity-filter (same plugin.go, `Filter`, `DefaultConfig`): with two or more
 *   endpoints and affinityThreshold > 0, the endpoints whose own prefix score is at least
 *   affinityThreshold are sticky (an absolute score, not relative to the best); none sticky:
 *   all are kept. TTFT load gate, when maxTTFTPenaltyMs > 0 and some endpoint is not sticky:
 *   each endpoint's TTFT is in-flight tokens / peakPrefillThroughput · 1000 ms, and when the
 *   best sticky one's exceeds the best non-sticky one's by more than maxTTFTPenaltyMs, all
 *   are kept; otherwise only the sticky ones. explorationProbability defaults to 0 (off).
 * - token-load-scorer (scheduling/scorer/tokenload/token_load.go): 1 − min(1, tokens /
 *   queueThresholdTokens), queueThresholdTokens 4194304 (`tokenLoadCapacity`), the tokens
 *   being the endpoint's in-flight tokens plus the request's own uncached tokens on it.
 * - inflight-load-producer (requestcontrol/dataproducer/inflightload/producer.go, README.md):
 *   at dispatch (PreRequest) adds to the chosen endpoint the request's uncached tokens there,
 *   (TotalBlocks − MatchBlocks) · block size plus the prompt past its indexed blocks
 *   (`uncachedInputTokens`); with addEstimatedOutputTokens false (the default) releases them
 *   at the response's first chunk (StartOfStream), or at its end when not streamed. The
 *   count is the EPP's own requests, not engine metrics. Here the in-flight tokens are the
 *   router's own count for the requests it routed (WorkerState.queuedPrefillTokens less what
 *   other replicas reported): each request's prompt less the tokens the router credits as
 *   cached on the chosen worker, released at its first token. A request whose answer is not
 *   streamed (RouteOptions.firstTokenReported false, as the gateway passes for it) has its
 *   tokens released when the router infers its prefill done (with the precise index: the KV
 *   event storing the prompt's last full block, or, with less than a block left, the engine's
 *   waiting queue no longer holding it), where upstream holds them to the response's end;
 *   with nothing to infer it from, at the end as upstream. The request's own uncached tokens
 *   follow upstream's formula above.
 * - max-score-picker (scheduling/picker/maxscore/picker.go): the highest score, ties at random
 *   (shuffle, then a stable sort); the config loader adds it and weight 1 when a profile has
 *   none (pkg/epp/config/loader/defaults.go, `ensureSchedulingLayer`).
 * - speculative entries (requestcontrol/dataproducer/preciseprefixcache/prerequest.go): with
 *   speculativeIndexing the chosen endpoint is indexed as holding the whole prompt for
 *   speculativeTTL (default 2 s); here the router's own speculative entries stand in for them
 *   (`speculative`), with the router's extent and lifetime.
 * Metrics are refreshed every 50 ms (pkg/epp/server/options.go, `RefreshMetricsInterval`),
 * though nothing in this profile reads them: `scrapeIntervalMs`, as for llmd (the simulator's
 * alone; `serve` and `epp` scrape at their --metrics-interval-ms).
 * Not modelled: flow control and saturation admission in front of the scheduler, and the
 * filter's exploration (off by default).
 */
export interface LlmdAffinityOptions {
  /** Prefix score (0-1) at or above which an endpoint is sticky (default 0.80; 0 turns the filter off). */
  affinityThreshold?: number;
  /** TTFT (ms) a sticky endpoint may lose to a non-sticky one before all are kept (default 18000; 0: always stick). */
  maxTtftPenaltyMs?: number;
  /** Prefill tokens a second that turn in-flight tokens into the gate's TTFT (default 15926; 0 only with maxTtftPenaltyMs 0). */
  peakPrefillThroughput?: number;
  /** In-flight tokens at which the token-load score reaches 0 (default 4194304, queueThresholdTokens). */
  tokenLoadCapacity?: number;
  /**
   * How often the simulator scrapes engine metrics for this policy, ms (default 50, llm-d's
   * RefreshMetricsInterval). Read by the simulator alone: `serve` and `epp` scrape at
   * --metrics-interval-ms whatever the policy.
   */
  scrapeIntervalMs?: number;
  /** Speculative entries for each decision, as the precise guide's speculativeIndexing (default true). */
  speculativeIndexing?: boolean;
}

/** The filter's affinityThreshold default (prefixcacheaffinity `DefaultConfig`). */
export const LLMD_AFFINITY_THRESHOLD = 0.8;
/** The filter's maxTTFTPenaltyMs default (ms), which the precise guide keeps. */
export const LLMD_MAX_TTFT_PENALTY_MS = 18_000;
/** The precise guide's peakPrefillThroughput (tokens a second). */
export const LLMD_PEAK_PREFILL_THROUGHPUT = 15_926;
/** token-load-scorer's queueThresholdTokens default (128 requests of 32K tokens). */
export const LLMD_TOKEN_LOAD_CAPACITY = 4_194_304;
/** The precise producer's weight of a block held in CPU (offload) memory (pkg/kvcache/backend.go). */
const CPU_TIER_WEIGHT = 0.8;

export class LlmdAffinityPolicy implements RoutingPolicy {
  readonly name = 'llmd-affinity';
  readonly affinityThreshold: number;
  readonly maxTtftPenaltyMs: number;
  readonly peakPrefillThroughput: number;
  readonly tokenLoadCapacity: number;
  readonly scrapeIntervalMs: number;
  readonly speculative: boolean;
  private readonly ties: number[] = [];
  private scores = new Float64Array(64);
  private prefix = new Float64Array(64);
  /** Whether the last choose() kept only the sticky candidates. */
  private narrowed = false;

  constructor(
    private readonly ctx: PolicyContext,
    options: LlmdAffinityOptions = {},
  ) {
    this.affinityThreshold = check.fraction(
      options.affinityThreshold ?? LLMD_AFFINITY_THRESHOLD,
      'llmd-affinity.affinityThreshold',
    );
    this.maxTtftPenaltyMs = check.finiteNonNegative(
      options.maxTtftPenaltyMs ?? LLMD_MAX_TTFT_PENALTY_MS,
      'llmd-affinity.maxTtftPenaltyMs',
    );
    this.peakPrefillThroughput = check.finiteNonNegative(
      options.peakPrefillThroughput ?? LLMD_PEAK_PREFILL_THROUGHPUT,
      'llmd-affinity.peakPrefillThroughput',
    );
    // it divides only for the TTFT load gate, which a penalty of 0 turns off (upstream's
    // validate() takes 0 then)
    if (this.peakPrefillThroughput === 0 && this.maxTtftPenaltyMs > 0)
      throw new RangeError(
        'llmd-affinity.peakPrefillThroughput must be > 0 unless llmd-affinity.maxTtftPenaltyMs is 0, got 0',
      );
    this.tokenLoadCapacity = check.finiteNonNegative(
      options.tokenLoadCapacity ?? LLMD_TOKEN_LOAD_CAPACITY,
      'llmd-affinity.tokenLoadCapacity',
    );
    if (!Number.isSafeInteger(this.tokenLoadCapacity) || this.tokenLoadCapacity < 1)
      throw new RangeError(
        `llmd-affinity.tokenLoadCapacity must be a whole number of tokens >= 1, got ${this.tokenLoadCapacity}`,
      );
    this.scrapeIntervalMs = check.finiteNonNegative(
      options.scrapeIntervalMs ?? LLMD_SCRAPE_INTERVAL_MS,
      'llmd-affinity.scrapeIntervalMs',
    );
    const { min, max } = LLMD_SCRAPE_INTERVAL_RANGE;
    if (this.scrapeIntervalMs < min || this.scrapeIntervalMs > max)
      throw new RangeError(
        `llmd-affinity.scrapeIntervalMs must be from ${min} to ${max}, got ${this.scrapeIntervalMs}`,
      );
    const speculative = options.speculativeIndexing ?? true;
    if (typeof speculative !== 'boolean')
      throw new TypeError(`llmd-affinity.speculativeIndexing must be a boolean, got ${typeof speculative}`);
    this.speculative = speculative;
  }

  /** The precise producer's MatchBlocks / TotalBlocks: tier-weighted, truncated, over full blocks. */
  private prefixScore(c: Candidate, r: RouteFeatures): number {
    if (r.requestBlocks <= 0) return 0;
    return matchBlocks(c) / r.requestBlocks;
  }

  /** The router's own count of the worker's in-flight uncached prompt tokens, this replica's part. */
  private inFlightTokens(c: Candidate): number {
    const w = c.worker;
    return Math.max(0, w.queuedPrefillTokens - w.remoteQueuedPrefillTokens);
  }

  /** The request's uncached tokens on the candidate (inflightload `uncachedInputTokens`). */
  private requestTokens(c: Candidate, r: RouteFeatures): number {
    const indexed = r.requestBlocks * r.blockSize;
    const uncachedIndexed = Math.max(0, indexed - matchBlocks(c) * r.blockSize);
    return uncachedIndexed + Math.max(0, r.promptTokens - indexed);
  }

  private tokenScore(c: Candidate, r: RouteFeatures): number {
    const tokens = this.inFlightTokens(c) + this.requestTokens(c, r);
    if (tokens <= 0) return 1;
    return 1 - Math.min(tokens, this.tokenLoadCapacity) / this.tokenLoadCapacity;
  }

  /** The gate's TTFT estimate (only read with peakPrefillThroughput > 0). */
  private ttftMs(c: Candidate): number {
    return (this.inFlightTokens(c) / this.peakPrefillThroughput) * 1000;
  }

  /**
   * The affinity filter over the first `n` prefix scores (in this.prefix): true when only the
   * sticky candidates are kept.
   */
  private narrows(candidates: readonly Candidate[], n: number): boolean {
    if (n <= 1 || this.affinityThreshold <= 0) return false;
    let sticky = 0;
    let bestSticky = Infinity;
    let bestOther = Infinity;
    for (let i = 0; i < n; i++) {
      // the gate is on only with a penalty, and then peakPrefillThroughput > 0
      const ttft = this.maxTtftPenaltyMs > 0 ? this.ttftMs(candidates[i]) : 0;
      if (this.prefix[i] >= this.affinityThreshold) {
        sticky++;
        if (ttft < bestSticky) bestSticky = ttft;
      } else if (ttft < bestOther) bestOther = ttft;
    }
    if (sticky === 0) return false;
    // the TTFT load gate: the sticky endpoints are too slow, so all are kept
    if (this.maxTtftPenaltyMs > 0 && sticky < n && bestSticky - bestOther > this.maxTtftPenaltyMs) return false;
    return true;
  }

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    const n = candidates.length;
    if (n === 0) return NO_CHOICE;
    if (this.scores.length < n) {
      this.scores = new Float64Array(n * 2);
      this.prefix = new Float64Array(n * 2);
    }
    for (let i = 0; i < n; i++) this.prefix[i] = this.prefixScore(candidates[i], request);
    this.narrowed = this.narrows(candidates, n);
    for (let i = 0; i < n; i++)
      this.scores[i] =
        this.narrowed && this.prefix[i] < this.affinityThreshold ? NaN : this.tokenScore(candidates[i], request);
    const index = pickWithRandomTies(this.scores, n, 1, this.ctx.random, this.ties);
    if (index < 0) return NO_CHOICE;
    return {
      index,
      confidence: candidates[index].cachedFraction,
      reason: this.narrowed ? 'cache-match' : 'least-loaded',
    };
  }

  scoreTerms(c: Candidate, r: RouteFeatures): Record<string, number | boolean> {
    const prefixScore = this.prefixScore(c, r);
    const terms: Record<string, number | boolean> = {
      prefixScore,
      sticky: this.affinityThreshold > 0 && prefixScore >= this.affinityThreshold,
      kept: !this.narrowed || prefixScore >= this.affinityThreshold,
      inFlightTokens: this.inFlightTokens(c),
      requestTokens: this.requestTokens(c, r),
    };
    // no TTFT without a throughput to divide by (the gate is off then)
    if (this.peakPrefillThroughput > 0) terms.ttftMs = this.ttftMs(c);
    terms.score = this.tokenScore(c, r);
    return terms;
  }
}

/** Leading blocks held, each weighted by its tier (GPU and speculative 1, offload 0.8), truncated. */
function matchBlocks(c: Candidate): number {
  const device = c.overlapBlocks - c.offloadBlocks;
  return Math.floor(device + CPU_TIER_WEIGHT * c.offloadBlocks);
}
