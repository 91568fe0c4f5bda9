import { lookup } from 'node:dns/promises';
import { BlockList, isIP } from 'node:net';
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
  /**
   * Whether a worker there already under the id of `w` is discovery's own: its record is `w`, as
   * discovery makes it, and no operator added it (the worker of another replica's discovery,
   * or of this one's before a restart, read from the shared state). Absent: only the workers
   * this discovery added are its own.
   */
  claimable?(w: WorkerRecord): boolean;
  /** Whether the operator drained the worker (asked when discovery removes it). */
  isDraining?(id: string): boolean;
  /** Drains the worker (one that was drained when it left DNS, back). */
  drainWorker?(id: string): void;
  log(message: string): void;
}

export type Resolver = (name: string) => Promise<string[]>;

export interface DnsDiscoveryOptions {
  /** Longest wait for one lookup's answer (default DEFAULT_LOOKUP_TIMEOUT_MS). */
  lookupTimeoutMs?: number;
}

/**
 * How long a lookup may take before the resolution fails (and the next interval tries again):
 * glibc's resolver gives each name server 5 s and tries twice (resolv.conf `timeout:5
 * attempts:2`), so an answer is rarely later than this.
 */
export const DEFAULT_LOOKUP_TIMEOUT_MS = 10_000;

/**
 * Lookups given up on but still unanswered, at most: node's lookup (getaddrinfo) cannot be
 * cancelled and holds one of libuv's four threads (shared with file, crypto and zlib work) until
 * it ends. Past this many, a resolution fails at once instead of taking another thread.
 */
const MAX_UNANSWERED_LOOKUPS = 2;

/** Addresses kept as drained after they left DNS, at most (the oldest is forgotten first). */
const MAX_DRAINED_GONE = 4096;

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

/** A BlockList of the rules `add` adds. */
function blockList(add: (list: BlockList) => void): BlockList {
  const list = new BlockList();
  add(list);
  return list;
}

/**
 * The addresses no engine can be reached at, each with why (the first list that holds an
 * address names it): the unspecified address (0.0.0.0, `::`; what sinkhole resolvers answer for
 * a name they block, and a connection to it reaches this host: the gateway itself, or whatever
 * listens here), the rest of 0.0.0.0/8 (a source address only), the limited broadcast address
 * and multicast addresses (no TCP connection goes to a group).
 */
const UNUSABLE: ReadonlyArray<readonly [BlockList, string]> = [
  [
    blockList((l) => {
      l.addAddress('0.0.0.0', 'ipv4');
      l.addAddress('::', 'ipv6');
    }),
    'is the unspecified address (a sinkhole answer)',
  ],
  [blockList((l) => l.addSubnet('0.0.0.0', 8, 'ipv4')), 'is in 0.0.0.0/8 (a source address only)'],
  [blockList((l) => l.addAddress('255.255.255.255', 'ipv4')), 'is the broadcast address'],
  [
    blockList((l) => {
      l.addSubnet('224.0.0.0', 4, 'ipv4');
      l.addSubnet('ff00::', 8, 'ipv6');
    }),
    'is a multicast address',
  ],
];

/**
 * Why no engine can be reached at an address (undefined: it may be one): one of UNUSABLE's, in
 * any spelling (`0:0:0:0:0:0:0:0`, `FF02::1`); an IPv4-mapped IPv6 address (`::ffff:0.0.0.0`,
 * `::ffff:e000:1`) is judged as its IPv4 address, as a connection to it goes there. A text that
 * is no IP address is refused too (a URL would read `0` as 0.0.0.0).
 */
export function unusableAddress(address: string): string | undefined {
  const family = isIP(address);
  if (family === 0) return 'is not an IP address';
  const type = family === 4 ? 'ipv4' : 'ipv6';
  const unusable = UNUSABLE.find(([list]) => list.check(address, type));
  return unusable === undefined ? undefined : `${unusable[1]}: no engine is reached there`;
}

/**
 * The worker for one resolved address: an IPv4 worker's id is `ip:port`, an IPv6 worker's the
 * address's canonical form with `-` for `:` and `-port` (`fd00--5-8000`); its URLs bracket the
 * address (`http://[fd00::5]:8000`). RangeError for an address no URL can hold (an IPv6 address
 * with a zone, `fe80::1%eth0`), for one no engine can be at (unusableAddress: 0.0.0.0, `::`,
 * broadcast, multicast) and for a text that is no IP address.
 */
