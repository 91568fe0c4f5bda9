/**
 * BlockIndex: which worker holds which KV block (by sequence hash), and in which tier.
 *
 * Layout, chosen for the route path's cost and for memory (README "Performance"):
 * - Blocks live in a node arena of typed arrays, addressed by a stable node id. A node holds
 *   the 64-bit key (two adjacent uint32) and, per tier, a bitmask of the worker slots holding
 *   it: `gpu`, `offload` (CPU or disk, vLLM's `medium`), and `predicted` (the router's own
 *   records: approximate mode, and precise mode's short-lived speculative entries). A node's
 *   masks are stored word-major (for each 32-slot word, its rows side by side), so the walk
 *   reads one cache line per node for the word it still needs.
 * - Lookups (overlaps) walk the request's blocks with the set of slots still matching and
 *   stop when it is empty. Only mask words with a matching slot are read, and once a single
 *   slot remains the walk tests that slot's bit alone: past the first few blocks the cost per
 *   block does not depend on the number of workers. Depths stay exact for every slot (the
 *   policies weigh them against load), so the walk is not cut short at one candidate.
 * - An open-addressing hash table (linear probing, backward-shift deletion) maps keys to
 *   node ids. No JS Map, no boxed numbers, no per-block objects.
 * - Per worker a reverse list of the node ids it stores (GPU, offload), so removing a worker
 *   or applying AllBlocksCleared costs O(that worker's blocks). Lists may hold stale ids;
 *   they are compacted when stale ids outnumber live ones. Predictions churn too fast for
 *   that; they are found through the generation lists below, which hold every worker's, so
 *   a clear walks them only while the worker still has predicted bits (counted exactly per
 *   worker): clearing a worker that has none, or clearing it again, costs nothing there.
 * - Predicted entries expire by generation: time is cut into generations of ttl/2 and each
 *   node keeps one predicted mask per generation slot. Three generations are live, so an
 *   entry lives at least `ttl` and less than 1.5 × ttl after it was last recorded, without
 *   per-entry timestamps. A fourth slot holds the generation that just expired while it is
 *   swept a little per operation (reads ignore it), so expiry never stalls a request.
 * - The entry budget counts (block, worker) pairs. Beyond it nodes are evicted by CLOCK
 *   (second chance), an LRU approximation whose "touch" is a one-byte write, so lookups stay
 *   cheap. New nodes start cold, so blocks seen once go before blocks reused since.
 *
 * Worker slots are small integers managed by the owner (the router); a mask word covers 32
 * slots and the index widens itself when a slot beyond the current width is first used.
 */

export const enum Tier {
  Gpu = 0,
  Offload = 1,
}

/** Rows per node: gpu, offload, then one predicted row per generation slot. */
const GENERATIONS = 4;
/** Generations whose predictions count; the remaining slot is the one being swept. */
const LIVE_GENERATIONS = 3;
const ROWS = 2 + GENERATIONS;
/** Nodes swept per operation; an operation recording n blocks sweeps n more, so the sweep
 * keeps pace with what is recorded and its cost is spread thin. */
const SWEEP_STEP = 16;
const ROW_GPU = 0;
const ROW_OFFLOAD = 1;
const ROW_PREDICTED = 2;

const EMPTY = -1;
const FREE = 2; // ref value of a node on the free list

/**
 * Keys of a sequence computed on demand (hashing.ts's TokenBlockKeys): a walk asks for more
 * only when it reaches the end of what is computed, so keys past where it stops are never computed.
 */
export interface BlockKeySource {
  /** Computes keys up to at least block `need` (capped at the sequence's end); returns how many are computed. */
  extend(need: number): number;
}

export interface BlockIndexOptions {
  /** Most (block, worker) entries kept; beyond it the coldest blocks are evicted. */
  maxEntries?: number;
  /** Lifetime of predicted entries in ms (at least this, less than 1.5×). */
  predictedTtlMs?: number;
  /** Initial node capacity (grows by doubling). */
  initialCapacity?: number;
}

/** Per-worker result of an overlap query, indexed by worker slot. Reused between queries. */
export class OverlapResult {
  /** Longest prefix of the query's blocks the worker holds, in any tier. */
  blocks: Int32Array;
  /** Of those, blocks held only in the offload tier. */
  offloadBlocks: Int32Array;
  /** Of those, blocks held only as the router's prediction. */
  predictedBlocks: Int32Array;
  /** Longest prefix any worker holds. */
  maxBlocks = 0;

  constructor(slots = 32) {
    this.blocks = new Int32Array(slots);
    this.offloadBlocks = new Int32Array(slots);
    this.predictedBlocks = new Int32Array(slots);
  }

  /** Grows to at least n slots (contents are reset by the next query). */
  ensureSlots(n: number): void {
    if (n <= this.blocks.length) return;
    const cap = Math.max(n, this.blocks.length * 2);
    this.blocks = new Int32Array(cap);
    this.offloadBlocks = new Int32Array(cap);
    this.predictedBlocks = new Int32Array(cap);
  }

  /** GPU-resident blocks of the worker's overlap. */
  gpuBlocks(slot: number): number {
    return this.blocks[slot] - this.offloadBlocks[slot] - this.predictedBlocks[slot];
  }
}

export interface BlockIndexStats {
  /** (block, worker) entries. */
  entries: number;
  /** Distinct blocks. */
  blocks: number;
  maxEntries: number;
  /** Bytes held by the index's arrays. */
  bytes: number;
  /** Entries evicted for the budget. */
  evictions: number;
  /** Predicted entries that expired. */
  expired: number;
  entriesPerWorker: Record<number, number>;
}

