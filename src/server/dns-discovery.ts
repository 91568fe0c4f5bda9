import { lookup } from 'node:dns/promises';
import type { WorkerRecord } from '../state/state-store.js';

/**
 * Engines found by resolving a DNS name: on Kubernetes, a headless Service over the model-server
 * pods resolves to every ready pod's IP, so pods that come and go become workers that come and
 * go — no API-server access or RBAC needed. Each address becomes a worker whose id is its
 * `ip:port` (the endpoint an Envoy gateway routes to).
 */
export interface DnsDiscoverySpec {
  /** The name to resolve, e.g. vllm-engines.default.svc.cluster.local */
  dns: string;
  /** The engines' HTTP port. */
  port: number;
  /** KV-event PUB port on each engine (vLLM's --kv-events-config endpoint), if any. */
  eventsPort?: number;
  /** Replay ROUTER port on each engine, if any (needs eventsPort). */
  replayPort?: number;
  /** Between resolutions (default 5000 ms). */
  intervalMs: number;
  /** Models every discovered engine serves (absent: any). */
  models?: string[];
}

export interface DnsDiscoveryHost {
  addWorker(w: WorkerRecord): void;
  removeWorker(id: string): boolean;
  hasWorker(id: string): boolean;
  log(message: string): void;
}

export type Resolver = (name: string) => Promise<string[]>;

const resolveAll: Resolver = async (name) => (await lookup(name, { all: true, verbatim: true })).map((a) => a.address);

/** The worker for one resolved address. */
export function workerForAddress(spec: DnsDiscoverySpec, address: string): WorkerRecord {
  const host = address.includes(':') ? `[${address}]` : address;
  return {
    id: `${host}:${spec.port}`,
    url: `http://${host}:${spec.port}`,
    events: spec.eventsPort ? `tcp://${host}:${spec.eventsPort}` : undefined,
    replay: spec.replayPort ? `tcp://${host}:${spec.replayPort}` : undefined,
    models: spec.models,
  };
}

/**
 * Resolves the name now and every interval: new addresses are added as workers; an address is
 * removed after it is missing from two resolutions in a row (one lookup that races a rollout
 * does not drop a pod). A failed lookup changes nothing.
 */
export class DnsDiscovery {
  private timer: NodeJS.Timeout | undefined;
  /** Workers this discovery added, with the number of resolutions they were missing from. */
  private readonly known = new Map<string, number>();
  private running: Promise<void> | undefined;
  private stopped = false;

  constructor(
    private readonly spec: DnsDiscoverySpec,
    private readonly host: DnsDiscoveryHost,
    private readonly resolve: Resolver = resolveAll,
  ) {}

  /** Resolves once (awaited), then keeps resolving in the background. */
  async start(): Promise<this> {
    await this.refresh();
    // stopped while the first resolution was under way: no interval may outlive stop()
    if (this.stopped) return this;
    this.timer = setInterval(() => void this.refresh(), this.spec.intervalMs);
    this.timer.unref();
    return this;
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
  }

  /** One resolution (concurrent calls share it). */
  refresh(): Promise<void> {
    this.running ??= this.resolveOnce().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private async resolveOnce(): Promise<void> {
    let addresses: string[];
    try {
      addresses = await this.resolve(this.spec.dns);
    } catch (err) {
      this.host.log(
        `discovery: cannot resolve ${this.spec.dns}: ${(err as Error).message}; keeping ${this.known.size} workers`,
      );
      return;
    }
    if (this.stopped) return;
    const seen = new Set<string>();
    for (const address of addresses.slice(0, 4096)) {
      const w = workerForAddress(this.spec, address);
      seen.add(w.id);
      this.known.set(w.id, 0);
      if (this.host.hasWorker(w.id)) continue;
      try {
        this.host.addWorker(w);
        this.host.log(`discovery: worker ${w.id} added (${this.spec.dns})`);
      } catch (err) {
        this.host.log(`discovery: cannot add ${w.id}: ${(err as Error).message}`);
      }
    }
    for (const [id, misses] of this.known) {
      if (seen.has(id)) continue;
      if (misses + 1 < 2) {
        this.known.set(id, misses + 1);
        continue;
      }
      this.known.delete(id);
      if (this.host.removeWorker(id)) this.host.log(`discovery: worker ${id} removed (gone from ${this.spec.dns})`);
    }
  }
}
