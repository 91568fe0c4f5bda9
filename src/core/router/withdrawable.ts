/**
 * The blocks a tracked decision alone added to the index's predictions on its worker, kept
 * while the engine may still refuse the request (until its prefill ends or it is released),
 * so that a refusal can withdraw them: the worker will not hold them after all.
 *
 * "Alone": a block the worker held before the decision (its engine reported it, or another
 * decision predicted it) was not added by it. A decision on the same worker made while this
 * one is pending that predicts one of its blocks (this replica's, or another's applied here)
 * claims it: the block stays if the first is refused, as the worker will hold it for the
 * second. Block keys chain their prefix, so a later decision has an added block only if it
 * has every block before it, at the same position: what it claims is a leading run of the
 * added blocks, found by comparing one key per pending decision on the worker.
 */
import type { WorkerState } from '../worker-registry.js';

/** Blocks per chunk of the block arena (a power of two). */
const CHUNK = 32;
const CHUNK_MASK = CHUNK - 1;
/** No chunk, decision or table entry. */
const NONE = -1;

/** The keys of a decision's blocks a refusal withdraws: [start, end) of `hi`/`lo`. */
export interface WithdrawnBlocks {
  /** The worker's slot. */
  readonly slot: number;
  /** Scratch, valid until the next take(). */
  readonly hi: Uint32Array;
  readonly lo: Uint32Array;
  readonly start: number;
  readonly end: number;
}

/**
 * Typed arrays, reused: routing allocates nothing here once they have grown to the traffic's
 * pending decisions (they grow by doubling and never shrink). A decision's blocks take a
 * list of chunks of CHUNK blocks (key halves and position) from a free list; the decision
 * itself a record from another, linked into its worker's list of pending decisions; tickets
 * find their record through an open-addressing table. A chunk whose blocks later decisions
 * have all claimed goes back to the free list at once.
 *
 * Memory: the tickets these belong to are not bounded by the router (InFlightTickets holds
 * every tracked request until release(); the caller bounds them, the gateway by the requests
 * it is proxying), so the arena bounds itself: it keeps at most `maxBlocks` blocks, counted
 * in whole chunks (the router passes maxIndexEntries, a cap the index itself never exceeds).
 * A decision that does not fit is not kept: a refusal withdraws nothing for it, and its
 * predictions last until their TTL. Records number at most the chunks held, and the ticket
 * table's entries less than four times the most records held at once.
 */
export class WithdrawablePredictions {
  private readonly maxChunks: number;

  // the block arena, by chunk: CHUNK slots of key halves and positions
  private hi: Uint32Array<ArrayBuffer> = new Uint32Array(16 * CHUNK);
  private lo: Uint32Array<ArrayBuffer> = new Uint32Array(16 * CHUNK);
  /** Each block's position in its decision's keys, ascending along the decision's chunks. */
  private at: Int32Array<ArrayBuffer> = new Int32Array(16 * CHUNK);
  /** The decision's next chunk, or the next free chunk. */
  private chunkNext: Int32Array<ArrayBuffer> = new Int32Array(16);
  private freeChunk = NONE;
  /** Chunks ever handed out (the rest of the arena is fresh), and those held now. */
  private chunksMade = 0;
  private chunksHeld = 0;

  // pending decisions, by record
  private ticketOf: Float64Array<ArrayBuffer> = new Float64Array(16);
  private slotOf: Int32Array<ArrayBuffer> = new Int32Array(16);
  /** The decision's blocks [from, count) are its own; `from` is in chunk `chunkOf`, the first it holds. */
  private fromOf: Int32Array<ArrayBuffer> = new Int32Array(16);
  private countOf: Int32Array<ArrayBuffer> = new Int32Array(16);
  private chunkOf: Int32Array<ArrayBuffer> = new Int32Array(16);
  /** The worker's list of pending decisions; `nextOf` also links the free records. */
  private prevOf: Int32Array<ArrayBuffer> = new Int32Array(16);
  private nextOf: Int32Array<ArrayBuffer> = new Int32Array(16);
  private freeRecord = NONE;
  private recordsMade = 0;
  private live = 0;

  /** Per worker slot, its first pending decision. */
  private headOf: Int32Array<ArrayBuffer> = new Int32Array(16).fill(NONE);

  /**
   * Ticket → record, linear probing from the ticket's low bits (0: empty; the router's tickets
   * count up from 1, the keys of decisions it applied from other replicas down from −1).
   */
  private tableTicket: Float64Array<ArrayBuffer> = new Float64Array(64);
  private tableRecord: Int32Array<ArrayBuffer> = new Int32Array(64);

  /** What take() returns the blocks in. */
  private scratchHi: Uint32Array<ArrayBuffer> = new Uint32Array(CHUNK);
  private scratchLo: Uint32Array<ArrayBuffer> = new Uint32Array(CHUNK);

  constructor(maxBlocks = 4_000_000) {
    this.maxChunks = Math.max(1, Math.ceil(maxBlocks / CHUNK));
  }