export class BlockIndex {
  readonly maxEntries: number;
  readonly predictedTtlMs: number;
  private readonly generationMs: number;

  // node arena
  private capacity: number;
  private words = 1;
  private stride = ROWS; // words * ROWS
  private keys: Uint32Array; // per node: low half, high half (one cache line for both)
  private masks: Uint32Array;
  private ref: Uint8Array; // 0 cold, 1 referenced, 2 free
  private mark: Uint32Array; // compaction epoch, to dedupe reverse lists
  private highWater = 0; // nodes [0, highWater) have been used at least once
  /** Free nodes, one bit each. Allocation takes the lowest free node at or after the cursor's
   * word, so a chain stored in one batch gets ascending ids wherever freed nodes lie together
   * (evicted chains free runs of nodes), and walks find the next block next door. */
  private freeBits: Uint32Array;
  private freeCount = 0;
  private freeCursor = 0;
  private liveNodes = 0;

  // hash table: node ids, EMPTY when vacant
  private table: Int32Array;
  private tableMask: number;
  private tableShift: number;

  // per worker slot
  private reverse: Int32Array[] = [];
  private reverseLength: number[] = [];
  private entriesOf: number[] = [];
  /** Predicted bits per worker, in every generation row (the one being swept included): a
   * clear walks the generation lists only while its worker's count is above 0. */
  private predictedOf: number[] = [];
  private markEpoch = 0;

  // predicted generations
  private generation = -1;
  private generationNodes: Int32Array[] = [];
  private generationLength: number[] = [];
  /** Offsets (in rows) of the live generations' predicted rows, for reads. */
  private liveRows = [ROW_PREDICTED, ROW_PREDICTED + 1, ROW_PREDICTED + 2];
  /** Generation slot being swept (-1: none), and how far. */
  private sweepSlot = -1;
  private sweepPos = 0;

  private walkNodes = new Int32Array(1024);
  private activeBits = new Int32Array(4);
  private activeWords = new Int32Array(4);
  private walkLength = 0;

  private totalEntries = 0;
  private evicted = 0;
  private expiredCount = 0;
  private clockHand = 0;

  constructor(options: BlockIndexOptions = {}) {
    this.maxEntries = options.maxEntries ?? 4_000_000;
    this.predictedTtlMs = options.predictedTtlMs ?? 120_000;
    if (!(this.maxEntries >= 1)) throw new RangeError(`maxEntries must be >= 1, got ${this.maxEntries}`);
    if (!(this.predictedTtlMs > 0)) throw new RangeError(`predictedTtlMs must be > 0, got ${this.predictedTtlMs}`);
    this.generationMs = this.predictedTtlMs / (LIVE_GENERATIONS - 1);
    this.capacity = Math.max(64, options.initialCapacity ?? 1024);
    this.keys = new Uint32Array(this.capacity * 2);
    this.masks = new Uint32Array(this.capacity * this.stride);
    this.ref = new Uint8Array(this.capacity);
    this.mark = new Uint32Array(this.capacity);
    this.freeBits = new Uint32Array((this.capacity + 31) >>> 5);
    const tableSize = nextPow2(this.capacity * 2);
    this.table = new Int32Array(tableSize).fill(EMPTY);
    this.tableMask = tableSize - 1;
    this.tableShift = 32 - Math.log2(tableSize);
    for (let g = 0; g < GENERATIONS; g++) {
      this.generationNodes.push(new Int32Array(256));
      this.generationLength.push(0);
    }
  }

  get entryCount(): number {
    return this.totalEntries;
  }

  get blockCount(): number {
    return this.liveNodes;
  }

  /** Entries (blocks) held by a worker slot. */
  entriesFor(slot: number): number {
    return this.entriesOf[slot] ?? 0;
  }

  // ---------------------------------------------------------------- events (precise mode)

  /** The worker stored these blocks (BlockStored). */
  applyStored(
    slot: number,
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    start: number,
    end: number,
    tier: Tier = Tier.Gpu,
  ): void {
    this.ensureSlot(slot);
    const row = tier === Tier.Offload ? ROW_OFFLOAD : ROW_GPU;
    this.walkLength = 0; // events are not the request just routed
    let node = EMPTY;
    for (let i = start; i < end; i++) {
      node = this.locate(i, hi[i] >>> 0, lo[i] >>> 0, node);
      this.setBit(node, row, slot);
    }
    this.enforceBudget();
  }

  /** The worker evicted these blocks (BlockRemoved). Unknown blocks are ignored. */
  applyRemoved(
    slot: number,
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    start: number,
    end: number,
    tier?: Tier,
  ): void {
    // the engine says it no longer holds them: a prediction that it does is wrong too
    this.clearBlocks(
      slot,
      hi,
      lo,
      start,
      end,
      tier === undefined || tier === Tier.Gpu,
      tier === undefined || tier === Tier.Offload,
    );
  }

