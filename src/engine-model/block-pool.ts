import { KeySlotTable, NONE } from './key-slot-table.js';

/**
 * The engine's pool of KV blocks, as vLLM V1's BlockPool (`vllm/v1/core/block_pool.py`):
 * per slot its cache key (NaN: not cached), the hashes its events carry and a reference
 * count; every slot no request holds sits in one free queue, least recently freed first. A
 * new block is taken from the front of the queue, and if that block still caches a prefix it
 * is evicted then (reported through `onRemoved` when it was announced).
 */
export class BlockPool {
  /** Cache key → slot of every cached block (held or free). */
  readonly slotOf: KeySlotTable;
  /** Requests holding each slot (0: in the free queue). */
  readonly refs: Int32Array;
  freeCount = 0;
  /** Counters of cache changes (blocks cached or evicted) and of blocks freed. */
  cacheChanges = 0;
  frees = 0;

  private readonly keyOf: Float64Array;
  private readonly hiOf: Uint32Array;
  private readonly loOf: Uint32Array;
  private readonly announced: Uint8Array;
  // the free queue's links are typed arrays, not lru-cache: pinning takes a block out mid-queue,
  // and typed links are 1.44× faster (`npm run bench:lru`)
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private freeHead = NONE;
  private freeTail = NONE;

  constructor(
    capacity: number,
    private readonly onRemoved: (hi: number, lo: number) => void,
  ) {
    const n = capacity;
    this.slotOf = new KeySlotTable(n);
    this.keyOf = new Float64Array(n).fill(Number.NaN);
    this.hiOf = new Uint32Array(n);
    this.loOf = new Uint32Array(n);
    this.announced = new Uint8Array(n);
    this.refs = new Int32Array(n);
    this.prev = new Int32Array(n);
    this.next = new Int32Array(n);
    for (let s = 0; s < n; s++) this.appendFree(s);
  }

  /** Caches a computed prefix block under its key; `announced` blocks are reported when evicted. */
  cache(slot: number, key: number, hi: number, lo: number): void {
    this.keyOf[slot] = key;
    this.hiOf[slot] = hi;
    this.loOf[slot] = lo;
    this.announced[slot] = 1;
    this.slotOf.set(key, slot);
    this.cacheChanges++;
  }

  /** Caches a computed content-anchor block, which is never announced as a KV event. */
  cacheSilently(slot: number, key: number): void {
    this.keyOf[slot] = key;
    this.announced[slot] = 0;
    this.slotOf.set(key, slot);
    this.cacheChanges++;
  }

  /** Whether the slot holds no cached block. */
  uncached(slot: number): boolean {
    return Number.isNaN(this.keyOf[slot]);
  }

  /** Keys of the announced (prefix) blocks in the cache, held or free. */
  announcedKeys(): number[] {
    const out: number[] = [];
    for (const [key, slot] of this.slotOf.entries()) if (this.announced[slot]) out.push(key);
    return out;
  }

  /** Takes the block at the front of the free queue, evicting what it cached. */
  takeFree(): number {
    const slot = this.freeHead;
    if (slot === NONE) throw new Error('engine block pool exhausted');
    this.unlinkFree(slot);
    const key = this.keyOf[slot];
    if (!Number.isNaN(key)) {
      this.cacheChanges++;
      this.slotOf.delete(key);
      this.keyOf[slot] = Number.NaN;
      if (this.announced[slot]) this.onRemoved(this.hiOf[slot], this.loOf[slot]);
      this.announced[slot] = 0;
    }
    this.refs[slot] = 1;
    return slot;
  }

  pin(slot: number): number {
    if (this.refs[slot]++ === 0) this.unlinkFree(slot);
    return slot;
  }

  unpin(slot: number): void {
    if (--this.refs[slot] === 0) this.appendFree(slot);
  }

  private appendFree(slot: number): void {
    this.prev[slot] = this.freeTail;
    this.next[slot] = NONE;
    if (this.freeTail !== NONE) this.next[this.freeTail] = slot;
    else this.freeHead = slot;
    this.freeTail = slot;
    this.freeCount++;
    this.frees++;
  }

  private unlinkFree(slot: number): void {
    const p = this.prev[slot];
    const n = this.next[slot];
    if (p !== NONE) this.next[p] = n;
    else this.freeHead = n;
    if (n !== NONE) this.prev[n] = p;
    else this.freeTail = p;
    this.freeCount--;
  }
}
