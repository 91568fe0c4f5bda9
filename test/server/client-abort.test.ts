import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { settled } from '../helpers/wait.js';

test('clients that give up before the engine answers do not count as engine failures', async () => {
  // non-streaming answers come when the last token is decoded: 2,000 tokens at 200 tok/s is 10 s
  const engine = await new MockEngine({ decodeTokS: 200 }).start();
  const router = new KVAwareRouter();
  const gw = await createGateway({
    router,
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    breakerFailures: 2,
  });
  try {
    const base = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const post = (body: unknown, signal?: AbortSignal) =>
      fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
        signal,
      });
    const inFlight = () => router.listWorkers()[0].inFlightRequests;
    for (let i = 0; i < 4; i++) {
      const ac = new AbortController();
      const pending = post({ prompt: `long answer ${i}`, max_tokens: 2000 }, ac.signal).catch((err: Error) => err);
      // wait until the gateway has routed it (it is in flight on e0), then hang up
      assert.equal(await settled(inFlight, (n) => n > 0, { intervalMs: 1 }), 1);
      ac.abort();
      assert.ok((await pending) instanceof Error);
      assert.equal(await settled(inFlight, (n) => n === 0, { intervalMs: 1 }), 0);
    }
    // more hang-ups than breakerFailures, and the worker still takes requests
    assert.equal(router.listWorkers()[0].available, true);
    const res = await post({ prompt: 'short', max_tokens: 1 });
    assert.equal(res.status, 200);
  } finally {
    await gw.close();
    await engine.close();
  }
});