  /**
   * The worker dropped everything (AllBlocksCleared), or was lost. O(that worker's stored
   * blocks), plus, only if it has predictions, the generation lists up to its last one.
   * With `keepOffload`, its offload-tier entries stay (an engine whose prefix cache was reset
   * while its KV connector kept its copies): its GPU and predicted entries go.
   */
  applyCleared(slot: number, keepOffload = false): void {
    if (slot >= this.words * 32) return;
    // stored entries through the worker's reverse list; predicted ones through the
    // generation lists (predictions are not kept on reverse lists: they churn too fast)
    const n = this.reverseLength[slot] ?? 0;
    for (let i = 0; i < n; i++) this.dropWorkerFromNode(this.reverse[slot][i], slot, keepOffload);
    // the nodes still held offload stay listed (the others are dropped by compacting)
    if (n > 0) {
      if (keepOffload) this.compactReverse(slot);
      else this.reverseLength[slot] = 0;
    }
    // the lists hold every worker's predictions: stop once this worker's are all dropped
    for (let g = 0; g < GENERATIONS && this.predictedOf[slot] > 0; g++) {
      const list = this.generationNodes[g];
      const len = this.generationLength[g];
      for (let i = 0; i < len && this.predictedOf[slot] > 0; i++) this.dropWorkerFromNode(list[i], slot, keepOffload);
    }
  }

  private dropWorkerFromNode(node: number, slot: number, keepOffload = false): void {
    if (this.ref[node] === FREE) return;
    const base = node * this.stride + (slot >>> 5) * ROWS;
    const bit = 1 << (slot & 31);
    let had = 0;
    for (let r = 0; r < ROWS; r++) {
      if (keepOffload && r === ROW_OFFLOAD) continue;
      const b = this.masks[base + r] & bit;
      if (b !== 0 && r >= ROW_PREDICTED) this.predictedOf[slot]--;
      had |= b;
      this.masks[base + r] &= ~bit;
    }
    // an entry held offload is still the worker's
    if (had !== 0 && (this.masks[base + ROW_OFFLOAD] & bit) === 0) {
      this.entriesOf[slot]--;
      this.totalEntries--;
      this.freeIfEmpty(node);
    }
  }

  // ------------------------------------------------------------- predictions (approximate)

  /**
   * Records that the worker will hold these blocks (the router just sent it the request).
   * Returns how many of them the worker did not hold before in any tier (neither reported
   * nor predicted): the blocks this record added. With `added` (room for end − start
   * numbers), their positions in `hi`/`lo` are written there, in order.
   */
  recordPredicted(
    slot: number,
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    start: number,
    end: number,
    now: number,
    added?: Int32Array,
  ): number {
    this.ensureSlot(slot);
    this.advanceTime(now);
    this.sweep(SWEEP_STEP + end - start);
    const g = this.generation % GENERATIONS;
    const row = ROW_PREDICTED + g;
    // the other live generations' rows: a prediction there is refreshed, not added
    const older1 = this.liveRows[1];
    const older2 = this.liveRows[2];
    const w = slot >>> 5;
    const bit = 1 << (slot & 31);
    let count = 0;
    let node = EMPTY;
    for (let i = start; i < end; i++) {
      const h = hi[i] >>> 0;
      const l = lo[i] >>> 0;
      node = this.locate(i, h, l, node);
      const base = node * this.stride + w * ROWS;
      // a block the engine reported storing needs no prediction; one predicted in this
      // generation already is up to date
      if ((this.masks[base + ROW_GPU] | this.masks[base + ROW_OFFLOAD] | this.masks[base + row]) & bit) continue;
      if (((this.masks[base + older1] | this.masks[base + older2]) & bit) === 0) {
        if (added !== undefined) added[count] = i;
        count++;
      }
      // the first predicted bit of this generation on a node puts it on the expiry list
      if (this.rowIsZero(node, row)) this.pushGenerationNode(g, node);
      this.setBit(node, row, slot);
    }
    this.enforceBudget();
    return count;
  }

  /**
   * Withdraws the worker's predictions of these blocks (the router's own records; what its
   * engine reported stays): it will not hold them after all. Unknown blocks are ignored.
   * Returns how many entries the worker lost.
   */
  withdrawPredicted(slot: number, hi: ArrayLike<number>, lo: ArrayLike<number>, start: number, end: number): number {
    if (slot >= this.words * 32) return 0;
    const held = this.entriesOf[slot] ?? 0;
    this.clearBlocks(slot, hi, lo, start, end, false, false);
    return held - (this.entriesOf[slot] ?? 0);
  }

  /** Clears the worker's predictions of these blocks, and its GPU and offload tiers as asked. */
  private clearBlocks(
    slot: number,
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    start: number,
    end: number,
    gpu: boolean,
    offload: boolean,
  ): void {
    if (slot >= this.words * 32) return;
    for (let i = start; i < end; i++) {
      const node = this.find(hi[i] >>> 0, lo[i] >>> 0);
      if (node === EMPTY) continue;
      if (gpu) this.clearBit(node, ROW_GPU, slot);
      if (offload) this.clearBit(node, ROW_OFFLOAD, slot);
      for (let g = 0; g < GENERATIONS; g++) this.clearBit(node, ROW_PREDICTED + g, slot);
      this.freeIfEmpty(node);
    }
  }

