/**
 * A worker whose KV-event endpoint ZeroMQ refuses (it passes the tcp://HOST:PORT check, but a
 * wildcard host is for binding) is refused as a whole: nothing of it stays registered or open.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';

test('an events endpoint ZeroMQ cannot connect to refuses the worker and leaves nothing behind', async () => {
  const engine = await new MockEngine().start();
  const adminToken = 'worker-add-failure-admin';
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 16 }),
    tokenize: 'engine',
    kvEvents: true,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    workers: [{ id: 'good', url: `http://127.0.0.1:${engine.port}` }],
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const res = await fetch(`${base}/admin/workers`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
      body: JSON.stringify({ id: 'bad', url: `http://127.0.0.1:${engine.port}`, events: 'tcp://*:5557' }),
    });
    assert.equal(res.status, 400, await res.text());
    assert.deepEqual(
      gateway.router.listWorkers().map((w) => w.id),
      ['good'],
      'the refused worker is not in the router',
    );
    assert.equal(gateway.connections.has('bad'), false);
    // every request goes to a worker the gateway can forward to
    for (let i = 0; i < 8; i++) {
      const r = await fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: `request ${i} `.repeat(10), max_tokens: 1 }),
      });
      assert.equal(r.status, 200, await r.text());
    }
  } finally {
    await gateway.close();
    await engine.close();
  }
});

test('a subscriber refused its endpoint closes its socket', async () => {
  const { KvEventSubscriber } = await import('../../src/engines/kv-events/subscriber.js');
  const { KvEventApplier } = await import('../../src/engines/kv-events/applier.js');
  const router = new KVAwareRouter({ blockSize: 16 });
  router.registerWorker('w', { url: 'http://127.0.0.1:1' });
  const subscriber = new KvEventSubscriber({
    workerId: 'w',
    endpoint: 'tcp://*:5557',
    applier: new KvEventApplier(router),
  });
  assert.throws(() => subscriber.start(), RangeError);
  assert.equal((subscriber as unknown as { sub: { closed: boolean } }).sub.closed, true);
  await subscriber.close();
});
