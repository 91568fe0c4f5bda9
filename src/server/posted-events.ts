/**
 * KV events posted as JSON (/admin/events, and the same lists relayed by the other replicas or
 * processes), applied in slices: a list may hold 100,000 events, which decoded and applied at
 * once would hold the event loop for a second or more. Between slices the loop turns, so that
 * requests are routed meanwhile, as for a large ZeroMQ batch (subscriber.ts).
 */
import { setImmediate as nextTurn } from 'node:timers/promises';
import { emptyCounts, type ApplyCounts, type KvEventApplier } from '../engines/kv-events/applier.js';
import type { JsonEventsReader, SkippedEvent } from '../engines/kv-events/decode.js';
import { APPLY_SLICE_EVENTS } from '../engines/kv-events/subscriber.js';

/**
 * Token ids and block hashes of posted events decoded and applied at once (with at most
 * APPLY_SLICE_EVENTS events): tens of milliseconds, as a slice of a ZeroMQ batch takes.
 */
export const POSTED_SLICE_ITEMS = 65_536;

/**
 * Lists of one worker that may wait to be applied (the one applying included). A list holds
 * its parsed events (up to the body limit) while it waits, so without a bound a client posting
 * for one worker faster than its lists apply would grow the gateway's memory without end.
 */
export const MAX_WAITING_LISTS = 16;

/**
 * What a posted list did: its counts and skipped events, how many of its events applied before
 * its worker went, or nothing, refused because MAX_WAITING_LISTS of the worker's lists were waiting.
 */
export type PostedOutcome =
  { applied: ApplyCounts; skipped: SkippedEvent[] } | { removedAfter: number } | { refusedWaiting: number };

export class PostedEvents {
  /** Per worker, the last list being applied: each waits for the one before. */
  private readonly posting = new Map<string, Promise<unknown>>();
  /** Per worker, its lists waiting or applying. */
  private readonly waiting = new Map<string, number>();

  constructor(private readonly applier: KvEventApplier) {}

  /**
   * Applies a worker's checked list, after the lists posted for it before (in the order they
   * came, never interleaved). `current` says whether the worker is still the one the list was
   * posted for: once it is not (removed, perhaps added again under its id), nothing more of the
   * list applies. With MAX_WAITING_LISTS of the worker's lists waiting already, the list is
   * refused at once (`refusedWaiting`) and nothing of it applies.
   */
  apply(worker: string, reader: JsonEventsReader, current: () => boolean): Promise<PostedOutcome> {
    const waiting = this.waiting.get(worker) ?? 0;
    if (waiting >= MAX_WAITING_LISTS) return Promise.resolve({ refusedWaiting: waiting });
    this.waiting.set(worker, waiting + 1);
    const run = (this.posting.get(worker) ?? Promise.resolve()).then(() => this.slices(worker, reader, current));
    const last = run.catch(() => {});
    this.posting.set(worker, last);
    void last.then(() => {
      const left = (this.waiting.get(worker) ?? 1) - 1;
      if (left > 0) this.waiting.set(worker, left);
      else this.waiting.delete(worker);
      if (this.posting.get(worker) === last) this.posting.delete(worker);
    });
    return run;
  }

  private async slices(worker: string, reader: JsonEventsReader, current: () => boolean): Promise<PostedOutcome> {
    const applied = emptyCounts();
    const skipped: SkippedEvent[] = [];
    for (let from = 0; ;) {
      if (!current()) return { removedAfter: from };
      let to = Math.min(reader.count, from + 1);
      let items = to > from ? reader.size(from) : 0;
      while (to < reader.count && to - from < APPLY_SLICE_EVENTS && items + reader.size(to) <= POSTED_SLICE_ITEMS)
        items += reader.size(to++);
      const batch = reader.read(from, to);
      if (batch.skipped) skipped.push(...batch.skipped);
      this.applier.apply(worker, batch, applied);
      if (to >= reader.count) return { applied, skipped };
      from = to;
      await nextTurn();
    }
  }
}
