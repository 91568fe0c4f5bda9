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
import { checkApiKeyEnv, checkHttpUrl, checkWorkerId, checkZmqEndpoint, engineAuthorization, splitCredentials } from './worker-input.js';

export interface WorkerConnection {
  record: WorkerRecord;
  /** The base URL without a trailing slash. */
  base: string;
  /** Keep-alive connections for the proxied requests. */
  pool: Pool;
  /** The models it serves, when it says. */
  models?: ReadonlySet<string>;
  subscriber?: KvEventSubscriber;
  /** Headers of every request to the engine (its API key, or the credentials of its URL). */
  headers: Record<string, string>;
  /** Give-ups of its requests that have sent nothing to their client yet: called when it leaves rotation, they move elsewhere. */
  unanswered: Set<() => void>;
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
  /** Where workers' `apiKeyEnv` variables are read. */
  env: NodeJS.ProcessEnv;
}

export class WorkerConnections {
  /** Everything the gateway keeps per worker, by id. */
  private readonly connections = new Map<string, WorkerConnection>();
  private readonly scraper?: MetricsScraper;
  private readonly checker?: HealthChecker;
  /** Subscribers of removed workers, still closing. */
  private readonly closing: Promise<void>[] = [];
  /** Workers their health check holds out: they may come back as a new process with an empty cache. */
  private readonly mayHaveRestarted = new Set<string>();

  constructor(private readonly options: WorkerConnectionsOptions) {
    const { router, health, log, metricsIntervalMs, healthCheckIntervalMs } = options;
    this.scraper = metricsIntervalMs > 0 ? new MetricsScraper(router, [], { intervalMs: metricsIntervalMs, health, log }).start() : undefined;
    // a probe's timeout is at least half a second, so a busy engine (or router) is not taken for a dead one
    this.checker = healthCheckIntervalMs > 0 ? new HealthChecker(health, { intervalMs: healthCheckIntervalMs, timeoutMs: Math.min(2000, Math.max(500, healthCheckIntervalMs)) }).start() : undefined;
    health.onChange((id, available, detail) => (available ? this.backInRotation(id) : this.outOfRotation(id, detail)));
    this.slowProbeGraceMs = Math.max(1000, 2 * healthCheckIntervalMs);
  }

  private readonly slowProbeGraceMs: number;
  private readonly graceTimers = new Set<NodeJS.Timeout>();

  /**
   * A worker left rotation: the requests it has not answered at all move to other workers
   * (nothing reached their clients). When only its probes were too slow (a busy engine answers
   * /health late too), they move only if it is still out a grace period later: a loaded engine
   * must not have its whole queue thrown onto the others. Engines announce no AllBlocksCleared
   * when they start, so one its health check holds out is remembered as possibly restarted.
   */
  private outOfRotation(id: string, detail: string): void {
    if (this.options.health.reasons(id).includes('health-check')) this.mayHaveRestarted.add(id);
    const giveUpAll = () => {
      const c = this.connections.get(id);
      if (c && this.options.health.reasons(id).length > 0) for (const giveUp of [...c.unanswered]) giveUp();
    };
    if (!/time(d)? ?out|aborted/i.test(detail)) return giveUpAll();
    const t = setTimeout(() => {
      this.graceTimers.delete(t);
      giveUpAll();
    }, this.slowProbeGraceMs);
    t.unref();
    this.graceTimers.add(t);
  }

  /** Back in rotation after its health check held it out: what the index says it holds is forgotten. */
  private backInRotation(id: string): void {
    if (!this.mayHaveRestarted.delete(id) || !this.connections.has(id)) return;
    this.options.applier.clearWorker(id);
    this.options.log(`${id}: index entries dropped (it was unreachable and may have restarted)`);
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
    checkWorkerId(w.id);
    checkHttpUrl(w.url, `worker ${w.id}: url`);
    if (w.models !== undefined && (!Array.isArray(w.models) || w.models.length > 1024 || !w.models.every((m) => typeof m === 'string' && m !== '' && m.length <= 512))) throw new TypeError(`worker ${w.id}: models must be a list of model names`);
    if (w.claGroups !== undefined && (!Array.isArray(w.claGroups) || w.claGroups.length > 1024 || !w.claGroups.every((g) => Number.isSafeInteger(g) && g >= 0))) throw new TypeError(`worker ${w.id}: claGroups must be a list of non-negative integers`);
    if (w.events !== undefined) checkZmqEndpoint(w.events, `worker ${w.id}: events`);
    if (w.replay !== undefined) {
      if (w.events === undefined) throw new RangeError(`worker ${w.id}: replay needs events`);
      checkZmqEndpoint(w.replay, `worker ${w.id}: replay`);
    }
    if (w.metrics !== undefined) checkHttpUrl(w.metrics, `worker ${w.id}: metrics`);
    let apiKey: string | undefined;
    if (w.apiKeyEnv !== undefined) {
      apiKey = this.options.env[checkApiKeyEnv(w.apiKeyEnv, `worker ${w.id}: apiKeyEnv`)];
      if (!apiKey) throw new RangeError(`worker ${w.id}: the environment variable ${w.apiKeyEnv} (its engine API key) is not set`);
    }
    if (this.connections.has(w.id)) throw new RangeError(`worker '${w.id}' exists`);
    router.registerWorker(w.id, { url: w.url, claGroups: w.claGroups });
    // credentials in the URL travel as a Basic authorization header (an engine key wins)
    const plain = splitCredentials(w.url);
    const base = plain.url.replace(/\/+$/, '');
    const record: WorkerRecord = { id: w.id, url: w.url, claGroups: w.claGroups, models: w.models, events: w.events, replay: w.replay, metrics: w.metrics };
    if (w.apiKeyEnv !== undefined) record.apiKeyEnv = w.apiKeyEnv;
    const authorization = engineAuthorization(apiKey) ?? plain.authorization;
    this.connections.set(w.id, {
      record, base,
      headers: authorization ? { 'content-type': 'application/json', authorization } : { 'content-type': 'application/json' },
      unanswered: new Set(),
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
    this.mayHaveRestarted.delete(id);
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
        const c = this.connections.get(w.id)!;
        const res = await upstreamRequest(`${c.base}/tokenize`, { method: 'POST', body: JSON.stringify(body), headers: c.headers, headersTimeout: 2000, bodyTimeout: 2000 });
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
    for (const t of this.graceTimers) clearTimeout(t);
  }

  /** Stops polling, drops every pool and waits for the subscribers to close. */
  async close(): Promise<void> {
    this.stopPolling();
    await Promise.all([...this.connections.values()].map((c) => c.pool.destroy()));
    await Promise.all([...this.connections.values()].map((c) => c.subscriber?.close()));
    await Promise.all(this.closing);
  }
}
