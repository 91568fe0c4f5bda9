import { EntryLists, moveFirst } from './entry-lists.js';

/**
 * Content anchors (docs/architecture.md §2): position-independent ids of reusable chunks (a retrieved
 * passage, a tool schema). Only engines with position-independent KV reuse can use them, so
 * they are scored apart from the prefix. No engine publishes events for them, so entries are
 * the router's own records with a TTL, refreshed when used; the table is bounded with
 * least-recently-used eviction. A request carries a handful of anchors, so a Map of holders
 * per anchor serves.
 *
 * A chunk's KV is reusable only within the namespace it was made in (LoRA adapter, cache
 * salt, CLA group), as a prefix block's is: an anchor is recorded and looked up under the
 * request's namespace, the root (hi, lo) of its block chain as hashing.ts chainRoot() writes it
 * (passed as that pair, not as two numbers: a uint32 past 2^31 would be boxed at every call).
 */
export interface ContentAnchor {
  id: string;
  /** Tokens the chunk's KV covers. */
  tokens: number;
}

/**
 * The workers holding one anchor made in one namespace: its chain root, as chainRoot() gives
 * it, kept as int32s (`| 0`): small integers, stored and compared without a number boxed.
 */
interface NamespaceHolders {
  readonly nsHi: number;
  readonly nsLo: number;
  /** Worker slot → expiry ms. */
  readonly holders: Map<number, number>;
}

export class ContentAnchorIndex {
  /** Anchor id → its holders in each namespace it was recorded in, one entry of the capacity each. */
  private readonly anchors: EntryLists<NamespaceHolders>;
  /**
   * No anchor's holders have all expired before this time (ms): the latest expiry of the least
   * recently recorded anchor when it was last looked at. Every anchor recorded since expires
   * later (the TTL is one, and the router's time never goes back), so until then there is
   * nothing to look at.
   */
  private liveUntil = -Infinity;

  constructor(
    readonly capacity: number,
    readonly ttlMs: number,
  ) {
    this.anchors = new EntryLists(capacity);
  }

  /** (Anchor, namespace) entries held. */
  get size(): number {
    return this.anchors.size;
  }

  /** (Anchor, namespace) entries the capacity pushed out. */
  get evictions(): number {
    return this.anchors.evictions;
  }

  /** Tokens of `anchors`, made in namespace `ns` (hi, lo), the worker at `slot` holds at time `now`. */
  heldTokens(slot: number, anchors: readonly ContentAnchor[], ns: Uint32Array, now: number): number {
    let tokens = 0;
    for (const a of anchors) {
      const namespaces = this.anchors.peek(a.id);
      if (namespaces === undefined) continue;
      const at = indexOfNamespace(namespaces, ns);
      const expiry = at < 0 ? undefined : namespaces[at].holders.get(slot);
      // tokens may be left out (route() and a shared decision take { id } alone): none then
      if (expiry !== undefined && expiry > now && a.tokens > 0) tokens += a.tokens;
    }
    return tokens;
  }

  /**
   * Records that the worker at `slot` holds these anchors, made in namespace `ns` (hi, lo), from
   * `now` for the TTL. First drops the least recently recorded anchors whose holders have
   * all expired: recorded longest ago, they expire first, so a few looked at per call keep up
   * with the anchors recorded, and an anchor no request uses again leaves the table (and its
   * count) when its TTL ends rather than when the capacity pushes it out. So does a namespace
   * of an anchor recorded in another, whose holders have all expired.
   */
  record(slot: number, anchors: readonly ContentAnchor[], ns: Uint32Array, now: number): void {
    if (now >= this.liveUntil) this.liveUntil = this.anchors.dropUnused(anchors.length + 1, latestExpiry, now);
    for (let i = 0; i < anchors.length; i++) {
      const a = anchors[i];
      const namespaces = this.anchors.get(a.id); // now the most recently used
      const at = namespaces === undefined ? -1 : indexOfNamespace(namespaces, ns);
      let entry: NamespaceHolders;
      // the namespace used goes first in the anchor's list: the least recently used goes when it is full
      if (at >= 0) entry = moveFirst(namespaces!, at);
      else {
        if (namespaces !== undefined && namespaces.length > 0) this.anchors.removeWhere(a.id, expiredBy, now);
        // at capacity, the least recently used anchors go
        this.anchors.add(a.id, (entry = { nsHi: ns[0] | 0, nsLo: ns[1] | 0, holders: new Map() }));
      }
      entry.holders.set(slot, now + this.ttlMs);
    }
  }

  /** The worker at `slot` no longer holds these anchors, in any namespace (an engine said so, or it was lost). */
  remove(slot: number, anchorIds?: readonly string[]): void {
    const ids = anchorIds ?? this.anchors.ids();
    for (const id of ids) this.anchors.removeWhere(id, leftBy, slot);
  }
}

/** Where namespace `ns` (hi, lo) is among an anchor's (-1: not there); an anchor is made in a handful at most. */
function indexOfNamespace(namespaces: readonly NamespaceHolders[], ns: Uint32Array): number {
  const hi = ns[0] | 0;
  const lo = ns[1] | 0;
  for (let i = 0; i < namespaces.length; i++) if (namespaces[i].nsHi === hi && namespaces[i].nsLo === lo) return i;
  return -1;
}

/** Whether no worker holds the anchor in this namespace after `now`. */
function expiredBy(n: NamespaceHolders, now: number): boolean {
  return latestExpiry(n) <= now;
}

/** The worker at `slot` no longer holds the anchor in this namespace: whether none does now. */
function leftBy(n: NamespaceHolders, slot: number): boolean {
  n.holders.delete(slot);
  return n.holders.size === 0;
}

/** When the last of the anchor's holders in this namespace stops holding it (ms; -Infinity: none holds it). */
function latestExpiry(n: NamespaceHolders): number {
  let latest = -Infinity;
  for (const expiry of n.holders.values()) if (expiry > latest) latest = expiry;
  return latest;
}
