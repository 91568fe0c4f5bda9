/**
 * A router holds at most MAX_WORKERS workers (each data-parallel rank is one): the admin API
 * answers 409 naming the field past it, and the router itself refuses one more. An id that
 * exists is a 409 naming `id` too.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { MAX_WORKERS } from '../../src/core/worker-registry.js';
import { createGateway } from '../../src/server/gateway.js';

test('the router refuses a worker past MAX_WORKERS', () => {
  const router = new KVAwareRouter({ blockSize: 16 });
  for (let i = 0; i < MAX_WORKERS; i++) router.registerWorker(`w${i}`);
  // a known id is still left as it is
  assert.doesNotThrow(() => router.registerWorker('w0'));
  assert.throws(() => router.registerWorker('one-more'), /at most 4096 workers/);
  assert.equal(router.listWorkers().length, MAX_WORKERS);
  router.removeWorker('w1');
  assert.doesNotThrow(() => router.registerWorker('one-more'));
});

test('POST /admin/workers past MAX_WORKERS answers 409 naming the field', async () => {
  const adminToken = 'worker-limit-admin';
  const url = 'http://127.0.0.1:1';
  // 63 workers of 64 ranks and 63 of one: one short of the limit
  const workers = [
    ...Array.from({ length: 63 }, (_, i) => ({ id: `dp${i}`, url, dpSize: 64 })),
    ...Array.from({ length: 63 }, (_, i) => ({ id: `w${i}`, url })),
  ];
  assert.equal(MAX_WORKERS, 63 * 64 + 63 + 1);
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 16 }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    workers,
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const add = async (worker: object) => {
      const res = await fetch(`${base}/admin/workers`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
        body: JSON.stringify(worker),
      });
      return { status: res.status, body: (await res.json()) as { error?: { message: string; param: string | null } } };
    };
    const ranks = await add({ id: 'two-ranks', url, dpSize: 2 });
    assert.equal(ranks.status, 409, JSON.stringify(ranks.body));
    assert.equal(ranks.body.error?.param, 'dpSize');
    assert.match(ranks.body.error?.message ?? '', /at most 4096 workers/);
    assert.equal((await add({ id: 'last', url })).status, 201);
    const full = await add({ id: 'past', url });
    assert.equal(full.status, 409, JSON.stringify(full.body));
    assert.equal(full.body.error?.param, 'id');
    assert.equal(gateway.router.listWorkers().length, MAX_WORKERS);
    assert.equal(gateway.connections.has('past'), false);
    assert.equal(gateway.connections.has('two-ranks'), false);
  } finally {
    await gateway.close();
  }
});

test('POST /admin/workers with an id that exists answers 409 naming the id', async () => {
  const adminToken = 'worker-exists-admin';
  const url = 'http://127.0.0.1:1';
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 16 }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    workers: [{ id: 'w3', url }],
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const res = await fetch(`${base}/admin/workers`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
      body: JSON.stringify({ id: 'w3', url: 'http://127.0.0.1:2' }),
    });
    const body = (await res.json()) as { error?: { message: string; param: string | null } };
    assert.equal(res.status, 409, JSON.stringify(body));
    assert.equal(body.error?.param, 'id');
    assert.match(body.error?.message ?? '', /worker 'w3' exists/);
    assert.equal(gateway.connections.get('w3')?.record.url, url, 'the worker is left as it was');
  } finally {
    await gateway.close();
  }
});
