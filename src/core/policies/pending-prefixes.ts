import { resized } from '../typed-arrays.js';
import type { Candidate, RequestBlocks } from './types.js';

/** Slots of the block table (a power of two; a colliding block overwrites the older entry). */
const BLOCK_SLOTS = 1 << 16;
/** Slots of the live-ticket ring (a power of two; a colliding ticket makes the older one look finished). */
const TICKET_SLOTS = 1 << 14;
/**
 * Kept positions per doubling of the prefix (log2): every position of the first 64 blocks,
 * then 32 per octave (every 2nd block of the next 64, every 4th of the next 128, …), so a
 * prefix found at a kept position is understated by less than 1/32 of its length.
 */
const LOG_KEPT_PER_OCTAVE = 5;
/** Consecutive kept positions past the index's deepest match, pending nowhere, that end a lookup. */
const MISSES_BEFORE_STOP = 4;

/**
 * Whether block position i (0-based) is one the table keeps: the same positions for every
 * request, so a follow-up's block at a kept position is the block a pending request sharing
 * that prefix recorded there (blocks are prefix-chained).
 */
export function keptPosition(i: number): boolean {
  const p = i + 1;
  const log = 31 - Math.clz32(p) - LOG_KEPT_PER_OCTAVE;
  return log <= 0 || (p & ((1 << log) - 1)) === 0;
}

/** The kept position after i. */
export function nextKept(i: number): number {
  const p = i + 2; // 1-based count of the next position
  const log = 31 - Math.clz32(p) - LOG_KEPT_PER_OCTAVE;
  if (log <= 0) return i + 1;
  const step = 1 << log;
  // round up to the step of p's octave (octaves start at powers of two, multiples of any smaller step)
  return ((p + step - 1) & ~(step - 1)) - 1;
}

/**
 * Prefixes the workers are about to hold: the blocks of the requests this router sent to each
 * worker that have not finished yet. A worker reports a block only once it has computed it,
 * which under load is long after the request was routed there (a queue of tens of seconds);
 * until then the index does not know that a follow-up request (the next turn of a
 * conversation, a sibling sharing a prompt) will find its prefix on that worker. The engine
 * keeps a running request's blocks until it finishes, so the prefix is there, or about to be,
 * for as long as the request is in flight; after that the index's own records take over.
 *
 * Fixed-size typed arrays, nothing allocated per request: a direct-mapped block table (a
 * newer block overwrites an older one in its slot, which can only understate what a worker
 * will hold) and a ring of live tickets. Blocks are prefix-chained, so a block found at
 * position i on a worker stands for the request's whole prefix up to i. Only the positions
 * keptPosition() names are recorded and looked up (the first 64, then 32 per doubling of the
 * prefix): a follow-up's prefix is understated by under 1/32 of its length, and a request
 * records about 32 · log2 of its blocks. A lookup reads every kept position within the
 * deepest prefix the index holds (a worker may have the rest of it pending), then stops after
 * MISSES_BEFORE_STOP kept positions in a row pending nowhere: a prefix pending deeper would
 * have been recorded at those positions too (unless overwritten since), so a lookup costs
 * what matches, not the prompt's length.
 */
export class PendingPrefixes {
  /**
   * Per slot four int32s, read together (one cache line): the block's key (high, low), the
   * worker slot + 1 (0: empty) and the low 32 bits of the recording request's ticket.
   */
  private readonly table = new Int32Array(BLOCK_SLOTS * 4);
  /** A ticket is live while its ring slot holds its low 32 bits (tickets count up from 1). */
  private readonly live = new Int32Array(TICKET_SLOTS);
  /** Per worker slot: the request's leading blocks pending there, from the last lookup(). */
  private depth: Float64Array<ArrayBuffer> = new Float64Array(64);
  /** Per worker slot: the low 32 bits of the ticket of the request that recorded the deepest of those blocks. */
  private holder: Int32Array<ArrayBuffer> = new Int32Array(64);
  /** The most leading blocks of the last looked-up request pending on any one candidate. */
  deepest = 0;

