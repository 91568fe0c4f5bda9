import { EntryLists, moveFirst } from './entry-lists.js';

/**
 * Most block ids (broadcastNewBlocks()) the anchor table keeps over all its anchors when it
 * counts them: about 50 bytes an id, so some 50 MB at the bound (and more for long ids). Ids past
 * it are not kept, nor counted in activeBlocks, until anchors holding some are evicted, moved to
 * another worker or dropped with theirs.
 */
export const MAX_ANCHOR_BLOCK_IDS = 1_000_000;

/**
 * Anchor → home worker, as the seed's `_anchor_to_worker`, but bounded: at capacity the
 * least recently used anchor is evicted (the seed's table grows without limit). Each entry
 * also remembers the CLA group its KV was made under and the block ids recorded for it,
 * so the router can count blocks per worker (the seed's never-updated `active_blocks`);
 * a table that counts none (policy 'seed', which reports 0 as the seed does) keeps none.
 *
 * KV is reusable only within its CLA group. The seed keeps one home an anchor, whatever the
 * groups that use it, and policy 'seed' keeps to that: an anchor used by two groups in turn
 * moves between them. A table `byClaGroup` (the other policies) gives each (anchor, CLA group)
 * a home of its own, so each group finds its KV where it was made; every home is an entry of
 * the capacity.
 */
export interface AnchorEntry {
  workerId: string;
  /** CLA group the KV was made under; null when unknown. KV is reusable only within a group. */
  claGroup: number | null;
  /** Block ids recorded on the home worker for this anchor (distinct). */
  blocks: Set<string> | null;
}

export class AnchorTable {
  /** Anchor → its homes, the most recently homed first: one under the seed's rule, one a CLA group by it. */
  private readonly entries: EntryLists<AnchorEntry>;
  private readonly blocksByWorker = new Map<string, number>();
  private kept = 0;

  /**
   * @param capacity most homes remembered (anchors, under the seed's rule)
   * @param maxBlockIds most block ids kept over all anchors (0: none, and none counted)
   * @param byClaGroup a home for each (anchor, CLA group) rather than one an anchor (the seed's)
   */
  constructor(
    readonly capacity: number,
    readonly maxBlockIds: number = MAX_ANCHOR_BLOCK_IDS,
    readonly byClaGroup = false,
  ) {
    this.entries = new EntryLists(capacity, (entry) => this.dropBlocks(entry));
  }

  /** Homes held (anchors, under the seed's rule). */
  get size(): number {
    return this.entries.size;
  }

  get evictions(): number {
    return this.entries.evictions;
  }

  /** Block ids kept over all anchors (at most maxBlockIds). */
  get keptBlockIds(): number {
    return this.kept;
  }

  /**
   * The anchor's home a request of `claGroup` finds, recency untouched: its one home under
   * the seed's rule. By CLA group, the group's own home, else the latest home of no known
   * group (recorded by broadcastNewBlocks(), or for a request naming none); a request naming
   * no group finds the latest home of any.
   */
  peek(anchor: string, claGroup: number | null = null): AnchorEntry | undefined {
    const homes = this.entries.peek(anchor);
    if (homes === undefined) return undefined;
    if (!this.byClaGroup || claGroup === null) return homes[0];
    let at = indexOfGroup(homes, claGroup);
    if (at < 0) at = indexOfGroup(homes, null);
    return at >= 0 ? homes[at] : undefined;
  }

  /**
   * Homes `anchor` on `workerId` for a request of `claGroup` (most recently used). Moving a
   * home to another worker, or to another CLA group, forgets the recorded blocks: that KV is
   * not where the anchor now points. By CLA group, the group's own home moves (a home of no
   * known group on that worker becomes the group's); a request naming no group keeps a home
   * of any group already on the worker, else moves the home of no known group.
   */
  home(anchor: string, workerId: string, claGroup: number | null): AnchorEntry {
    const homes = this.entries.get(anchor); // now the most recently used
    if (homes === undefined) return this.add(anchor, workerId, claGroup);
    if (!this.byClaGroup) return this.moveHome(homes[0], workerId, claGroup);
    let at = indexOfGroup(homes, claGroup);
    if (claGroup !== null) {
      if (at < 0) at = indexOfHome(homes, workerId, null);
    } else {
      const there = indexOfHome(homes, workerId, undefined);
      if (there >= 0) at = there;
    }
    if (at < 0) return this.add(anchor, workerId, claGroup);
    return this.moveHome(moveFirst(homes, at), workerId, claGroup);
  }

  /** Records block ids on the anchor's home worker (homing it there first, keeping the group of a home already there). */
  recordBlocks(anchor: string, blockIds: readonly string[], workerId: string): void {
    const entry = this.home(anchor, workerId, null);
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

  /** Forgets every home on a worker. O(homes): removal is rare, lookups are not. Returns how many went. */
  dropWorker(workerId: string): number {
    let gone = 0;
    for (const anchor of this.entries.ids()) gone += this.entries.removeWhere(anchor, homedOn, workerId);
    return gone;
  }

  /** A new home, at capacity in place of the least recently used. */
  private add(anchor: string, workerId: string, claGroup: number | null): AnchorEntry {
    const entry: AnchorEntry = { workerId, claGroup, blocks: null };
    this.entries.add(anchor, entry);
    return entry;
  }

  /** A home moved to (or kept on) `workerId` for a request of `claGroup`, as the seed's rule has it. */
  private moveHome(entry: AnchorEntry, workerId: string, claGroup: number | null): AnchorEntry {
    if (entry.workerId !== workerId || (claGroup !== null && entry.claGroup !== null && entry.claGroup !== claGroup)) {
      this.dropBlocks(entry);
      entry.workerId = workerId;
      entry.claGroup = claGroup;
    } else if (claGroup !== null) {
      entry.claGroup = claGroup;
    }
    return entry;
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

/** Where the home of `claGroup` is among an anchor's (-1: none). */
function indexOfGroup(homes: readonly AnchorEntry[], claGroup: number | null): number {
  for (let i = 0; i < homes.length; i++) if (homes[i].claGroup === claGroup) return i;
  return -1;
}

/** Where a home on `workerId` is among an anchor's, of `claGroup` (undefined: of any group); -1: none. */
function indexOfHome(homes: readonly AnchorEntry[], workerId: string, claGroup: number | null | undefined): number {
  for (let i = 0; i < homes.length; i++)
    if (homes[i].workerId === workerId && (claGroup === undefined || homes[i].claGroup === claGroup)) return i;
  return -1;
}

function homedOn(entry: AnchorEntry, workerId: string): boolean {
  return entry.workerId === workerId;
}
