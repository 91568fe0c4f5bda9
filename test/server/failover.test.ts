import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';

test('killing a worker under load loses no request that had not started streaming', async () => {
  const engines = [await new MockEngine({ decodeTokS: 100 }).start(), await new MockEngine({ decodeTokS: 100 }).start()];
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({ router, workers: engines.map((e, i) => ({ id: `e${i}`, url: `http://127.0.0.1:${e.port}` })), breakerFailures: 2 });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const one = (i: number) =>
    fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: `request ${i}`, max_tokens: 20 }) }).then(async (r) => ({
      status: r.status,
      worker: r.headers.get('x-contextforge-worker'),
      body: (await r.json()) as { usage?: { completion_tokens: number } },
    }));
  // 40 non-streaming requests in flight on both engines (20 tokens at 100 tok/s: ~200 ms each)
  const inFlight = Array.from({ length: 40 }, (_, i) => one(i));
  await new Promise((r) => setTimeout(r, 60));
  await engines[1].close(); // dies with requests in its queue and batch
  const more = Array.from({ length: 20 }, (_, i) => one(100 + i));
  const results = await Promise.all([...inFlight, ...more]);
  for (const r of results) {
    assert.equal(r.status, 200);
    assert.equal(r.body.usage?.completion_tokens, 20);
  }
  const lateOnE1 = results.slice(40).filter((r) => r.worker === 'e1').length;
  assert.equal(lateOnE1, 0, 'nothing after the kill was answered by the dead worker');
  assert.equal(router.listWorkers().find((w) => w.id === 'e1')!.healthy, false, 'its circuit is open');
  assert.equal(router.getStats().inFlightRequests, 0, 'every ticket was released');
  const metrics = await (await fetch(`${base}/metrics`)).text();
  assert.match(metrics, /contextforge_upstream_retries_total\{worker="e1"\} [1-9]/);
  await gateway.close();
  await engines[0].close();
});
