import { EventEmitter } from 'node:events';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { Pool, request as upstreamRequest } from 'undici';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { KVAwareRouter, RouteRequest, RouteResult } from '../core/router.js';
import type { ChatMessage } from '../core/hashing.js';
import { HealthChecker, WorkerHealth } from '../engines/health.js';
import { KvEventApplier } from '../engines/kv-events/applier.js';
import { decodeJsonEvents, KvEventFormatError } from '../engines/kv-events/decode.js';
import { KvEventSubscriber } from '../engines/kv-events/subscriber.js';
import { MetricsScraper } from '../engines/metrics/scraper.js';
import type { PromptTokenizer } from '../engines/chat-tokenizer.js';
import { TokenizerUnavailableError, type AsyncPromptTokenizer } from '../engines/tokenizer-pool.js';
import { MemoryStateStore, type StateStore, type WorkerRecord } from '../state/state-store.js';

/**
 * The HTTP gateway: an OpenAI-compatible routing proxy in front of the engines. Each request
 * is routed with KVAwareRouter.route() from its text or token ids and the metadata of
 * DESIGN.md §5, forwarded to the chosen engine, and streamed back without buffering. The
 * router's in-flight accounting follows the request: prefill until the first upstream byte,
 * decode until the end, released on completion, error or client disconnect.
 */
/** A worker as the gateway takes it (flags, config, admin API) and the replicas share it. */
export type GatewayWorker = WorkerRecord;

export interface GatewayOptions {
  router: KVAwareRouter;
  workers?: GatewayWorker[];
  /** Bearer token for /admin; without one, /admin answers loopback clients only. */
  adminToken?: string;
  bodyLimit?: number;
  /** Attempts on other workers after a connection failure or a 5xx before the first byte. */
  maxRetries?: number;
  upstreamTimeoutMs?: number;
  /** Consecutive failures that open a worker's circuit (default 3), and for how long (5 s). */
  breakerFailures?: number;
  breakerCooldownMs?: number;
  /** Applies KV events posted to /admin/events (the serve command shares it with the subscribers). */
  applier?: KvEventApplier;
  /**
   * How prompts are hashed: `text` (default; UTF-8 chunks of the canonical text), `tokenizer`
   * (token ids from the model's own tokenizer and chat template, in process: `promptTokenizer`)
   * or `engine` (token ids from an available worker's /tokenize). With token ids the blocks
   * match the engines' own, so KV events can feed the index.
   */
  tokenize?: 'text' | 'tokenizer' | 'engine';
  /** In process (blocks the event loop while it works) or a TokenizerPool on worker threads. */
  promptTokenizer?: PromptTokenizer | AsyncPromptTokenizer;
  /** Subscribe to the workers' KV events (their `events` endpoints); needs token ids, so not with `text`. */
  kvEvents?: boolean;
  /** Interval of the load-metrics scrape per worker (default 1000 ms; 0: no scraping). */
  metricsIntervalMs?: number;
  /** Interval of the active health check, GET {url}/health (default 2000 ms; 0: none). */
  healthCheckIntervalMs?: number;
  /** One line per notable event (health changes, event-stream gaps). */
  log?: (message: string) => void;
  /** Shared state for several replicas (default: in memory, this replica only). */
  state?: StateStore;
}

const METADATA_FIELD = 'contextforge';

interface WorkerConnection {
  record: GatewayWorker;
  /** The base URL without a trailing slash. */
  base: string;
  /** Keep-alive connections for the proxied requests. */
  pool: Pool;
  /** The models it serves, when it says. */
  models?: ReadonlySet<string>;
  subscriber?: KvEventSubscriber;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** The body as received: forwarded as is when the router changes nothing in it (no re-serialisation). */
    rawBody?: string;
  }
}

class RequestError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

function openAiError(reply: FastifyReply, status: number, message: string, param: string | null = null): FastifyReply {
  return reply.code(status).send({ error: { message, type: status >= 500 ? 'server_error' : 'invalid_request_error', param, code: null } });
}

