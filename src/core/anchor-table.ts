import { LRUCache } from 'lru-cache';

/**
 * Most block ids (broadcastNewBlocks()) the anchor table keeps over all its anchors when it
 * counts them: about 50 bytes an id, so some 50 MB at the bound (and more for long ids, each at
 * most the router's maxIdBytes, 1 KiB by default). Ids past it are not kept, nor counted in
 * activeBlocks, until anchors holding some are evicted, moved to another worker or dropped with
 * theirs.
 */
export const MAX_ANCHOR_BLOCK_IDS = 1_000_000;

/**
 * Anchor → home worker, as the seed's `_anchor_to_worker`, but bounded: at capacity the
 * least recently used anchor is evicted (the seed's table grows without limit). Each entry
 * also remembers the CLA group its KV was made under and the block ids recorded for it,
 * so the router can count blocks per worker (the seed's never-updated `active_blocks`);
 * a table that counts none (policy 'seed', which reports 0 as the seed does) keeps none.
 */
export interface AnchorEntry {
  workerId: string;
  /** CLA group the KV was made under; null when unknown. KV is reusable only within a group. */
  claGroup: number | null;
  /** Block ids recorded on the home worker for this anchor (distinct). */
  blocks: Set<string> | null;
}

export class AnchorTable {
  /**
   * Made at the first anchor homed: lru-cache sizes its arrays by the capacity when it is made
   * (tens of milliseconds and megabytes at the default 100,000), and a router that is never
   * given an anchor (most are) never needs them; the first request to home one pays it, once.
   */
  private entries: LRUCache<string, AnchorEntry> | undefined;
  private readonly blocksByWorker = new Map<string, number>();
  private evicted = 0;
  private kept = 0;

  /**
   * @param capacity most anchors remembered
   * @param maxBlockIds most block ids kept over all anchors (0: none, and none counted)
   */
  constructor(
    readonly capacity: number,
    readonly maxBlockIds: number = MAX_ANCHOR_BLOCK_IDS,
  ) {}

  private made(): LRUCache<string, AnchorEntry> {
    return (this.entries ??= new LRUCache({
      max: this.capacity,
      dispose: (entry, _anchor, reason) => {
        if (reason !== 'evict') return;
        this.dropBlocks(entry);
        this.evicted++;
      },
    }));
  }

  get size(): number {
    return this.entries?.size ?? 0;
  }

  get evictions(): number {
    return this.evicted;
  }

  /** Block ids kept over all anchors (at most maxBlockIds). */
  get keptBlockIds(): number {
    return this.kept;
  }

  /** Reads without touching recency. */
  peek(anchor: string): AnchorEntry | undefined {
    return this.entries?.peek(anchor);
  }

  /**
   * Homes `anchor` on `workerId` (most recently used). Moving it to another worker, or to
   * another CLA group, forgets the recorded blocks: that KV is not where the anchor now points.
   */
  home(anchor: string, workerId: string, claGroup: number | null): AnchorEntry {
    let entry = this.made().get(anchor); // now the most recently used
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
      this.made().set(anchor, entry); // at capacity, the least recently used anchor is evicted
    }
    return entry;
  }

  /** Records block ids on the anchor's home worker (homing it there first). */
  recordBlocks(anchor: string, blockIds: readonly string[], workerId: string): void {
    const existing = this.entries?.peek(anchor);
    const entry = this.home(anchor, workerId, existing?.workerId === workerId ? existing.claGroup : null);
    if (blockIds.length === 0 || this.kept >= this.maxBlockIds) return;
    const blocks = (entry.blocks ??= new Set());
    const before = blocks.size;
    const room = this.maxBlockIds - this.kept;
    for (const id of blockIds) {
      if (blocks.size - before >= room) break;
      blocks.add(id);
    }
    this.addBlocks(workerId, blocks.size - before);
  }

  /** Blocks recorded on a worker across all anchors homed there. */
  blocksOn(workerId: string): number {
    return this.blocksByWorker.get(workerId) ?? 0;
  }

  /** Forgets every anchor homed on a worker. O(anchors): removal is rare, lookups are not. */
  dropWorker(workerId: string): number {
    const gone: string[] = [];
    const entries = this.entries;
    if (entries === undefined) return 0;
    for (const [anchor, entry] of entries.entries()) if (entry.workerId === workerId) gone.push(anchor);
    for (const anchor of gone) entries.delete(anchor);
    this.kept -= this.blocksOn(workerId);
    this.blocksByWorker.delete(workerId);
    return gone.length;
  }

  private dropBlocks(entry: AnchorEntry): void {
    if (entry.blocks && entry.blocks.size > 0) this.addBlocks(entry.workerId, -entry.blocks.size);
    entry.blocks = null;
  }

  private addBlocks(workerId: string, delta: number): void {
    if (delta === 0) return;
    this.kept += delta;
    const next = (this.blocksByWorker.get(workerId) ?? 0) + delta;
    if (next === 0) this.blocksByWorker.delete(workerId);
    else this.blocksByWorker.set(workerId, next);
  }
}
