/**
 * Other router replicas' in-flight work, per replica and worker, as the shared state learns
 * it: decision, prefill-done and release messages move the tallies as requests start, get
 * their first token and end, and snapshots seed a replica not heard from yet (and correct one
 * whose tally drifted from them, reconcile()). The router is given the sum over replicas;
 * dropping a replica (it stopped heartbeating) drops its requests with it. No I/O here, so
 * the bookkeeping is tested without Redis.
 *
 * What it holds is bounded whatever the peers send (anything on the fleet's Redis can publish
 * on its channel): tallies are kept only for workers this router has (`workers`), a worker's tally
 * is forgotten once it is back to nothing, and past MAX_REMOTE_REPLICAS replicas, or
 * MAX_WORKERS workers with work of one replica, the rest is refused and counted (`refused`).
 */
import type { InFlightLoad } from '../core/router/index.js';
import { MAX_REMOTE_LOAD } from '../core/router/in-flight.js';
import { MAX_WORKERS } from '../core/worker-registry.js';

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

/**
 * Most other replicas (or gateway processes) whose tallies are kept at once: far past any fleet
 * of router replicas (each replica keeps one connection to every engine), so only a buggy or
 * hostile peer inventing replica ids reaches it. A replica past it is refused (counted in
 * `refused`, said once through `onRefused`) until one tallied is dropped: with Redis, a
 * replica that does not heartbeat is dropped at the next load sync.
 */
export const MAX_REMOTE_REPLICAS = 256;

/**
 * Longest replica id kept: a random id is 12 characters and a gateway process's a number, so
 * a longer one is a peer's garbage, which MAX_REMOTE_REPLICAS copies of would weigh.
 */
export const MAX_REPLICA_ID_LENGTH = 256;

export interface RemoteLoadOptions {
  /**
   * Whether this router has a worker (its registry, asked on each change): a change or snapshot
   * entry of any other worker is dropped (counted in `unknownWorkers`). Default: every id is kept
   * (the relay, which has no router, keeps what the processes send, within MAX_WORKERS per
   * process).
   */
  hasWorker?: (workerId: string) => boolean;
  /** Told the first time something is refused (`refused`); later refusals are only counted. */
  onRefused?: (why: string) => void;
}

export class RemoteLoad {
  private readonly replicas = new Map<string, ReplicaLoad>();
  private readonly hasWorker: ((workerId: string) => boolean) | undefined;
  private readonly onRefused: ((why: string) => void) | undefined;
  /**
   * Sums sum() clamped to MAX_REMOTE_LOAD (other replicas claiming more work on a worker than
   * the router takes: a buggy or hostile peer): each such sum counts once.
   */
  clamped = 0;
  /** Changes and snapshot entries dropped because they name a worker this router does not have (`workers`). */
  unknownWorkers = 0;
  /**
   * Changes and snapshots refused at a bound: of a replica past MAX_REMOTE_REPLICAS or with an
   * id past MAX_REPLICA_ID_LENGTH, or of a worker past MAX_WORKERS with work of one replica.
   */
  refused = 0;
  /**
   * Tallies replaced from their replica's own snapshot because they disagreed with it
   * (reconcile()): a forged message under its id, or one of its messages lost.
   */
  corrected = 0;

  constructor(options: RemoteLoadOptions = {}) {
    this.hasWorker = options.hasWorker;
    this.onRefused = options.onRefused;
  }

