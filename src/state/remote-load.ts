/**
 * Other router replicas' in-flight work, per replica and worker, as the shared state learns
 * it: decision, prefill-done and release messages move the tallies as requests start, get
 * their first token and end, and snapshots seed a replica not heard from yet. The router is given the sum over replicas;
 * dropping a replica (it stopped heartbeating) drops its requests with it. No I/O here, so
 * the bookkeeping is tested without Redis.
 */
import type { InFlightLoad } from '../core/router/index.js';
import { MAX_REMOTE_LOAD } from '../core/router/in-flight.js';

/** One replica's work on one worker. */
export interface WorkerTally {
  requests: number;
  prefill: number;
  decode: number;
}

/** One replica's work per worker id. */
export type ReplicaLoad = Map<string, WorkerTally>;

/**
 * Largest count or token amount one message or snapshot entry may carry: what the router takes
 * for a whole sum (MAX_REMOTE_LOAD, 2^40), far past any real load. Sums over replicas, and a
 * replica's tally over many messages, may pass it: sum() clamps them to it.
 */
export const MAX_REMOTE_AMOUNT = MAX_REMOTE_LOAD;

/** A count or token amount another replica sent: a number from 0 to MAX_REMOTE_AMOUNT. */
export function isRemoteAmount(v: unknown): v is number {
  return typeof v === 'number' && v >= 0 && v <= MAX_REMOTE_AMOUNT;
}

export class RemoteLoad {
  private readonly replicas = new Map<string, ReplicaLoad>();
  /**
   * Sums sum() clamped to MAX_REMOTE_LOAD (other replicas claiming more work on a worker than
   * the router takes: a buggy or hostile peer): each such sum counts once.
   */
  clamped = 0;

  /**
   * Adds a message's change to a replica's tally on a worker; counts never go below 0.
   * Ignored (false) when a change is not a finite number (a malformed message); decided(),
   * prefilled() and released() also ignore amounts that are not isRemoteAmount().
   */
  add(replica: string, workerId: string, requests: number, prefill: number, decode: number): boolean {
    if (!(Number.isFinite(requests) && Number.isFinite(prefill) && Number.isFinite(decode))) return false;
    let load = this.replicas.get(replica);
    if (!load) this.replicas.set(replica, (load = new Map()));
    const l = load.get(workerId) ?? { requests: 0, prefill: 0, decode: 0 };
    l.requests = Math.max(0, l.requests + requests);
    l.prefill = Math.max(0, l.prefill + prefill);
    l.decode = Math.max(0, l.decode + decode);
    load.set(workerId, l);
    return true;
  }

  /** A decision: one more request on the worker, its uncached prompt tokens queued as prefill. */
  decided(replica: string, workerId: string, prefillTokens: number): boolean {
    return isRemoteAmount(prefillTokens) && this.add(replica, workerId, 1, prefillTokens, 0);
  }

  /** The request's prefill finished (first token): its tokens move from queued prefill to decode. */
  prefilled(replica: string, workerId: string, prefillTokens: number, decodeTokens: number): boolean {
    return (
      isRemoteAmount(prefillTokens) &&
      isRemoteAmount(decodeTokens) &&
      this.add(replica, workerId, 0, -prefillTokens, decodeTokens)
    );
  }

  /**
   * The request ended: it leaves the worker, with its decode tokens when its prefill-done was
   * announced (`decodeTokens` given), else with its still queued prefill.
   */
  released(replica: string, workerId: string, prefillTokens: number, decodeTokens: number | undefined): boolean {
    if (!isRemoteAmount(prefillTokens)) return false;
    if (decodeTokens === undefined) return this.add(replica, workerId, -1, -prefillTokens, 0);
    return isRemoteAmount(decodeTokens) && this.add(replica, workerId, -1, 0, -decodeTokens);
  }

  /**
   * The other replicas' work on a worker, summed: each amount at most MAX_REMOTE_LOAD, what
   * KVAwareRouter.setRemoteLoad() takes (a larger one is clamped, and counted in `clamped`), so
   * the stores can pass it on from a timer or a message handler without it throwing.
   */
  sum(workerId: string): InFlightLoad {
    let requests = 0;
    let prefill = 0;
    let decode = 0;
    for (const load of this.replicas.values()) {
      const l = load.get(workerId);
      if (!l) continue;
      requests += l.requests;
      prefill += l.prefill;
      decode += l.decode;
    }
    if (requests > MAX_REMOTE_LOAD || prefill > MAX_REMOTE_LOAD || decode > MAX_REMOTE_LOAD) {
      this.clamped++;
      requests = Math.min(requests, MAX_REMOTE_LOAD);
      prefill = Math.min(prefill, MAX_REMOTE_LOAD);
      decode = Math.min(decode, MAX_REMOTE_LOAD);
    }
    return { inFlightRequests: requests, queuedPrefillTokens: prefill, activeDecodeTokens: decode };
  }

  has(replica: string): boolean {
    return this.replicas.has(replica);
  }

  /** Replaces a replica's tally with what it says it holds (it came back: messages of it may have been lost). */
  replace(replica: string, load: ReplicaLoad): void {
    this.replicas.set(replica, load);
  }

  /** Starts a replica from its snapshot, unless messages already started its tally. */
  seed(replica: string, load: ReplicaLoad): void {
    if (!this.replicas.has(replica)) this.replicas.set(replica, load);
  }

  /** Every replica's tally on every worker. */
  *entries(): IterableIterator<[replica: string, workerId: string, tally: Readonly<WorkerTally>]> {
    for (const [replica, load] of this.replicas) for (const [id, l] of load) yield [replica, id, l];
  }

  /** Drops every replica not in `alive`; true when one was dropped. */
  retain(alive: ReadonlySet<string>): boolean {
    let changed = false;
    for (const r of this.replicas.keys()) {
      if (!alive.has(r)) {
        this.replicas.delete(r);
        changed = true;
      }
    }
    return changed;
  }

  /** Drops one replica (it stopped); true when it was known. */
  drop(replica: string): boolean {
    return this.replicas.delete(replica);
  }

  /** Forgets every replica (messages were missed: start again from snapshots). */
  clear(): void {
    this.replicas.clear();
  }
}