  /** Decisions pending with blocks of their own (tests and stats). */
  get size(): number {
    return this.live;
  }

  /**
   * Keeps what the ticket's decision on `worker` added: the `count` blocks of `hi`/`lo` at
   * the positions `at[0]` … `at[count − 1]` (ascending). Copies them.
   */
  open(
    ticket: number,
    worker: WorkerState,
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    at: Int32Array,
    count: number,
  ): void {
    if (count <= 0) return;
    this.drop(ticket); // the router opens a ticket once; another call replaces what it kept
    const chunks = Math.ceil(count / CHUNK);
    if (this.chunksHeld + chunks > this.maxChunks) return;
    const d = this.newRecord();
    const slot = worker.slot;
    this.ticketOf[d] = ticket;
    this.slotOf[d] = slot;
    this.fromOf[d] = 0;
    this.countOf[d] = count;
    let chunk = this.newChunk();
    this.chunkOf[d] = chunk;
    for (let k = 0; k < count; k++) {
      if (k > 0 && (k & CHUNK_MASK) === 0) {
        const next = this.newChunk();
        this.chunkNext[chunk] = next;
        chunk = next;
      }
      const j = chunk * CHUNK + (k & CHUNK_MASK);
      const p = at[k];
      this.hi[j] = hi[p];
      this.lo[j] = lo[p];
      this.at[j] = p;
    }
    this.chunkNext[chunk] = NONE;
    // first in its worker's list
    if (slot >= this.headOf.length) this.growHeads(slot + 1);
    const head = this.headOf[slot];
    this.prevOf[d] = NONE;
    this.nextOf[d] = head;
    if (head !== NONE) this.prevOf[head] = d;
    this.headOf[slot] = d;
    this.insertTicket(ticket, d);
  }

  /**
   * A decision on `worker` predicts the blocks [0, n) of `hi`/`lo` (keys at their positions
   * in the request's sequence): the blocks of pending decisions it shares become its too.
   */
  claim(worker: WorkerState, hi: ArrayLike<number>, lo: ArrayLike<number>, n: number): void {
    const slot = worker.slot;
    let d = slot < this.headOf.length ? this.headOf[slot] : NONE;
    while (d !== NONE) {
      const next = this.nextOf[d];
      let k = this.fromOf[d];
      let chunk = this.chunkOf[d];
      const end = this.countOf[d];
      while (k < end) {
        const j = chunk * CHUNK + (k & CHUNK_MASK);
        const p = this.at[j];
        if (p >= n || hi[p] >>> 0 !== this.hi[j] || lo[p] >>> 0 !== this.lo[j]) break;
        k++;
        // a chunk claimed whole is no longer needed
        if ((k & CHUNK_MASK) === 0 && k < end) {
          const claimed = chunk;
          chunk = this.chunkNext[claimed];
          this.freeChunks(claimed, claimed);
        }
      }
      this.fromOf[d] = k;
      this.chunkOf[d] = chunk;
      if (k === end) this.forget(d); // nothing left of its own
      d = next;
    }
  }

  /** The ticket's blocks still its own, no longer kept (its engine refused it); undefined: none. */
  take(ticket: number): WithdrawnBlocks | undefined {
    const i = this.findTicket(ticket);
    if (i === NONE) return undefined;
    const d = this.tableRecord[i];
    const from = this.fromOf[d];
    const n = this.countOf[d] - from;
    if (this.scratchHi.length < n) {
      const size = Math.max(n, 2 * this.scratchHi.length);
      this.scratchHi = new Uint32Array(size);
      this.scratchLo = new Uint32Array(size);
    }
    let chunk = this.chunkOf[d];
    for (let k = 0; k < n; k++) {
      const b = from + k;
      if (k > 0 && (b & CHUNK_MASK) === 0) chunk = this.chunkNext[chunk];
      const j = chunk * CHUNK + (b & CHUNK_MASK);
      this.scratchHi[k] = this.hi[j];
      this.scratchLo[k] = this.lo[j];
    }
    const slot = this.slotOf[d];
    this.forget(d, i);
    return { slot, hi: this.scratchHi, lo: this.scratchLo, start: 0, end: n };
  }

  /** The ticket is past refusal (its prefill ended, or it was released): its blocks stay. */
  drop(ticket: number): void {
    const i = this.findTicket(ticket);
    if (i !== NONE) this.forget(this.tableRecord[i], i);
  }

  /** The worker left the router: nothing of its decisions is withdrawn. */
  dropWorker(worker: WorkerState): void {
    const slot = worker.slot;
    if (slot >= this.headOf.length) return;
    for (let d = this.headOf[slot]; d !== NONE;) {
      const next = this.nextOf[d];
      this.removeTicket(this.findTicket(this.ticketOf[d]));
      this.release(d);
      d = next;
    }
    this.headOf[slot] = NONE;
  }

