/** Slots of the count table (a power of two; colliding (prefix, worker) pairs share a count). */
const COUNT_SLOTS = 1 << 14;
/** Slots of the ticket table (a power of two; a ticket 16,384 newer takes the older one's place). */
const TICKET_SLOTS = 1 << 14;

/** The count slot of a prefix on a worker slot. */
function countSlot(prefixKey: number, slot: number): number {
  return (Math.imul(prefixKey ^ Math.imul(slot + 1, 0x9e3779b1), 0x85ebca6b) >>> 0) & (COUNT_SLOTS - 1);
}

/**
 * How many of the requests this router sent each worker, and that have not finished, share a
 * prefix: the sharers that keep the worker's copy of it. An engine does not evict a block a
 * running request holds, so a prefix in-flight requests reuse on a worker stays there while
 * they run; a copy of the same prefix on a worker where none of them runs sits among the free
 * blocks, and a request waiting there for KV may lose it to the requests admitted before it.
 *
 * Fixed-size typed arrays, nothing allocated per request: a direct-mapped table of counts keyed
 * by (prefix, worker), where two pairs that collide add up (which overstates the sharers, as if
 * the prefix were held), and a ring of tickets, each with the count it added to.
 */
export class PrefixSharers {
  private readonly counts = new Int32Array(COUNT_SLOTS);
  /** Per ticket slot: the ticket (low 32 bits), its count slot + 1 (0: none) and its worker slot. */
  private readonly tickets = new Int32Array(TICKET_SLOTS);
  private readonly countOf = new Int32Array(TICKET_SLOTS);
  private readonly workerOf = new Int32Array(TICKET_SLOTS);

  /** In-flight requests this router sent worker `slot` that share the prefix `prefixKey` (0: none). */
  on(prefixKey: number, slot: number): number {
    return prefixKey === 0 ? 0 : this.counts[countSlot(prefixKey, slot)];
  }

  /** A request sharing `prefixKey` was sent to worker `slot` under `ticket` (untracked, 0: not counted). */
  record(prefixKey: number, slot: number, ticket: number): void {
    if (ticket <= 0 || prefixKey === 0) return;
    const t = ticket | 0;
    const i = t & (TICKET_SLOTS - 1);
    // the older ticket in this slot stops counting early: an understatement, never a leak
    this.release(this.tickets[i]);
    const at = countSlot(prefixKey, slot);
    this.counts[at]++;
    this.tickets[i] = t;
    this.countOf[i] = at + 1;
    this.workerOf[i] = slot;
  }

  /** The request finished, failed or was abandoned: it no longer holds the prefix there. */
  release(ticket: number): void {
    const t = ticket | 0;
    const i = t & (TICKET_SLOTS - 1);
    if (t === 0 || this.tickets[i] !== t || this.countOf[i] === 0) return;
    const at = this.countOf[i] - 1;
    this.counts[at] = Math.max(0, this.counts[at] - 1);
    this.countOf[i] = 0;
  }

  /** Forgets the requests on a removed worker (its slot may be reused). */
  removeWorker(slot: number): void {
    for (let i = 0; i < TICKET_SLOTS; i++)
      if (this.countOf[i] !== 0 && this.workerOf[i] === slot) this.release(this.tickets[i]);
  }
}
