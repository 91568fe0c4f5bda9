/**
 * The approximate tree SGLang's cache-aware routing keeps per worker (sgl-project/sglang,
 * sgl-model-gateway/src/policies/tree.rs; smg-project/smg, crates/kv_index/src/string_tree.rs
 * and token_tree.rs): what the router has sent where, over a request's prefix-chained block
 * keys (a block's hash names its whole path, so a set of hashes is a radix tree), each block
 * stamped with the decision that last touched it. Shared by the `sglang` and `smg` policies.
 */
import { resized } from '../typed-arrays.js';

const INITIAL_TREE_SLOTS = 64;

/** A bucket of the tree's hash index: 32 well-mixed bits of a 53-bit block key. */
function mixKey(key: number): number {
  const h = Math.imul((key >>> 0) ^ Math.imul(Math.floor(key / 4294967296), 0x9e3779b1), 0x85ebca6b);
  return Math.imul(h ^ (h >>> 15), 0xc2b2ae35) ^ (h >>> 13);
}

/**
 * One worker's approximate tree: its blocks in least-recently-used order, kept as it changes
 * (a doubly linked list over slots of typed arrays) so that eviction costs what it removes.
 * An insert moves the request's blocks to the most recent end deepest first, so the list is
 * ordered by (last access, depth descending); a node is touched whenever a descendant is, so
 * that order is leaf-first: no node goes before its descendants and the tree stays
 * prefix-closed as it shrinks. Blocks are found through an open-addressing index over the
 * same slots (linear probing, deletion by backward shift): no per-block heap objects for the
 * collector to trace, and a delete as cheap as a lookup, where a Map of a million float keys
 * takes hundreds of milliseconds to empty.
 */
export class ApproxTree {
  private keyAt = new Float64Array(INITIAL_TREE_SLOTS);
  private accessAt = new Float64Array(INITIAL_TREE_SLOTS);
  /** Characters each block was charged when inserted, given back when it goes. */
  private charsAt = new Float64Array(INITIAL_TREE_SLOTS);
  private prev = new Int32Array(INITIAL_TREE_SLOTS);
  private next = new Int32Array(INITIAL_TREE_SLOTS);
  /** Hash index: slot + 1 per bucket, 0 when empty; twice the slots, so at most half full. */
  private buckets = new Int32Array(2 * INITIAL_TREE_SLOTS);
  /** Each bucket's mixed key, so that probes and shifts read the index alone. */
  private bucketHash = new Int32Array(2 * INITIAL_TREE_SLOTS);
  /** Least recently used slot (evicted first), −1 when empty. */
  private oldest = -1;
  private newest = -1;
  /** Free slots, chained through `next`. */
  private freeSlot = -1;
  /** Slots handed out so far (the high-water mark). */
  private slotsUsed = 0;
  /** Characters the tree holds: the sum of its blocks' charges. */
  chars = 0;

  has(key: number): boolean {
    return this.find(key) >= 0;
  }

  /** The epoch of the block's last access; −1 when the tree lacks it. */
  lastAccess(key: number): number {
    const slot = this.find(key);
    return slot < 0 ? -1 : this.accessAt[slot];
  }

  /**
   * Moves the request's blocks to the most recent end, charging each new block
   * `charsPerBlock` characters; a block already held keeps the charge it was inserted with,
   * so requests of different block sizes leave `chars` equal to what the tree holds.
   */
  insert(keys: Float64Array, n: number, epoch: number, charsPerBlock: number): void {
    for (let i = n - 1; i >= 0; i--) {
      const key = keys[i];
      let slot = this.find(key);
      if (slot < 0) {
        slot = this.allocate(key);
        this.charsAt[slot] = charsPerBlock;
        this.chars += charsPerBlock;
      } else this.unlink(slot);
      this.accessAt[slot] = epoch;
      this.append(slot);
    }
  }

  /** Drops least-recently-used leaves until the tree holds at most `max` characters. */
  evict(max: number): void {
    while (this.chars > max && this.oldest >= 0) this.dropOldest();
  }

  /** The epoch of the least recently used block; Infinity when the tree is empty. */
  oldestAccess(): number {
    return this.oldest < 0 ? Infinity : this.accessAt[this.oldest];
  }

  /**
   * Drops least-recently-used leaves last accessed at or before `epoch` until at least
   * `chars` characters are gone or none is left; returns the characters dropped.
   */
  evictThrough(epoch: number, chars: number): number {
    let dropped = 0;
    while (dropped < chars && this.oldest >= 0 && this.accessAt[this.oldest] <= epoch) dropped += this.dropOldest();
    return dropped;
  }

