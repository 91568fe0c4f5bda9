import type { Candidate, RequestBlocks } from './types.js';

/** Slots of the block table (a power of two; a colliding block overwrites the older entry). */
const BLOCK_SLOTS = 1 << 16;
/** Slots of the live-ticket ring (a power of two; a colliding ticket makes the older one look finished). */
const TICKET_SLOTS = 1 << 14;
/** Blocks recorded per request at most: a longer prompt records every k-th block, and its last. */
export const MAX_RECORDED_BLOCKS = 256;

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
 * position i on a worker stands for the request's whole prefix up to i; a long prompt records
 * every k-th block, which understates a follow-up's prefix by at most k − 1 blocks.
 */
export class PendingPrefixes {
  private readonly blockHi = new Int32Array(BLOCK_SLOTS);
  private readonly blockLo = new Int32Array(BLOCK_SLOTS);
  /** Worker slot + 1 (0: empty) and the ticket of the request that recorded the block. */
  private readonly blockWorker = new Int32Array(BLOCK_SLOTS);
  private readonly blockTicket = new Float64Array(BLOCK_SLOTS);
  /** A ticket is live while its ring slot holds it. */
  private readonly live = new Float64Array(TICKET_SLOTS);
  /** Per worker slot: the request's leading blocks pending there, from the last lookup(). */
  private depth: Float64Array<ArrayBuffer> = new Float64Array(64);
  /** The most leading blocks of the last looked-up request pending on any one candidate. */
  deepest = 0;

  /** Records a routed request's blocks on worker `slot` until release(ticket); untracked (0) tickets record nothing. */
  record(slot: number, ticket: number, blocks: RequestBlocks | undefined): void {
    const n = blocks ? blocks.length : 0;
    if (ticket <= 0 || n === 0) return;
    this.live[ticket & (TICKET_SLOTS - 1)] = ticket;
    const stride = Math.ceil(n / MAX_RECORDED_BLOCKS);
    // read once: the router may compute the keys behind these on first read
    const his = blocks!.hi;
    const los = blocks!.lo;
    for (let i = n - 1; i >= 0; i -= stride) {
      const at = tableSlot(his[i], los[i]);
      this.blockHi[at] = his[i];
      this.blockLo[at] = los[i];
      this.blockWorker[at] = slot + 1;
      this.blockTicket[at] = ticket;
    }
  }

  /** The request finished, failed or was abandoned: its blocks are no longer pending. */
  release(ticket: number): void {
    const at = ticket & (TICKET_SLOTS - 1);
    if (this.live[at] === ticket) this.live[at] = 0;
  }

  /** Forgets every block pending on a removed worker (its slot may be reused). */
  removeWorker(slot: number): void {
    for (let i = 0; i < BLOCK_SLOTS; i++) if (this.blockWorker[i] === slot + 1) this.blockWorker[i] = 0;
  }

  /** Finds, for every candidate, how many of the request's leading blocks are pending on it. */
  lookup(candidates: readonly Candidate[], blocks: RequestBlocks | undefined): void {
    for (const c of candidates) {
      if (c.worker.slot >= this.depth.length) this.depth = grow(this.depth, c.worker.slot + 1);
      this.depth[c.worker.slot] = 0;
    }
    this.deepest = 0;
    const n = blocks ? blocks.length : 0;
    // read once: the router may compute the keys behind these on first read
    const his = n > 0 ? blocks!.hi : undefined;
    const los = n > 0 ? blocks!.lo : undefined;
    for (let i = 0; i < n; i++) {
      const hi = his![i];
      const lo = los![i];
      const at = tableSlot(hi, lo);
      const worker = this.blockWorker[at] - 1;
      if (worker < 0 || this.blockHi[at] !== (hi | 0) || this.blockLo[at] !== (lo | 0)) continue;
      const ticket = this.blockTicket[at];
      if (this.live[ticket & (TICKET_SLOTS - 1)] !== ticket) continue;
      if (worker < this.depth.length && i + 1 > this.depth[worker]) {
        this.depth[worker] = i + 1;
        this.deepest = i + 1;
      }
    }
  }

  /** Leading blocks of the last looked-up request pending on the candidate's worker. */
  blocksOn(c: Candidate): number {
    return c.worker.slot < this.depth.length ? this.depth[c.worker.slot] : 0;
  }
}

function tableSlot(hi: number, lo: number): number {
  return (lo ^ Math.imul(hi, 0x9e3779b1)) & (BLOCK_SLOTS - 1);
}

function grow(a: Float64Array, n: number): Float64Array<ArrayBuffer> {
  const b = new Float64Array(Math.max(n, a.length * 2));
  b.set(a);
  return b;
}
