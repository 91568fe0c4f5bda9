import { outstanding, pickMax } from './pick.js';
import { NO_CHOICE, type Candidate, type PolicyChoice, type RouteFeatures, type RoutingPolicy } from './types.js';

/**
 * Baseline: the worker with the fewest outstanding requests (the router's own count), then
 * the lowest KV usage; remaining ties rotate.
 */
export class LeastLoadedPolicy implements RoutingPolicy {
  readonly name = 'least-loaded';
  private readonly tieBreak = { cursor: 0 };
  private readonly scratch: number[] = [];

  choose(candidates: readonly Candidate[], request?: RouteFeatures): PolicyChoice {
    // outstanding requests dominate; KV usage (0-1) only separates equal counts
    const index = pickMax(
      candidates,
      (c) => -(outstanding(c) + c.worker.load * 0.5),
      this.tieBreak,
      this.scratch,
      request?.dryRun !== true,
    );
    return index < 0 ? NO_CHOICE : { index, confidence: candidates[index].cachedFraction, reason: 'least-loaded' };
  }

  scoreTerms(c: Candidate): Record<string, number> {
    return { outstanding: outstanding(c), kvUsage: c.worker.load };
  }
}