  /**
   * Expires predicted entries older than the TTL. Time only moves forward: a `now` earlier
   * than the latest seen is read as the latest seen (what is recorded then goes into the
   * newest generation and lives a full lifetime from it), and one before 0 (or NaN) as 0, the
   * first generation. The generation that leaves the window is swept incrementally by later
   * operations (see sweep()).
   */
  advanceTime(now: number): void {
    const at = Math.floor(now / this.generationMs);
    // generation numbers are >= 0 (-1 is "no time seen yet"; a slot is the number modulo GENERATIONS)
    const g = at > 0 ? at : 0;
    if (this.generation < 0) {
      this.generation = g;
      this.setLiveRows();
      return;
    }
    if (g <= this.generation) return;
    this.flushExpiry(); // the slot swept so far is about to be written again
    // generations that leave the live window [g - 2, g]; all but the newest are swept now
    const firstLive = g - LIVE_GENERATIONS + 1;
    const from = Math.max(this.generation - LIVE_GENERATIONS + 1, 0);
    const last = Math.min(this.generation, firstLive - 1);
    for (let x = from; x < last; x++) this.sweepRange(x % GENERATIONS, 0, Infinity);
    this.generation = g;
    this.setLiveRows();
    if (last >= from) {
      this.sweepSlot = last % GENERATIONS;
      this.sweepPos = 0;
      // a slot that is neither live nor being swept must be empty before it is written
      if (g - last >= GENERATIONS) this.flushExpiry();
    }
  }

  /** Finishes any pending expiry sweep now (tests, stats; not needed for correct reads). */
  flushExpiry(): void {
    if (this.sweepSlot >= 0) this.sweep(Infinity);
  }

  /** Sweeps up to `budget` nodes of the expired generation. */
  private sweep(budget: number): void {
    if (this.sweepSlot < 0) return;
    const g = this.sweepSlot;
    const end = Math.min(this.generationLength[g], this.sweepPos + budget);
    this.sweepRange(g, this.sweepPos, end);
    this.sweepPos = end;
    if (end >= this.generationLength[g]) {
      this.generationLength[g] = 0;
      const list = this.generationNodes[g];
      if (list.length > 4096 && end < list.length / 4) this.generationNodes[g] = new Int32Array(list.length / 2);
      this.sweepSlot = -1;
      this.sweepPos = 0;
    }
  }

  private setLiveRows(): void {
    const g = this.generation;
    for (let k = 0; k < LIVE_GENERATIONS; k++)
      this.liveRows[k] = ROW_PREDICTED + ((((g - k) % GENERATIONS) + GENERATIONS) % GENERATIONS);
  }

  // ---------------------------------------------------------------------------- queries

  /**
   * Each worker's overlap with the request's block sequence: the longest prefix it holds in
   * any tier, with how many of those blocks are offloaded or only predicted. Matched blocks
   * are marked recently used. `now` (ms) first expires old predictions. With `keys`, only the
   * first `ready` of the n keys are computed in `hi`/`lo` (arrays that hold all n) and the walk
   * asks `keys` for more when it gets there.
   */
  overlaps(
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    n: number,
    out: OverlapResult,
    now?: number,
    keys?: BlockKeySource,
    ready: number = n,
  ): OverlapResult {
    if (now !== undefined) {
      this.advanceTime(now);
      this.sweep(SWEEP_STEP);
    }
    const slots = this.words * 32;
    out.ensureSlots(slots);
    out.blocks.fill(0);
    out.offloadBlocks.fill(0);
    out.predictedBlocks.fill(0);
    out.maxBlocks = 0;
    if (this.words === 1) return this.overlapsOneWord(hi, lo, n, out, keys, ready);
    return this.overlapsWide(hi, lo, n, out, keys, ready);
  }

  private overlapsOneWord(
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    n: number,
    out: OverlapResult,
    keys: BlockKeySource | undefined,
    ready: number,
  ): OverlapResult {
    const masks = this.masks;
    const walk = this.walkFor(n);
    const stride = this.stride; // ROWS when words = 1
    const p0 = this.liveRows[0];
    const p1 = this.liveRows[1];
    const p2 = this.liveRows[2];
    let active = -1; // every slot still matching
    let i = 0;
    let node = EMPTY;
    for (; i < n; i++) {
      if (i === ready) ready = keys!.extend(i + 1);
      // blocks stored in one batch get consecutive node ids: try the next one before hashing
      const h = hi[i] >>> 0;
      const l = lo[i] >>> 0;
      node = node === EMPTY ? this.find(h, l) : this.findNear(node, h, l);
      if (node === EMPTY) break;
      walk[i] = node;
      const base = node * stride;
      const gpu = masks[base];
      const off = masks[base + 1];
      const pred = masks[base + p0] | masks[base + p1] | masks[base + p2];
      const next = active & (gpu | off | pred);
      if (next === 0) break;
      this.ref[node] = 1;
      // slots dropping out at depth 0 already read 0
      if (next !== active && i > 0) this.finishSlots(active & ~next, 0, i, out);
      const offOnly = next & off & ~gpu;
      if (offOnly !== 0) countBits(offOnly, 0, out.offloadBlocks);
      const predOnly = next & pred & ~gpu & ~off;
      if (predOnly !== 0) countBits(predOnly, 0, out.predictedBlocks);
      active = next;
      if ((active & (active - 1)) === 0)
        return this.walkOneSlot(hi, lo, n, i + 1, node, 31 - Math.clz32(active), out, keys, ready);
    }
    if (i > 0) this.finishSlots(active, 0, i, out);
    out.maxBlocks = i;
    this.walkLength = i;
    return out;
  }

