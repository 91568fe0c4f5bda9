/**
 * In-flight work on workers: the tickets the router hands out for tracked requests, and the
 * split of each worker's counts into this replica's own part and what other replicas report.
 * Policies read the totals on WorkerState; these helpers keep them consistent as requests
 * move from queued prefill to decode to done, and as remote tallies change.
 */
import * as check from '../validate.js';
import type { WorkerState } from '../worker-registry.js';
import type { InFlightLoad, SharedDecision } from './types.js';

/** One tracked request. Released records are kept for the next ones (see TicketTable). */
class Ticket {
  /** Uncached prompt tokens still counted as queued prefill. */
  prefill = 0;
  /** KV tokens counted as decoding once prefill is done. */
  kvTokens = 0;
  prefilled = false;
  /** When it was opened (router clock, ms). */
  openedAt = 0;
  /** How the router learns its prefill ended (see PrefillEnd). */
  prefillEnd: PrefillEnd = 'reported';
  /** What the decision shared with other replicas, for an unreported ticket (told when its prefill is read). */
  shared: SharedDecision | undefined = undefined;
  /** The key halves of the block whose KV event ends the prefill ('block'). */
  awaitHi = 0;
  awaitLo = 0;
  /** The next free record, while this one is free. */
  nextFree: Ticket | undefined = undefined;

  constructor(public worker: WorkerState) {}
}

/**
 * The entry a ticket number probes first: its bits mixed (murmur3's finaliser over the low word
 * and the high word), so the sequential numbers the router hands out scatter over the table. On
 * the numbers themselves the open tickets would fill one run of adjacent entries, and removing
 * one scans to the end of that run to close the gap: releasing N open tickets would take N²/2
 * steps (20,000 open at once: about a second).
 */
function homeOf(ticket: number, mask: number): number {
  let h = (ticket >>> 0) ^ Math.imul((ticket / 4294967296) >>> 0, 0x9e3779b1);
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h & mask;
}

/**
 * The open tickets by number: open addressing with linear probing from homeOf(), and released
 * records kept on a free list for the next ones. Opening and releasing a ticket allocate nothing
 * once the table has grown to the most tickets open at once (it doubles and never shrinks, kept
 * at most half full); a Map would reallocate its table as entries come and go.
 */
export class TicketTable {
  /** Ticket numbers by entry (0: empty; tickets count up from 1). */
  private keys = new Float64Array(64);
  private records: Array<Ticket | undefined> = new Array<Ticket | undefined>(64).fill(undefined);
  private free: Ticket | undefined = undefined;
  size = 0;

  get(ticket: number): Ticket | undefined {
    const i = this.find(ticket);
    return i < 0 ? undefined : this.records[i];
  }

  /** A record for a new ticket (not in the table), its fields at their defaults but `worker`. */
  open(ticket: number, worker: WorkerState): Ticket {
    let t = this.free;
    if (t) {
      this.free = t.nextFree;
      t.nextFree = undefined;
      t.worker = worker;
      t.prefill = 0;
      t.kvTokens = 0;
      t.prefilled = false;
      t.openedAt = 0;
      t.prefillEnd = 'reported';
      t.shared = undefined;
      t.awaitHi = 0;
      t.awaitLo = 0;
    } else t = new Ticket(worker);
    if (2 * (this.size + 1) > this.keys.length) this.rehash(2 * this.keys.length);
    const mask = this.keys.length - 1;
    let i = homeOf(ticket, mask);
    while (this.keys[i] !== 0) i = (i + 1) & mask;
    this.keys[i] = ticket;
    this.records[i] = t;
    this.size++;
    return t;
  }

  /**
   * Removes the ticket. Its record is kept for a later ticket: its fields stay readable until
   * the next open() (release() reads them after the ticket has left the table).
   */
  delete(ticket: number): void {
    let i = this.find(ticket);
    if (i < 0) return;
    const t = this.records[i]!;
    t.shared = undefined; // not kept alive by a free record
    t.nextFree = this.free;
    this.free = t;
    this.size--;
    // empty entry i, moving back the entries after it that probing would no longer reach
    const mask = this.keys.length - 1;
    for (let j = (i + 1) & mask; this.keys[j] !== 0; j = (j + 1) & mask) {
      const home = homeOf(this.keys[j], mask);
      // entry j stays if its home lies cyclically in (i, j]
      const stays = i < j ? home > i && home <= j : home > i || home <= j;
      if (stays) continue;
      this.keys[i] = this.keys[j];
      this.records[i] = this.records[j];
      i = j;
    }
    this.keys[i] = 0;
    this.records[i] = undefined;
  }

