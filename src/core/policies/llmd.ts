import { NO_CHOICE, type Candidate, type PolicyChoice, type PolicyContext, type RouteFeatures, type RoutingPolicy } from './types.js';

/**
 * llm-d's inference scheduler (llm-d/llm-d-inference-scheduler over the Gateway API
 * Inference Extension's scorers): a weighted sum of
 * - prefix-cache scorer: matched blocks / request blocks,
 * - kv-cache-utilization scorer: 1 − KV usage,
 * - queue scorer: (max queue − queue) / (max queue − min queue) over the candidates (1 when
 *   all are equal), the queue being the engine's waiting requests from /metrics,
 * with weights 3 : 2 : 2, and the max-score picker (ties at random).
 */
export interface LlmdOptions {
  prefixWeight?: number;
  kvWeight?: number;
  queueWeight?: number;
}

export class LlmdPolicy implements RoutingPolicy {
  readonly name = 'llmd';
  private readonly wPrefix: number;
  private readonly wKv: number;
  private readonly wQueue: number;
  private readonly ties: number[] = [];
  private minQueue = 0;
  private maxQueue = 0;

  constructor(
    private readonly ctx: PolicyContext,
    options: LlmdOptions = {},
  ) {
    this.wPrefix = options.prefixWeight ?? 3;
    this.wKv = options.kvWeight ?? 2;
    this.wQueue = options.queueWeight ?? 2;
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
    let best = -Infinity;
    const ties = this.ties;
    ties.length = 0;
    for (let i = 0; i < n; i++) {
      const s = this.score(candidates[i], request);
      if (s > best + 1e-9) {
        best = s;
        ties.length = 0;
        ties.push(i);
      } else if (s >= best - 1e-9) ties.push(i);
    }
    const index = ties.length === 1 ? ties[0] : ties[Math.floor(this.ctx.random() * ties.length)];
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
