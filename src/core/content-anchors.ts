import { LRUCache } from 'lru-cache';

/**
 * Content anchors (docs/architecture.md §2): position-independent ids of reusable chunks (a retrieved
 * passage, a tool schema). Only engines with position-independent KV reuse can use them, so
 * they are scored apart from the prefix. No engine publishes events for them, so entries are
 * the router's own records with a TTL, refreshed when used; the table is bounded with
 * least-recently-used eviction. A request carries a handful of anchors, so a Map of holders
 * per anchor serves.
 */
export interface ContentAnchor {
  id: string;
  /** Tokens the chunk's KV covers. */
  tokens: number;
}

export class ContentAnchorIndex {
  /** anchor id → (worker slot → expiry ms). */
  private readonly anchors: LRUCache<string, Map<number, number>>;
  private evicted = 0;

  constructor(
    readonly capacity: number,
    readonly ttlMs: number,
  ) {
    this.anchors = new LRUCache({
      max: capacity,
      dispose: (_holders, _id, reason) => {
        if (reason === 'evict') this.evicted++;
      },
    });
  }

  get size(): number {
    return this.anchors.size;
  }

  get evictions(): number {
    return this.evicted;
  }

  /** Tokens of `anchors` the worker at `slot` holds at time `now`. */
  heldTokens(slot: number, anchors: readonly ContentAnchor[], now: number): number {
    let tokens = 0;
    for (const a of anchors) {
      const expiry = this.anchors.peek(a.id)?.get(slot);
      // tokens may be left out (route() and a shared decision take { id } alone): none then
      if (expiry !== undefined && expiry > now && a.tokens > 0) tokens += a.tokens;
    }
    return tokens;
  }

  /**
   * Records that the worker at `slot` holds these anchors from `now` for the TTL. First drops
   * the least recently recorded anchors whose holders have all expired: recorded longest ago,
   * they expire first, so a few looked at per call keep up with the anchors recorded, and an
   * anchor no request uses again leaves the table (and its count) when its TTL ends rather than
   * when the capacity pushes it out.
   */
  record(slot: number, anchors: readonly ContentAnchor[], now: number): void {
    this.dropExpired(now, anchors.length + 1);
    for (const a of anchors) {
      let holders = this.anchors.get(a.id); // now the most recently used
      if (!holders) this.anchors.set(a.id, (holders = new Map())); // at capacity, the least recently used goes
      holders.set(slot, now + this.ttlMs);
    }
  }

  /** Drops up to `most` of the least recently recorded anchors, while all their holders have expired by `now`. */
  private dropExpired(now: number, most: number): void {
    for (let dropped = 0; dropped < most; dropped++) {
      // looked up afresh each time: the table is not changed under an iteration
      const oldest = this.anchors.rkeys().next();
      if (oldest.done) return;
      const holders = this.anchors.peek(oldest.value);
      if (holders) for (const expiry of holders.values()) if (expiry > now) return;
      this.anchors.delete(oldest.value);
    }
  }

  /** The worker at `slot` no longer holds these anchors (an engine said so, or it was lost). */
  remove(slot: number, anchorIds?: readonly string[]): void {
    const ids = anchorIds ?? [...this.anchors.keys()];
    for (const id of ids) {
      const holders = this.anchors.peek(id);
      if (!holders) continue;
      holders.delete(slot);
      if (holders.size === 0) this.anchors.delete(id);
    }
  }
}