  /** Records a routed request's blocks on worker `slot` until release(ticket); untracked (0) tickets record nothing. */
  record(slot: number, ticket: number, blocks: RequestBlocks | undefined): void {
    const n = blocks ? blocks.length : 0;
    if (ticket <= 0 || n === 0) return;
    const t = ticket | 0;
    this.live[t & (TICKET_SLOTS - 1)] = t;
    // read once: the router may compute the keys behind these on first read
    const his = blocks!.hi;
    const los = blocks!.lo;
    const table = this.table;
    for (let i = 0; i < n; i = nextKept(i)) {
      const at = tableSlot(his[i], los[i]) << 2;
      table[at] = his[i];
      table[at + 1] = los[i];
      table[at + 2] = slot + 1;
      table[at + 3] = t;
    }
  }

  /** The request finished, failed or was abandoned: its blocks are no longer pending. */
  release(ticket: number): void {
    const t = ticket | 0;
    const at = t & (TICKET_SLOTS - 1);
    if (this.live[at] === t) this.live[at] = 0;
  }

  /** Forgets every block pending on a removed worker (its slot may be reused). */
  removeWorker(slot: number): void {
    const table = this.table;
    for (let at = 2; at < table.length; at += 4) if (table[at] === slot + 1) table[at] = 0;
  }

  /**
   * Finds, for every candidate, how many of the request's leading blocks are pending on it (at
   * kept positions). `indexed`: the deepest prefix of the request any worker holds in the
   * index, read whole; past it the lookup stops at the first run of misses.
   */
  lookup(candidates: readonly Candidate[], blocks: RequestBlocks | undefined, indexed: number): void {
    for (const c of candidates) {
      if (c.worker.slot >= this.depth.length) {
        this.depth = grow(this.depth, c.worker.slot + 1);
        this.holder = resized(this.holder, this.depth.length);
      }
      this.depth[c.worker.slot] = 0;
      this.holder[c.worker.slot] = 0;
    }
    this.deepest = 0;
    const n = blocks ? blocks.length : 0;
    if (n === 0) return;
    // read once: the router may compute the keys behind these on first read
    const his = blocks!.hi;
    const los = blocks!.lo;
    const table = this.table;
    const live = this.live;
    let misses = 0;
    for (let i = 0; i < n; i = nextKept(i)) {
      const hi = his[i] | 0;
      const lo = los[i] | 0;
      const at = tableSlot(hi, lo) << 2;
      const worker = table[at + 2] - 1;
      const t = table[at + 3];
      if (worker < 0 || table[at] !== hi || table[at + 1] !== lo || t === 0 || live[t & (TICKET_SLOTS - 1)] !== t) {
        if (i >= indexed && ++misses >= MISSES_BEFORE_STOP) break;
        continue;
      }
      misses = 0;
      if (worker < this.depth.length && i + 1 > this.depth[worker]) {
        this.depth[worker] = i + 1;
        this.holder[worker] = t;
        this.deepest = i + 1;
      }
    }
  }

  /** Leading blocks of the last looked-up request pending on the candidate's worker. */
  blocksOn(c: Candidate): number {
    return c.worker.slot < this.depth.length ? this.depth[c.worker.slot] : 0;
  }

  /** The ticket (low 32 bits; 0: none) of the request holding the deepest of those blocks on the candidate's worker. */
  holderOn(c: Candidate): number {
    return c.worker.slot < this.holder.length ? this.holder[c.worker.slot] : 0;
  }
}

function tableSlot(hi: number, lo: number): number {
  return (lo ^ Math.imul(hi, 0x9e3779b1)) & (BLOCK_SLOTS - 1);
}

function grow(a: Float64Array, n: number): Float64Array<ArrayBuffer> {
  return resized(a, Math.max(n, a.length * 2));
}