  /**
   * More than 32 slots. Only the words that still have a matching slot are read: their list
   * shrinks as slots drop out, so once a prefix narrows to the few workers that hold it, the
   * cost per block no longer grows with the number of workers.
   */
  private overlapsWide(
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    n: number,
    out: OverlapResult,
    keys: BlockKeySource | undefined,
    ready: number,
  ): OverlapResult {
    const words = this.words;
    const stride = this.stride;
    const walk = this.walkFor(n);
    const p0 = this.liveRows[0];
    const p1 = this.liveRows[1];
    const p2 = this.liveRows[2];
    if (this.activeBits.length < words) {
      this.activeBits = new Int32Array(words);
      this.activeWords = new Int32Array(words);
    }
    const bits = this.activeBits; // per word: the slots still matching
    const list = this.activeWords; // the words whose bits are not 0
    for (let w = 0; w < words; w++) {
      bits[w] = -1;
      list[w] = w;
    }
    let count = words;
    const masks = this.masks;
    let i = 0;
    let node = EMPTY;
    for (; i < n; i++) {
      if (i === ready) ready = keys!.extend(i + 1);
      const h = hi[i] >>> 0;
      const l = lo[i] >>> 0;
      node = node === EMPTY ? this.find(h, l) : this.findNear(node, h, l);
      if (node === EMPTY) break;
      const base = node * stride;
      let kept = 0;
      for (let k = 0; k < count; k++) {
        const w = list[k];
        const current = bits[w];
        const b = base + w * ROWS;
        const gpu = masks[b];
        const off = masks[b + ROW_OFFLOAD];
        const pred = masks[b + p0] | masks[b + p1] | masks[b + p2];
        const next = current & (gpu | off | pred);
        // slots dropping out at depth 0 already read 0; later ones end at this depth, which
        // is also where the walk ends if none is left
        if (next !== current && i > 0) this.finishSlots(current & ~next, w, i, out);
        if (next === 0) continue;
        const offOnly = next & off & ~gpu;
        if (offOnly !== 0) countBits(offOnly, w, out.offloadBlocks);
        const predOnly = next & pred & ~gpu & ~off;
        if (predOnly !== 0) countBits(predOnly, w, out.predictedBlocks);
        bits[w] = next;
        list[kept++] = w;
      }
      count = kept;
      if (count === 0) break;
      walk[i] = node;
      this.ref[node] = 1;
      if (count === 1) {
        const last = bits[list[0]];
        if ((last & (last - 1)) === 0)
          return this.walkOneSlot(hi, lo, n, i + 1, node, (list[0] << 5) + (31 - Math.clz32(last)), out, keys, ready);
      }
    }
    if (i > 0) for (let k = 0; k < count; k++) this.finishSlots(bits[list[k]], list[k], i, out);
    out.maxBlocks = i;
    this.walkLength = i;
    return out;
  }

  /**
   * The rest of a walk once one slot alone still matches (from block i, after `node`): its
   * depth and tiers stay exact, as the policies weigh them against load, but each block costs
   * one word per row whatever the number of workers.
   */
  private walkOneSlot(
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    n: number,
    i: number,
    node: number,
    slot: number,
    out: OverlapResult,
    keys: BlockKeySource | undefined,
    ready: number,
  ): OverlapResult {
    const masks = this.masks;
    const walk = this.walkNodes;
    const stride = this.stride;
    const offset = (slot >>> 5) * ROWS;
    const bit = 1 << (slot & 31);
    const p0 = this.liveRows[0];
    const p1 = this.liveRows[1];
    const p2 = this.liveRows[2];
    let offloaded = 0;
    let predicted = 0;
    for (; i < n; i++) {
      if (i === ready) ready = keys!.extend(i + 1);
      node = this.findNear(node, hi[i] >>> 0, lo[i] >>> 0);
      if (node === EMPTY) break;
      const b = node * stride + offset;
      if ((masks[b] & bit) === 0) {
        if ((masks[b + ROW_OFFLOAD] & bit) !== 0) offloaded++;
        else if (((masks[b + p0] | masks[b + p1] | masks[b + p2]) & bit) !== 0) predicted++;
        else break;
      }
      walk[i] = node;
      this.ref[node] = 1;
    }
    out.blocks[slot] = i;
    out.offloadBlocks[slot] += offloaded;
    out.predictedBlocks[slot] += predicted;
    out.maxBlocks = i;
    this.walkLength = i;
    return out;
  }

  /** Scratch for the node ids of the last query's walk, so recording the same request after
   * the decision does not hash into the table again for blocks the walk already found. */
  private walkFor(n: number): Int32Array {
    if (this.walkNodes.length < n) this.walkNodes = new Int32Array(Math.max(n, this.walkNodes.length * 2));
    this.walkLength = 0;
    return this.walkNodes;
  }

  /** Slots in `bits` (of word w) stopped matching at block `depth`. */
  private finishSlots(bits: number, w: number, depth: number, out: OverlapResult): void {
    while (bits !== 0) {
      const low = bits & -bits;
      const slot = (w << 5) + (31 - Math.clz32(low));
      out.blocks[slot] = depth;
      bits ^= low;
    }
  }

  /**
   * Extends `out` (an overlaps() result for the same blocks) with blocks held beyond the
   * longest prefix: a worker holding block j (GPU or offload, not predicted) is counted as
   * holding blocks 0..j. For keys that are the engine's own hashes (vLLM's, `--block-hash
   * vllm`), where the engine only caches a block whose prefix it cached, and where the router
   * may never have seen those ancestors stored (it joined late). Costs one lookup per block
   * past the prefix; the default route path does not call it.
   */
  extendToDeepestHeld(hi: ArrayLike<number>, lo: ArrayLike<number>, n: number, out: OverlapResult): OverlapResult {
    const words = this.words;
    for (let j = n - 1; j >= out.maxBlocks; j--) {
      const node = this.find(hi[j] >>> 0, lo[j] >>> 0);
      if (node === EMPTY) continue;
      const base = node * this.stride;
      for (let w = 0; w < words; w++) {
        // each word of 32 workers keeps its rows together (base + w · ROWS + row)
        const b = base + w * ROWS;
        const gpu = this.masks[b + ROW_GPU];
        let bits = gpu | this.masks[b + ROW_OFFLOAD];
        while (bits !== 0) {
          const low = bits & -bits;
          bits ^= low;
          const slot = (w << 5) + (31 - Math.clz32(low));
          if (out.blocks[slot] >= j + 1) continue;
          out.blocks[slot] = j + 1;
          out.offloadBlocks[slot] = gpu & low ? 0 : j + 1;
          out.predictedBlocks[slot] = 0;
          if (j + 1 > out.maxBlocks) out.maxBlocks = j + 1;
        }
      }
    }
    return out;
  }

