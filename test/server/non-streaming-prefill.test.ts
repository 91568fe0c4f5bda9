import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { KvEventSubscriber } from '../../src/engines/kv-events/subscriber.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { RecordingStateStore } from '../helpers/recording-state-store.js';
import { settled } from '../helpers/wait.js';

test('an answer that is not streamed: its prefill ends in the router when the engine reports the prompt stored, not with the answer', async () => {
  // 400 tokens at 100 tok/s: the whole answer comes about 4 s after the prefill
  const engine = await new MockEngine({
    decodeTokS: 100,
    events: 'tcp://127.0.0.1:*',
    replay: 'tcp://127.0.0.1:*',
  }).start();
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
  const state = new RecordingStateStore();
  const gw = await createGateway({
    state,
    router,
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    tokenize: 'engine',
  });
  const sub = new KvEventSubscriber({
    workerId: 'e0',
    endpoint: engine.eventsEndpoint,
    replayEndpoint: engine.replayEndpoint,
    applier: new KvEventApplier(router),
  }).start();
  try {
    const base = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const prompt = Array.from({ length: 200 }, (_, i) => `word${i}`).join(' ');
    const answer = fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'mock', prompt, max_tokens: 400 }),
    });
    const w = () => router.listWorkers()[0];
    const seen = await settled(
      () => ({ inFlight: w().inFlightRequests, queued: w().queuedPrefillTokens, decoding: w().activeDecodeTokens }),
      (s) => s.inFlight === 1 && s.queued === 0 && s.decoding > 0,
      { timeoutMs: 3000, intervalMs: 5 },
    );
    assert.equal(seen.inFlight, 1, 'the answer is still being generated');
    assert.equal(seen.queued, 0, 'its prompt no longer counts as queued prefill');
    assert.ok(seen.decoding > 0, 'it counts as decoding');
    // and the other replicas hear of it then, not with the answer
    assert.deepEqual(state.told, ['made', 'prefilled']);
    const res = await answer;
    assert.equal(res.status, 200);
    const body = (await res.json()) as { usage: { completion_tokens: number } };
    assert.equal(body.usage.completion_tokens, 400);
    assert.equal(
      await settled(
        () => w().inFlightRequests,
        (n) => n === 0,
      ),
      0,
    );
    assert.equal(w().activeDecodeTokens, 0);
    assert.deepEqual(state.told, ['made', 'prefilled', 'prefilled', 'ended']);
  } finally {
    await sub.close();
    await gw.close();
    await engine.close();
  }
});
