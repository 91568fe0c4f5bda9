/**
 * contextforge_request_duration_seconds counts every request the gateway routed and answered,
 * whatever the answer: the engine's, or the gateway's own once every engine tried failed (502)
 * or refused as overloaded (429). An outage must show in the histogram's count, not vanish
 * from it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Registry } from 'prom-client';
import { answeringEngine, badFirstGateway, failingEngine, freePort, post } from './harness.js';

/** A sample of the registry's text, or 0 when it has none. */
async function sample(registry: Registry, series: string): Promise<number> {
  const text = await registry.metrics();
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? 0 : Number(line.slice(series.length + 1));
}

const COUNT = 'contextforge_request_duration_seconds_count';

test('a request answered 502 after every engine failed (500, connection refused) is observed in the duration histogram', async () => {
  const failing = await failingEngine();
  const refusedPort = await freePort();
  const g = await badFirstGateway(failing.url, false, { maxRetries: 2 });
  try {
    g.gateway.addWorker({ id: 'refused', url: `http://127.0.0.1:${refusedPort}` });
    const before = await sample(g.gateway.metrics, COUNT);
    const r = await post(g.base, '/v1/completions', { prompt: 'all engines fail', max_tokens: 2 });
    assert.equal(r.status, 502, r.text);
    assert.equal(await sample(g.gateway.metrics, COUNT), before + 1, 'the 502 is one more observed request');
  } finally {
    await g.close();
    await failing.close();
  }
});

test('a request answered 429 after every engine refused as overloaded is observed in the duration histogram', async () => {
  const overloaded = await answeringEngine(429, '{"error":{"message":"overloaded"}}', { 'retry-after': '2' });
  const g = await badFirstGateway(overloaded.url, false);
  try {
    const before = await sample(g.gateway.metrics, COUNT);
    const r = await post(g.base, '/v1/completions', { prompt: 'overloaded', max_tokens: 2 });
    assert.equal(r.status, 429, r.text);
    assert.equal(await sample(g.gateway.metrics, COUNT), before + 1, 'the 429 is one more observed request');
  } finally {
    await g.close();
    await overloaded.close();
  }
});

test('a request no worker can take (503) or for a model no worker serves (404) is observed in the duration histogram', async () => {
  const ok = await answeringEngine(200, '{"choices":[{"text":"ok"}]}');
  const g = await badFirstGateway(ok.url, false);
  try {
    g.gateway.removeWorker('bad');
    g.gateway.addWorker({ id: 'alpha', url: ok.url, models: ['alpha'] });
    const missing = await post(g.base, '/v1/completions', { model: 'gamma', prompt: 'x', max_tokens: 2 });
    assert.equal(missing.status, 404, missing.text);
    assert.equal(await sample(g.gateway.metrics, COUNT), 1, 'the 404 is observed');
    g.router.drainWorker('alpha');
    const none = await post(g.base, '/v1/completions', { model: 'alpha', prompt: 'x', max_tokens: 2 });
    assert.equal(none.status, 503, none.text);
    assert.equal(await sample(g.gateway.metrics, COUNT), 2, 'the 503 is observed');
  } finally {
    await g.close();
    await ok.close();
  }
});

test('a request answered by an engine is observed once, as before', async () => {
  const ok = await answeringEngine(200, '{"choices":[{"text":"ok"}]}');
  const g = await badFirstGateway(ok.url, false);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'answered', max_tokens: 2 });
    assert.equal(r.status, 200, r.text);
    assert.equal(await sample(g.gateway.metrics, COUNT), 1);
  } finally {
    await g.close();
    await ok.close();
  }
});
