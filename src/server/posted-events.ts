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

/** What a posted list did: its counts and skipped events, or how many of its events applied before its worker went. */
export type PostedOutcome = { applied: ApplyCounts; skipped: SkippedEvent[] } | { removedAfter: number };

export class PostedEvents {
  /** Per worker, the last list being applied: each waits for the one before. */
  private readonly posting = new Map<string, Promise<unknown>>();

  constructor(private readonly applier: KvEventApplier) {}

  /**
   * Applies a worker's checked list, after the lists posted for it before (in the order they
   * came, never interleaved). `current` says whether the worker is still the one the list was
   * posted for: once it is not (removed, perhaps added again under its id), nothing more of the
   * list applies.
   */
  apply(worker: string, reader: JsonEventsReader, current: () => boolean): Promise<PostedOutcome> {
    const run = (this.posting.get(worker) ?? Promise.resolve()).then(() => this.slices(worker, reader, current));
    const last = run.catch(() => {});
    this.posting.set(worker, last);
    void last.then(() => {
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
