import { NO_CHOICE, type Candidate, type PolicyChoice, type RouteFeatures, type RoutingPolicy } from './types.js';
import type { WorkerState } from '../worker-registry.js';

/** Load under which the anchor's home worker keeps the anchor (seed: `current_load < 0.95`). */
export const SEED_LOCALITY_MAX_LOAD = 0.95;
/** Load under which a worker serving the CLA group is taken (seed: `current_load < 0.8`). */
export const SEED_CLA_MAX_LOAD = 0.8;

/**
 * What the seed's `load` is read from. The seed takes whatever number its caller reports
 * (`update_worker_state(worker_id, load)`, "VRAM pressure"); the natural reading, and the
 * default, is the engine's KV-cache usage. `queue-inclusive` reports a worker whose engine
 * has requests waiting as fully loaded (1), else its KV usage: vLLM queues only when it
 * cannot admit, so a queue is pressure that KV usage alone may not show.
 */
export type SeedLoadSignal = 'kv-usage' | 'queue-inclusive';

export interface SeedOptions {
  /** Default 'kv-usage'. */
  loadSignal?: SeedLoadSignal;
}

/**
 * ContextForge V4.0's rule, exactly (reference/seed/kv_aware_router.py, `select_worker`):
 * 1. the anchor's home worker while its load < 0.95 (confidence 0.9);
 * 2. else the first worker in registration order serving the CLA group with load < 0.8 (0.75);
 * 3. else the least-loaded worker, the earliest registered winning ties (0.5).
 * The caller names the anchor (route({ anchor })); without one, the anchor's home is the
 * worker holding the request's longest cached prefix (see KVAwareRouter.route).
 */
export class SeedPolicy implements RoutingPolicy {
  readonly name = 'seed';
  readonly loadSignal: SeedLoadSignal;

  constructor(options: SeedOptions = {}) {
    const signal = options.loadSignal ?? 'kv-usage';
    if (signal !== 'kv-usage' && signal !== 'queue-inclusive') {
      throw new RangeError(`seed.loadSignal must be 'kv-usage' or 'queue-inclusive', got '${String(signal)}'`);
    }
    this.loadSignal = signal;
  }

  /** The load the seed compares with its thresholds. */
  load(w: WorkerState): number {
    return this.loadSignal === 'queue-inclusive' && w.waitingRequests > 0 ? 1 : w.load;
  }

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    for (let i = 0; i < candidates.length; i++) {
      const c = candidates[i];
      if (c.holdsAnchor && this.load(c.worker) < SEED_LOCALITY_MAX_LOAD) {
        return { index: i, confidence: 0.9, reason: 'locality' };
      }
    }
    if (request.claGroup !== null) {
      for (let i = 0; i < candidates.length; i++) {
        const c = candidates[i];
        if (c.servesCla && this.load(c.worker) < SEED_CLA_MAX_LOAD) {
          return { index: i, confidence: 0.75, reason: 'cla' };
        }
      }
    }
    let best = -1;
    for (let i = 0; i < candidates.length; i++) {
      // Strict `<` keeps the earliest registered worker on ties, as Python's stable sort does.
      if (best < 0 || this.load(candidates[i].worker) < this.load(candidates[best].worker)) best = i;
    }
    return best < 0 ? NO_CHOICE : { index: best, confidence: 0.5, reason: 'least-loaded' };
  }

  scoreTerms(c: Candidate): Record<string, number | boolean> {
    return { holdsAnchor: c.holdsAnchor, servesCla: c.servesCla, load: this.load(c.worker) };
  }
}
