import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Registry } from 'prom-client';
import { KVAwareRouter } from '../../src/index.js';
import { RouterPicker, type RoutingBackend } from '../../src/epp/router-picker.js';
import { until } from '../helpers/wait.js';
import { handlerCapturingPick } from './harness.js';
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

test('the endpoint picker: a streamed answer Envoy does not send as it comes has its prefill read off the engine', async () => {
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
  router.registerWorker('w0');
  const state = new RecordingStateStore();
  const stop = sharePrefillReads(router, state);
  const picker = new RouterPicker(backend(router, state), { fallbacks: 0 });
  // response body mode NONE or BUFFERED: the picker sees no first token while the answer streams
  const streamed = await picker.pick({
    headers: new Map([[':path', '/v1/completions']]),
    body: Buffer.from(JSON.stringify({ model: 'mock', prompt: '3', stream: true })),
    subset: undefined,
    requestId: 'r3',
    responseBodyStreamed: false,
  });
  assert.ok(streamed.ok);
  if (!streamed.ok) return;
  const w = router.listWorkers()[0];
  assert.equal(w.queuedPrefillTokens, 64);
  // the engine stores the prompt: its prefill is done, though no byte of the answer was seen
  router.applyStored('w0', router.hashTokens(tokens(3)));
  assert.equal(w.queuedPrefillTokens, 0);
  assert.equal(state.prefilled.length, 1);
  streamed.inFlight.end();
  assert.equal(w.inFlightRequests, 0);
  stop();
});

test('the ext_proc handler tells the picker whether Envoy sends the response body as it comes', async () => {
  const seen = async (mode: string | undefined): Promise<boolean | undefined> => {
    const { call, picked } = handlerCapturingPick();
    call.push({
      request: 'request_headers',
      request_headers: { headers: { headers: [] }, end_of_stream: false },
      ...(mode === undefined
        ? {}
        : { protocol_config: { request_body_mode: 'FULL_DUPLEX_STREAMED', response_body_mode: mode } }),
    });
    call.push({ request: 'request_body', request_body: { body: Buffer.from('{"stream":true}'), end_of_stream: true } });
    await until(() => picked() !== undefined, 'the pick');
    call.destroy();
    return picked()!.responseBodyStreamed;
  };
  assert.equal(await seen(undefined), true, 'no protocol_config: as the picker is deployed, streamed');
  assert.equal(await seen('FULL_DUPLEX_STREAMED'), true);
  assert.equal(await seen('STREAMED'), true);
  assert.equal(await seen('NONE'), false);
  assert.equal(await seen('BUFFERED'), false);
  assert.equal(await seen('BUFFERED_PARTIAL'), false);
});