  /** Whether a worker holds a block, and in which tier (tests and tools; not the hot path). */
  holder(slot: number, hi: number, lo: number): 'gpu' | 'offload' | 'predicted' | null {
    const node = this.find(hi >>> 0, lo >>> 0);
    if (node === EMPTY || slot >= this.words * 32) return null;
    const base = node * this.stride + (slot >>> 5) * ROWS;
    const bit = 1 << (slot & 31);
    if (this.masks[base + ROW_GPU] & bit) return 'gpu';
    if (this.masks[base + ROW_OFFLOAD] & bit) return 'offload';
    for (const row of this.liveRows) if (this.masks[base + row] & bit) return 'predicted';
    return null;
  }

  stats(): BlockIndexStats {
    this.flushExpiry();
    const entriesPerWorker: Record<number, number> = {};
    this.entriesOf.forEach((n, slot) => {
      if (n > 0) entriesPerWorker[slot] = n;
    });
    let bytes =
      this.keys.byteLength +
      this.masks.byteLength +
      this.ref.byteLength +
      this.mark.byteLength +
      this.freeBits.byteLength +
      this.table.byteLength;
    for (const r of this.reverse) if (r) bytes += r.byteLength;
    for (const g of this.generationNodes) bytes += g.byteLength;
    return {
      entries: this.totalEntries,
      blocks: this.liveNodes,
      maxEntries: this.maxEntries,
      bytes,
      evictions: this.evicted,
      expired: this.expiredCount,
      entriesPerWorker,
    };
  }

  // --------------------------------------------------------------------- bit bookkeeping

  private ensureSlot(slot: number): void {
    if (!Number.isInteger(slot) || slot < 0) throw new RangeError(`slot must be a non-negative integer, got ${slot}`);
    if (slot >= this.words * 32) this.widen(Math.floor(slot / 32) + 1);
    while (this.reverse.length <= slot) {
      this.reverse.push(new Int32Array(64));
      this.reverseLength.push(0);
      this.entriesOf.push(0);
      this.predictedOf.push(0);
    }
  }

  /** Whether the worker has any bit on the node (any tier). */
  private holds(node: number, w: number, bit: number): boolean {
    const base = node * this.stride + w * ROWS;
    for (let r = 0; r < ROWS; r++) if (this.masks[base + r] & bit) return true;
    return false;
  }

  private setBit(node: number, row: number, slot: number): void {
    const w = slot >>> 5;
    const bit = 1 << (slot & 31);
    const base = node * this.stride + w * ROWS;
    const idx = base + row;
    if (this.masks[idx] & bit) return;
    const hadStored = (this.masks[base + ROW_GPU] | this.masks[base + ROW_OFFLOAD]) & bit;
    const had = hadStored !== 0 || this.holds(node, w, bit);
    this.masks[idx] |= bit;
    if (row >= ROW_PREDICTED) this.predictedOf[slot]++;
    if (!had) {
      this.entriesOf[slot]++;
      this.totalEntries++;
    }
    // the reverse list holds the stored tiers only, so removing a worker costs its blocks
    if (row < ROW_PREDICTED && hadStored === 0) this.pushReverse(slot, node);
  }

  private clearBit(node: number, row: number, slot: number): void {
    const w = slot >>> 5;
    const bit = 1 << (slot & 31);
    const idx = node * this.stride + w * ROWS + row;
    if ((this.masks[idx] & bit) === 0) return;
    this.masks[idx] &= ~bit;
    if (row >= ROW_PREDICTED) this.predictedOf[slot]--;
    if (!this.holds(node, w, bit)) {
      this.entriesOf[slot]--;
      this.totalEntries--;
    }
  }

  private rowIsZero(node: number, row: number): boolean {
    const base = node * this.stride + row;
    for (let w = 0; w < this.words; w++) if (this.masks[base + w * ROWS] !== 0) return false;
    return true;
  }

  private freeIfEmpty(node: number): void {
    const base = node * this.stride;
    for (let i = 0; i < this.stride; i++) if (this.masks[base + i] !== 0) return;
    this.freeNode(node);
  }

  /** Returns an empty node to the free list. */
  private freeNode(node: number): void {
    this.removeFromTable(node);
    this.ref[node] = FREE;
    this.freeBits[node >>> 5] |= 1 << (node & 31);
    this.freeCount++;
    this.liveNodes--;
  }

  private pushReverse(slot: number, node: number): void {
    let list = this.reverse[slot];
    let n = this.reverseLength[slot];
    if (n === list.length) {
      // compact first when stale ids dominate, else grow
      if (n > 2 * this.entriesOf[slot] + 64) {
        n = this.compactReverse(slot);
        list = this.reverse[slot];
      }
      if (n === list.length) {
        const bigger = new Int32Array(list.length * 2);
        bigger.set(list);
        this.reverse[slot] = list = bigger;
      }
    }
    list[n] = node;
    this.reverseLength[slot] = n + 1;
  }

