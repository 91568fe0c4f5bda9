import type { KVAwareRouter } from '../core/router.js';

/** In-flight work one replica has on each worker, as the messages of that replica tell it. */
type ReplicaLoad = Map<string, { requests: number; prefill: number; decode: number }>;

/**
 * The other replicas' in-flight work, kept current from their decision and release messages
 * and summed into the router (setRemoteLoad), so this replica's policies see the whole
 * fleet's queues and replicas do not pile onto one worker.
 */
export class RemoteLoads {
  private readonly byReplica = new Map<string, ReplicaLoad>();

  constructor(private readonly router: KVAwareRouter) {}

  /** A replica's request started (+1, its uncached prompt tokens) or ended (−1, −tokens) on a worker. */
  add(replica: string, workerId: string, requests: number, prefill: number): void {
    if (!Number.isFinite(prefill) || !Number.isFinite(requests)) return;
    let load = this.byReplica.get(replica);
    if (!load) this.byReplica.set(replica, (load = new Map()));
    const l = load.get(workerId) ?? { requests: 0, prefill: 0, decode: 0 };
    l.requests = Math.max(0, l.requests + requests);
    l.prefill = Math.max(0, l.prefill + prefill);
    load.set(workerId, l);
    this.apply(workerId);
  }

  /** Replaces a replica's whole picture (its snapshot); nothing is applied until apply()/applyAll(). */
  set(replica: string, load: ReplicaLoad): void {
    this.byReplica.set(replica, load);
  }

  has(replica: string): boolean {
    return this.byReplica.has(replica);
  }

  replicas(): IterableIterator<string> {
    return this.byReplica.keys();
  }

  /** A replica stopped: its requests are gone with it. */
  drop(replica: string): void {
    if (this.byReplica.delete(replica)) this.applyAll();
  }

  clear(): void {
    this.byReplica.clear();
    this.applyAll();
  }

  applyAll(): void {
    for (const w of this.router.listWorkers()) this.apply(w.id);
  }

  /** Sums the other replicas' work on a worker into the router's view. */
  apply(workerId: string): void {
    if (!this.router.listWorkers().some((w) => w.id === workerId)) return;
    let requests = 0;
    let prefill = 0;
    let decode = 0;
    for (const load of this.byReplica.values()) {
      const l = load.get(workerId);
      if (!l) continue;
      requests += l.requests;
      prefill += l.prefill;
      decode += l.decode;
    }
    this.router.setRemoteLoad(workerId, { inFlightRequests: requests, queuedPrefillTokens: prefill, activeDecodeTokens: decode });
  }
}
