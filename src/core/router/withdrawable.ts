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

/** One pending decision's added blocks, those from `from` on still its own. */
interface Added {
  readonly ticket: number;
  readonly worker: WorkerState;
  readonly hi: Uint32Array;
  readonly lo: Uint32Array;
  /** Each block's position in the decision's keys, ascending. */
  readonly at: Int32Array;
  /** Blocks before this one were claimed by later decisions on the worker. */
  from: number;
}

/** The keys of a decision's blocks a refusal withdraws: [start, end) of `hi`/`lo`. */
export interface WithdrawnBlocks {
  readonly worker: WorkerState;
  readonly hi: Uint32Array;
  readonly lo: Uint32Array;
  readonly start: number;
  readonly end: number;
}

export class WithdrawablePredictions {
  private readonly byTicket = new Map<number, Added>();
  private readonly byWorker = new Map<WorkerState, Set<Added>>();

  /** Decisions pending with blocks of their own (tests and stats). */
  get size(): number {
    return this.byTicket.size;
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
    const added: Added = {
      ticket,
      worker,
      hi: new Uint32Array(count),
      lo: new Uint32Array(count),
      at: at.slice(0, count),
      from: 0,
    };
    for (let k = 0; k < count; k++) {
      added.hi[k] = hi[at[k]];
      added.lo[k] = lo[at[k]];
    }
    this.byTicket.set(ticket, added);
    let set = this.byWorker.get(worker);
    if (!set) this.byWorker.set(worker, (set = new Set()));
    set.add(added);
  }

  /**
   * A decision on `worker` predicts the blocks [0, n) of `hi`/`lo` (keys at their positions
   * in the request's sequence): the blocks of pending decisions it shares become its too.
   */
  claim(worker: WorkerState, hi: ArrayLike<number>, lo: ArrayLike<number>, n: number): void {
    const pending = this.byWorker.get(worker);
    if (!pending) return;
    for (const a of pending) {
      let k = a.from;
      const end = a.at.length;
      while (k < end) {
        const p = a.at[k];
        if (p >= n || hi[p] >>> 0 !== a.hi[k] || lo[p] >>> 0 !== a.lo[k]) break;
        k++;
      }
      a.from = k;
      if (k === end) this.forget(a); // nothing left of its own
    }
  }

  /** The ticket's blocks still its own, no longer kept (its engine refused it); undefined: none. */
  take(ticket: number): WithdrawnBlocks | undefined {
    const a = this.byTicket.get(ticket);
    if (!a) return undefined;
    this.forget(a);
    return { worker: a.worker, hi: a.hi, lo: a.lo, start: a.from, end: a.at.length };
  }

  /** The ticket is past refusal (its prefill ended, or it was released): its blocks stay. */
  drop(ticket: number): void {
    const a = this.byTicket.get(ticket);
    if (a) this.forget(a);
  }

  /** The worker left the router: nothing of its decisions is withdrawn. */
  dropWorker(worker: WorkerState): void {
    const pending = this.byWorker.get(worker);
    if (!pending) return;
    for (const a of pending) this.byTicket.delete(a.ticket);
    this.byWorker.delete(worker);
  }

  private forget(a: Added): void {
    this.byTicket.delete(a.ticket);
    const pending = this.byWorker.get(a.worker);
    if (!pending) return;
    pending.delete(a);
    if (pending.size === 0) this.byWorker.delete(a.worker);
  }
}
