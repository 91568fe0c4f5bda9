import { NO_CHOICE, type Candidate, type PolicyChoice, type PolicyContext, type RouteFeatures, type RoutingPolicy } from './types.js';

/**
 * NVIDIA Dynamo's KV router cost (ai-dynamo/dynamo, docs/router/kv_cache_routing.md, "Cost
 * Calculation" and "Worker Selection"):
 *
 *   cost = prefill_load_scale · max(prompt blocks + active prefill blocks − overlap credit, 0)
 *          + active decode blocks
 *
 * with overlap credit 1.0 per GPU block and 0.75 per CPU-offloaded block (the router's own
 * predictions, Dynamo's approximate mode, count as cached). The lowest cost wins, ties at
 * random; with temperature > 0 the worker is sampled by softmax over the costs normalised to
 * [0, 1].
 */
export interface DynamoOptions {
  prefillLoadScale?: number;
  temperature?: number;
  gpuCredit?: number;
  offloadCredit?: number;
}

export class DynamoPolicy implements RoutingPolicy {
  readonly name = 'dynamo';
  private readonly scale: number;
  private readonly temperature: number;
  private readonly gpuCredit: number;
  private readonly offloadCredit: number;
  private costs = new Float64Array(64);
  private readonly ties: number[] = [];

  constructor(
    private readonly ctx: PolicyContext,
    options: DynamoOptions = {},
  ) {
    this.scale = options.prefillLoadScale ?? 1.0;
    this.temperature = options.temperature ?? 0;
    this.gpuCredit = options.gpuCredit ?? 1.0;
    this.offloadCredit = options.offloadCredit ?? 0.75;
  }

  cost(c: Candidate, r: RouteFeatures): number {
    const bs = r.blockSize;
    const promptBlocks = r.promptTokens > 0 ? Math.ceil(r.promptTokens / bs) : r.requestBlocks;
    const credit = (c.overlapBlocks - c.offloadBlocks) * this.gpuCredit + c.offloadBlocks * this.offloadCredit;
    const activePrefillBlocks = c.worker.queuedPrefillTokens / bs;
    const activeDecodeBlocks = c.worker.activeDecodeTokens / bs;
    return this.scale * Math.max(promptBlocks + activePrefillBlocks - credit, 0) + activeDecodeBlocks;
  }

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    const n = candidates.length;
    if (n === 0) return NO_CHOICE;
    if (this.costs.length < n) this.costs = new Float64Array(n * 2);
    let min = Infinity;
    let max = -Infinity;
    for (let i = 0; i < n; i++) {
      const cost = this.cost(candidates[i], request);
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
      const ties = this.ties;
      ties.length = 0;
      for (let i = 0; i < n; i++) if (this.costs[i] - min <= 1e-9) ties.push(i);
      index = ties.length === 1 ? ties[0] : ties[Math.floor(this.ctx.random() * ties.length)];
    }
    return { index, confidence: candidates[index].cachedFraction, reason: 'cost' };
  }

  scoreTerms(c: Candidate, r: RouteFeatures): Record<string, number> {
    return {
      cost: this.cost(c, r),
      overlapBlocks: c.overlapBlocks,
      offloadBlocks: c.offloadBlocks,
      activePrefillBlocks: c.worker.queuedPrefillTokens / r.blockSize,
      activeDecodeBlocks: c.worker.activeDecodeTokens / r.blockSize,
    };
  }
}
