/**
 * What a client claims about its own request, taken at its word only as far as it can be:
 * content anchors that claim more cached tokens than the prompt has, metadata headers given
 * twice.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';

let engine: MockEngine;
let gateway: Gateway;
let base = '';

before(async () => {
  engine = await new MockEngine({ decodeTokS: 10_000 }).start();
  gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
    cachedTokensHeader: true,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close();
  await engine.close();
});

const counter = async (name: string) => {
  const text = await (await fetch(`${base}/metrics`)).text();
  return Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
};

test('an anchor claiming 2^53 tokens cannot push the cached-tokens metric or header past the prompt', async () => {
  const body = JSON.stringify({
    prompt: 'hi',
    max_tokens: 1,
    contextforge: { anchors: [{ id: 'huge', tokens: Number.MAX_SAFE_INTEGER }] },
  });
  const headers: string[] = [];
  // the first request records the anchor on the worker, the second is scored with it
  for (let i = 0; i < 2; i++) {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    });
    assert.equal(res.status, 200);
    headers.push(res.headers.get('x-contextforge-cached-tokens') ?? '');
    await res.text();
  }
  const cached = await counter('contextforge_predicted_cached_tokens_total');
  const prompt = await counter('contextforge_prompt_tokens_total');
  assert.ok(cached <= prompt, `cached tokens counted (${cached}) exceed the prompt tokens counted (${prompt})`);
  for (const h of headers) assert.ok(Number(h) <= prompt, `x-contextforge-cached-tokens: ${h}`);
});
