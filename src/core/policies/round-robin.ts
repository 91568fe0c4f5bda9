import { NO_CHOICE, type Candidate, type PolicyChoice, type RoutingPolicy } from './types.js';

/** Baseline: each request to the next available worker in turn, blind to cache and load. */
export class RoundRobinPolicy implements RoutingPolicy {
  readonly name = 'round-robin';
  private cursor = 0;

  choose(candidates: readonly Candidate[]): PolicyChoice {
    if (candidates.length === 0) return NO_CHOICE;
    const index = this.cursor++ % candidates.length;
    return { index, confidence: candidates[index].cachedFraction, reason: 'rotation' };
  }
}
