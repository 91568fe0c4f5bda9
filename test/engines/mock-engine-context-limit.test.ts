import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';

const engines: MockEngine[] = [];
const gateways: Gateway[] = [];
after(async () => {
  for (const g of gateways) await g.close();
  for (const e of engines) await e.close();
});

test("mock engine: a request over --max-model-len gets vLLM's HTTP 400", async () => {
  const e = await new MockEngine({ maxModelLen: 64, decodeTokS: 2000 }).start();
  engines.push(e);
  const post = (body: unknown) =>
    fetch(`http://127.0.0.1:${e.port}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify(body),
      headers: { 'content-type': 'application/json' },
    });
  const prompt = Array.from({ length: 50 }, (_, i) => i + 1000);

  const tooLong = await post({ prompt: [...prompt, ...prompt], max_tokens: 1 });
  assert.equal(tooLong.status, 400);
  assert.deepEqual(await tooLong.json(), {
    error: {
      message:
        "This model's maximum context length is 64 tokens. However, your request has 100 input tokens. Please reduce the length of the input messages.",
      type: 'BadRequestError',
      param: null,
      code: 400,
    },
  });

  const tooMuchOutput = await post({ prompt, max_tokens: 20 });
  assert.equal(tooMuchOutput.status, 400);
  const body = (await tooMuchOutput.json()) as { error: { message: string } };
  assert.match(
    body.error.message,
    /'max_tokens' or 'max_completion_tokens' is too large: 20\. This model's maximum context length is 64 tokens and your request has 50 input tokens \(20 > 64 - 50\)/,
  );

  const fits = await post({ prompt, max_tokens: 14 });
  assert.equal(fits.status, 200);
  assert.equal(((await fits.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens, 14);

  const tok = await fetch(`http://127.0.0.1:${e.port}/tokenize`, {
    method: 'POST',
    body: JSON.stringify({ prompt: 'hi' }),
    headers: { 'content-type': 'application/json' },
  });
  assert.equal(((await tok.json()) as { max_model_len: number }).max_model_len, 64);
});

test('mock engine: cancelling a request mid-prefill keeps the blocks another request still computes', async () => {
  const e = await new MockEngine({ prefillTokS: 2000, decodeTokS: 2000, blockSize: 16 }).start();
  engines.push(e);
  const url = (path: string) => `http://127.0.0.1:${e.port}${path}`;
  const prompt = Array.from({ length: 800 }, (_, i) => i + 5000); // a 400 ms prefill step
  const body = JSON.stringify({ prompt, max_tokens: 2 });
  const headers = { 'content-type': 'application/json' };
  const abort = new AbortController();
  const first = fetch(url('/v1/completions'), { method: 'POST', body, headers, signal: abort.signal }).catch(
    () => undefined,
  );
  const metrics = async () => (await fetch(url('/metrics'))).text();
  // wait until the first request is in its prefill step, then queue the same prompt again
  await until(async () => /vllm:num_requests_running\{[^}]*\} 1/.test(await metrics()), 'the first request to start', {
    intervalMs: 1,
  });
  const second = fetch(url('/v1/completions'), { method: 'POST', body, headers });
  await until(async () => /vllm:num_requests_waiting\{[^}]*\} 1/.test(await metrics()), 'the second request to queue', {
    intervalMs: 1,
  });
  abort.abort();
  await first;
  assert.equal((await second).status, 200);
  const cache = await fetch(url('/debug/cache'));
  assert.equal(cache.status, 200);
  assert.equal(((await cache.json()) as { blockHashes: string[] }).blockHashes.length, 800 / 16);
});

test("the engine's context-limit 400 reaches the client through the gateway unchanged", async () => {
  const e = await new MockEngine({ maxModelLen: 64 }).start();
  engines.push(e);
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gw = await createGateway({
    router,
    workers: [{ id: 'a', url: `http://127.0.0.1:${e.port}` }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  gateways.push(gw);
  const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  const prompt = Array.from({ length: 100 }, (_, i) => i + 1000);
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 1 }),
  });
  assert.equal(r.status, 400);
  const body = (await r.json()) as { error: { type: string; code: number; message: string } };
  assert.equal(body.error.type, 'BadRequestError');
  assert.equal(body.error.code, 400);
  assert.match(body.error.message, /maximum context length is 64 tokens/);
  assert.equal(r.headers.get('x-contextforge-worker'), 'a');
});