  private find(ticket: number): number {
    if (!(ticket > 0)) return -1;
    const mask = this.keys.length - 1;
    for (let i = homeOf(ticket, mask); this.keys[i] !== 0; i = (i + 1) & mask) if (this.keys[i] === ticket) return i;
    return -1;
  }

  private rehash(size: number): void {
    const keys = this.keys;
    const records = this.records;
    this.keys = new Float64Array(size);
    this.records = new Array<Ticket | undefined>(size).fill(undefined);
    const mask = size - 1;
    for (let k = 0; k < keys.length; k++) {
      if (keys[k] === 0) continue;
      let i = homeOf(keys[k], mask);
      while (this.keys[i] !== 0) i = (i + 1) & mask;
      this.keys[i] = keys[k];
      this.records[i] = records[k];
    }
  }
}

/**
 * How the end of a ticket's prefill becomes known: 'reported', the caller reports the first
 * token; the others are requests whose first token nobody reports (an answer that is not
 * streamed arrives whole): 'block', the KV event storing the prompt's last full block;
 * 'admission', the engine's waiting queue no longer holding it (less than a block left);
 * 'answer', nothing to read it from, so the whole answer (the caller's markPrefillDone).
 */
type PrefillEnd = 'reported' | 'block' | 'admission' | 'answer';

/**
 * A worker's tickets whose first token nobody reports, in the order they were opened (the
 * order their requests reached the engine's FIFO waiting queue). Released and prefilled
 * tickets are dropped from the front as it is read, and the rest compacted when they
 * outnumber the live ones, so a worker that is never scraped holds no more than about twice
 * its unreported requests in flight.
 */
class UnreportedQueue {
  tickets: number[] = [];
  head = 0;
  live = 0;
}

/** The tracked requests of one router, by ticket number (0 is never a ticket). */
export class InFlightTickets {
  private readonly tickets = new TicketTable();
  private readonly unreported = new Map<WorkerState, UnreportedQueue>();
  /** Per worker, the tickets awaiting a block, by the low half of its key. */
  private readonly awaited = new Map<WorkerState, Map<number, number[]>>();
  private nextTicket = 1;

  /** Tracked requests not yet released. */
  get size(): number {
    return this.tickets.size;
  }

  /**
   * Counts a new request on the worker: its uncached tokens as queued prefill. Returns its
   * ticket. `reported` false: nobody will report its first token (see admitUnreported()), and
   * `shared` is the decision as other replicas know it, to tell them when its prefill is read.
   */
  open(
    worker: WorkerState,
    uncachedTokens: number,
    promptTokens: number,
    now = 0,
    reported = true,
    shared?: SharedDecision,
  ): number {
    const ticket = this.nextTicket++;
    const t = this.tickets.open(ticket, worker);
    t.prefill = uncachedTokens;
    t.kvTokens = promptTokens;
    t.openedAt = now;
    t.prefillEnd = reported ? 'reported' : 'answer';
    t.shared = reported ? undefined : shared;
    worker.queuedPrefillTokens += uncachedTokens;
    worker.inFlightRequests++;
    if (!reported) {
      let q = this.unreported.get(worker);
      if (!q) this.unreported.set(worker, (q = new UnreportedQueue()));
      q.tickets.push(ticket);
      q.live++;
    }
    return ticket;
  }

  /** The request's prefill finished (first token seen): its work moves from prefill to decode. */
  markPrefillDone(ticket: number): void {
    const t = this.tickets.get(ticket);
    if (!t || t.prefilled) return;
    t.worker.queuedPrefillTokens = Math.max(0, t.worker.queuedPrefillTokens - t.prefill);
    t.worker.activeDecodeTokens += t.kvTokens;
    t.prefilled = true;
    t.prefill = 0;
    if (t.prefillEnd === 'block') this.stopAwaiting(ticket, t);
    if (t.prefillEnd !== 'reported') this.leaveQueue(t.worker);
  }

  /** The decision an unreported ticket shared with other replicas, if any. */
  sharedOf(ticket: number): SharedDecision | undefined {
    return this.tickets.get(ticket)?.shared;
  }

  /** The unreported request's prefill ends when its engine admits it (see admitUnreported()). */
  awaitAdmission(ticket: number): void {
    const t = this.tickets.get(ticket);
    if (t && t.prefillEnd === 'answer') t.prefillEnd = 'admission';
  }

