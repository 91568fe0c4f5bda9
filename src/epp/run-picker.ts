import { DnsDiscovery, type DnsDiscoveryHost, type DnsDiscoverySpec } from '../server/dns-discovery.js';
import type { WorkerRecord } from '../state/state-store.js';
import type { Gateway } from '../server/gateway.js';
import { gatewayRoutingBackend } from './gateway-backend.js';
import { RouterPicker } from './router-picker.js';
import { startEppServer, type EppServerOptions } from './server.js';
import { scrapeGapMs } from '../engines/metrics/scraper.js';
import { DEFAULT_TIMEOUTS } from '../server/timeouts.js';

/** Settings of the endpoint picker and engine discovery, shared by `epp` and `serve --epp-port`. */
export interface PickerConfig {
  discover?: DnsDiscoverySpec;
  objectives?: ReadonlyMap<string, number>;
  shedQueueDepth: number;
  shedKvUsage: number;
  /** See RouterPickerOptions; absent: from the scrape interval (pickerStaleMs). */
  shedMetricsStaleMs?: number;
  /** The gateway's metrics scrape interval (0: no scrapes). */
  metricsIntervalMs?: number;
  eppFallbacks: number;
  /** Time from a stream's request headers to its body's end (the gateway's --request-timeout-ms). */
  requestTimeoutMs?: number;
  /** Time from a stream's start to its request headers (the gateway's --headers-timeout-ms). */
  headersTimeoutMs?: number;
}

/**
 * How long a routed request counts in its worker's load while no response phase begins on its
 * stream (ms): the gateway's own longest wait for an answer to begin, its default inter-chunk
 * timeout (a non-streamed answer's headers come after the whole generation). A stream Envoy
 * holds open without a response (a peer that never sends one) would otherwise keep the count
 * raised for the connection's life. Not a setting: epp proxies nothing, so serve's
 * --upstream-timeout-ms is none of its own (docs/configuration.md).
 */
export const DEFAULT_RESPONSE_TIMEOUT_MS = DEFAULT_TIMEOUTS.interChunkTimeoutMs;

export interface RunningPicker {
  /** The bound gRPC port, when the picker serves. */
  eppPort: number | undefined;
  /** The bound plaintext gRPC health port, when one was asked for. */
  healthPort: number | undefined;
  close(): Promise<void>;
}

/**
 * Starts what a gateway needs for the endpoint picker: DNS discovery of the engines (with
 * --discover) and the ext_proc gRPC server (when `port` is given).
 */
export async function startPicker(
  gateway: Gateway,
  c: PickerConfig & { bodyLimit: number; shutdownGraceMs?: number },
  o: {
    host: string;
    port: number | undefined;
    log: (m: string) => void;
    readinessIntervalMs?: number;
    /** TLS of the ext_proc port (default: plaintext). */
    tls?: EppServerOptions['tls'];
    /** A plaintext port of the gRPC health services alone (default: none). */
    healthPort?: number;
  },
): Promise<RunningPicker> {
  const discovery = c.discover ? await new DnsDiscovery(c.discover, discoveryHost(gateway, o.log)).start() : undefined;
  if (o.port === undefined) {
    return { eppPort: undefined, healthPort: undefined, close: async () => discovery?.stop() };
  }
  const backend = gatewayRoutingBackend(gateway);
  const picker = new RouterPicker(backend, {
    fallbacks: c.eppFallbacks,
    objectives: c.objectives,
    shedQueueDepth: c.shedQueueDepth,
    shedKvUsage: c.shedKvUsage,
    shedMetricsStaleMs: pickerStaleMs(c),
    log: o.log,
  });
  const server = await startEppServer({
    host: o.host,
    port: o.port,
    picker,
    bodyLimit: c.bodyLimit,
    // one budget for the process: the gateway's HTTP requests and the picker's streams
    bodyBudget: gateway.bodyBudget,
    // counted with the gateway's: the picker's streams draw on the gateway's budget
    onBodyBudgetRefusal: () => gateway.countBodyBudgetRefusal(),
    // an ext_proc stream's body gets the time an HTTP client's request gets
    bodyTimeoutMs: c.requestTimeoutMs,
    // and a stream's request headers the time an HTTP client's headers get
    headersTimeoutMs: c.headersTimeoutMs,
    responseTimeoutMs: DEFAULT_RESPONSE_TIMEOUT_MS,
    log: o.log,
    onOutcome: (outcome) => picker.countOutcome(outcome),
    onResponseTimeout: () => picker.countResponseTimeout(),
    // as /readyz: ready too while requests are panic-routed, or the Service would drop the picker
    // exactly when it routes over engines whose probes only time out
    ready: () => gateway.ready(),
    readinessIntervalMs: o.readinessIntervalMs,
    // the gateway's cap, per listener: Envoy's connections are clients of this process too
    capConnections: (listener) => gateway.capClientConnections(listener, 'ext_proc'),
    tls: o.tls,
    healthPort: o.healthPort,
  });
  return {
    eppPort: server.port,
    healthPort: server.healthPort,
    close: async () => {
      discovery?.stop();
      await server.close(c.shutdownGraceMs);
    },
  };
}

/**
 * The least default age past which shedding counts a worker's metrics as stale (ms). The check
 * finds a worker whose readings stopped, not a round that ran late: at a short interval a router
 * kept busy for a second or two would otherwise count every worker saturated and shed every
 * request. It is what the default was at a 1000 ms interval.
 */
export const MIN_DEFAULT_STALE_MS = 4000;

/**
 * The age past which shedding counts a worker's metrics as stale: the setting, else the longest
 * gap between two readings of an engine that answers every scrape plus one more interval (a
 * reading is stale once a whole round has gone by without one), at least MIN_DEFAULT_STALE_MS;
 * none when metrics are not scraped.
 */
export function pickerStaleMs(c: Pick<PickerConfig, 'shedMetricsStaleMs' | 'metricsIntervalMs'>): number | undefined {
  if (c.metricsIntervalMs === 0) return undefined;
  if (c.shedMetricsStaleMs !== undefined) return c.shedMetricsStaleMs;
  if (c.metricsIntervalMs === undefined) return undefined;
  return Math.max(MIN_DEFAULT_STALE_MS, scrapeGapMs(c.metricsIntervalMs) + c.metricsIntervalMs);
}

/** Whether a worker's record is `discovered`, as discovery makes it (no field it leaves unset is set). */
function sameRecord(record: WorkerRecord | undefined, discovered: WorkerRecord): boolean {
  if (record === undefined) return false;
  const fields = new Set([...Object.keys(record), ...Object.keys(discovered)] as Array<keyof WorkerRecord>);
  for (const f of fields) if (JSON.stringify(record[f]) !== JSON.stringify(discovered[f])) return false;
  return true;
}

/** What DNS discovery does to a gateway's workers. */
export function discoveryHost(gateway: Gateway, log: (m: string) => void): DnsDiscoveryHost {
  return {
    addWorker: (w) => gateway.addWorker(w),
    // gone from DNS: not recorded as an admin removal (every replica reads the records itself)
    removeWorker: (id) => gateway.removeWorker(id, { record: false }),
    hasWorker: (id) => gateway.connections.has(id),
    claimable: (w) => !gateway.addedByOperator(w.id) && sameRecord(gateway.connections.get(w.id)?.record, w),
    // (asked only as discovery removes a worker: a look through the list is fine there)
    isDraining: (id) => gateway.router.listWorkers().some((w) => w.id === id && w.draining),
    drainWorker: (id) => void gateway.drainWorker(id, true),
    log,
  };
}
