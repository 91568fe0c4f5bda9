import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { RecordingStateStore } from '../helpers/recording-state-store.js';

// An engine that refuses a request (an HTTP 4xx) holds none of it: the gateway withdraws its
// own predictions (markRefused) and tells the other replicas, so they withdraw what they
// applied of its decision (docs/routing.md §6).

test('an engine answering 400: the other replicas are told of the refusal, between the decision and its end', async () => {
  const engine = await new MockEngine({}).start();
  const state = new RecordingStateStore();
  const gw = await createGateway({
    state,
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const base = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const send = (maxTokens: number) =>
      fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'mock', prompt: 'a prompt of a few words', max_tokens: maxTokens, stream: true }),
      });
    const refused = await send(0); // the engine rejects max_tokens 0
    assert.equal(refused.status, 400);
    await refused.arrayBuffer();
    // (the error body's first byte reports a prefill too, after the refusal: it withdraws nothing)
    assert.deepEqual(
      state.told.filter((m) => m !== 'prefilled'),
      ['made', 'refused', 'ended'],
    );
    state.told.length = 0;
    const served = await send(2);
    assert.equal(served.status, 200);
    await served.arrayBuffer();
    assert.deepEqual(state.told, ['made', 'prefilled', 'ended']);
  } finally {
    await gw.close();
    await engine.close();
  }
});