  /**
   * The unreported request's prefill ends when its engine stores the prompt's last full block
   * (key `hi`, `lo`), which it computes in the prefill's last chunk: the engine's KV event says
   * so (storedBlocks()), and the waiting queue's count no longer decides for it.
   */
  awaitBlock(ticket: number, hi: number, lo: number): void {
    const t = this.tickets.get(ticket);
    if (!t || t.prefilled || t.prefillEnd !== 'answer') return;
    t.prefillEnd = 'block';
    t.awaitHi = hi;
    t.awaitLo = lo;
    let byKey = this.awaited.get(t.worker);
    if (!byKey) this.awaited.set(t.worker, (byKey = new Map()));
    const list = byKey.get(lo);
    if (list) list.push(ticket);
    else byKey.set(lo, [ticket]);
  }

  /** Whether any request on the worker awaits a block (a cheap test before storedBlocks()). */
  awaitsBlocks(worker: WorkerState): boolean {
    return this.awaited.has(worker);
  }

  /** The worker stored these blocks: calls `done` with each ticket whose awaited block is among them. */
  storedBlocks(
    worker: WorkerState,
    hi: ArrayLike<number>,
    lo: ArrayLike<number>,
    n: number,
    done: (ticket: number) => void,
  ): void {
    const byKey = this.awaited.get(worker);
    if (!byKey) return;
    let found: number[] | undefined;
    for (let i = 0; i < n; i++) {
      const list = byKey.get(lo[i]);
      if (!list) continue;
      for (const ticket of list) {
        const t = this.tickets.get(ticket);
        if (t && t.awaitHi === hi[i]) (found ??= []).push(ticket);
      }
    }
    if (found) for (const ticket of found) done(ticket);
  }

  /** The ticket no longer awaits its block (its prefill ended, or it was released). */
  private stopAwaiting(ticket: number, t: Ticket): void {
    const byKey = this.awaited.get(t.worker);
    const list = byKey?.get(t.awaitLo);
    if (!byKey || !list) return;
    const i = list.indexOf(ticket);
    if (i >= 0) list.splice(i, 1);
    if (list.length === 0) byKey.delete(t.awaitLo);
    if (byKey.size === 0) this.awaited.delete(t.worker);
  }

  /**
   * The worker's engine reported `waiting` requests in its waiting queue, as read at
   * `sampledAt` (router clock; requests opened after it, or less than ENGINE_ARRIVAL_MS before,
   * are not in the reading). Of this router's requests there whose first token nobody reports,
   * at most `waiting` can still be waiting, and the engine admits its waiting queue first come,
   * first served: all but the `waiting` most recent are admitted. For those marked with
   * awaitAdmission(), with less than a block left to compute, admission ends the prefill: calls
   * `done` with each, oldest first. A lower bound: other routers' requests in the queue only
   * make it mark fewer.
   */
  admitUnreported(worker: WorkerState, waiting: number, sampledAt: number, done: (ticket: number) => void): void {
    const q = this.unreported.get(worker);
    if (!q || q.live === 0) return;
    // the live tickets in the reading, oldest first: those routed ENGINE_ARRIVAL_MS or more
    // before it (one routed just before may not have reached the engine's waiting queue)
    let inReading = 0;
    for (let i = q.head; i < q.tickets.length; i++) {
      const t = this.tickets.get(q.tickets[i]);
      if (!t || t.prefilled) continue;
      if (t.openedAt > sampledAt - ENGINE_ARRIVAL_MS) break;
      inReading++;
    }
    let admit = inReading - waiting;
    if (admit <= 0) return;
    // gathered first: marking one changes the queue
    const admitted: number[] = [];
    for (let i = q.head; i < q.tickets.length && admit > 0; i++) {
      const ticket = q.tickets[i];
      const t = this.tickets.get(ticket);
      if (!t || t.prefilled) continue;
      admit--;
      // admitted; a prefill of many chunks waits for its own block's event instead
      if (t.prefillEnd === 'admission') admitted.push(ticket);
    }
    for (const ticket of admitted) done(ticket);
  }

