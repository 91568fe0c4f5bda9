import { NO_CHOICE, type Candidate, type PolicyChoice, type PolicyContext, type RoutingPolicy } from './types.js';

/** Baseline: a uniformly random available worker (seeded, so simulations repeat). */
export class RandomPolicy implements RoutingPolicy {
  readonly name = 'random';
  constructor(private readonly ctx: PolicyContext) {}

  choose(candidates: readonly Candidate[]): PolicyChoice {
    if (candidates.length === 0) return NO_CHOICE;
    const index = Math.floor(this.ctx.random() * candidates.length);
    return { index, confidence: candidates[index].cachedFraction, reason: 'random' };
  }
}
