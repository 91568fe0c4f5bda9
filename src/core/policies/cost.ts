import { NO_CHOICE, type Candidate, type PolicyChoice, type RouteFeatures, type RoutingPolicy } from './types.js';

/**
 * The weights of the `cost` policy, in one place. A candidate's score is
 *
 *   locality · cachedFraction + cla · servesCla + workflow · continuity
 *     − load · load − pressure · max(0, load − pressureKnee) / (1 − pressureKnee)
 *
 * and the highest score wins. Workers at or above `pressureCeiling` are left out unless every
 * candidate is. The defaults keep a request with its KV (or its workflow's previous step) up
 * to roughly the seed's CLA threshold of 0.8 and move it to an idle worker beyond that: the
 * pressure term grows steeply past the knee, so a hot prefix is not piled onto a saturated
 * worker.
 */
export interface CostWeights {
  /** Reward per unit of the request's KV already on the worker. */
  locality: number;
  /** Reward for serving the request's CLA group. */
  cla: number;
  /** Reward for the worker that ran the workflow's previous step. */
  workflow: number;
  /** Linear penalty per unit of load. */
  load: number;
  /** Extra penalty, scaled to 1 at load 1, for load beyond the knee (VRAM pressure). */
  pressure: number;
  /** Load at which the pressure penalty starts. */
  pressureKnee: number;
  /** Load at or above which a worker is excluded while any other is below it. */
  pressureCeiling: number;
}

export const DEFAULT_COST_WEIGHTS: Readonly<CostWeights> = Object.freeze({
  locality: 1.0,
  cla: 0.3,
  workflow: 0.6,
  load: 0.5,
  pressure: 2.0,
  pressureKnee: 0.8,
  pressureCeiling: 0.95,
});

/** Scores within this distance are ties. */
const TIE_EPSILON = 1e-9;

export function costScore(c: Candidate, w: Readonly<CostWeights>): number {
  const load = c.worker.load;
  const overKnee = load > w.pressureKnee ? (load - w.pressureKnee) / (1 - w.pressureKnee) : 0;
  return (
    w.locality * c.cachedFraction +
    (c.servesCla ? w.cla : 0) +
    (c.continuity ? w.workflow : 0) -
    w.load * load -
    w.pressure * overKnee
  );
}

/**
 * The default policy: every candidate scored on anchor locality, CLA compatibility, load and
 * workflow continuity (see CostWeights). Ties rotate among the tied workers instead of always
 * going to the first registered one, which would skew a fleet of equally idle workers.
 */
export class CostPolicy implements RoutingPolicy {
  readonly name = 'cost';
  private tieCursor = 0;
  /** Reused between calls: the route path should not allocate per candidate. */
  private tied: number[] = [];

  constructor(readonly weights: Readonly<CostWeights> = DEFAULT_COST_WEIGHTS) {}

  choose(candidates: readonly Candidate[], _request: RouteFeatures): PolicyChoice {
    if (candidates.length === 0) return NO_CHOICE;
    const w = this.weights;
    let anyBelowCeiling = false;
    for (const c of candidates) if (c.worker.load < w.pressureCeiling) anyBelowCeiling = true;

    let bestScore = -Infinity;
    const tied = this.tied;
    tied.length = 0;
    for (let i = 0; i < candidates.length; i++) {
      const c = candidates[i];
      if (anyBelowCeiling && c.worker.load >= w.pressureCeiling) continue;
      const s = costScore(c, w);
      if (s > bestScore + TIE_EPSILON) {
        bestScore = s;
        tied.length = 0;
        tied.push(i);
      } else if (s >= bestScore - TIE_EPSILON) {
        tied.push(i);
      }
    }
    const index = tied.length === 1 ? tied[0] : tied[this.tieCursor++ % tied.length];
    return { index, confidence: candidates[index].cachedFraction, reason: 'cost' };
  }
}