  /**
   * Drops the least recently used block (a leaf, the tree being prefix-closed), frees its
   * slot and returns the characters it was charged.
   */
  private dropOldest(): number {
    const slot = this.oldest;
    const chars = this.charsAt[slot];
    this.unlink(slot);
    this.unindex(slot);
    this.next[slot] = this.freeSlot;
    this.freeSlot = slot;
    this.chars -= chars;
    return chars;
  }

  /** The key's slot, −1 when absent. */
  private find(key: number): number {
    const mask = this.buckets.length - 1;
    const hash = mixKey(key);
    for (let b = hash & mask; ; b = (b + 1) & mask) {
      const entry = this.buckets[b];
      if (entry === 0) return -1;
      if (this.bucketHash[b] === hash && this.keyAt[entry - 1] === key) return entry - 1;
    }
  }

  private index(slot: number): void {
    const mask = this.buckets.length - 1;
    const hash = mixKey(this.keyAt[slot]);
    let b = hash & mask;
    while (this.buckets[b] !== 0) b = (b + 1) & mask;
    this.buckets[b] = slot + 1;
    this.bucketHash[b] = hash;
  }

  /** Removes the slot from the index, shifting later entries of its probe run back (no tombstones). */
  private unindex(slot: number): void {
    const { buckets, bucketHash } = this;
    const mask = buckets.length - 1;
    let hole = mixKey(this.keyAt[slot]) & mask;
    while (buckets[hole] !== slot + 1) hole = (hole + 1) & mask;
    for (let b = (hole + 1) & mask; buckets[b] !== 0; b = (b + 1) & mask) {
      const home = bucketHash[b] & mask;
      // the entry at b may fill the hole unless its home lies cyclically in (hole, b]
      if (hole <= b ? home > hole && home <= b : home > hole || home <= b) continue;
      buckets[hole] = buckets[b];
      bucketHash[hole] = bucketHash[b];
      hole = b;
    }
    buckets[hole] = 0;
  }

  private allocate(key: number): number {
    let slot = this.freeSlot;
    if (slot >= 0) this.freeSlot = this.next[slot];
    else {
      if (this.slotsUsed === this.keyAt.length) this.grow();
      slot = this.slotsUsed++;
    }
    this.keyAt[slot] = key;
    this.index(slot);
    return slot;
  }

  /** Doubles the slots and rebuilds the index (only while the tree grows to its cap). */
  private grow(): void {
    const size = this.keyAt.length * 2;
    this.keyAt = resized(this.keyAt, size);
    this.accessAt = resized(this.accessAt, size);
    this.charsAt = resized(this.charsAt, size);
    this.prev = resized(this.prev, size);
    this.next = resized(this.next, size);
    this.buckets = new Int32Array(2 * size);
    this.bucketHash = new Int32Array(2 * size);
    // every slot is live when the tree grows (none was free)
    for (let slot = 0; slot < this.slotsUsed; slot++) this.index(slot);
  }

  private unlink(slot: number): void {
    const before = this.prev[slot];
    const after = this.next[slot];
    if (before >= 0) this.next[before] = after;
    else this.oldest = after;
    if (after >= 0) this.prev[after] = before;
    else this.newest = before;
  }

  private append(slot: number): void {
    this.prev[slot] = this.newest;
    this.next[slot] = -1;
    if (this.newest >= 0) this.next[this.newest] = slot;
    else this.oldest = slot;
    this.newest = slot;
  }
}

/** Characters the trees hold together. */
export function totalChars(trees: ReadonlyArray<ApproxTree | undefined>): number {
  let total = 0;
  for (const t of trees) if (t) total += t.chars;
  return total;
}

/**
 * Drops least-recently-used leaves across all the trees, oldest first whichever tree holds
 * them, until together they hold at most `max` characters: one budget shared by the workers
 * rather than one each. Every decision stamps one tree with a fresh epoch, so the trees'
 * epochs never tie and taking the oldest block of any tree is one least-recently-used order.
 */
export function evictShared(trees: ReadonlyArray<ApproxTree | undefined>, max: number): void {
  let total = totalChars(trees);
  while (total > max) {
    let oldest: ApproxTree | undefined;
    let oldestAt = Infinity;
    let nextAt = Infinity;
    for (const t of trees) {
      if (!t) continue;
      const at = t.oldestAccess();
      if (at < oldestAt) {
        nextAt = oldestAt;
        oldestAt = at;
        oldest = t;
      } else if (at < nextAt) nextAt = at;
    }
    if (!oldest) return;
    // the oldest tree gives up blocks until another tree holds an older one
    total -= oldest.evictThrough(nextAt, total - max);
  }
}
