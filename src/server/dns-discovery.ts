import { lookup } from 'node:dns/promises';
import type { WorkerRecord } from '../state/state-store.js';

/**
 * Engines found by resolving a DNS name: on Kubernetes, a headless Service over the model-server
 * pods resolves to every ready pod's IP, so pods that come and go become workers that come and
 * go — no API-server access or RBAC needed. Each address becomes a worker whose id is its
 * `ip:port` (an IPv6 address: `fd00--5-8000`, see workerForAddress).
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

/**
 * The id of the worker at an IPv6 address (canonical form, as a URL writes it): the address with
 * each `:` written `-`, then `-PORT` — `fd00::5` on port 8000 is `fd00--5-8000`, `::1` is
 * `0--1-8000`. A worker id cannot hold brackets, and an IPv6 address has no `-`, so the id names
 * one address and port and cannot be taken for an IPv4 worker's `ip:port`.
 */
function ipv6WorkerId(address: string, port: number): string {
  // `::` at either end written `0::` / `::0` (the same address): an id starts with a letter or digit
  const spelled = `${address.startsWith(':') ? '0' : ''}${address}${address.endsWith(':') ? '0' : ''}`;
  return `${spelled.replaceAll(':', '-')}-${port}`;
}

/**
 * The worker for one resolved address: an IPv4 worker's id is `ip:port`, an IPv6 worker's the
 * address's canonical form with `-` for `:` and `-port` (`fd00--5-8000`); its URLs bracket the
 * address (`http://[fd00::5]:8000`). RangeError for an address no URL can hold (an IPv6 address
 * with a zone, `fe80::1%eth0`).
 */
export function workerForAddress(spec: DnsDiscoverySpec, address: string): WorkerRecord {
  let host = address;
  let id = `${address}:${spec.port}`;
  if (address.includes(':')) {
    let canonical: string;
    try {
      canonical = new URL(`http://[${address}]/`).hostname.slice(1, -1);
    } catch {
      throw new RangeError(`address ${address} cannot be written in a URL`);
    }
    host = `[${canonical}]`;
    id = ipv6WorkerId(canonical, spec.port);
  }
  return {
    id,
    url: `http://${host}:${spec.port}`,
    events: spec.eventsPort ? `tcp://${host}:${spec.eventsPort}` : undefined,
    replay: spec.replayPort ? `tcp://${host}:${spec.replayPort}` : undefined,
    models: spec.models,
  };
}

/**
 * Resolves the name now and every interval: new addresses are added as workers; an address is
 * removed after it is missing from two resolutions in a row (one lookup that races a rollout
 * does not drop a pod). A failed lookup changes nothing. An address that cannot be added is
 * tried again at every resolution but logged once while it keeps failing the same way.
 */
export class DnsDiscovery {
  private timer: NodeJS.Timeout | undefined;
  /** Workers this discovery added, with the number of resolutions they were missing from. */
  private readonly known = new Map<string, number>();
  /** Addresses the last resolution could not add, with what was logged. */
  private refused = new Map<string, string>();
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
    const refused = new Map<string, string>();
    for (const address of addresses.slice(0, 4096)) {
      let id = address;
      try {
        const w = workerForAddress(this.spec, address);
        id = w.id;
        seen.add(w.id);
        this.known.set(w.id, 0);
        if (this.host.hasWorker(w.id)) continue;
        this.host.addWorker(w);
        this.host.log(`discovery: worker ${w.id} added (${this.spec.dns})`);
      } catch (err) {
        const message = `discovery: cannot add ${id}: ${(err as Error).message}`;
        // the same refusal again at every interval says nothing new
        if (this.refused.get(address) !== message) this.host.log(message);
        refused.set(address, message);
      }
    }
    this.refused = refused;
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
