/**
 * The gateway's workers and everything it keeps per worker: the undici pool the proxied
 * requests use, the KV-event subscriber, the metrics scrape and the active health check.
 * Adding a worker registers it with the router and starts all of them; removing it stops
 * them and forgets what the router and the event applier recorded about it.
 */
import { Pool, request as upstreamRequest } from 'undici';
import type { KVAwareRouter, RouteRequest } from '../core/router/index.js';
import { HealthChecker, type WorkerHealth } from '../engines/health.js';
import type { KvEventApplier } from '../engines/kv-events/applier.js';
import { KvEventSubscriber } from '../engines/kv-events/subscriber.js';
import { MetricsScraper } from '../engines/metrics/scraper.js';
import type { WorkerRecord } from '../state/state-store.js';

export interface WorkerConnection {
  record: WorkerRecord;
  /** The base URL without a trailing slash. */
  base: string;
  /** Keep-alive connections for the proxied requests. */
  pool: Pool;
  /** The models it serves, when it says. */
  models?: ReadonlySet<string>;
  subscriber?: KvEventSubscriber;
}

export interface WorkerConnectionsOptions {
  router: KVAwareRouter;
  applier: KvEventApplier;
  health: WorkerHealth;
  /** Subscribe to the workers' KV events (their `events` endpoints). */
  kvEvents?: boolean;
  /** Interval of the load-metrics scrape per worker (0: no scraping). */
  metricsIntervalMs: number;
  /** Interval of the active health check (0: none). */
  healthCheckIntervalMs: number;
  log: (message: string) => void;
}

export class WorkerConnections {
  /** Everything the gateway keeps per worker, by id. */
  private readonly connections = new Map<string, WorkerConnection>();
  private readonly scraper?: MetricsScraper;
  private readonly checker?: HealthChecker;
  /** Subscribers of removed workers, still closing. */
  private readonly closing: Promise<void>[] = [];

  constructor(private readonly options: WorkerConnectionsOptions) {
    const { router, health, log, metricsIntervalMs, healthCheckIntervalMs } = options;
    this.scraper = metricsIntervalMs > 0 ? new MetricsScraper(router, [], { intervalMs: metricsIntervalMs, health, log }).start() : undefined;
    this.checker = healthCheckIntervalMs > 0 ? new HealthChecker(health, { intervalMs: healthCheckIntervalMs }).start() : undefined;
  }

  get size(): number {
    return this.connections.size;
  }

  has(id: string): boolean {
    return this.connections.has(id);
  }

  get(id: string): WorkerConnection | undefined {
    return this.connections.get(id);
  }

  /** The workers as configured, for the shared state. */
  records(): WorkerRecord[] {
    return [...this.connections.values()].map((c) => c.record);
  }

  /** Checks a worker's settings, registers it and starts its pool, subscriber, scrape and check. */
  add(w: WorkerRecord): WorkerRecord {
    const { router, applier, log } = this.options;
    if (typeof w.id !== 'string' || w.id === '') throw new TypeError('worker id must be a non-empty string');
    if (typeof w.url !== 'string' || !/^https?:\/\//.test(w.url)) throw new RangeError(`worker ${w.id}: url must start with http:// or https://`);
    if (w.models !== undefined && (!Array.isArray(w.models) || !w.models.every((m) => typeof m === 'string' && m !== ''))) throw new TypeError(`worker ${w.id}: models must be a list of model names`);
    if (w.events !== undefined && !/^(tcp|ipc):\/\//.test(w.events)) throw new RangeError(`worker ${w.id}: events must be a tcp:// or ipc:// endpoint`);
    if (w.replay !== undefined && (w.events === undefined || !/^(tcp|ipc):\/\//.test(w.replay))) throw new RangeError(`worker ${w.id}: replay must be a tcp:// or ipc:// endpoint, with events`);
    if (w.metrics !== undefined && !/^https?:\/\//.test(w.metrics)) throw new RangeError(`worker ${w.id}: metrics must be an http(s) URL`);
    if (this.connections.has(w.id)) throw new RangeError(`worker '${w.id}' exists`);
    router.registerWorker(w.id, { url: w.url, claGroups: w.claGroups });
    const base = w.url.replace(/\/+$/, '');
    const record: WorkerRecord = { id: w.id, url: w.url, claGroups: w.claGroups, models: w.models, events: w.events, replay: w.replay, metrics: w.metrics };
    this.connections.set(w.id, {
      record, base,
      pool: new Pool(base, { connections: 256, keepAliveTimeout: 30_000 }),
      models: w.models ? new Set(w.models) : undefined,
      subscriber: this.options.kvEvents && w.events ? new KvEventSubscriber({ workerId: w.id, endpoint: w.events, replayEndpoint: w.replay, applier, log }).start() : undefined,
    });
    this.scraper?.add({ workerId: w.id, url: w.metrics ?? `${base}/metrics` });
    this.checker?.add(w.id, base);
    return record;
  }

  /** Stops everything kept for the worker and removes it from the router. False when unknown. */
  remove(id: string): boolean {
    const c = this.connections.get(id);
    if (!c) return false;
    this.connections.delete(id);
    void c.pool.close().catch(() => {}); // lets its in-flight requests finish
    if (c.subscriber) this.closing.push(c.subscriber.close().catch(() => {}));
    this.scraper?.remove(id);
    this.checker?.remove(id);
    this.options.health.forget(id);
    this.options.applier.clearWorker(id);
    return this.options.router.removeWorker(id);
  }

  /** Workers that list their models and `model` is not among them. */
  withoutModel(model: unknown): Set<string> {
    const out = new Set<string>();
    if (typeof model !== 'string') return out;
    for (const [id, c] of this.connections) if (c.models && !c.models.has(model)) out.add(id);
    return out;
  }

  /** Token ids of the prompt from an available engine's /tokenize; undefined if none answers. */
  async tokenizeOnEngine(r: RouteRequest): Promise<number[] | undefined> {
    if (r.tokens) return r.tokens as number[];
    const body = r.messages ? { messages: r.messages } : { prompt: r.text };
    for (const w of this.options.router.listWorkers()) {
      if (!w.available) continue;
      try {
        const res = await upstreamRequest(`${this.connections.get(w.id)!.base}/tokenize`, { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' }, headersTimeout: 2000, bodyTimeout: 2000 });
        if (res.statusCode !== 200) {
          await res.body.dump();
          continue;
        }
        const out = (await res.body.json()) as { tokens?: unknown };
        if (Array.isArray(out.tokens)) return out.tokens as number[];
      } catch {
        // try the next worker
      }
    }
    return undefined;
  }

  /** Stops the metrics scrapes and health checks (first step of closing the gateway). */
  stopPolling(): void {
    this.scraper?.stop();
    this.checker?.stop();
  }

  /** Stops polling, drops every pool and waits for the subscribers to close. */
  async close(): Promise<void> {
    this.stopPolling();
    await Promise.all([...this.connections.values()].map((c) => c.pool.destroy()));
    await Promise.all([...this.connections.values()].map((c) => c.subscriber?.close()));
    await Promise.all(this.closing);
  }
}
