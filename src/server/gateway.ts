import { EventEmitter } from 'node:events';
import { createServer as createHttpServer } from 'node:http';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { Pool, request as upstreamRequest } from 'undici';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { KVAwareRouter, RouteRequest, RouteResult } from '../core/router.js';
import { HealthChecker, WorkerHealth } from '../engines/health.js';
import { KvEventApplier } from '../engines/kv-events/applier.js';
import { decodeJsonEvents, KvEventFormatError } from '../engines/kv-events/decode.js';
import { KvEventSubscriber } from '../engines/kv-events/subscriber.js';
import { MetricsScraper } from '../engines/metrics/scraper.js';
import type { PromptTokenizer } from '../engines/chat-tokenizer.js';
import { MemoryStateStore, type StateStore, type WorkerRecord } from '../state/state-store.js';
import { adminRequestProblem, AdminToken, generateToken } from './admin-auth.js';
import { tenantCacheSalt, type ApiKeys } from './api-keys.js';
import { checkRequestLimits, clientMessage, parseJsonBody, readRouteRequest, RequestLimitError, type ReadRequest, type RequestLimits } from './request-limits.js';
import { checkTimeouts, FirstByteDeadlines, type GatewayTimeouts } from './timeouts.js';
import { checkApiKeyEnv, checkHttpUrl, checkWorkerId, checkZmqEndpoint, engineAuthorization, redactUrl, splitCredentials } from './worker-input.js';

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
  /**
   * Bearer token for /admin (and /v1/route unless `publicRouteApi`); without one a random token
   * is made, readable as `gateway.adminToken`. Loopback clients get no exemption.
   */
  adminToken?: string;
  /** Answer /v1/route without the admin token (it shows what is cached where). */
  publicRouteApi?: boolean;
  /** Client API keys → tenants: requests then need a key, and tenants never share KV. */
  apiKeys?: ApiKeys;
  /** Add `x-contextforge-cached-tokens` to proxied responses (it shows what is cached). */
  cachedTokensHeader?: boolean;
  /** Limits on what a client controls (ids, anchors, JSON depth). */
  limits?: Partial<RequestLimits>;
  /** Client-side and engine-side timeouts (timeouts.ts). */
  timeouts?: Partial<GatewayTimeouts>;
  /** Where workers' `apiKeyEnv` variables are read (default process.env). */
  env?: NodeJS.ProcessEnv;
  bodyLimit?: number;
  /** Attempts on other workers after a connection failure or a 5xx before the first byte. */
  maxRetries?: number;
  /** The inter-chunk timeout (timeouts.interChunkTimeoutMs wins when both are given). */
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
  promptTokenizer?: PromptTokenizer;
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


interface WorkerConnection {
  record: GatewayWorker;
  /** The base URL without a trailing slash. */
  base: string;
  /** Keep-alive connections for the proxied requests. */
  pool: Pool;
  /** The models it serves, when it says. */
  models?: ReadonlySet<string>;
  subscriber?: KvEventSubscriber;
  /** Headers of every request to the engine (its API key, when it has one). */
  headers: Record<string, string>;
  /** Aborts of its requests that have sent nothing to their client yet (retried elsewhere when it leaves rotation). */
  unanswered: Set<() => void>;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** The body as received: forwarded as is when the router changes nothing in it (no re-serialisation). */
    rawBody?: string;
    /** The tenant of the request's API key (with --api-keys-file). */
    tenant?: string;
  }
}


function openAiError(reply: FastifyReply, status: number, message: string, param: string | null = null, code: string | null = null): FastifyReply {
  return reply.code(status).send({ error: { message, type: status >= 500 ? 'server_error' : status === 401 ? 'authentication_error' : 'invalid_request_error', param, code } });
}