  private compactReverse(slot: number): number {
    const list = this.reverse[slot];
    const n = this.reverseLength[slot];
    const w = slot >>> 5;
    const bit = 1 << (slot & 31);
    const epoch = ++this.markEpoch;
    let k = 0;
    for (let i = 0; i < n; i++) {
      const node = list[i];
      const base = node * this.stride + w * ROWS;
      const stored = (this.masks[base + ROW_GPU] | this.masks[base + ROW_OFFLOAD]) & bit;
      if (this.ref[node] === FREE || this.mark[node] === epoch || stored === 0) continue;
      this.mark[node] = epoch;
      list[k++] = node;
    }
    this.reverseLength[slot] = k;
    return k;
  }

  private pushGenerationNode(g: number, node: number): void {
    let list = this.generationNodes[g];
    const n = this.generationLength[g];
    if (n === list.length) {
      const bigger = new Int32Array(list.length * 2);
      bigger.set(list);
      this.generationNodes[g] = list = bigger;
    }
    list[n] = node;
    this.generationLength[g] = n + 1;
  }

  /** Drops the predicted bits of generation slot g for list entries [from, to). */
  private sweepRange(g: number, from: number, to: number): void {
    const list = this.generationNodes[g];
    const n = Math.min(this.generationLength[g], to);
    const row = ROW_PREDICTED + g;
    const masks = this.masks;
    const stride = this.stride;
    const words = this.words;
    for (let i = from; i < n; i++) {
      const node = list[i];
      if (this.ref[node] === FREE) continue;
      let left = 0; // any bit left on the node, in any row
      for (let w = 0; w < words; w++) {
        const base = node * stride + w * ROWS;
        let bits = masks[base + row];
        masks[base + row] = 0;
        let others = 0;
        for (let r = 0; r < ROWS; r++) others |= masks[base + r];
        left |= others;
        while (bits !== 0) {
          const low = bits & -bits;
          bits ^= low;
          const slot = (w << 5) + (31 - Math.clz32(low));
          this.predictedOf[slot]--;
          // entries still held through another row are not lost
          if ((others & low) !== 0) continue;
          this.entriesOf[slot]--;
          this.totalEntries--;
          this.expiredCount++;
        }
      }
      if (left === 0) this.freeNode(node);
    }
    if (to === Infinity) this.generationLength[g] = 0;
  }

  // -------------------------------------------------------------------------- eviction

  private enforceBudget(): void {
    if (this.totalEntries <= this.maxEntries) return;
    const ref = this.ref;
    // at most two sweeps find a cold node; bounded so a pathological state cannot spin
    let steps = 0;
    const limit = 2 * this.highWater + 2;
    while (this.totalEntries > this.maxEntries && this.liveNodes > 0 && steps++ < limit * 4) {
      if (this.clockHand >= this.highWater) this.clockHand = 0;
      const node = this.clockHand++;
      if (ref[node] === FREE) continue;
      if (ref[node] === 1) {
        ref[node] = 0;
        continue;
      }
      this.evictNode(node);
    }
  }

  private evictNode(node: number): void {
    const base = node * this.stride;
    for (let w = 0; w < this.words; w++) {
      let bits = 0;
      for (let r = 0; r < ROWS; r++) bits |= this.masks[base + w * ROWS + r];
      for (let r = ROW_PREDICTED; r < ROWS; r++) {
        let predicted = this.masks[base + w * ROWS + r];
        while (predicted !== 0) {
          const low = predicted & -predicted;
          predicted ^= low;
          this.predictedOf[(w << 5) + (31 - Math.clz32(low))]--;
        }
      }
      while (bits !== 0) {
        const low = bits & -bits;
        bits ^= low;
        const slot = (w << 5) + (31 - Math.clz32(low));
        this.entriesOf[slot]--;
        this.totalEntries--;
        this.evicted++;
      }
    }
    this.masks.fill(0, base, base + this.stride);
    this.freeIfEmpty(node);
  }

  // ------------------------------------------------------------------------ hash table

