import { NO_CHOICE, type Candidate, type PolicyChoice, type RouteFeatures, type RoutingPolicy } from './types.js';

/** Baseline: each request to the next available worker in turn, blind to cache and load. */
export class RoundRobinPolicy implements RoutingPolicy {
  readonly name = 'round-robin';
  private cursor = 0;

  choose(candidates: readonly Candidate[], request?: RouteFeatures): PolicyChoice {
    if (candidates.length === 0) return NO_CHOICE;
    const index = this.cursor % candidates.length;
    // a dry run shows the next turn without taking it
    if (request?.dryRun !== true) this.cursor++;
    return { index, confidence: candidates[index].cachedFraction, reason: 'rotation' };
  }
}