  /**
   * Adds a message's change to a replica's tally on a worker; counts never go below 0, and a
   * tally back to nothing is forgotten. Ignored (false) when a change is not a finite number
   * (a malformed message), names a worker this router does not have, or is refused at a bound
   * (see the class); decided(), prefilled() and released() also ignore amounts that are not
   * isRemoteAmount().
   */
  add(replica: string, workerId: string, requests: number, prefill: number, decode: number): boolean {
    if (!(Number.isFinite(requests) && Number.isFinite(prefill) && Number.isFinite(decode))) return false;
    if (!this.knows(workerId)) {
      this.unknownWorkers++;
      return false;
    }
    const load = this.replicas.get(replica) ?? this.admit(replica, new Map());
    if (!load) return false;
    let l = load.get(workerId);
    if (!l) {
      if (load.size >= MAX_WORKERS)
        return this.refuse(`replica '${clip(replica)}' names more than ${MAX_WORKERS} workers with work`);
      l = { requests: 0, prefill: 0, decode: 0 };
    }
    l.requests = Math.max(0, l.requests + requests);
    l.prefill = Math.max(0, l.prefill + prefill);
    l.decode = Math.max(0, l.decode + decode);
    if (l.requests === 0 && l.prefill === 0 && l.decode === 0) load.delete(workerId);
    else load.set(workerId, l);
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

  /**
   * Replaces a replica's tally with what it says it holds (it came back: messages of it may
   * have been lost); entries of workers this router does not have are left out. False when the
   * replica is refused (see the class).
   */
  replace(replica: string, load: ReplicaLoad): boolean {
    const kept = this.within(replica, load);
    if (this.replicas.has(replica)) this.replicas.set(replica, kept);
    else if (!this.admit(replica, kept)) return false;
    return true;
  }

  /**
   * Replaces a tallied replica's tally with its snapshot when the two differ, counted in
   * `corrected`; entries of workers this router does not have, and empty ones, are left out of
   * both, as replace() leaves them out. False (nothing done) when they agree or the replica is
   * not tallied (seed() starts it). When the snapshot is recent enough to trust is the caller's
   * to judge (the Redis store's load sync).
   */
  reconcile(replica: string, load: ReplicaLoad): boolean {
    const tally = this.replicas.get(replica);
    if (!tally || this.agrees(tally, load)) return false;
    this.replicas.set(replica, this.within(replica, load));
    this.corrected++;
    return true;
  }

  /** Starts a replica from its snapshot (as replace()), unless messages already started its tally. */
  seed(replica: string, load: ReplicaLoad): boolean {
    return this.replicas.has(replica) || this.replace(replica, load);
  }

  /**
   * Forgets every tally on a worker this router no longer has (`workers`), for the stores to call
   * once a worker is removed: a tally kept for it would count again if it came back. True when
   * one was forgotten.
   */
  forgetUnknownWorkers(): boolean {
    if (!this.hasWorker) return false;
    let changed = false;
    for (const load of this.replicas.values())
      for (const id of load.keys())
        if (!this.hasWorker(id)) {
          load.delete(id);
          changed = true;
        }
    return changed;
  }

  /** The replicas tallied now. */
  get size(): number {
    return this.replicas.size;
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

  /** Starts a replica's tally with `load`, unless that passes a bound: undefined then (refused, counted). */
  private admit(replica: string, load: ReplicaLoad): ReplicaLoad | undefined {
    if (replica.length > MAX_REPLICA_ID_LENGTH) {
      this.refuse(`a replica id of ${replica.length} characters (at most ${MAX_REPLICA_ID_LENGTH})`);
      return undefined;
    }
    if (this.replicas.size >= MAX_REMOTE_REPLICAS) {
      this.refuse(`replica '${clip(replica)}' past the ${MAX_REMOTE_REPLICAS} replicas tallied`);
      return undefined;
    }
    this.replicas.set(replica, load);
    return load;
  }

  /** `load` without its entries of workers this router does not have, nor those past MAX_WORKERS, nor empty ones. */
  private within(replica: string, load: ReplicaLoad): ReplicaLoad {
    const kept: ReplicaLoad = new Map();
    for (const [id, l] of load) {
      if (!this.knows(id)) this.unknownWorkers++;
      else if (l.requests === 0 && l.prefill === 0 && l.decode === 0) continue;
      else if (kept.size >= MAX_WORKERS)
        this.refuse(`replica '${clip(replica)}' names more than ${MAX_WORKERS} workers with work`);
      else kept.set(id, l);
    }
    return kept;
  }

  /** Whether `tally` holds what `load` says of every worker this router has, and nothing else; counts nothing. */
  private agrees(tally: ReplicaLoad, load: ReplicaLoad): boolean {
    let matched = 0;
    for (const [id, l] of load) {
      if ((l.requests === 0 && l.prefill === 0 && l.decode === 0) || !this.knows(id)) continue;
      const t = tally.get(id);
      if (!t || t.requests !== l.requests || t.prefill !== l.prefill || t.decode !== l.decode) return false;
      matched++;
    }
    return matched === tally.size;
  }

  /** Whether this router has the worker (every id, without `hasWorker`). */
  private knows(workerId: string): boolean {
    return this.hasWorker === undefined || this.hasWorker(workerId);
  }

  private refuse(why: string): false {
    if (this.refused++ === 0) this.onRefused?.(why);
    return false;
  }
}

/** A peer's id for a log line: at most 64 characters. */
function clip(id: string): string {
  return id.length > 64 ? `${id.slice(0, 64)}…` : id;
}