export interface Gateway {
  app: FastifyInstance;
  router: KVAwareRouter;
  metrics: Registry;
  /** Who holds which worker out of rotation (health check, metrics scrape, circuit breaker). */
  health: WorkerHealth;
  addWorker(w: GatewayWorker): void;
  removeWorker(id: string): boolean;
  close(): Promise<void>;
}

export async function createGateway(options: GatewayOptions): Promise<Gateway> {
  const { router } = options;
  const applier = options.applier ?? new KvEventApplier(router);
  const tokenizeMode = options.tokenize ?? 'text';
  if (tokenizeMode === 'tokenizer' && !options.promptTokenizer) throw new TypeError("tokenize 'tokenizer' needs a promptTokenizer");
  if (options.kvEvents && tokenizeMode === 'text') throw new RangeError('kvEvents needs token ids: tokenize must be tokenizer or engine');
  const log = options.log ?? (() => {});
  /** Everything the gateway keeps per worker, by id. */
  const connections = new Map<string, WorkerConnection>();
  const health = new WorkerHealth(router, log);
  const metricsIntervalMs = options.metricsIntervalMs ?? 1000;
  const healthCheckIntervalMs = options.healthCheckIntervalMs ?? 2000;
  const scraper = metricsIntervalMs > 0 ? new MetricsScraper(router, [], { intervalMs: metricsIntervalMs, health, log }).start() : undefined;
  const checker = healthCheckIntervalMs > 0 ? new HealthChecker(health, { intervalMs: healthCheckIntervalMs }).start() : undefined;
  const closing: Promise<void>[] = [];
  const state = options.state ?? new MemoryStateStore();
  const app = Fastify({ bodyLimit: options.bodyLimit ?? 16 * 1024 * 1024, logger: false });
  const maxRetries = options.maxRetries ?? 2;
  const timeout = options.upstreamTimeoutMs ?? 300_000;

  const metrics = new Registry();
  const requests = new Counter({ name: 'contextforge_requests_total', help: 'Requests by path and status.', labelNames: ['path', 'status'], registers: [metrics] });
  const decisions = new Counter({ name: 'contextforge_route_decisions_total', help: 'Routing decisions by policy and reason.', labelNames: ['policy', 'reason'], registers: [metrics] });
  const cachedTokens = new Counter({ name: 'contextforge_predicted_cached_tokens_total', help: 'Prompt tokens predicted cached on the chosen worker.', registers: [metrics] });
  const promptTokens = new Counter({ name: 'contextforge_prompt_tokens_total', help: 'Prompt tokens routed (estimated in text mode).', registers: [metrics] });
  const retries = new Counter({ name: 'contextforge_upstream_retries_total', help: 'Requests retried on another worker.', labelNames: ['worker'], registers: [metrics] });
  const ttft = new Histogram({ name: 'contextforge_time_to_first_byte_seconds', help: 'Time to the first upstream byte, as the router sees it.', buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30], registers: [metrics] });
  const latency = new Histogram({ name: 'contextforge_request_duration_seconds', help: 'Request duration through the router.', buckets: [0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120], registers: [metrics] });
  new Gauge({
    name: 'contextforge_worker_kv_usage',
    help: 'KV-cache usage per worker, as last reported.',
    labelNames: ['worker'],
    registers: [metrics],
    collect() {
      this.reset();
      for (const w of router.listWorkers()) this.set({ worker: w.id }, w.load);
    },
  });
  new Gauge({
    name: 'contextforge_worker_in_flight',
    help: "The router's in-flight requests per worker.",
    labelNames: ['worker'],
    registers: [metrics],
    collect() {
      this.reset();
      for (const w of router.listWorkers()) this.set({ worker: w.id }, w.inFlightRequests);
    },
  });
  new Gauge({
    name: 'contextforge_index_entries',
    help: '(block, worker) entries in the block index.',
    registers: [metrics],
    collect() {
      this.set(router.index.entryCount);
    },
  });

  // circuit breaker: a worker that fails `breakerFailures` times in a row gets no requests
  // for `breakerCooldownMs`, then is tried again (one more failure opens it again)
  const breakerFailures = options.breakerFailures ?? 3;
  const breakerCooldownMs = options.breakerCooldownMs ?? 5000;
  const failures = new Map<string, number>();
  const cooldowns = new Set<NodeJS.Timeout>();
  const upstreamFailed = (id: string) => {
    const n = (failures.get(id) ?? 0) + 1;
    failures.set(id, n);
    if (n < breakerFailures || !connections.has(id)) return;
    health.set(id, 'breaker', false, `${n} consecutive failures`);
    failures.set(id, breakerFailures - 1);
    const t = setTimeout(() => {
      cooldowns.delete(t);
      if (connections.has(id)) health.set(id, 'breaker', true);
    }, breakerCooldownMs);
    t.unref();
    cooldowns.add(t);
  };
  const upstreamAnswered = (id: string) => failures.delete(id);
  const breakerOpen = new Counter({ name: 'contextforge_upstream_failures_total', help: 'Connection failures and 5xx before the first byte, per worker.', labelNames: ['worker'], registers: [metrics] });

  const addWorkerLocally = (w: GatewayWorker) => {
    if (typeof w.id !== 'string' || w.id === '') throw new TypeError('worker id must be a non-empty string');
    if (typeof w.url !== 'string' || !/^https?:\/\//.test(w.url)) throw new RangeError(`worker ${w.id}: url must start with http:// or https://`);
    if (w.models !== undefined && (!Array.isArray(w.models) || !w.models.every((m) => typeof m === 'string' && m !== ''))) throw new TypeError(`worker ${w.id}: models must be a list of model names`);
    if (w.events !== undefined && !/^(tcp|ipc):\/\//.test(w.events)) throw new RangeError(`worker ${w.id}: events must be a tcp:// or ipc:// endpoint`);
    if (w.replay !== undefined && (w.events === undefined || !/^(tcp|ipc):\/\//.test(w.replay))) throw new RangeError(`worker ${w.id}: replay must be a tcp:// or ipc:// endpoint, with events`);
    if (w.metrics !== undefined && !/^https?:\/\//.test(w.metrics)) throw new RangeError(`worker ${w.id}: metrics must be an http(s) URL`);
    if (connections.has(w.id)) throw new RangeError(`worker '${w.id}' exists`);
    router.registerWorker(w.id, { url: w.url, claGroups: w.claGroups });
    const base = w.url.replace(/\/+$/, '');
    const record: GatewayWorker = { id: w.id, url: w.url, claGroups: w.claGroups, models: w.models, events: w.events, replay: w.replay, metrics: w.metrics };
    connections.set(w.id, {
      record, base,
      pool: new Pool(base, { connections: 256, keepAliveTimeout: 30_000 }),
      models: w.models ? new Set(w.models) : undefined,
      subscriber: options.kvEvents && w.events ? new KvEventSubscriber({ workerId: w.id, endpoint: w.events, replayEndpoint: w.replay, applier, log }).start() : undefined,
    });
    scraper?.add({ workerId: w.id, url: w.metrics ?? `${base}/metrics` });
    checker?.add(w.id, base);
    return record;
  };
  const addWorker = (w: GatewayWorker) => state.workerAdded(addWorkerLocally(w));
  const removeWorker = (id: string) => {
    const removed = removeWorkerLocally(id);
    if (removed) state.workerRemoved(id);
    return removed;
  };
  const removeWorkerLocally = (id: string) => {
    const c = connections.get(id);
    if (!c) return false;
    connections.delete(id);
    void c.pool.close().catch(() => {}); // lets its in-flight requests finish
    if (c.subscriber) closing.push(c.subscriber.close().catch(() => {}));
    scraper?.remove(id);
    checker?.remove(id);
    health.forget(id);
    failures.delete(id);
    applier.clearWorker(id);
    return router.removeWorker(id);
  };

  /** Workers that list their models and `model` is not among them. */
  const workersWithoutModel = (model: unknown): Set<string> => {
    const out = new Set<string>();
    if (typeof model !== 'string') return out;
    for (const [id, c] of connections) if (c.models && !c.models.has(model)) out.add(id);
    return out;
  };
  for (const w of options.workers ?? []) addWorkerLocally(w);
  await state.attach({
    router,
    listWorkers: () => [...connections.values()].map((c) => c.record),
    addWorkerFromState: (w) => {
      addWorkerLocally(w);
      log(`worker '${w.id}' added by another replica`);
    },
    removeWorkerFromState: (id) => {
      removeWorkerLocally(id);
      log(`worker '${id}' removed by another replica`);
    },
    log,
  });

  /** Token ids of the prompt from an available engine's /tokenize; undefined if none answers (text mode then). */
  const tokenizeOnEngine = async (r: RouteRequest): Promise<number[] | undefined> => {
    if (r.tokens) return r.tokens as number[];
    const body = r.messages ? { messages: r.messages } : { prompt: r.text };
    for (const w of router.listWorkers()) {
      if (!w.available) continue;
      try {
        const res = await upstreamRequest(`${connections.get(w.id)!.base}/tokenize`, { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' }, headersTimeout: 2000, bodyTimeout: 2000 });
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
  };

  // JSON bodies are parsed once and kept as received, so an unchanged body is forwarded
  // without serialising it again; clients that send JSON without saying so (curl -d) are
  // read as JSON too. JSON.parse makes "__proto__" an own key, never the prototype.
  app.decorateRequest('rawBody', undefined);
  const parseJson = (req: FastifyRequest, body: string | Buffer, done: (err: Error | null, body?: unknown) => void) => {
    if (body === '') return done(null, undefined);
    try {
      const parsed: unknown = JSON.parse(body as string);
      req.rawBody = body as string;
      done(null, parsed);
    } catch {
      done(Object.assign(new Error('the body is not valid JSON'), { statusCode: 400 }), undefined);
    }
  };
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, parseJson);
  app.addContentTypeParser('*', { parseAs: 'string' }, parseJson);
  app.setErrorHandler((err: Error & { statusCode?: number }, _req, reply) => {
    const status = err.statusCode && err.statusCode >= 400 && err.statusCode < 600 ? err.statusCode : 500;
    const message = status === 413 ? `request body too large: ${err.message}` : err.message;
    void openAiError(reply, status, message);
  });
  app.setNotFoundHandler((req, reply) => void openAiError(reply, 404, `no route ${req.method} ${req.url}`));
  app.addHook('onResponse', async (req, reply) => {
    requests.inc({ path: req.routeOptions.url ?? 'unknown', status: String(reply.statusCode) });
  });

  // ------------------------------------------------------------------ OpenAI proxy

  /**
   * Reads a request into what to route on (token ids from an engine in `engine` mode) and the
   * body to forward; answers a 4xx and returns undefined when the request is malformed.
   */
  const prepare = async (path: string, req: FastifyRequest, reply: FastifyReply) => {
    let parsed: ReturnType<typeof parseRequest>;
    try {
      parsed = parseRequest(path, req);
    } catch (err) {
      if (err instanceof RequestError || err instanceof RangeError || err instanceof TypeError) {
        void openAiError(reply, err instanceof RequestError ? err.status : 400, err.message, err instanceof RequestError ? err.param : null);
        return undefined;
      }
      throw err;
    }
    if (tokenizeMode === 'engine') {
      const tokens = await tokenizeOnEngine(parsed.routeRequest);
      if (tokens) parsed.routeRequest = { ...parsed.routeRequest, tokens, messages: undefined, text: undefined };
    } else if (tokenizeMode === 'tokenizer' && !parsed.routeRequest.tokens) {
      try {
        const tokens = await options.promptTokenizer!.tokenize(parsed.routeRequest);
        parsed.routeRequest = { ...parsed.routeRequest, tokens, messages: undefined, text: undefined };
      } catch (err) {
        if (err instanceof TokenizerUnavailableError) {
          reply.header('retry-after', '1');
          void openAiError(reply, 503, err.message);
          return undefined;
        }
        // a template that rejects the conversation (roles out of order, say) is the client's to fix
        void openAiError(reply, 400, `the chat template rejected the request: ${(err as Error).message}`, 'messages');
        return undefined;
      }
    }
    return parsed;
  };

  const proxy = (path: '/v1/completions' | '/v1/chat/completions') => async (req: FastifyRequest, reply: FastifyReply) => {
    const prepared = await prepare(path, req, reply);
    if (!prepared) return reply;
    const { routeRequest, body, unchanged } = prepared;
    const started = performance.now();
    const excluded = workersWithoutModel(body.model);
    if (excluded.size > 0 && excluded.size === connections.size) {
      return reply.code(404).send({ error: { message: `The model '${String(body.model)}' does not exist on any worker`, type: 'invalid_request_error', param: 'model', code: 'model_not_found' } });
    }
    const learning = state.beforeRoute(routeRequest);
    if (learning) await learning;
    const share = state.sharesDecisions;
    const release = (decision: RouteResult) => {
      router.release(decision.ticket);
      if (decision.shared) state.decisionEnded(decision.shared);
    };
    for (let attempt = 0; ; attempt++) {
      const decision = router.route(routeRequest, { exclude: excluded, share });
      if (decision.workerId === '') {
        reply.header('retry-after', '1');
        return openAiError(reply, 503, 'no worker can take the request now');
      }
      decisions.inc({ policy: decision.policy, reason: decision.reason });
      if (decision.shared) state.decisionMade(decision.shared);
      const forwarded = decision.cacheSalt
        ? JSON.stringify({ ...body, cache_salt: decision.cacheSalt })
        : unchanged && req.rawBody !== undefined ? req.rawBody : JSON.stringify(body);
      const outcome = await forward(reply, connections.get(decision.workerId)!.pool, path, forwarded, decision, timeout, (seconds) => {
        ttft.observe(seconds);
        router.markPrefillDone(decision.ticket);
      });
      if (outcome === 'retry') {
        upstreamFailed(decision.workerId);
        breakerOpen.inc({ worker: decision.workerId });
      } else upstreamAnswered(decision.workerId);
      if (outcome === 'retry' && attempt < maxRetries && !reply.raw.destroyed) {
        release(decision);
        excluded.add(decision.workerId);
        retries.inc({ worker: decision.workerId });
        await new Promise((r) => setTimeout(r, 25 * (attempt + 1)));
        continue;
      }
      release(decision);
      if (outcome === 'retry') {
        reply.header('retry-after', '1');
        return openAiError(reply, 502, `the engines failed to answer (last: ${decision.workerId})`);
      }
      cachedTokens.inc(decision.cachedTokens);
      promptTokens.inc(decision.promptTokens);
      latency.observe((performance.now() - started) / 1000);
      return reply;
    }
  };
  app.post('/v1/completions', proxy('/v1/completions'));
  app.post('/v1/chat/completions', proxy('/v1/chat/completions'));

  app.post('/v1/route', async (req, reply) => {
    const path = (req.body as { messages?: unknown } | null)?.messages !== undefined ? '/v1/chat/completions' : '/v1/completions';
    const prepared = await prepare(path, req, reply);
    if (!prepared) return reply;
    const { routeRequest } = prepared;
    const r = router.route(routeRequest, { dryRun: true, explain: true, exclude: workersWithoutModel(prepared.body.model) });
    return { worker: r.workerId, cachedTokens: r.cachedTokens, confidence: r.confidence, policy: r.policy, reason: r.reason, promptTokens: r.promptTokens, explain: r.explain };
  });

  app.get('/v1/models', async () => {
    const seen = new Map<string, unknown>();
    await Promise.all(
      router.listWorkers().filter((w) => w.available).map(async (w) => {
        try {
          const res = await upstreamRequest(`${connections.get(w.id)!.base}/v1/models`, { headersTimeout: 2000, bodyTimeout: 2000 });
          if (res.statusCode !== 200) return void (await res.body.dump());
          const list = (await res.body.json()) as { data?: Array<{ id: string }> };
          for (const m of list.data ?? []) if (!seen.has(m.id)) seen.set(m.id, m);
        } catch {
          // an engine that does not answer contributes nothing
        }
      }),
    );
    return { object: 'list', data: [...seen.values()] };
  });

  // --------------------------------------------------------------- health, metrics

  app.get('/healthz', async () => ({ status: 'ok' }));
  app.get('/readyz', async (_req, reply) => {
    const available = router.listWorkers().filter((w) => w.available).length;
    return reply.code(available > 0 ? 200 : 503).send({ status: available > 0 ? 'ready' : 'no available worker', availableWorkers: available });
  });
  app.get('/metrics', async (_req, reply) => reply.type(metrics.contentType).send(await metrics.metrics()));

  // ------------------------------------------------------------------------- admin

  app.register(async (admin) => {
    admin.addHook('onRequest', async (req, reply) => {
      if (options.adminToken) {
        if (req.headers.authorization !== `Bearer ${options.adminToken}`) return openAiError(reply, 401, 'admin endpoints need the bearer token');
      } else if (!isLoopback(req.ip)) {
        return openAiError(reply, 403, 'admin endpoints answer loopback clients only when no admin token is set');
      }
    });
    admin.get('/admin/workers', async () => ({
      workers: router.listWorkers().map((w) => {
        const c = connections.get(w.id);
        return {
          id: w.id, url: c?.base, healthy: w.healthy, outOfRotation: health.reasons(w.id), draining: w.draining, kvUsage: w.load,
          models: c?.record.models ?? null, kvEvents: c?.subscriber?.stats ?? null,
          inFlightRequests: w.inFlightRequests, waitingRequests: w.waitingRequests, runningRequests: w.runningRequests,
          indexEntries: router.index.entriesFor(w.slot), claGroups: [...w.claGroups],
        };
      }),
    }));
    admin.post('/admin/workers', async (req, reply) => {
      const b = req.body as Partial<GatewayWorker> | null;
      if (!b || typeof b.id !== 'string' || b.id === '' || typeof b.url !== 'string') return openAiError(reply, 400, 'a worker needs a string id and url');
      if (connections.has(b.id)) return openAiError(reply, 409, `worker '${b.id}' exists`);
      try {
        addWorker({ id: b.id, url: b.url, claGroups: b.claGroups, models: b.models, events: b.events, replay: b.replay, metrics: b.metrics });
      } catch (err) {
        if (err instanceof RangeError || err instanceof TypeError) return openAiError(reply, 400, err.message);
        throw err;
      }
      return reply.code(201).send({ id: b.id });
    });
    admin.delete('/admin/workers/:id', async (req, reply) => {
      const { id } = req.params as { id: string };
      return removeWorker(id) ? { removed: id } : openAiError(reply, 404, `no worker '${id}'`);
    });
    admin.post('/admin/workers/:id/drain', async (req, reply) => {
      const { id } = req.params as { id: string };
      if (!connections.has(id)) return openAiError(reply, 404, `no worker '${id}'`);
      router.drainWorker(id);
      return { draining: id };
    });
    admin.post('/admin/workers/:id/resume', async (req, reply) => {
      const { id } = req.params as { id: string };
      if (!connections.has(id)) return openAiError(reply, 404, `no worker '${id}'`);
      router.resumeWorker(id);
      return { resumed: id };
    });
    admin.get('/admin/stats', async () => ({ ...router.getStats(), state: state.stats() }));
    // KV events as JSON, for engines that cannot publish over ZeroMQ: vLLM's field names
    admin.post('/admin/events', async (req, reply) => {
      const b = req.body as { worker?: unknown; events?: unknown } | null;
      if (!b || typeof b.worker !== 'string' || !connections.has(b.worker)) return openAiError(reply, 400, 'events need the id of a known worker in "worker"', 'worker');
      try {
        const batch = decodeJsonEvents(b.events);
        return { applied: applier.apply(b.worker, batch) };
      } catch (err) {
        if (err instanceof KvEventFormatError) return openAiError(reply, 400, err.message, 'events');
        throw err;
      }
    });
  });

  await app.ready();
  return {
    app, router, metrics, health, addWorker, removeWorker,
    close: async () => {
      for (const t of cooldowns) clearTimeout(t);
      scraper?.stop();
      checker?.stop();
      await app.close();
      await Promise.all([...connections.values()].map((c) => c.pool.destroy()));
      await Promise.all([...connections.values()].map((c) => c.subscriber?.close()));
      await Promise.all(closing);
      await state.close();
    },
  };
}

function isLoopback(ip: string): boolean {
  return ip === '127.0.0.1' || ip === '::1' || ip === '::ffff:127.0.0.1' || ip.startsWith('127.');
}

/** Reads the request: what to route on, and the body to forward (metadata field removed). */
function parseRequest(path: string, req: FastifyRequest): { routeRequest: RouteRequest; body: Record<string, unknown>; unchanged: boolean } {
  const raw = req.body;
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new RequestError(400, 'the body must be a JSON object');
  const { [METADATA_FIELD]: meta, ...body } = raw as Record<string, unknown>;
  if (meta !== undefined && (meta === null || typeof meta !== 'object' || Array.isArray(meta))) throw new RequestError(400, `"${METADATA_FIELD}" must be an object`, METADATA_FIELD);
  const m = (meta ?? {}) as Record<string, unknown>;
  const h = req.headers;
  const header = (name: string) => (typeof h[name] === 'string' ? (h[name] as string) : undefined);
  const int = (v: unknown, name: string): number | undefined => {
    if (v === undefined) return undefined;
    const n = typeof v === 'string' ? Number(v) : v;
    if (typeof n !== 'number' || !Number.isInteger(n) || n < 0) throw new RequestError(400, `${name} must be a non-negative integer`, name);
    return n;
  };
  const anchorsRaw = m.anchors ?? header('x-anchor-ids')?.split(',').map((s) => s.trim()).filter(Boolean);
  let contentAnchors: RouteRequest['contentAnchors'];
  if (anchorsRaw !== undefined) {
    if (!Array.isArray(anchorsRaw)) throw new RequestError(400, 'anchors must be a list', 'anchors');
    contentAnchors = anchorsRaw.map((a) => {
      if (typeof a === 'string') {
        const [id, tokens] = a.split(':');
        return { id, tokens: tokens === undefined ? 0 : int(tokens, 'x-anchor-ids tokens')! };
      }
      return a as { id: string; tokens: number };
    });
  }
  const isolate = m.isolate === true || header('x-kv-isolate') === '1' || header('x-kv-isolate') === 'true';
  const routeRequest: RouteRequest = {
    workflowId: (m.workflowId as string | undefined) ?? header('x-workflow-id'),
    workflowStep: int(m.workflowStep ?? header('x-workflow-step'), 'x-workflow-step') ?? null,
    agentRole: (m.agentRole as string | undefined) ?? header('x-agent-role'),
    claGroup: int(m.claGroup ?? header('x-cla-group'), 'x-cla-group') ?? null,
    contentAnchors,
    isolate: isolate || undefined,
  };
  if (typeof body.cache_salt === 'string') routeRequest.cacheSalt = body.cache_salt;
  if (path === '/v1/chat/completions') {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0) throw new RequestError(400, 'messages must be a non-empty array', 'messages');
    messages.forEach((msg, i) => {
      if (msg === null || typeof msg !== 'object' || typeof (msg as ChatMessage).role !== 'string') throw new RequestError(400, `messages[${i}] must have a string role`, 'messages');
    });
    routeRequest.messages = messages as ChatMessage[];
  } else {
    const prompt = body.prompt;
    const first = Array.isArray(prompt) && prompt.length > 0 && (typeof prompt[0] === 'string' || Array.isArray(prompt[0])) ? prompt[0] : prompt;
    if (typeof first === 'string') routeRequest.text = first;
    else if (Array.isArray(first) && first.every((t) => Number.isInteger(t) && t >= 0)) routeRequest.tokens = first as number[];
    else throw new RequestError(400, 'prompt must be a string, a list of strings, token ids, or a list of token-id lists', 'prompt');
  }
  return { routeRequest, body, unchanged: meta === undefined };
}

/**
 * Sends the request to one engine and passes its answer to the client: a stream chunk by
 * chunk, a complete JSON answer in one write with its length. Returns 'retry' when the engine
 * failed before anything reached the client (connection error, 5xx, a JSON answer cut
 * short), so the caller can try another worker; 'done' otherwise (a failure after the first
 * byte to the client ends an SSE stream with an OpenAI-style error event).
 */
async function forward(
  reply: FastifyReply,
  pool: Pool,
  path: string,
  body: string,
  decision: RouteResult,
  timeout: number,
  onFirstByte: (seconds: number) => void,
): Promise<'done' | 'retry'> {
  // undici takes an EventEmitter as the abort signal: cheaper per request than an AbortController
  const abort = new EventEmitter();
  let aborted = false;
  const res = reply.raw;
  // the response closing before it finished means the client went away (a request's own
  // 'close' only says its body was read)
  const onClientGone = () => {
    if (res.writableFinished) return;
    aborted = true;
    abort.emit('abort');
  };
  res.once('close', onClientGone);
  const started = performance.now();
  let upstream;
  try {
    upstream = await pool.request({
      path,
      method: 'POST',
      body,
      headers: JSON_HEADERS,
      signal: abort,
      headersTimeout: timeout,
      bodyTimeout: timeout,
    });
  } catch {
    res.off('close', onClientGone);
    // a client that went away aborted the request: not the engine's failure, nothing to retry
    return aborted ? 'done' : 'retry';
  }
  if (upstream.statusCode >= 500) {
    await upstream.body.dump().catch(() => {});
    res.off('close', onClientGone);
    return 'retry';
  }
  const contentType = String(upstream.headers['content-type'] ?? 'application/json');
  const streaming = contentType.includes('event-stream');
  const headers: Record<string, string> = {
    'content-type': contentType,
    'x-contextforge-worker': decision.workerId,
    'x-contextforge-cached-tokens': String(Math.round(decision.cachedTokens)),
  };
  let first = true;
  try {
    if (!streaming && upstream.headers['content-length'] !== undefined) {
      // a complete JSON answer of known size: sent in one write with its length, not chunked
      const chunks: Buffer[] = [];
      for await (const chunk of upstream.body) {
        if (first) {
          first = false;
          onFirstByte((performance.now() - started) / 1000);
        }
        chunks.push(chunk as Buffer);
      }
      const payload = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
      headers['content-length'] = String(payload.length);
      reply.hijack();
      res.writeHead(upstream.statusCode, headers);
      res.end(payload);
      return 'done';
    }
    if (streaming) headers['cache-control'] = 'no-cache';
    reply.hijack();
    res.writeHead(upstream.statusCode, headers);
    for await (const chunk of upstream.body) {
      if (first) {
        first = false;
        onFirstByte((performance.now() - started) / 1000);
      }
      if (!res.write(chunk)) await new Promise((r) => res.once('drain', r));
    }
    res.end();
  } catch (err) {
    if (!res.headersSent) {
      // the engine failed before anything reached the client: another worker can answer
      if (!aborted) return 'retry';
      res.end();
    } else {
      if (!aborted && streaming) {
        res.write(`data: ${JSON.stringify({ error: { message: `the engine failed mid-stream: ${(err as Error).message}`, type: 'server_error', code: null } })}\n\n`);
      }
      res.end();
    }
  } finally {
    res.off('close', onClientGone);
  }
  return 'done';
}

const JSON_HEADERS = { 'content-type': 'application/json' };