export function workerForAddress(spec: DnsDiscoverySpec, address: string): WorkerRecord {
  let host = address;
  let id = `${address}:${spec.port}`;
  let canonical = address;
  if (address.includes(':')) {
    try {
      canonical = new URL(`http://[${address}]/`).hostname.slice(1, -1);
    } catch {
      throw new RangeError(`address ${address} cannot be written in a URL`);
    }
    host = `[${canonical}]`;
    id = ipv6WorkerId(canonical, spec.port);
  }
  const unusable = unusableAddress(canonical);
  if (unusable !== undefined) throw new RangeError(`address ${address} ${unusable}`);
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
 * does not drop a pod). Only workers this discovery added are removed: one the operator added
 * (the admin API, the configuration, another replica through the shared state) under an
 * address's id stays, whatever DNS says. As for Envoy's STRICT_DNS, an answer is the whole set
 * (one with no address would remove every worker after two resolutions) and a failed lookup (an
 * error, or no answer within the lookup timeout) changes nothing: the workers found last stay,
 * their health checks saying whether they serve. getaddrinfo reports a name without addresses
 * as an error (ENOTFOUND), so a Service scaled to zero keeps its last workers. A worker drained when it is removed comes back drained (an
 * operator's drain is of the address, and must not end with a stay out of DNS: a pod that fails
 * its readiness for a while). A failure is logged once per kind until a lookup succeeds;
 * an address that cannot be added is tried again at every resolution but logged once while it
 * keeps failing the same way.
 */
export class DnsDiscovery {
  private timer: NodeJS.Timeout | undefined;
  /** Workers this discovery added, with the number of resolutions they were missing from. */
  private readonly known = new Map<string, number>();
  /** Addresses the last resolution could not add, with what was logged. */
  private refused = new Map<string, string>();
  private running: Promise<void> | undefined;
  private stopped = false;
  /** The kind of the failure last logged (its code, or message), until a lookup succeeds. */
  private failing: string | undefined;
  /** Lookups given up on at their deadline that have not ended yet. */
  private unanswered = 0;
  private readonly lookupTimeoutMs: number;
  /** Workers this discovery removed while they were drained: they come back drained. */
  private readonly drainedGone = new Set<string>();

  constructor(
    private readonly spec: DnsDiscoverySpec,
    private readonly host: DnsDiscoveryHost,
    private readonly resolve: Resolver = resolveAll,
    options: DnsDiscoveryOptions = {},
  ) {
    this.lookupTimeoutMs = options.lookupTimeoutMs ?? DEFAULT_LOOKUP_TIMEOUT_MS;
  }

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

  /** The name's addresses, or a rejection: the lookup failed, or did not answer within the lookup timeout. */
  private lookup(): Promise<string[]> {
    if (this.unanswered >= MAX_UNANSWERED_LOOKUPS)
      return Promise.reject(
        Object.assign(new Error(`${this.unanswered} earlier lookups have not answered yet`), { code: 'UNANSWERED' }),
      );
    const lookup = this.resolve(this.spec.dns);
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        // given up on, not ended: counted until it ends (a late answer is not taken)
        this.unanswered++;
        void lookup.then(
          () => this.unanswered--,
          () => this.unanswered--,
        );
        reject(Object.assign(new Error(`no answer within ${this.lookupTimeoutMs} ms`), { code: 'TIMEOUT' }));
      }, this.lookupTimeoutMs);
      // (not unref'd: the lookup under way keeps the process alive as long anyway)
    });
    return Promise.race([lookup, deadline]).finally(() => clearTimeout(timer));
  }

  private async resolveOnce(): Promise<void> {
    let addresses: string[];
    try {
      addresses = await this.lookup();
    } catch (err) {
      const e = err as Error & { code?: unknown };
      const kind = typeof e.code === 'string' ? e.code : String(e.message);
      // the same failure at every interval says nothing new
      if (this.failing !== kind)
        this.host.log(
          `discovery: cannot resolve ${this.spec.dns}: ${e.message}; keeping ${this.known.size} workers (logged once until it resolves)`,
        );
      this.failing = kind;
      return;
    }
    if (this.stopped) return;
    if (this.failing !== undefined) {
      this.failing = undefined;
      this.host.log(`discovery: ${this.spec.dns} resolves again (${addresses.length} addresses)`);
    }
    const seen = new Set<string>();
    const refused = new Map<string, string>();
    for (const address of addresses.slice(0, 4096)) {
      let id = address;
      try {
        const w = workerForAddress(this.spec, address);
        id = w.id;
        seen.add(w.id);
        if (this.host.hasWorker(w.id)) {
          // one of its own, still listed; a worker the operator added under this id is theirs
          const own = this.host.claimable ? this.host.claimable(w) : this.known.has(w.id);
          if (own) this.known.set(w.id, 0);
          else this.known.delete(w.id);
          continue;
        }
        this.host.addWorker(w);
        this.known.set(w.id, 0);
        // the operator's drain holds for the address, not for one stay in DNS
        const drained = this.drainedGone.delete(w.id) && this.host.drainWorker !== undefined;
        if (drained) this.host.drainWorker!(w.id);
        this.host.log(
          `discovery: worker ${w.id} added${drained ? ' drained (as it was when it left DNS; resume it through the admin API)' : ''} (${this.spec.dns})`,
        );
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
      const drained = this.host.isDraining?.(id) === true;
      if (!this.host.removeWorker(id)) continue;
      this.host.log(`discovery: worker ${id} removed (gone from ${this.spec.dns})`);
      if (drained) {
        if (this.drainedGone.size >= MAX_DRAINED_GONE) this.drainedGone.delete(this.drainedGone.values().next().value!);
        this.drainedGone.add(id);
      }
    }
  }
}