  /** The request completed, failed or was abandoned: its work leaves the worker. Idempotent. */
  release(ticket: number): void {
    const t = this.tickets.get(ticket);
    if (!t) return;
    this.tickets.delete(ticket);
    const w = t.worker;
    if (t.prefillEnd === 'block' && !t.prefilled) this.stopAwaiting(ticket, t);
    if (t.prefillEnd !== 'reported' && !t.prefilled) this.leaveQueue(w);
    w.queuedPrefillTokens = Math.max(0, w.queuedPrefillTokens - t.prefill);
    if (t.prefilled) w.activeDecodeTokens = Math.max(0, w.activeDecodeTokens - t.kvTokens);
    w.inFlightRequests = Math.max(0, w.inFlightRequests - 1);
  }

  /** An unreported ticket on the worker was prefilled or released. */
  private leaveQueue(worker: WorkerState): void {
    const q = this.unreported.get(worker);
    if (!q) return;
    q.live--;
    if (q.live <= 0) this.unreported.delete(worker);
    else this.compact(q);
  }

  /** Drops released and prefilled tickets from the front, and from the rest when they outnumber the live ones. */
  private compact(q: UnreportedQueue): void {
    while (q.head < q.tickets.length) {
      const t = this.tickets.get(q.tickets[q.head]);
      if (t && !t.prefilled) break;
      q.head++;
    }
    const held = q.tickets.length - q.head;
    if (q.head > 0 && (q.head >= held || held > 2 * q.live + 16)) {
      q.tickets = q.tickets.slice(q.head).filter((ticket) => {
        const t = this.tickets.get(ticket);
        return t !== undefined && !t.prefilled;
      });
      q.head = 0;
    }
  }
}

/** This replica's own in-flight work on a worker: the totals less what other replicas reported. */
export function localLoad(w: WorkerState): InFlightLoad {
  return {
    inFlightRequests: Math.max(0, w.inFlightRequests - w.remoteInFlightRequests),
    queuedPrefillTokens: Math.max(0, w.queuedPrefillTokens - w.remoteQueuedPrefillTokens),
    activeDecodeTokens: Math.max(0, w.activeDecodeTokens - w.remoteActiveDecodeTokens),
  };
}

/**
 * Largest amount setRemoteLoad() takes for each of a worker's counts (2^40, about 1.1e12):
 * requests, or tokens of queued prefill or of decode, summed over the other replicas. Far past
 * any real load (a worker's KV cache holds some millions of tokens, its queue some thousands of
 * requests; 2^40 tokens are 8,192 prompts of the longest maxPromptTokens allows, 2^27), and small
 * enough that the worker's totals, which setRemoteLoad() moves by the difference between the
 * old and the new remote amount, stay whole numbers below 2^53, where floating point is exact:
 * replacing a remote amount then restores this replica's own counts exactly. A larger one (1e308)
 * would swamp every score, and replacing it would lose the replica's own counts to rounding.
 */
export const MAX_REMOTE_LOAD = 2 ** 40;

/**
 * How long after it is routed a request may still be missing from its engine's reading of its
 * waiting queue (ms): the HTTP hop, the engine's API server tokenizing it (about 0.1 s for a
 * 100,000-token prompt), the hand-over to the engine core, and the step in progress, after
 * which the engine's gauges count it (up to 0.44 s for a full 8,192-token step). A reading
 * taken sooner is not taken to have admitted it: it may not have arrived yet.
 */
export const ENGINE_ARRIVAL_MS = 500;

/**
 * Replaces the remote part of a worker's counts with `load`, adjusting the totals by the
 * difference. Every amount is checked before anything changes.
 */
export function setRemoteLoad(w: WorkerState, load: InFlightLoad): void {
  const requests = check.numberUpTo(load.inFlightRequests, 'load.inFlightRequests', MAX_REMOTE_LOAD);
  // a count of requests; the token amounts may be fractions (a cached share is credited in part)
  if (!Number.isInteger(requests))
    throw new RangeError(`load.inFlightRequests must be a whole number of requests, got ${requests}`);
  const prefill = check.numberUpTo(load.queuedPrefillTokens, 'load.queuedPrefillTokens', MAX_REMOTE_LOAD);
  const decode = check.numberUpTo(load.activeDecodeTokens, 'load.activeDecodeTokens', MAX_REMOTE_LOAD);
  w.inFlightRequests += requests - w.remoteInFlightRequests;
  w.queuedPrefillTokens += prefill - w.remoteQueuedPrefillTokens;
  w.activeDecodeTokens += decode - w.remoteActiveDecodeTokens;
  w.remoteInFlightRequests = requests;
  w.remoteQueuedPrefillTokens = prefill;
  w.remoteActiveDecodeTokens = decode;
}
