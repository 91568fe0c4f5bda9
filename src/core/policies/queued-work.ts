import type { WorkerState } from '../worker-registry.js';
import { withSlot } from './slot-array.js';

/** Slots of the ticket ring (a power of two; a colliding ticket drops the older one's record). */
const TICKET_SLOTS = 1 << 14;

/**
 * The prefill work queued on each worker, in prefill-token equivalents. The router counts a
 * worker's queue in tokens (`queuedPrefillTokens`), but a token's prefill costs more the longer
 * the context it attends to: the 112,000 tokens of an agent context recomputed from scratch
 * take 4.7 times as long as 112,000 tokens of short prompts. For the requests this policy
 * routed, it knows each one's work (W(u) as it chose); it replaces their tokens in the
 * router's count by that work, from routing until the prefill is done or the request ends.
 * What it did not route (other replicas' share, a count set by hand) stays in tokens.
 *
 * Fixed-size typed arrays, nothing allocated per request: a ring of tickets and per-worker sums.
 */
export class QueuedWork {
  private readonly ticketOf = new Float64Array(TICKET_SLOTS);
  private readonly slotOf = new Int32Array(TICKET_SLOTS);
  private readonly tokensOf = new Float64Array(TICKET_SLOTS);
  private readonly workOf = new Float64Array(TICKET_SLOTS);
  /** Per worker slot: the open tickets, the tokens the router counts for them, and their work. */
  private count: Float64Array<ArrayBuffer> = new Float64Array(64);
  private tokens: Float64Array<ArrayBuffer> = new Float64Array(64);
  private work: Float64Array<ArrayBuffer> = new Float64Array(64);

  /** A routed request: `tokens` as the router counts them in the worker's queue, `work` their prefill work. */
  open(slot: number, ticket: number, tokens: number, work: number): void {
    if (ticket <= 0) return;
    const at = ticket & (TICKET_SLOTS - 1);
    if (this.ticketOf[at] > 0) this.close(at);
    this.count = withSlot(this.count, slot);
    this.tokens = withSlot(this.tokens, slot);
    this.work = withSlot(this.work, slot);
    this.ticketOf[at] = ticket;
    this.slotOf[at] = slot;
    this.tokensOf[at] = tokens;
    this.workOf[at] = work;
    this.count[slot]++;
    this.tokens[slot] += tokens;
    this.work[slot] += work;
  }

  /** The request's prefill is done, or it ended before: its work leaves the queue. Idempotent. */
  done(ticket: number): void {
    const at = ticket & (TICKET_SLOTS - 1);
    if (this.ticketOf[at] === ticket) this.close(at);
  }

  /** Forgets a removed worker's tickets (its slot may be reused). */
  removeWorker(slot: number): void {
    for (let i = 0; i < TICKET_SLOTS; i++) if (this.ticketOf[i] > 0 && this.slotOf[i] === slot) this.ticketOf[i] = 0;
    if (slot < this.count.length) this.count[slot] = this.tokens[slot] = this.work[slot] = 0;
  }

  /** Prefill work queued on the worker: the router's token count with this policy's requests counted by their work. */
  on(worker: WorkerState): number {
    const s = worker.slot;
    if (s >= this.count.length || this.count[s] === 0) return worker.queuedPrefillTokens;
    return Math.max(0, worker.queuedPrefillTokens - this.tokens[s]) + this.work[s];
  }

  private close(at: number): void {
    const s = this.slotOf[at];
    this.ticketOf[at] = 0;
    if (--this.count[s] <= 0) {
      // sums of floats drift: an empty queue is exactly empty
      this.count[s] = this.tokens[s] = this.work[s] = 0;
    } else {
      this.tokens[s] -= this.tokensOf[at];
      this.work[s] -= this.workOf[at];
    }
  }
}
