/**
 * Every connection the gateway keeps to an engine carries a long stream: a request that waits
 * for one of them has not reached the engine yet, and must still end within its deadline, or
 * at once when its client leaves, instead of waiting until a stream ends.
 */
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { answeringEngine, fakeEngine } from './harness.js';
import { until } from '../helpers/wait.js';

/** The connections the gateway keeps to one engine (engineConnections). */
const POOL_CONNECTIONS = 8;

/** An engine that starts every stream and keeps it going, and the streams it holds. */
async function streamingEngine() {
  const streams = new Set<ServerResponse>();
  const engine = await fakeEngine((req, res) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"text":"a"}]}\n\n');
      streams.add(res);
    });
  });
  return { engine, streams };
}

/**
 * A gateway keeping `engineConnections` connections to the engine at `url` (POOL_CONNECTIONS
 * unless told), its breaker opening after `breakerFailures`; a request not streamed waits for
 * a connection up to `interChunkTimeoutMs` (2 s unless told).
 */
function saturableGateway(
  router: KVAwareRouter,
  url: string,
  breakerFailures: number,
  { engineConnections = POOL_CONNECTIONS, interChunkTimeoutMs = 2000 } = {},
) {
  return createGateway({
    router,
    workers: [{ id: 'e0', url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: 'fault-suite-admin',
    breakerFailures,
    engineConnections,
    timeouts: { firstByteTimeoutMs: 300, interChunkTimeoutMs },
  });
}

/**
 * A round-robin gateway over a streaming engine `e0` (its circuit opening after
 * `breakerFailures`) with every one of its POOL_CONNECTIONS connections carrying a stream the
 * engine keeps going; `stream(prompt)` starts one more. `stop()` ends the streams, the
 * gateway and the engine.
 */
async function saturatedGateway(breakerFailures: number) {
  const { engine, streams } = await streamingEngine();
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await saturableGateway(router, engine.url, breakerFailures);
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const stream = (prompt: string) =>
    fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt, max_tokens: 1000, stream: true }),
      signal: AbortSignal.timeout(10_000),
    });
  const held = await Promise.all(Array.from({ length: POOL_CONNECTIONS }, (_, i) => stream(`held ${i}`)));
  const keepGoing = setInterval(() => {
    for (const res of streams) res.write('data: {"choices":[{"text":"b"}]}\n\n');
  }, 200);
  return {
    gateway,
    streams,
    stream,
    stop: async () => {
      clearInterval(keepGoing);
      for (const r of held) await r.body?.cancel();
      await gateway.close(0);
      await engine.close();
    },
  };
}

test('a request waiting for a connection the engine streams on ends by its deadline, or when its client leaves', async () => {
  const { engine, streams } = await streamingEngine();
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await saturableGateway(router, engine.url, 1000);
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const stream = (prompt: string, signal?: AbortSignal, streamed = true) =>
    fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt, max_tokens: 1000, stream: streamed }),
      signal,
    });
  const held = await Promise.all(Array.from({ length: POOL_CONNECTIONS }, (_, i) => stream(`held ${i}`)));
  assert.ok(held.every((r) => r.status === 200));
  assert.equal(streams.size, POOL_CONNECTIONS, 'every connection to the engine carries a stream');
  // the engine keeps the streams going (well within the inter-chunk timeout)
  const keepGoing = setInterval(() => {
    for (const res of streams) res.write('data: {"choices":[{"text":"b"}]}\n\n');
  }, 200);
  try {
    const e0 = gateway.connections.get('e0')!;
    // one more stream: it waits for a connection past its first-byte deadline, then is answered
    // as an overloaded gateway answers (no other worker can take it)
    const overdue = await stream('one more', AbortSignal.timeout(10_000));
    assert.equal(overdue.status, 503);
    await overdue.text();
    assert.equal(router.getStats().inFlightRequests, POOL_CONNECTIONS);
    // given up, it waits nowhere any more, neither with its body in undici's pool queue nor in the gateway's
    assert.equal(e0.pool.stats.queued, 0, "the request given up is not left in undici's pool queue");
    assert.equal(e0.slots?.queued, 0, 'the request given up is not left waiting for a connection');
    // one that is not streamed: it waits no longer than the inter-chunk timeout
    const whole = await stream('not streamed', AbortSignal.timeout(10_000), false);
    assert.equal(whole.status, 503);
    await whole.text();
    assert.equal(router.getStats().inFlightRequests, POOL_CONNECTIONS);
    assert.equal(e0.pool.stats.queued, 0, "the request given up is not left in undici's pool queue");
    // a client that leaves while its request waits for a connection releases it at once
    const leaving = new AbortController();
    const left = stream('leaving', leaving.signal).catch(() => undefined);
    await until(() => router.getStats().inFlightRequests === POOL_CONNECTIONS + 1, 'the request to be routed');
    leaving.abort();
    await left;
    await until(
      () => router.getStats().inFlightRequests === POOL_CONNECTIONS,
      'the request whose client left to be released',
      { timeoutMs: 5000 },
    );
    assert.equal(streams.size, POOL_CONNECTIONS, 'neither request reached the engine');
    assert.equal(e0.pool.stats.queued, 0, "the request whose client left is not left in undici's pool queue");
    assert.equal(e0.slots?.queued, 0, 'the request whose client left is not left waiting for a connection');
  } finally {
    clearInterval(keepGoing);
    for (const r of held) await r.body?.cancel();
    await gateway.close(0);
    await engine.close();
  }
});

