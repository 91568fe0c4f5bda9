/**
 * Failing engines: killed under load, hanging, answering 500, restarting with an empty cache.
 * For each fault, the promise the gateway makes and its proof.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { failingEngine, fakeEngine, hangingEngine, KillableEngine, post } from './harness.js';
import { until } from '../helpers/wait.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0, adminToken: 'fault-suite-admin' };

/** Reads an SSE body into its events (JSON objects; [DONE] as the string). */
const sseEvents = (text: string) =>
  text
    .split('\n\n')
    .filter(Boolean)
    .map((e) => e.replace(/^data: /, ''))
    .map((d) => (d === '[DONE]' ? d : (JSON.parse(d) as { error?: { message: string }; choices?: unknown })));

test('engine killed under load: no non-streamed request fails; streams cut after their first byte end with an SSE error event', async () => {
  const engines = [
    await new KillableEngine({ decodeTokS: 100 }).start(),
    await new KillableEngine({ decodeTokS: 100 }).start(),
    await new KillableEngine({ decodeTokS: 100 }).start(),
  ];
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers: engines.map((e, i) => ({ id: `k${i}`, url: e.url })),
    ...quiet,
    healthCheckIntervalMs: 100,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const plain = (i: number) => post(base, '/v1/completions', { prompt: `plain ${i}`, max_tokens: 30 });
  const streamed = (i: number) =>
    post(base, '/v1/completions', { prompt: `stream ${i}`, max_tokens: 30, stream: true });
  const inFlight = [
    ...Array.from({ length: 45 }, (_, i) => plain(i)),
    ...Array.from({ length: 15 }, (_, i) => streamed(i)),
  ];
  // the kill comes while requests are queued and running on every engine
  await until(() => router.listWorkers().find((w) => w.id === 'k1')!.inFlightRequests > 3, 'requests running on k1');
  await engines[1].kill();
  const later = Array.from({ length: 30 }, (_, i) => plain(100 + i));
  const results = await Promise.all([...inFlight, ...later]);
  const plainResults = [...results.slice(0, 45), ...results.slice(60)];
  for (const r of plainResults) {
    assert.equal(r.status, 200, r.text.slice(0, 200));
    assert.equal((JSON.parse(r.text) as { usage: { completion_tokens: number } }).usage.completion_tokens, 30);
  }
  for (const r of results.slice(45, 60)) {
    assert.equal(r.status, 200);
    const events = sseEvents(r.text);
    // either the whole stream, or (cut on the killed engine after its first byte) a clean error
    // event; both end with data: [DONE]
    assert.equal(events.at(-1), '[DONE]');
    const beforeDone = events.at(-2);
    if (typeof beforeDone === 'object' && beforeDone.error !== undefined) {
      assert.equal(beforeDone.error.message, 'the engine failed mid-stream');
      assert.ok(events.length >= 3, 'what was streamed before the failure came through');
    }
  }
  assert.equal(router.getStats().inFlightRequests, 0, 'every ticket released');
  await gateway.close();
  for (const e of engines) await e.kill();
});

test('engine hangs: a stream waits a few seconds past the usual first byte, then moves to another worker', async () => {
  const hanging = await hangingEngine();
  const good = await new MockEngine().start();
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers: [
      { id: 'hang', url: hanging.url },
      { id: 'good', url: `http://127.0.0.1:${good.port}` },
    ],
    ...quiet,
    timeouts: { firstByteTimeoutMs: 300 },
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const results = await Promise.all(
    Array.from({ length: 6 }, (_, i) =>
      post(base, '/v1/completions', { prompt: `s${i}`, max_tokens: 2, stream: true }),
    ),
  );
  for (const r of results) {
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
    assert.equal(sseEvents(r.text).at(-1), '[DONE]');
  }
  assert.ok(hanging.requests >= 1, 'the hanging engine was tried');
  assert.equal(router.getStats().inFlightRequests, 0);
  await gateway.close();
  await hanging.close();
  await good.close();
});

test('engine hangs on a non-streamed request and fails its health check: the request moves elsewhere', async () => {
  let healthy = true;
  const stuck = await fakeEngine(
    (req) => {
      req.resume();
      healthy = false; // the engine's core is wedged: /health fails, as vLLM's does
    },
    () => (healthy ? 200 : 503),
  );
  const good = await new MockEngine().start();
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers: [
      { id: 'stuck', url: stuck.url },
      { id: 'good', url: `http://127.0.0.1:${good.port}` },
    ],
    ...quiet,
    healthCheckIntervalMs: 50,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const results = await Promise.all(
    Array.from({ length: 4 }, (_, i) => post(base, '/v1/completions', { prompt: `n${i}`, max_tokens: 2 })),
  );
  for (const r of results) {
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
  }
  assert.ok(stuck.requests >= 1);
  assert.deepEqual(gateway.health.reasons('stuck'), ['health-check']);
  await gateway.close();
  await stuck.close();
  await good.close();
});

