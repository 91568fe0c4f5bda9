import * as check from '../validate.js';
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
 * llm-d's inference scheduler (llm-d/llm-d-inference-scheduler, renamed llm-d/llm-d-router in
 * 2026; the endpoint picker) with its built-in default configuration: a weighted sum of
 * scorers and the max-score picker (ties at random):
 * - prefix-cache scorer: matched blocks / request blocks (here from the engines' KV events,
 *   as llm-d's precise-prefix-cache-scorer; its default approximate scorer learns from its
 *   own decisions instead);
 * - kv-cache-utilization scorer: 1 − KV usage
 *   (pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization/kvcache_utilization.go);
 * - queue scorer: (max queue − queue) / (max queue − min queue) over the candidates, 1 when
 *   all are equal, the queue being the engine's waiting requests from /metrics
 *   (pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go).
 * Default weights queue 2, kv-cache-utilization 2, prefix-cache 3
 * (pkg/epp/config/loader/defaults.go, `loadDefaultConfig`; the same in the Helm chart's
 * config/charts/epplib/templates/_config.yaml, config/charts/routerlib/templates/_config.yaml
 * at llm-d/llm-d-router@ebab687927f5331c1b39defcb579a07951bce56c). Metrics are refreshed every
 * 50 ms (pkg/epp/server/options.go, `RefreshMetricsInterval`): `scrapeIntervalMs`, which the
 * simulator uses for this policy's load scrapes unless told otherwise (`serve` and `epp` scrape
 * at their --metrics-interval-ms instead). The prefix scorer reads
 * the router's speculative entries too (16 blocks past what the worker holds, for 5 s), where
 * llm-d's precise producer indexes a request's whole prompt for 2 s when `speculativeIndexing`
 * is on (off by default, on in its precise-prefix guide).
 * llm-d's deployment guides configure another profile since mid-2026 (a prefix-affinity
 * filter and the token-load scorer): that one is `llmd-affinity` (llmd-affinity.ts).
 */
export interface LlmdOptions {
  prefixWeight?: number;
  kvWeight?: number;
  queueWeight?: number;
  /**
   * How often the simulator scrapes engine metrics for this policy, ms (default 50, llm-d's
   * RefreshMetricsInterval). Read by the simulator alone: `serve` and `epp` scrape at
   * --metrics-interval-ms whatever the policy.
   */
  scrapeIntervalMs?: number;
}

/** llm-d's default metrics refresh interval (ms). */
export const LLMD_SCRAPE_INTERVAL_MS = 50;

/**
 * The range of `scrapeIntervalMs` (ms): the simulator scrapes every worker at every interval,
 * so below 1 ms a run would barely advance, and above a day (the simulator's longest delay) it
 * would never scrape.
 */
export const LLMD_SCRAPE_INTERVAL_RANGE = Object.freeze({ min: 1, max: 86_400_000 });

export class LlmdPolicy implements RoutingPolicy {
  readonly name = 'llmd';
  private readonly wPrefix: number;
  private readonly wKv: number;
  private readonly wQueue: number;
  readonly scrapeIntervalMs: number;
  private readonly ties: number[] = [];
  private scores = new Float64Array(64);
  private minQueue = 0;
  private maxQueue = 0;

  constructor(
    private readonly ctx: PolicyContext,
    options: LlmdOptions = {},
  ) {
    this.wPrefix = check.finiteNonNegative(options.prefixWeight ?? 3, 'llmd.prefixWeight');
    this.wKv = check.finiteNonNegative(options.kvWeight ?? 2, 'llmd.kvWeight');
    this.wQueue = check.finiteNonNegative(options.queueWeight ?? 2, 'llmd.queueWeight');
    this.scrapeIntervalMs = check.finiteNonNegative(
      options.scrapeIntervalMs ?? LLMD_SCRAPE_INTERVAL_MS,
      'llmd.scrapeIntervalMs',
    );
    const { min, max } = LLMD_SCRAPE_INTERVAL_RANGE;
    if (this.scrapeIntervalMs < min || this.scrapeIntervalMs > max)
      throw new RangeError(`llmd.scrapeIntervalMs must be from ${min} to ${max}, got ${this.scrapeIntervalMs}`);
  }

  private score(c: Candidate, r: RouteFeatures): number {
    const prefix = r.requestBlocks > 0 ? c.overlapBlocks / r.requestBlocks : 0;
    const kv = 1 - c.worker.load;
    const q = c.worker.waitingRequests;
    const queue = this.maxQueue === this.minQueue ? 1 : (this.maxQueue - q) / (this.maxQueue - this.minQueue);
    return this.wPrefix * prefix + this.wKv * kv + this.wQueue * queue;
  }

  private scanQueues(candidates: readonly Candidate[]): void {
    this.minQueue = Infinity;
    this.maxQueue = -Infinity;
    for (const c of candidates) {
      const q = c.worker.waitingRequests;
      if (q < this.minQueue) this.minQueue = q;
      if (q > this.maxQueue) this.maxQueue = q;
    }
  }

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    const n = candidates.length;
    if (n === 0) return NO_CHOICE;
    this.scanQueues(candidates);
    if (this.scores.length < n) this.scores = new Float64Array(n * 2);
    for (let i = 0; i < n; i++) this.scores[i] = this.score(candidates[i], request);
    const index = pickWithRandomTies(this.scores, n, 1, this.ctx.random, this.ties);
    if (index < 0) return NO_CHOICE;
    return { index, confidence: candidates[index].cachedFraction, reason: 'cost' };
  }

  scoreTerms(c: Candidate, r: RouteFeatures): Record<string, number> {
    return {
      prefixScore: r.requestBlocks > 0 ? c.overlapBlocks / r.requestBlocks : 0,
      kvScore: 1 - c.worker.load,
      waitingRequests: c.worker.waitingRequests,
      score: this.score(c, r),
    };
  }
}
