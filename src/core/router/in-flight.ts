/**
 * In-flight work on workers: the tickets the router hands out for tracked requests, and the
 * split of each worker's counts into this replica's own part and what other replicas report.
 * Policies read the totals on WorkerState; these helpers keep them consistent as requests
 * move from queued prefill to decode to done, and as remote tallies change.
 */
import * as check from '../validate.js';
import type { WorkerState } from '../worker-registry.js';
import type { InFlightLoad } from './types.js';

interface Ticket {
  worker: WorkerState;
  /** Uncached prompt tokens still counted as queued prefill. */
  prefill: number;
  /** KV tokens counted as decoding once prefill is done. */
  kvTokens: number;
  prefilled: boolean;
}

/** The tracked requests of one router, by ticket number (0 is never a ticket). */
export class InFlightTickets {
  private readonly tickets = new Map<number, Ticket>();
  private nextTicket = 1;

  /** Tracked requests not yet released. */
  get size(): number {
    return this.tickets.size;
  }

  /** Counts a new request on the worker: its uncached tokens as queued prefill. Returns its ticket. */
  open(worker: WorkerState, uncachedTokens: number, promptTokens: number): number {
    const ticket = this.nextTicket++;
    this.tickets.set(ticket, { worker, prefill: uncachedTokens, kvTokens: promptTokens, prefilled: false });
    worker.queuedPrefillTokens += uncachedTokens;
    worker.inFlightRequests++;
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
  }

  /** The request completed, failed or was abandoned: its work leaves the worker. Idempotent. */
  release(ticket: number): void {
    const t = this.tickets.get(ticket);
    if (!t) return;
    this.tickets.delete(ticket);
    const w = t.worker;
    w.queuedPrefillTokens = Math.max(0, w.queuedPrefillTokens - t.prefill);
    if (t.prefilled) w.activeDecodeTokens = Math.max(0, w.activeDecodeTokens - t.kvTokens);
    w.inFlightRequests = Math.max(0, w.inFlightRequests - 1);
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

/** Replaces the remote part of a worker's counts with `load`, adjusting the totals by the difference. */
export function setRemoteLoad(w: WorkerState, load: InFlightLoad): void {
  const requests = check.finiteNonNegative(load.inFlightRequests, 'inFlightRequests');
  const prefill = check.finiteNonNegative(load.queuedPrefillTokens, 'queuedPrefillTokens');
  const decode = check.finiteNonNegative(load.activeDecodeTokens, 'activeDecodeTokens');
  w.inFlightRequests += requests - w.remoteInFlightRequests;
  w.queuedPrefillTokens += prefill - w.remoteQueuedPrefillTokens;
  w.activeDecodeTokens += decode - w.remoteActiveDecodeTokens;
  w.remoteInFlightRequests = requests;
  w.remoteQueuedPrefillTokens = prefill;
  w.remoteActiveDecodeTokens = decode;
}
