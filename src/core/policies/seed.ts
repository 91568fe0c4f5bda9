import { NO_CHOICE, type Candidate, type PolicyChoice, type RouteFeatures, type RoutingPolicy } from './types.js';

/** Load under which the anchor's home worker keeps the anchor (seed: `current_load < 0.95`). */
export const SEED_LOCALITY_MAX_LOAD = 0.95;
/** Load under which a worker serving the CLA group is taken (seed: `current_load < 0.8`). */
export const SEED_CLA_MAX_LOAD = 0.8;

/**
 * ContextForge V4.0's rule, exactly (reference/seed/kv_aware_router.py, `select_worker`):
 * 1. the anchor's home worker while its load < 0.95 (confidence 0.9);
 * 2. else the first worker in registration order serving the CLA group with load < 0.8 (0.75);
 * 3. else the least-loaded worker, the earliest registered winning ties (0.5).
 * Through route() without an explicit anchor, the anchor's home is the worker holding the
 * request's longest cached prefix (see KVAwareRouter.route).
 */
export class SeedPolicy implements RoutingPolicy {
  readonly name = 'seed';

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    for (let i = 0; i < candidates.length; i++) {
      const c = candidates[i];
      if (c.holdsAnchor && c.worker.load < SEED_LOCALITY_MAX_LOAD) {
        return { index: i, confidence: 0.9, reason: 'locality' };
      }
    }
    if (request.claGroup !== null) {
      for (let i = 0; i < candidates.length; i++) {
        const c = candidates[i];
        if (c.servesCla && c.worker.load < SEED_CLA_MAX_LOAD) {
          return { index: i, confidence: 0.75, reason: 'cla' };
        }
      }
    }
    let best = -1;
    for (let i = 0; i < candidates.length; i++) {
      // Strict `<` keeps the earliest registered worker on ties, as Python's stable sort does.
      if (best < 0 || candidates[i].worker.load < candidates[best].worker.load) best = i;
    }
    return best < 0 ? NO_CHOICE : { index: best, confidence: 0.5, reason: 'least-loaded' };
  }

  scoreTerms(c: Candidate): Record<string, number | boolean> {
    return { holdsAnchor: c.holdsAnchor, servesCla: c.servesCla, load: c.worker.load };
  }
}
