import { outstanding } from './pick.js';
import { NO_CHOICE, type Candidate, type PolicyChoice, type PolicyContext, type RoutingPolicy } from './types.js';

/**
 * Baseline: the power of two choices (Mitzenmacher, "The Power of Two Choices in Randomized
 * Load Balancing", 2001): sample two distinct workers at random, take the one with fewer
 * outstanding requests (ties: lower KV usage, then the first sampled).
 */
export class PowerOfTwoPolicy implements RoutingPolicy {
  readonly name = 'power-of-two';
  constructor(private readonly ctx: PolicyContext) {}

  choose(candidates: readonly Candidate[]): PolicyChoice {
    const n = candidates.length;
    if (n === 0) return NO_CHOICE;
    const a = Math.floor(this.ctx.random() * n);
    let index = a;
    if (n > 1) {
      const b = (a + 1 + Math.floor(this.ctx.random() * (n - 1))) % n;
      const ca = candidates[a];
      const cb = candidates[b];
      const la = outstanding(ca);
      const lb = outstanding(cb);
      if (lb < la || (lb === la && cb.worker.load < ca.worker.load)) index = b;
    }
    return { index, confidence: candidates[index].cachedFraction, reason: 'least-loaded' };
  }

  scoreTerms(c: Candidate): Record<string, number> {
    return { outstanding: outstanding(c), kvUsage: c.worker.load };
  }
}