export interface Gateway {
  app: FastifyInstance;
  router: KVAwareRouter;
  metrics: Registry;
  /** The admin bearer token (the configured one, or the one made at start). */
  adminToken: string;
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
  const checker = healthCheckIntervalMs > 0 ? new HealthChecker(health, { intervalMs: healthCheckIntervalMs, timeoutMs: Math.min(2000, Math.max(500, healthCheckIntervalMs)) }).start() : undefined;
  const closing: Promise<void>[] = [];
  const state = options.state ?? new MemoryStateStore();
  const limits = checkRequestLimits(options.limits);
  const timeouts = checkTimeouts({ interChunkTimeoutMs: options.upstreamTimeoutMs, ...options.timeouts });
  const adminTokenText = options.adminToken ?? generateToken();
  const adminToken = new AdminToken(adminTokenText);
  const env = options.env ?? process.env;
  const app = Fastify({
    bodyLimit: options.bodyLimit ?? 16 * 1024 * 1024,
    logger: false,
    connectionTimeout: timeouts.connectionTimeoutMs,
    // slow clients: the headers and the whole request must arrive in time (checked every second)
    serverFactory: (handler) =>
      createHttpServer({ headersTimeout: Math.min(timeouts.headersTimeoutMs, timeouts.requestTimeoutMs), requestTimeout: timeouts.requestTimeoutMs, connectionsCheckingInterval: Math.min(1000, timeouts.headersTimeoutMs) }, handler),
  });
  const maxRetries = options.maxRetries ?? 2;
  const firstByte = new FirstByteDeadlines(timeouts.firstByteTimeoutMs, timeouts.interChunkTimeoutMs);
  const cachedTokensHeader = options.cachedTokensHeader === true;
  // a worker leaving rotation (health check, scrape, breaker) gives up the requests it has not
  // answered at all: they are retried elsewhere, as nothing reached their clients
  // a worker its health check held out may come back as a new process with an empty cache
  // (engines announce no AllBlocksCleared on start): what the index says it holds is forgotten
  const mayHaveRestarted = new Set<string>();
  health.onChange((id, available) => {
    if (available) {
      if (mayHaveRestarted.delete(id) && connections.has(id)) {
        applier.clearWorker(id);
        log(`${id}: index entries dropped (it was unreachable and may have restarted)`);
      }
      return;
    }
    if (health.reasons(id).includes('health-check')) mayHaveRestarted.add(id);
    const c = connections.get(id);
    if (c) for (const giveUp of [...c.unanswered]) giveUp();
  });

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
      apiKey = env[checkApiKeyEnv(w.apiKeyEnv, `worker ${w.id}: apiKeyEnv`)];
      if (!apiKey) throw new RangeError(`worker ${w.id}: the environment variable ${w.apiKeyEnv} (its engine API key) is not set`);
    }
    if (connections.has(w.id)) throw new RangeError(`worker '${w.id}' exists`);
    router.registerWorker(w.id, { url: w.url, claGroups: w.claGroups });
    // credentials in the URL travel as a Basic authorization header (an engine key wins)
    const plain = splitCredentials(w.url);
    const base = plain.url.replace(/\/+$/, '');
    const record: GatewayWorker = { id: w.id, url: w.url, claGroups: w.claGroups, models: w.models, events: w.events, replay: w.replay, metrics: w.metrics };
    if (w.apiKeyEnv !== undefined) record.apiKeyEnv = w.apiKeyEnv;
    const authorization = engineAuthorization(apiKey) ?? plain.authorization;
    connections.set(w.id, {
      record, base,
      headers: authorization ? { 'content-type': 'application/json', authorization } : { 'content-type': 'application/json' },
      unanswered: new Set(),
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
    firstByte.forget(id);
    mayHaveRestarted.delete(id);
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
        const c = connections.get(w.id)!;
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
  };

  // JSON bodies are parsed once and kept as received, so an unchanged body is forwarded
  // without serialising it again; clients that send JSON without saying so (curl -d) are
  // read as JSON too. JSON.parse makes "__proto__" an own key, never the prototype.
  app.decorateRequest('rawBody', undefined);
  const parseJson = (req: FastifyRequest, body: string | Buffer, done: (err: Error | null, body?: unknown) => void) => {
    if (body === '') return done(null, undefined);
    try {
      // the nesting depth is checked before parsing: a 10,000-deep body is a 400, not a stack overflow
      const parsed: unknown = parseJsonBody(body as string, limits.maxJsonDepth);
      req.rawBody = body as string;
      done(null, parsed);
    } catch (err) {
      done(err instanceof RequestLimitError ? err : Object.assign(new Error('the body is not valid JSON'), { statusCode: 400 }), undefined);
    }
  };
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, parseJson);
  app.addContentTypeParser('*', { parseAs: 'string' }, parseJson);
  app.setErrorHandler((err: Error & { statusCode?: number }, req, reply) => {
    // a check's TypeError/RangeError is the client's; anything else is ours, and its message stays in the log
    const clientError = err instanceof RequestLimitError || ((err instanceof TypeError || err instanceof RangeError) && clientMessage(err, '') !== '');
    const status = err instanceof RequestLimitError ? err.status : err.statusCode && err.statusCode >= 400 && err.statusCode < 500 ? err.statusCode : clientError ? 400 : 500;
    if (status >= 500) {
      log(`internal error on ${req.method} ${req.routeOptions.url ?? 'unknown'}: ${err.stack ?? err.message}`);
      return void openAiError(reply, 500, 'internal error');
    }
    const message = status === 413 ? `request body too large: ${err.message}` : err.message;
    void openAiError(reply, status, message, err instanceof RequestLimitError ? err.param : null);
  });
  app.setNotFoundHandler((req, reply) => void openAiError(reply, 404, `no route ${req.method} ${req.url}`));
  app.addHook('onResponse', async (req, reply) => {
    requests.inc({ path: req.routeOptions.url ?? 'unknown', status: String(reply.statusCode) });
  });

  // ------------------------------------------------------------------ OpenAI proxy

  /** With API keys, the OpenAI routes need one; its tenant goes with the request. */
  const requireApiKey = async (req: FastifyRequest, reply: FastifyReply) => {
    if (!options.apiKeys) return;
    const tenant = options.apiKeys.tenantOf(req.headers.authorization);
    if (tenant === undefined) return openAiError(reply, 401, 'a valid API key is required (Authorization: Bearer KEY)', null, 'invalid_api_key');
    req.tenant = tenant;
  };
  /** Admin endpoints and (unless public) /v1/route: same-site JSON with the admin token. */
  const requireAdmin = async (req: FastifyRequest, reply: FastifyReply) => {
    const problem = adminRequestProblem(req.method, req.headers);
    if (problem) return openAiError(reply, problem.status, problem.message);
    if (!adminToken.matches(req.headers.authorization)) return openAiError(reply, 401, 'this endpoint needs the admin token (Authorization: Bearer TOKEN)');
  };

  /**
   * Reads a request into what to route on (token ids from an engine in `engine` mode) and the
   * body to forward; answers a 4xx and returns undefined when the request is malformed.
   */
  const prepare = async (path: string, req: FastifyRequest, reply: FastifyReply): Promise<ReadRequest | undefined> => {
    let parsed: ReadRequest;
    try {
      parsed = readRouteRequest(path, req.body, req.headers, limits);
    } catch (err) {
      if (err instanceof RequestLimitError) {
        void openAiError(reply, err.status, err.message, err.param);
        return undefined;
      }
      throw err;
    }
    if (req.tenant !== undefined) {
      // tenants never share KV: the engine keys its cache on the salt, the router its hashes
      const salt = tenantCacheSalt(req.tenant, parsed.routeRequest.cacheSalt);
      parsed.routeRequest.cacheSalt = salt;
      parsed.body.cache_salt = salt;
      parsed.unchanged = false;
    }
    if (tokenizeMode === 'engine') {
      const tokens = await tokenizeOnEngine(parsed.routeRequest);
      if (tokens) parsed.routeRequest = { ...parsed.routeRequest, tokens, messages: undefined, text: undefined };
    } else if (tokenizeMode === 'tokenizer' && !parsed.routeRequest.tokens) {
      try {
        const tokens = options.promptTokenizer!.tokenize(parsed.routeRequest);
        parsed.routeRequest = { ...parsed.routeRequest, tokens, messages: undefined, text: undefined };
      } catch (err) {
        // a template that rejects the conversation (roles out of order, say) is the client's to fix
        void openAiError(reply, 400, `the chat template rejected the request: ${clientMessage(err, 'it raised an error')}`, 'messages');
        return undefined;
      }
    }
    return parsed;
  };

  /** route(), with its argument checks answered as 400 (never 500) and nothing internal shown. */
  const routeOr400 = (reply: FastifyReply, request: RouteRequest, opts: Parameters<KVAwareRouter['route']>[1]): RouteResult | undefined => {
    try {
      return router.route(request, opts);
    } catch (err) {
      if (err instanceof TypeError || err instanceof RangeError) {
        void openAiError(reply, 400, clientMessage(err));
        return undefined;
      }
      throw err;
    }
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
    const streaming = body.stream === true;
    const release = (decision: RouteResult) => {
      router.release(decision.ticket);
      if (decision.shared) state.decisionEnded(decision.shared);
    };
    let failedAttempts = 0;
    for (let attempt = 0; ; attempt++) {
      if (reply.raw.destroyed) {
        // the client left while the request waited for a retry
        reply.hijack();
        return reply;
      }
      const decision = routeOr400(reply, routeRequest, { exclude: excluded, share });
      if (!decision) return reply;
      if (decision.workerId === '') {
        reply.header('retry-after', '1');
        // engines tried and failed: 502; nothing to try at all: 503
        if (failedAttempts > 0) return openAiError(reply, 502, 'the engines failed to answer');
        return openAiError(reply, 503, 'no worker can take the request now');
      }
      decisions.inc({ policy: decision.policy, reason: decision.reason });
      if (decision.shared) state.decisionMade(decision.shared);
      const forwarded = decision.cacheSalt
        ? JSON.stringify({ ...body, cache_salt: decision.cacheSalt })
        : unchanged && req.rawBody !== undefined ? req.rawBody : JSON.stringify(body);
      const connection = connections.get(decision.workerId)!;
      const outcome = await forward(reply, connection, path, forwarded, {
        workerId: decision.workerId,
        cachedTokens: cachedTokensHeader ? decision.cachedTokens : undefined,
        streaming,
        firstByteTimeoutMs: streaming ? firstByte.deadlineMs(decision.workerId) : timeouts.interChunkTimeoutMs,
        interChunkTimeoutMs: timeouts.interChunkTimeoutMs,
        onFirstByte: (seconds) => {
          ttft.observe(seconds);
          if (streaming) firstByte.observe(decision.workerId, seconds * 1000);
          router.markPrefillDone(decision.ticket);
        },
      });
      release(decision);
      // a client that went away says nothing about the engine: no failure, no retry
      if (outcome === 'client-gone') {
        if (!reply.sent) {
          reply.hijack();
          reply.raw.end();
        }
        return reply;
      }
      if (outcome === 'retry' || outcome === 'worker-out') {
        failedAttempts++;
        if (outcome === 'retry') {
          upstreamFailed(decision.workerId);
          breakerOpen.inc({ worker: decision.workerId });
        }
        excluded.add(decision.workerId);
        if (attempt < maxRetries) {
          retries.inc({ worker: decision.workerId });
          await new Promise((r) => setTimeout(r, 25 * (attempt + 1)));
          continue;
        }
        reply.header('retry-after', '1');
        return openAiError(reply, 502, `the engines failed to answer (last: ${decision.workerId})`);
      }
      upstreamAnswered(decision.workerId);
      cachedTokens.inc(decision.cachedTokens);
      promptTokens.inc(decision.promptTokens);
      latency.observe((performance.now() - started) / 1000);
      return reply;
    }
  };
  app.post('/v1/completions', { onRequest: requireApiKey }, proxy('/v1/completions'));
  app.post('/v1/chat/completions', { onRequest: requireApiKey }, proxy('/v1/chat/completions'));

  app.post('/v1/route', { onRequest: options.publicRouteApi ? requireApiKey : requireAdmin }, async (req, reply) => {
    const path = (req.body as { messages?: unknown } | null)?.messages !== undefined ? '/v1/chat/completions' : '/v1/completions';
    const prepared = await prepare(path, req, reply);
    if (!prepared) return reply;
    const { routeRequest } = prepared;
    const r = routeOr400(reply, routeRequest, { dryRun: true, explain: true, exclude: workersWithoutModel(prepared.body.model) });
    if (!r) return reply;
    return { worker: r.workerId, cachedTokens: r.cachedTokens, confidence: r.confidence, policy: r.policy, reason: r.reason, promptTokens: r.promptTokens, explain: r.explain };
  });
  app.get('/v1/models', { onRequest: requireApiKey }, async () => {
    const seen = new Map<string, unknown>();
    await Promise.all(
      router.listWorkers().filter((w) => w.available).map(async (w) => {
        try {
          const c = connections.get(w.id)!;
          const res = await upstreamRequest(`${c.base}/v1/models`, { headers: c.headers, headersTimeout: 2000, bodyTimeout: 2000 });
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
    admin.addHook('onRequest', requireAdmin);
    admin.get('/admin/workers', async () => ({
      workers: router.listWorkers().map((w) => {
        const c = connections.get(w.id);
        return {
          id: w.id, url: c ? redactUrl(c.record.url) : undefined, healthy: w.healthy, outOfRotation: health.reasons(w.id), draining: w.draining, kvUsage: w.load,
          models: c?.record.models ?? null, kvEvents: c?.subscriber?.stats ?? null,
          inFlightRequests: w.inFlightRequests, waitingRequests: w.waitingRequests, runningRequests: w.runningRequests,
          indexEntries: router.index.entriesFor(w.slot), claGroups: [...w.claGroups],
        };
      }),
    }));
    admin.post('/admin/workers', async (req, reply) => {
      const b = req.body as Partial<GatewayWorker> | null;
      if (!b || typeof b !== 'object' || typeof b.id !== 'string' || b.id === '' || typeof b.url !== 'string') return openAiError(reply, 400, 'a worker needs a string id and url');
      const known = ['id', 'url', 'claGroups', 'models', 'events', 'replay', 'metrics', 'apiKeyEnv'];
      const unknown = Object.keys(b).find((k) => !known.includes(k));
      if (unknown !== undefined) return openAiError(reply, 400, `unknown field '${unknown.slice(0, 64)}' (known: ${known.join(', ')})`, unknown.slice(0, 64));
      if (connections.has(b.id)) return openAiError(reply, 409, `worker '${b.id}' exists`);
      try {
        addWorker({ id: b.id, url: b.url, claGroups: b.claGroups, models: b.models, events: b.events, replay: b.replay, metrics: b.metrics, apiKeyEnv: b.apiKeyEnv });
      } catch (err) {
        if (err instanceof RangeError || err instanceof TypeError) return openAiError(reply, 400, clientMessage(err, 'the worker is malformed'));
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
    app, router, metrics, health, addWorker, removeWorker, adminToken: adminTokenText,
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


/** How one attempt on one engine ended. */
type ForwardOutcome =
  /** answered (or failed after its first byte reached the client, and was ended cleanly) */
  | 'done'
  /** the engine failed before anything reached the client: another worker can take it */
  | 'retry'
  /** the worker left rotation before answering anything: another worker can take it */
  | 'worker-out'
  /** the client went away: nothing to retry, and nothing the engine did wrong */
  | 'client-gone';

interface ForwardOptions {
  workerId: string;
  /** Predicted cached tokens for the response header, when it is enabled. */
  cachedTokens: number | undefined;
  /** The client asked for a stream. */
  streaming: boolean;
  firstByteTimeoutMs: number;
  interChunkTimeoutMs: number;
  onFirstByte: (seconds: number) => void;
}

/**
 * Sends the request to one engine and passes its answer to the client: a stream chunk by
 * chunk, a complete JSON answer in one write with its length. Nothing is sent to the client
 * before the engine's first body byte, so until then a failure (connection error, 5xx, first-
 * byte timeout, the worker leaving rotation) can be retried on another worker. A failure after
 * the first byte ends an SSE stream with an OpenAI-style error event.
 */
async function forward(reply: FastifyReply, connection: WorkerConnection, path: string, body: string, o: ForwardOptions): Promise<ForwardOutcome> {
  // undici takes an EventEmitter as the abort signal: cheaper per request than an AbortController
  const abort = new EventEmitter();
  let why: 'client' | 'first-byte' | 'worker-out' | undefined;
  const giveUp = (reason: 'client' | 'first-byte' | 'worker-out') => {
    if (why !== undefined) return;
    why = reason;
    abort.emit('abort');
  };
  const res = reply.raw;
  // the response closing before it finished means the client went away (a request's own
  // 'close' only says its body was read)
  const onClientGone = () => {
    if (!res.writableFinished) giveUp('client');
  };
  res.once('close', onClientGone);
  const onWorkerOut = () => giveUp('worker-out');
  connection.unanswered.add(onWorkerOut);
  // a streamed answer's first byte is due a few seconds past the worker's usual queue; a
  // non-streamed answer's first byte is the whole answer (undici's timeouts bound it)
  const timer = o.streaming ? setTimeout(() => giveUp('first-byte'), o.firstByteTimeoutMs) : undefined;
  const failed = (): ForwardOutcome => (why === 'client' ? 'client-gone' : why === 'worker-out' ? 'worker-out' : 'retry');
  const started = performance.now();
  let sent = false;
  let eventStream = false;
  try {
    const upstream = await connection.pool.request({
      path, method: 'POST', body, headers: connection.headers, signal: abort,
      headersTimeout: o.streaming ? o.firstByteTimeoutMs + 1000 : o.interChunkTimeoutMs,
      bodyTimeout: o.interChunkTimeoutMs,
    });
    if (upstream.statusCode >= 500) {
      await upstream.body.dump().catch(() => {});
      return failed();
    }
    const contentType = String(upstream.headers['content-type'] ?? 'application/json');
    eventStream = contentType.includes('event-stream');
    const headers: Record<string, string> = { 'content-type': contentType, 'x-contextforge-worker': o.workerId };
    if (o.cachedTokens !== undefined) headers['x-contextforge-cached-tokens'] = String(Math.round(o.cachedTokens));
    const chunks = upstream.body[Symbol.asyncIterator]();
    const first = await chunks.next();
    if (timer) clearTimeout(timer);
    if (why !== undefined) return failed();
    o.onFirstByte((performance.now() - started) / 1000);
    if (!eventStream && upstream.headers['content-length'] !== undefined) {
      // a complete JSON answer of known size: sent in one write with its length, not chunked
      const parts: Buffer[] = first.done ? [] : [first.value as Buffer];
      for (let next = await chunks.next(); !next.done; next = await chunks.next()) parts.push(next.value as Buffer);
      if (why !== undefined) return failed();
      const payload = parts.length === 1 ? parts[0] : Buffer.concat(parts);
      headers['content-length'] = String(payload.length);
      connection.unanswered.delete(onWorkerOut);
      reply.hijack();
      sent = true;
      res.writeHead(upstream.statusCode, headers);
      res.end(payload);
      return 'done';
    }
    if (eventStream) headers['cache-control'] = 'no-cache';
    connection.unanswered.delete(onWorkerOut);
    reply.hijack();
    sent = true;
    res.writeHead(upstream.statusCode, headers);
    if (!first.done && !res.write(first.value)) await new Promise((r) => res.once('drain', r));
    for (let next = await chunks.next(); !next.done; next = await chunks.next()) {
      if (!res.write(next.value)) await new Promise((r) => res.once('drain', r));
    }
    res.end();
    return 'done';
  } catch {
    if (!sent) return failed();
    // after the first byte: end the stream cleanly; the cause stays out of the client's view
    if (why !== 'client' && eventStream) {
      res.write(`data: ${JSON.stringify({ error: { message: 'the engine failed mid-stream', type: 'server_error', code: null } })}\n\n`);
    }
    res.end();
    return why === 'client' ? 'client-gone' : 'done';
  } finally {
    if (timer) clearTimeout(timer);
    res.off('close', onClientGone);
    connection.unanswered.delete(onWorkerOut);
  }
}
