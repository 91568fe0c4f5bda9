/**
 * The OpenAI proxy: routes each completion request, forwards it to the chosen engine and
 * passes the answer back without buffering a stream. A connection failure or 5xx before the
 * first byte is retried on another worker (and counted by the circuit breaker). The router's
 * in-flight ticket follows the request: prefill until the first upstream byte, decode until
 * the end, released on completion, error or client disconnect.
 */
import { EventEmitter } from 'node:events';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Pool } from 'undici';
import type { KVAwareRouter, RouteResult } from '../core/router/index.js';
import type { StateStore } from '../state/state-store.js';
import type { CircuitBreaker } from './circuit-breaker.js';
import type { GatewayMetrics } from './metrics.js';
import { openAiError, type OpenAiPath, type RequestReader } from './openai-request.js';
import { DP_RANK_HEADER } from './engine-deployments.js';
import type { WorkerConnections } from './worker-connections.js';

export interface ProxyDeps {
  router: KVAwareRouter;
  state: StateStore;
  connections: WorkerConnections;
  breaker: CircuitBreaker;
  metrics: GatewayMetrics;
  readRequest: RequestReader;
  /** Attempts on other workers after a failure before the first byte. */
  maxRetries: number;
  /** Headers and body timeout of the upstream request (ms). */
  timeout: number;
}

/** The Fastify handler of one OpenAI completion path. */
export function createProxyHandler(deps: ProxyDeps, path: OpenAiPath) {
  const { router, state, connections, breaker, metrics, readRequest, maxRetries, timeout } = deps;
  return async (req: FastifyRequest, reply: FastifyReply) => {
    const prepared = await readRequest(path, req, reply);
    if (!prepared) return reply;
    const { routeRequest, body, unchanged } = prepared;
    const started = performance.now();
    const excluded = connections.withoutModel(body.model);
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
      metrics.decisions.inc({ policy: decision.policy, reason: decision.reason });
      if (decision.shared) state.decisionMade(decision.shared);
      const forwarded = decision.cacheSalt
        ? JSON.stringify({ ...body, cache_salt: decision.cacheSalt })
        : unchanged && req.rawBody !== undefined ? req.rawBody : JSON.stringify(body);
      const target = connections.get(decision.workerId)!;
      const outcome = await forward(reply, target.pool, path, forwarded, decision, target.rank, target.workerId, timeout, (seconds) => {
        metrics.ttft.observe(seconds);
        router.markPrefillDone(decision.ticket);
      });
      if (outcome === 'retry') {
        breaker.failed(decision.workerId);
        metrics.upstreamFailures.inc({ worker: decision.workerId });
      } else breaker.answered(decision.workerId);
      if (outcome === 'retry' && attempt < maxRetries && !reply.raw.destroyed) {
        release(decision);
        excluded.add(decision.workerId);
        metrics.retries.inc({ worker: decision.workerId });
        await new Promise((r) => setTimeout(r, 25 * (attempt + 1)));
        continue;
      }
      release(decision);
      if (outcome === 'retry') {
        reply.header('retry-after', '1');
        return openAiError(reply, 502, `the engines failed to answer (last: ${decision.workerId})`);
      }
      metrics.cachedTokens.inc(decision.cachedTokens);
      metrics.promptTokens.inc(decision.promptTokens);
      metrics.latency.observe((performance.now() - started) / 1000);
      return reply;
    }
  };
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
  /** The data-parallel rank to run on (vLLM's X-data-parallel-rank header), or null. */
  rank: number | null,
  /** The worker's own id (a rank's worker), for the response header. */
  workerId: string,
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
      headers: rank === null ? JSON_HEADERS : { ...JSON_HEADERS, [DP_RANK_HEADER]: String(rank) },
      signal: abort,
      headersTimeout: timeout,
      bodyTimeout: timeout,
    });
  } catch {
    res.off('close', onClientGone);
    return 'retry';
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
    'x-contextforge-worker': workerId,
    'x-contextforge-cached-tokens': String(Math.round(decision.cachedTokens)),
  };
  if (rank !== null) headers['x-contextforge-rank'] = String(rank);
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