  /** Ends the pending decision `d`, whose ticket is at table entry `entry`. */
  private forget(d: number, entry = this.findTicket(this.ticketOf[d])): void {
    const prev = this.prevOf[d];
    const next = this.nextOf[d];
    if (prev === NONE) this.headOf[this.slotOf[d]] = next;
    else this.nextOf[prev] = next;
    if (next !== NONE) this.prevOf[next] = prev;
    this.removeTicket(entry);
    this.release(d);
  }

  /** Returns the record and its chunks to their free lists (it is in no list or table). */
  private release(d: number): void {
    let last = this.chunkOf[d];
    while (this.chunkNext[last] !== NONE) last = this.chunkNext[last];
    this.freeChunks(this.chunkOf[d], last);
    this.nextOf[d] = this.freeRecord;
    this.freeRecord = d;
    this.live--;
  }

  // ------------------------------------------------------------------ chunks and records

  private newChunk(): number {
    this.chunksHeld++;
    const free = this.freeChunk;
    if (free !== NONE) {
      this.freeChunk = this.chunkNext[free];
      return free;
    }
    if (this.chunksMade === this.chunkNext.length) {
      const size = Math.min(2 * this.chunksMade, this.maxChunks);
      this.chunkNext = grown(this.chunkNext, size);
      this.hi = grown(this.hi, size * CHUNK);
      this.lo = grown(this.lo, size * CHUNK);
      this.at = grown(this.at, size * CHUNK);
    }
    return this.chunksMade++;
  }

  /** Frees the chunks `first` … `last` of one list. */
  private freeChunks(first: number, last: number): void {
    for (let c = first; ; c = this.chunkNext[c]) {
      this.chunksHeld--;
      if (c === last) break;
    }
    this.chunkNext[last] = this.freeChunk;
    this.freeChunk = first;
  }

  private newRecord(): number {
    this.live++;
    const free = this.freeRecord;
    if (free !== NONE) {
      this.freeRecord = this.nextOf[free];
      return free;
    }
    if (this.recordsMade === this.ticketOf.length) {
      const size = 2 * this.recordsMade;
      this.ticketOf = grown(this.ticketOf, size);
      this.slotOf = grown(this.slotOf, size);
      this.fromOf = grown(this.fromOf, size);
      this.countOf = grown(this.countOf, size);
      this.chunkOf = grown(this.chunkOf, size);
      this.prevOf = grown(this.prevOf, size);
      this.nextOf = grown(this.nextOf, size);
    }
    return this.recordsMade++;
  }

  private growHeads(slots: number): void {
    const heads = new Int32Array(Math.max(slots, 2 * this.headOf.length)).fill(NONE);
    heads.set(this.headOf);
    this.headOf = heads;
  }

  // ------------------------------------------------------------------ ticket table

  /** The table entry holding the ticket, or NONE. */
  private findTicket(ticket: number): number {
    if (ticket === 0) return NONE;
    const mask = this.tableTicket.length - 1;
    for (let i = (ticket >>> 0) & mask; this.tableTicket[i] !== 0; i = (i + 1) & mask)
      if (this.tableTicket[i] === ticket) return i;
    return NONE;
  }

  /** Adds a ticket not in the table; kept at most half full. */
  private insertTicket(ticket: number, d: number): void {
    if (2 * this.live > this.tableTicket.length) this.rehash(2 * this.tableTicket.length);
    const mask = this.tableTicket.length - 1;
    let i = (ticket >>> 0) & mask;
    while (this.tableTicket[i] !== 0) i = (i + 1) & mask;
    this.tableTicket[i] = ticket;
    this.tableRecord[i] = d;
  }

  /** Empties entry `i`, moving back the entries after it that probing would no longer reach. */
  private removeTicket(i: number): void {
    if (i === NONE) return;
    const mask = this.tableTicket.length - 1;
    for (let j = (i + 1) & mask; this.tableTicket[j] !== 0; j = (j + 1) & mask) {
      const home = (this.tableTicket[j] >>> 0) & mask;
      // entry j stays if its home lies cyclically in (i, j]
      const stays = i < j ? home > i && home <= j : home > i || home <= j;
      if (stays) continue;
      this.tableTicket[i] = this.tableTicket[j];
      this.tableRecord[i] = this.tableRecord[j];
      i = j;
    }
    this.tableTicket[i] = 0;
  }

  private rehash(size: number): void {
    const tickets = this.tableTicket;
    const records = this.tableRecord;
    this.tableTicket = new Float64Array(size);
    this.tableRecord = new Int32Array(size);
    const mask = size - 1;
    for (let k = 0; k < tickets.length; k++) {
      if (tickets[k] === 0) continue;
      let i = (tickets[k] >>> 0) & mask;
      while (this.tableTicket[i] !== 0) i = (i + 1) & mask;
      this.tableTicket[i] = tickets[k];
      this.tableRecord[i] = records[k];
    }
  }
}

/** A copy of `a` in an array of `size` elements (zeros past `a`). */
function grown<T extends Uint32Array | Int32Array | Float64Array>(a: T, size: number): T {
  const b = new (a.constructor as new (n: number) => T)(size);
  b.set(a);
  return b;
}