test('engine answers 500: retried elsewhere, its circuit opens; all engines failing is a 502 with Retry-After, none available a 503', async () => {
  const bad = await failingEngine();
  const good = await new MockEngine().start();
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers: [
      { id: 'bad', url: bad.url },
      { id: 'good', url: `http://127.0.0.1:${good.port}` },
    ],
    ...quiet,
    breakerFailures: 2,
    breakerCooldownMs: 60_000,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  for (let i = 0; i < 6; i++) {
    const r = await post(base, '/v1/completions', { prompt: `r${i}`, max_tokens: 1 });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
  }
  assert.deepEqual(gateway.health.reasons('bad'), ['breaker']);
  await gateway.close();

  const bad2 = await failingEngine();
  const all = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [
      { id: 'b1', url: bad.url },
      { id: 'b2', url: bad2.url },
    ],
    ...quiet,
    breakerFailures: 100,
  });
  const allBase = await all.app.listen({ host: '127.0.0.1', port: 0 });
  const failed = await post(allBase, '/v1/completions', { prompt: 'x', max_tokens: 1 });
  assert.equal(failed.status, 502);
  assert.equal(failed.headers.get('retry-after'), '1');
  assert.doesNotMatch(failed.text, /engine exploded/, "nothing of the engine's error leaks");
  all.health.set('b1', 'breaker', false);
  all.health.set('b2', 'breaker', false);
  const none = await post(allBase, '/v1/completions', { prompt: 'x', max_tokens: 1 });
  assert.equal(none.status, 503);
  assert.equal(none.headers.get('retry-after'), '1');
  // the dry run says why
  const why = await post(allBase, '/v1/route', { prompt: 'x' }, { authorization: 'Bearer fault-suite-admin' });
  assert.equal(why.status, 200);
  assert.deepEqual(JSON.parse(why.text).noWorker, {
    reason: 'none-available',
    workers: 2,
    unavailable: 2,
    excluded: 0,
  });
  await all.close();
  await bad.close();
  await bad2.close();
  await good.close();
});

test('engine restarts with an empty cache: the index forgets it (health path and event path)', async () => {
  // health path: approximate mode, the router's own predictions for the worker are dropped
  const engine = await new KillableEngine().start();
  const router = new KVAwareRouter({ blockSize: 16 });
  const gateway = await createGateway({
    router,
    workers: [{ id: 'r0', url: engine.url }],
    ...quiet,
    healthCheckIntervalMs: 50,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const prompt = 'a long shared system prompt '.repeat(30);
  assert.equal((await post(base, '/v1/completions', { prompt, max_tokens: 1 })).status, 200);
  assert.ok(router.index.entryCount > 0);
  await engine.kill();
  await until(() => gateway.health.reasons('r0').includes('health-check'), 'the health check to take it out');
  await engine.restart();
  await until(() => gateway.health.reasons('r0').length === 0, 'it to come back');
  assert.equal(router.index.entryCount, 0, 'nothing it held before the restart is predicted');
  await gateway.close();
  await engine.kill();

  // event path: the event stream of a restarted engine (disconnect, numbering from 0) clears the worker
  const events = await new KillableEngine({ events: 'tcp://127.0.0.1:*' }).start();
  const precise = new KVAwareRouter({ blockSize: 16, indexMode: 'precise', speculativeBlocks: 0 });
  const applier = new KvEventApplier(precise);
  const gw = await createGateway({
    router: precise,
    applier,
    tokenize: 'engine',
    kvEvents: true,
    workers: [{ id: 'p0', url: events.url, events: events.engine!.eventsEndpoint }],
    ...quiet,
  });
  const pbase = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  // a history of batches, so the restarted publisher's numbering is seen to go back
  for (let i = 0; i < 20; i++)
    assert.equal(
      (await post(pbase, '/v1/completions', { prompt: i === 0 ? prompt : `filler ${i} `.repeat(10), max_tokens: 1 }))
        .status,
      200,
    );
  await until(
    async () =>
      (
        (await (
          await fetch(`${pbase}/admin/workers`, { headers: { authorization: 'Bearer fault-suite-admin' } })
        ).json()) as { workers: Array<{ kvEvents: { lastSeq: number } }> }
      ).workers[0].kvEvents.lastSeq >= 15,
    'its KV events in the index',
  );
  await events.restart();
  // the new process stores blocks of other prompts: its batches number from 0 again (the first
  // ones may be published before the subscriber has reconnected, so keep sending)
  let n = 0;
  await until(async () => {
    assert.equal(
      (await post(pbase, '/v1/completions', { prompt: `something else ${n++} `.repeat(10), max_tokens: 1 })).status,
      200,
    );
    const stats = (await (
      await fetch(`${pbase}/admin/workers`, { headers: { authorization: 'Bearer fault-suite-admin' } })
    ).json()) as { workers: Array<{ kvEvents: { restarts: number; disconnects: number; batches: number } }> };
    // the subscriber sees the publisher go away (or its numbering start over) and drops the entries
    const k = stats.workers[0].kvEvents;
    return (k.restarts >= 1 || k.disconnects >= 1) && k.batches > 20;
  }, 'the old entries dropped');
  const route = (await (
    await fetch(`${pbase}/v1/route`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer fault-suite-admin' },
      body: JSON.stringify({ prompt }),
    })
  ).json()) as { cachedTokens: number };
  assert.equal(route.cachedTokens, 0, 'the first prompt is no longer predicted cached');
  await gw.close();
  await events.kill();
});