test('a worker whose connections are all busy is no engine failure: its request moves to another worker, its circuit stays closed', async () => {
  const free = await answeringEngine(200, '{"choices":[{"text":"ok"}]}');
  // one engine failure would open the circuit
  const { gateway, streams, stream, stop } = await saturatedGateway(1);
  const waitTimeouts = async () =>
    (await gateway.metrics.getSingleMetric('contextforge_engine_connection_wait_timeouts_total')?.get())?.values ?? [];
  try {
    assert.equal(streams.size, POOL_CONNECTIONS, 'every connection to e0 carries a stream');
    gateway.addWorker({ id: 'e1', url: free.url });
    // round robin sends one of the next requests to e0: it waits for a connection until its
    // deadline, then e1 answers it
    for (let i = 0; i < 4 && (await waitTimeouts()).length === 0; i++) {
      const r = await stream(`more ${i}`);
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('x-contextforge-worker'), 'e1');
      await r.text();
    }
    assert.deepEqual(
      (await waitTimeouts()).map((v) => [v.labels.worker, v.value]),
      [['e0', 1]],
    );
    assert.deepEqual(gateway.health.reasons('e0'), [], "e0's circuit stays closed");
    const failures = await gateway.metrics.getSingleMetric('contextforge_upstream_failures_total')?.get();
    assert.deepEqual(failures?.values, [], 'no engine failure counted');
    // with e1 gone, nothing can take a request: answered as an overloaded gateway is
    assert.ok(gateway.removeWorker('e1'));
    const refused = await stream('no free connection');
    assert.equal(refused.status, 503);
    assert.equal(refused.headers.get('retry-after'), '1');
    const body = (await refused.json()) as { error: { code: string; type: string } };
    assert.equal(body.error.code, 'engine_connections_busy');
    assert.deepEqual(gateway.health.reasons('e0'), [], "e0's circuit stays closed");
  } finally {
    await stop();
    await free.close();
  }
});

test('a request waiting for a connection of a removed worker moves to another worker at once, as no engine failure', async () => {
  const { engine: removed, streams } = await streamingEngine();
  const other = await answeringEngine(200, '{"choices":[{"text":"ok"}]}');
  const router = new KVAwareRouter({ policy: 'round-robin' });
  // one connection to e0; a request not streamed would wait for it a minute
  const gateway = await saturableGateway(router, removed.url, 1, { engineConnections: 1, interChunkTimeoutMs: 60_000 });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const complete = (prompt: string, stream: boolean) =>
    fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt, max_tokens: 1000, stream }),
      signal: AbortSignal.timeout(30_000),
    });
  const metric = async (name: string) =>
    ((await gateway.metrics.getSingleMetric(name)?.get())?.values ?? []).map((v) => [v.labels.worker, v.value]);
  const held = await complete('held', true);
  assert.equal(held.status, 200);
  try {
    assert.equal(streams.size, 1, "e0's one connection carries a stream");
    const slots = gateway.connections.get('e0')!.slots;
    let waiting: Response | undefined;
    const answered = complete('waiting', false).then((r) => (waiting = r));
    await until(() => slots.queued === 1, 'the request to wait for the connection the stream holds');
    gateway.addWorker({ id: 'e1', url: other.url });
    assert.ok(gateway.removeWorker('e0'));
    // well before its own deadline, and while the stream on e0 still goes on
    await until(() => waiting !== undefined, 'the waiting request to be answered', { timeoutMs: 5000 });
    await answered;
    assert.equal(waiting!.status, 200);
    assert.equal(waiting!.headers.get('x-contextforge-worker'), 'e1');
    await waiting!.text();
    assert.equal(slots.queued, 0, 'nothing waits for a connection to the removed worker');
    assert.equal(streams.size, 1, 'the request never reached e0');
    assert.deepEqual(await metric('contextforge_upstream_failures_total'), [], 'no engine failure counted');
    // the move is a retry of a worker removed: its series left /metrics with it, and the retry
    // brings none back (a worker that leaves rotation, still there, counts it)
    assert.deepEqual(await metric('contextforge_upstream_retries_total'), []);
    assert.deepEqual(await metric('contextforge_engine_connection_wait_timeouts_total'), []);
    assert.deepEqual(gateway.health.reasons('e0'), [], 'no circuit opened for the removed worker');
  } finally {
    for (const res of streams) res.end('data: [DONE]\n\n');
    await held.body?.cancel();
    await gateway.close(0);
    await removed.close();
    await other.close();
  }
});

test('one worker with no free connection and one answering 503 with a Retry-After: the client is told to come back then', async () => {
  const unavailable = await answeringEngine(503, '{"error":{"message":"unavailable"}}', { 'retry-after': '30' });
  const { gateway, streams, stream, stop } = await saturatedGateway(1000);
  try {
    assert.equal(streams.size, POOL_CONNECTIONS, 'every connection to e0 carries a stream');
    gateway.addWorker({ id: 'e1', url: unavailable.url });
    const refused = await stream('both come back later');
    const body = (await refused.json()) as { error: { code: string } };
    assert.equal(refused.status, 503);
    assert.equal(refused.headers.get('retry-after'), '30');
    assert.equal(body.error.code, 'engines_unavailable');
  } finally {
    await stop();
    await unavailable.close();
  }
});
