/** Marks an empty entry (and, in the block pool, the end of the free queue). */
export const NONE = -1;

/**
 * Cache key → block slot, open addressing with linear probing over typed arrays: the engine
 * looks up every prompt block of every request, and a Map keyed by 53-bit doubles allocates
 * and hashes slowly. At most `capacity` keys (one per block); the table stays at most half full.
 */
export class KeySlotTable {
  private readonly keys: Float64Array;
  private readonly slots: Int32Array;
  private readonly mask: number;
  private readonly shift: number;
  size = 0;

  /** The most keys a table takes: twice as many entries must fit a 31-bit shift of 1. */
  static readonly MAX_CAPACITY = 2 ** 29;

  constructor(capacity: number) {
    // past this `1 << bits` overflows to a negative number and the loop below never ends
    if (!Number.isInteger(capacity) || capacity < 0 || capacity > KeySlotTable.MAX_CAPACITY)
      throw new RangeError(`capacity must be an integer from 0 to ${KeySlotTable.MAX_CAPACITY} keys, got ${capacity}`);
    let bits = 4;
    while (1 << bits < 2 * capacity) bits++;
    this.keys = new Float64Array(1 << bits);
    this.slots = new Int32Array(1 << bits).fill(NONE);
    this.mask = (1 << bits) - 1;
    this.shift = 32 - bits;
  }

  private home(key: number): number {
    return Math.imul((key >>> 0) ^ Math.floor(key / 4294967296), 0x9e3779b1) >>> this.shift;
  }

  get(key: number): number {
    for (let i = this.home(key); ; i = (i + 1) & this.mask) {
      const s = this.slots[i];
      if (s === NONE) return NONE;
      if (this.keys[i] === key) return s;
    }
  }

  has(key: number): boolean {
    return this.get(key) !== NONE;
  }

  /** Adds a key that is not present. */
  set(key: number, slot: number): void {
    let i = this.home(key);
    while (this.slots[i] !== NONE) i = (i + 1) & this.mask;
    this.keys[i] = key;
    this.slots[i] = slot;
    this.size++;
  }

  delete(key: number): void {
    let i = this.home(key);
    for (; ; i = (i + 1) & this.mask) {
      if (this.slots[i] === NONE) return;
      if (this.keys[i] === key) break;
    }
    this.size--;
    // backward-shift deletion: move later entries of the run into the hole when they may
    for (let j = (i + 1) & this.mask; this.slots[j] !== NONE; j = (j + 1) & this.mask) {
      const h = this.home(this.keys[j]);
      const movable = i <= j ? h <= i || h > j : h <= i && h > j;
      if (movable) {
        this.keys[i] = this.keys[j];
        this.slots[i] = this.slots[j];
        i = j;
      }
    }
    this.slots[i] = NONE;
  }

  *entries(): Generator<[number, number]> {
    for (let i = 0; i < this.slots.length; i++) if (this.slots[i] !== NONE) yield [this.keys[i], this.slots[i]];
  }
}
