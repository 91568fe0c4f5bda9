/**
 * Requests in flight on a worker whose health check fails (its /health answers 500: vLLM's engine
 * core died, SGLang busy or starting a drain). The engine may still answer them, so they move
 * only to a worker in rotation serving their model; with none, they stay, bounded by the usual
 * timeouts, and move once such a worker comes into rotation.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayWorker } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';
import { holdingEngine, post } from './harness.js';

/** A round-robin gateway probing its workers' /health every 20 ms, no metrics scrape. */
async function gatewayOver(workers: GatewayWorker[]) {
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({ router, workers, metricsIntervalMs: 0, healthCheckIntervalMs: 20 });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const out = (id: string) => router.listWorkers().find((w) => w.id === id)?.available === false;
  return { router, gateway, base, out };
}

test("one worker whose /health turns 500 with a request in flight: the request stays and gets the engine's answer", async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  const g = await gatewayOver([{ id: 'a', url: a.url }]);
  try {
    const pending = post(g.base, '/v1/completions', { prompt: 'kept', max_tokens: 1 });
    await until(() => a.posts === 1, 'the request on the engine');
    health = 500;
    await until(() => g.out('a'), 'a out of rotation');
    assert.deepEqual(g.gateway.health.reasons('a'), ['health-check']);
    a.release();
    const r = await pending;
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'a');
    assert.match(r.text, /from-a/);
    assert.equal(a.abandoned, 0, 'the engine kept the request');
    assert.equal(a.posts, 1, 'sent once');
  } finally {
    await g.gateway.close();
    await a.close();
  }
});

test('two workers of one model: the request unanswered on the one whose /health turns 500 moves to the other', async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  const b = await holdingEngine('from-b');
  const g = await gatewayOver([
    { id: 'a', url: a.url, models: ['m'] },
    { id: 'b', url: b.url, models: ['m'] },
  ]);
  try {
    // round robin: the first request goes to the first worker
    const pending = post(g.base, '/v1/completions', { model: 'm', prompt: 'moves', max_tokens: 1 });
    await until(() => a.posts === 1, 'the request on a');
    health = 500;
    await until(() => b.posts === 1, 'the request moved to b');
    b.release();
    const r = await pending;
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'b');
    assert.match(r.text, /from-b/);
    await until(() => a.abandoned === 1, 'a let go of the request');
  } finally {
    await g.gateway.close();
    await a.close();
    await b.close();
  }
});

test('a request kept on a worker out of rotation moves once a worker serving its model comes into rotation', async () => {
  let healthA = 200;
  let healthB = 500;
  const a = await holdingEngine('from-a', () => healthA);
  const b = await holdingEngine('from-b', () => healthB);
  const g = await gatewayOver([
    { id: 'a', url: a.url, models: ['m'] },
    { id: 'b', url: b.url, models: ['m'] },
  ]);
  try {
    await until(() => g.out('b'), 'b out of rotation');
    const pending = post(g.base, '/v1/completions', { model: 'm', prompt: 'waits', max_tokens: 1 });
    await until(() => a.posts === 1, 'the request on a');
    healthA = 500;
    await until(() => g.out('a'), 'a out of rotation');
    assert.equal(b.posts, 0, 'no worker in rotation to move to');
    healthB = 200;
    await until(() => b.posts === 1, 'the kept request moved to b once b is back in rotation');
    b.release();
    const r = await pending;
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'b');
    await until(() => a.abandoned === 1, 'a let go of the request');
  } finally {
    await g.gateway.close();
    await a.close();
    await b.close();
  }
});

test('a request kept on a worker out of rotation moves to a worker of its model added meanwhile', async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  const c = await holdingEngine('from-c');
  const g = await gatewayOver([{ id: 'a', url: a.url, models: ['m'] }]);
  try {
    const pending = post(g.base, '/v1/completions', { model: 'm', prompt: 'waits', max_tokens: 1 });
    await until(() => a.posts === 1, 'the request on a');
    health = 500;
    await until(() => g.out('a'), 'a out of rotation');
    g.gateway.addWorker({ id: 'c', url: c.url, models: ['m'] });
    await until(() => c.posts === 1, 'the kept request moved to the worker added');
    c.release();
    const r = await pending;
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'c');
    await until(() => a.abandoned === 1, 'a let go of the request');
  } finally {
    await g.gateway.close();
    await a.close();
    await c.close();
  }
});

test('a request kept on a worker out of rotation moves to a worker of its model resumed from draining', async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  const d = await holdingEngine('from-d');
  const g = await gatewayOver([
    { id: 'a', url: a.url, models: ['m'] },
    { id: 'd', url: d.url, models: ['m'] },
  ]);
  try {
    g.router.drainWorker('d');
    const pending = post(g.base, '/v1/completions', { model: 'm', prompt: 'waits', max_tokens: 1 });
    await until(() => a.posts === 1, 'the request on a');
    health = 500;
    await until(() => g.out('a'), 'a out of rotation');
    assert.equal(d.posts, 0, 'a draining worker takes no request');
    const resumed = await fetch(`${g.base}/admin/workers/d/resume`, {
      method: 'POST',
      headers: { authorization: `Bearer ${g.gateway.adminToken}` },
    });
    assert.equal(resumed.status, 200, await resumed.text());
    await until(() => d.posts === 1, 'the kept request moved to the worker resumed');
    d.release();
    const r = await pending;
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'd');
    await until(() => a.abandoned === 1, 'a let go of the request');
  } finally {
    await g.gateway.close();
    await a.close();
    await d.close();
  }
});