  /**
   * Fibonacci hashing: the top bits of a multiplicative mix. Taking the top bits keeps
   * structured keys (precomputed ids, test keys) from piling into a few buckets.
   */
  private bucketOf(hi: number, lo: number): number {
    return Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1) >>> this.tableShift;
  }

  private find(hi: number, lo: number): number {
    const table = this.table;
    const mask = this.tableMask;
    let pos = this.bucketOf(hi, lo);
    for (;;) {
      const node = table[pos];
      if (node === EMPTY) return EMPTY;
      if (this.keys[2 * node] === lo && this.keys[2 * node + 1] === hi) return node;
      pos = (pos + 1) & mask;
    }
  }

  /**
   * The node of block i of a sequence being recorded: from the last query's walk when it
   * covered block i with this key (recording right after routing the same request), else
   * the node after the previous block's (chains are allocated in order), else the table.
   */
  private locate(i: number, h: number, l: number, previous: number): number {
    if (i < this.walkLength) {
      const node = this.walkNodes[i];
      if (this.keys[2 * node] === l && this.keys[2 * node + 1] === h && this.ref[node] !== FREE) {
        this.ref[node] = 1;
        return node;
      }
    }
    if (previous !== EMPTY) {
      const near = this.adjacent(previous, h, l);
      if (near !== EMPTY) {
        this.ref[near] = 1;
        return near;
      }
    }
    return this.findOrInsert(h, l);
  }

  /**
   * The node holding key (h, l) if it sits next to `node` in the arena. Chains stored in one
   * batch get consecutive ids (ascending when fresh, descending when reused from the free
   * list), so the next block of a walk is usually adjacent and needs no table probe.
   */
  private adjacent(node: number, h: number, l: number): number {
    const up = node + 1;
    if (up < this.highWater && this.keys[2 * up] === l && this.keys[2 * up + 1] === h && this.ref[up] !== FREE)
      return up;
    const down = node - 1;
    if (down >= 0 && this.keys[2 * down] === l && this.keys[2 * down + 1] === h && this.ref[down] !== FREE) return down;
    return EMPTY;
  }

  private findNear(node: number, h: number, l: number): number {
    const near = this.adjacent(node, h, l);
    return near !== EMPTY ? near : this.find(h, l);
  }

  /** An existing block is marked recently used; a new one starts cold. One probe either way. */
  private findOrInsert(hi: number, lo: number): number {
    if ((this.liveNodes + 1) * 2 > this.table.length) this.growTable();
    const table = this.table;
    const mask = this.tableMask;
    let pos = this.bucketOf(hi, lo);
    for (;;) {
      const found = table[pos];
      if (found === EMPTY) break;
      if (this.keys[2 * found] === lo && this.keys[2 * found + 1] === hi) {
        this.ref[found] = 1;
        return found;
      }
      pos = (pos + 1) & mask;
    }
    const node = this.allocateNode();
    this.keys[2 * node] = lo;
    this.keys[2 * node + 1] = hi;
    this.ref[node] = 0; // new blocks start cold (see class comment)
    table[pos] = node;
    this.liveNodes++;
    return node;
  }

  private insertIntoTable(node: number): void {
    const mask = this.tableMask;
    let pos = this.bucketOf(this.keys[2 * node + 1], this.keys[2 * node]);
    while (this.table[pos] !== EMPTY) pos = (pos + 1) & mask;
    this.table[pos] = node;
  }

  private removeFromTable(node: number): void {
    const table = this.table;
    const mask = this.tableMask;
    let pos = this.bucketOf(this.keys[2 * node + 1], this.keys[2 * node]);
    while (table[pos] !== node) {
      if (table[pos] === EMPTY) return;
      pos = (pos + 1) & mask;
    }
    // backward-shift deletion keeps probe chains intact without tombstones
    let hole = pos;
    let j = pos;
    for (;;) {
      j = (j + 1) & mask;
      const other = table[j];
      if (other === EMPTY) break;
      const ideal = this.bucketOf(this.keys[2 * other + 1], this.keys[2 * other]);
      // move `other` into the hole unless its ideal slot lies cyclically in (hole, j]
      const inRange = hole <= j ? ideal > hole && ideal <= j : ideal > hole || ideal <= j;
      if (!inRange) {
        table[hole] = other;
        hole = j;
      }
    }
    table[hole] = EMPTY;
  }

  private growTable(): void {
    const size = this.table.length * 2;
    this.table = new Int32Array(size).fill(EMPTY);
    this.tableMask = size - 1;
    this.tableShift = 32 - Math.log2(size);
    for (let node = 0; node < this.highWater; node++) if (this.ref[node] !== FREE) this.insertIntoTable(node);
  }

  private allocateNode(): number {
    if (this.freeCount > 0) {
      const bits = this.freeBits;
      const words = (this.highWater + 31) >>> 5;
      let w = this.freeCursor < words ? this.freeCursor : 0;
      while (bits[w] === 0) w = w + 1 < words ? w + 1 : 0;
      const low = bits[w] & -bits[w];
      bits[w] ^= low;
      this.freeCursor = w;
      this.freeCount--;
      return (w << 5) + (31 - Math.clz32(low));
    }
    if (this.highWater === this.capacity) this.growArena(this.capacity * 2);
    return this.highWater++;
  }

  private growArena(capacity: number): void {
    const grow32 = (a: Uint32Array, n: number) => {
      const b = new Uint32Array(n);
      b.set(a);
      return b;
    };
    this.keys = grow32(this.keys, capacity * 2);
    this.masks = grow32(this.masks, capacity * this.stride);
    this.mark = grow32(this.mark, capacity);
    const ref = new Uint8Array(capacity);
    ref.set(this.ref);
    this.ref = ref;
    const free = new Uint32Array((capacity + 31) >>> 5);
    free.set(this.freeBits);
    this.freeBits = free;
    this.capacity = capacity;
  }

  /** Makes room for more worker slots: every mask row gets more words. */
  private widen(words: number): void {
    const oldWords = this.words;
    const oldStride = this.stride;
    const stride = words * ROWS;
    const masks = new Uint32Array(this.capacity * stride);
    // a node's words keep their offsets: the new words follow the old ones
    for (let node = 0; node < this.highWater; node++) {
      masks.set(this.masks.subarray(node * oldStride, node * oldStride + oldWords * ROWS), node * stride);
    }
    this.masks = masks;
    this.words = words;
    this.stride = stride;
  }
}

function countBits(bits: number, w: number, into: Int32Array): void {
  while (bits !== 0) {
    const low = bits & -bits;
    into[(w << 5) + (31 - Math.clz32(low))]++;
    bits ^= low;
  }
}

function nextPow2(n: number): number {
  let p = 1;
  while (p < n) p *= 2;
  return p;
}
