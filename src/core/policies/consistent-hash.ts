import { hashString32 } from '../hashing.js';
import { NO_CHOICE, type Candidate, type PolicyChoice, type RouteFeatures, type RoutingPolicy } from './types.js';

/** Virtual nodes per worker on the ring: enough to keep the spread within a few percent. */
const VNODES = 160;

/**
 * Baseline: consistent hashing (Karger et al., 1997) of the request's first blocks onto a
 * ring of the available workers, as gateways do for session affinity. Requests sharing their
 * opening blocks land together, blind to load; removing or draining a worker moves only its
 * own keys. The ring is rebuilt only when the set of available workers changes.
 */
export class ConsistentHashPolicy implements RoutingPolicy {
  readonly name = 'consistent-hash';
  private ringPoints = new Uint32Array(0);
  private ringOwners: string[] = [];
  private members: string[] = [];
  private readonly indexOf = new Map<string, number>();

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    if (candidates.length === 0) return NO_CHOICE;
    this.syncRing(candidates);
    const key = request.routingKey >>> 0;
    // first ring point at or after the key, wrapping around
    let lo = 0;
    let hi = this.ringPoints.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.ringPoints[mid] < key) lo = mid + 1;
      else hi = mid;
    }
    const owner = this.ringOwners[lo === this.ringPoints.length ? 0 : lo];
    const index = this.indexOf.get(owner)!;
    return { index, confidence: candidates[index].cachedFraction, reason: 'hash' };
  }

  private syncRing(candidates: readonly Candidate[]): void {
    let same = candidates.length === this.members.length;
    for (let i = 0; same && i < candidates.length; i++) same = candidates[i].worker.id === this.members[i];
    if (same) return;
    this.members = candidates.map((c) => c.worker.id);
    this.indexOf.clear();
    this.members.forEach((id, i) => this.indexOf.set(id, i));
    const points: Array<[number, string]> = [];
    for (const id of this.members) for (let v = 0; v < VNODES; v++) points.push([hashString32(`${id}#${v}`), id]);
    points.sort((a, b) => a[0] - b[0]);
    this.ringPoints = Uint32Array.from(points, (p) => p[0]);
    this.ringOwners = points.map((p) => p[1]);
  }
}
