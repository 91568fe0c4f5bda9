import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Registry } from 'prom-client';
import { KVAwareRouter } from '../../src/index.js';
import { RouterPicker, type RoutingBackend } from '../../src/epp/router-picker.js';
import { sharePrefillReads } from '../../src/state/prefill-sharing.js';
import { RecordingStateStore } from '../helpers/recording-state-store.js';

const tokens = (family: number) => Array.from({ length: 64 }, (_, i) => family * 1000 + i);

function backend(router: KVAwareRouter, state: RecordingStateStore): RoutingBackend {
  return {
    router,
    state,
    metrics: new Registry(),
    *workers() {
      yield { id: 'w0', url: 'http://127.0.0.1:9001' };
    },
    workersWithoutModel: () => new Set(),
    // token ids, as the gateway's tokenizer or the engine's /tokenize give them
    prepare: async (_path, body) => {
      const b = body as { prompt: string };
      return {
        routeRequest: { tokens: tokens(Number(b.prompt)) },
        body: b as Record<string, unknown>,
        unchanged: true,
      };
    },
  };
}

test('the endpoint picker: a body that is not streamed has its prefill read off the engine, and shared', async () => {
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
  router.registerWorker('w0');
  const state = new RecordingStateStore();
  // as the gateway behind the picker does for every front end on its router
  const stop = sharePrefillReads(router, state);
  const picker = new RouterPicker(backend(router, state), { fallbacks: 0 });
  const pick = (prompt: number, stream: boolean) =>
    picker.pick({
      headers: new Map([[':path', '/v1/completions']]),
      body: Buffer.from(JSON.stringify({ model: 'mock', prompt: String(prompt), stream })),
      subset: undefined,
      requestId: `r${prompt}`,
    });
  const w = router.listWorkers()[0];

  const whole = await pick(1, false);
  const streamed = await pick(2, true);
  assert.ok(whole.ok && streamed.ok);
  if (!whole.ok || !streamed.ok) return;
  assert.equal(w.queuedPrefillTokens, 128);
  // the engine stores both prompts: only the whole answer's prefill is read off it
  router.applyStored('w0', router.hashTokens(tokens(1)));
  router.applyStored('w0', router.hashTokens(tokens(2)));
  assert.equal(w.queuedPrefillTokens, 64, 'the streamed one waits for its first byte');
  assert.equal(state.prefilled.length, 1);
  streamed.inFlight.firstByte();
  assert.equal(w.queuedPrefillTokens, 0);
  assert.equal(state.prefilled.length, 2);
  whole.inFlight.firstByte();
  whole.inFlight.end();
  streamed.inFlight.end();
  assert.equal(w.inFlightRequests, 0);
  assert.equal(w.activeDecodeTokens, 0);
  stop();
});
