/**
 * The 503 a request gets when no worker can take it says why, with a stable code: how many
 * workers there are and how many are out for each reason (circuit breaker, health check,
 * draining…), counted rather than listed, so the message stays short for any fleet.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { fakeEngine, type FakeEngine } from '../faults/harness.js';

let engine: FakeEngine;
let gateway: Gateway;
let base = '';
const FLEET = 60;

before(async () => {
  engine = await fakeEngine((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[{"text":"ok"}]}');
  });
  gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: Array.from({ length: FLEET }, (_, i) => ({ id: `w${i}`, url: engine.url })),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    panicRouting: false,
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close(0);
  await engine.close();
});

const complete = async () => {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: 'hello' }),
    signal: AbortSignal.timeout(10_000),
  });
  return {
    status: res.status,
    retryAfter: res.headers.get('retry-after'),
    error: ((await res.json()) as { error: { code: string | null; message: string } }).error,
  };
};

test('the 503 names the code and counts the workers out per reason', async () => {
  for (let i = 0; i < FLEET; i++) {
    if (i < 3) gateway.drainWorker(`w${i}`, true);
    else if (i < 10) gateway.health.set(`w${i}`, 'health-check', false, 'answered 500');
    else gateway.health.set(`w${i}`, 'breaker', false);
  }
  const { status, retryAfter, error } = await complete();
  assert.equal(status, 503);
  assert.equal(retryAfter, '1');
  assert.equal(error.code, 'no_worker_available');
  assert.match(error.message, /^no worker can take the request now/);
  assert.match(error.message, /\b60 workers: 50 circuit breaker open, 7 health check failing, 3 draining\b/);
  // counted, not one line per worker
  assert.ok(error.message.length < 200, error.message);
});
