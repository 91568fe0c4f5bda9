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
import { fakeEngine } from './harness.js';
import { until } from '../helpers/wait.js';

/** The connections the gateway keeps to one engine (engineConnections). */
const POOL_CONNECTIONS = 8;

test('a request waiting for a connection the engine streams on ends by its deadline, or when its client leaves', async () => {
  const streams = new Set<ServerResponse>();
  // an engine that starts every stream and keeps it going
  const engine = await fakeEngine((req, res) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"text":"a"}]}\n\n');
      streams.add(res);
    });
  });
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers: [{ id: 'e0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: 'fault-suite-admin',
    breakerFailures: 1000,
    engineConnections: POOL_CONNECTIONS,
    timeouts: { firstByteTimeoutMs: 300, interChunkTimeoutMs: 2000 },
  });
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
    // one more stream: it waits for a connection past its first-byte deadline, then fails as an overdue attempt does
    const overdue = await stream('one more', AbortSignal.timeout(10_000));
    assert.equal(overdue.status, 502);
    await overdue.text();
    assert.equal(router.getStats().inFlightRequests, POOL_CONNECTIONS);
    // one that is not streamed: it waits no longer than the inter-chunk timeout
    const whole = await stream('not streamed', AbortSignal.timeout(10_000), false);
    assert.equal(whole.status, 502);
    await whole.text();
    assert.equal(router.getStats().inFlightRequests, POOL_CONNECTIONS);
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
  } finally {
    clearInterval(keepGoing);
    for (const r of held) await r.body?.cancel();
    await gateway.close(0);
    await engine.close();
  }
});
