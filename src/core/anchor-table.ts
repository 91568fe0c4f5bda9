import { LRUCache } from 'lru-cache';

/**
 * Anchor → home worker, as the seed's `_anchor_to_worker`, but bounded: at capacity the
 * least recently used anchor is evicted (the seed's table grows without limit). Each entry
 * also remembers the CLA group its KV was made under and the block ids recorded for it,
 * so the router can count blocks per worker (the seed's never-updated `active_blocks`).
 */
export interface AnchorEntry {
  workerId: string;
  /** CLA group the KV was made under; null when unknown. KV is reusable only within a group. */
  claGroup: number | null;
  /** Block ids recorded on the home worker for this anchor (distinct). */
  blocks: Set<string> | null;
}

export class AnchorTable {
  private readonly entries: LRUCache<string, AnchorEntry>;
  private readonly blocksByWorker = new Map<string, number>();
  private evicted = 0;

  constructor(readonly capacity: number) {
    this.entries = new LRUCache({
      max: capacity,
      dispose: (entry, _anchor, reason) => {
        if (reason !== 'evict') return;
        this.dropBlocks(entry);
        this.evicted++;
      },
    });
  }

  get size(): number {
    return this.entries.size;
  }

  get evictions(): number {
    return this.evicted;
  }

  /** Reads without touching recency. */
  peek(anchor: string): AnchorEntry | undefined {
    return this.entries.peek(anchor);
  }

  /**
   * Homes `anchor` on `workerId` (most recently used). Moving it to another worker, or to
   * another CLA group, forgets the recorded blocks: that KV is not where the anchor now points.
   */
  home(anchor: string, workerId: string, claGroup: number | null): AnchorEntry {
    let entry = this.entries.get(anchor); // now the most recently used
    if (entry) {
      if (
        entry.workerId !== workerId ||
        (claGroup !== null && entry.claGroup !== null && entry.claGroup !== claGroup)
      ) {
        this.dropBlocks(entry);
        entry.workerId = workerId;
        entry.claGroup = claGroup;
      } else if (claGroup !== null) {
        entry.claGroup = claGroup;
      }
    } else {
      entry = { workerId, claGroup, blocks: null };
      this.entries.set(anchor, entry); // at capacity, the least recently used anchor is evicted
    }
    return entry;
  }

  /** Records block ids on the anchor's home worker (homing it there first). */
  recordBlocks(anchor: string, blockIds: readonly string[], workerId: string): void {
    const existing = this.entries.peek(anchor);
    const entry = this.home(anchor, workerId, existing?.workerId === workerId ? existing.claGroup : null);
    if (blockIds.length === 0) return;
    const blocks = (entry.blocks ??= new Set());
    const before = blocks.size;
    for (const id of blockIds) blocks.add(id);
    this.addBlocks(workerId, blocks.size - before);
  }

  /** Blocks recorded on a worker across all anchors homed there. */
  blocksOn(workerId: string): number {
    return this.blocksByWorker.get(workerId) ?? 0;
  }

  /** Forgets every anchor homed on a worker. O(anchors): removal is rare, lookups are not. */
  dropWorker(workerId: string): number {
    const gone: string[] = [];
    for (const [anchor, entry] of this.entries.entries()) if (entry.workerId === workerId) gone.push(anchor);
    for (const anchor of gone) this.entries.delete(anchor);
    this.blocksByWorker.delete(workerId);
    return gone.length;
  }

  private dropBlocks(entry: AnchorEntry): void {
    if (entry.blocks && entry.blocks.size > 0) this.addBlocks(entry.workerId, -entry.blocks.size);
    entry.blocks = null;
  }

  private addBlocks(workerId: string, delta: number): void {
    if (delta === 0) return;
    const next = (this.blocksByWorker.get(workerId) ?? 0) + delta;
    if (next === 0) this.blocksByWorker.delete(workerId);
    else this.blocksByWorker.set(workerId, next);
  }
}
