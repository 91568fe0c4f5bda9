/**
 * The `model` field is what the gateway routes on (a worker that lists its models gets only
 * requests for them), so a request whose model is not a string is the client's mistake to fix:
 * a 400 naming `model`, before routing. Forwarded, it would be routed past every worker's model
 * list, and an engine that fails on it with a 5xx would count that against the worker: a few
 * such requests would open every worker's circuit.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { fakeEngine, type FakeEngine } from '../faults/harness.js';

let engine: FakeEngine;
let gateway: Gateway;
let base = '';
/** What reached the engine: the `model` of each request. */
const seen: unknown[] = [];

before(async () => {
  // an engine that fails on a model it cannot read, as the mock engine did on {"toString": 1}
  engine = await fakeEngine((req, res) => {
    // the gateway's own reads (its periodic /v1/models) are no completions
    if (req.method !== 'POST') return void res.writeHead(404).end();
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      const { model } = JSON.parse(body) as { model?: unknown };
      seen.push(model);
      const ok = model === undefined || model === null || typeof model === 'string';
      const text = ok ? '{"choices":[{"text":"ok"}]}' : '{"error":{"message":"engine exploded"}}';
      res.writeHead(ok ? 200 : 500, { 'content-type': 'application/json', 'content-length': text.length }).end(text);
    });
  });
  gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'e0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close(0);
  await engine.close();
});

const post = (path: string, body: string, headers: Record<string, string> = {}) =>
  fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });

test('a model that is not a string is a 400 naming model; it reaches no engine and opens no circuit', async () => {
  const bodies = [
    '{"model":{"toString":1},"prompt":"x","max_tokens":1}',
    '{"model":5,"prompt":"x","max_tokens":1}',
    '{"model":["mock"],"prompt":"x","max_tokens":1}',
    '{"model":true,"messages":[{"role":"user","content":"x"}],"max_tokens":1}',
  ];
  for (const [i, body] of bodies.entries()) {
    const path = body.includes('messages') ? '/v1/chat/completions' : '/v1/completions';
    // the fast path and Fastify's route (a query string takes the request past the fast path) alike
    for (const target of [path, `${path}?via=fastify`]) {
      const res = await post(target, body);
      const text = await res.text();
      assert.equal(res.status, 400, `${target} ${body}: ${text}`);
      const { error } = JSON.parse(text) as { error: { message: string; param: string | null; type: string } };
      assert.equal(error.param, 'model', text);
      assert.equal(error.type, 'invalid_request_error');
      assert.match(error.message, /^model must be a string/, `${i}: ${text}`);
    }
  }
  assert.deepEqual(seen, [], 'no request with a bad model reached the engine');
  // the worker is still in rotation, and a request with a model (or none, or null) is served
  assert.equal((await fetch(`${base}/readyz`)).status, 200);
  for (const model of ['"mock"', 'null']) {
    const res = await post('/v1/completions', `{"model":${model},"prompt":"x","max_tokens":1}`);
    assert.equal(res.status, 200, await res.text());
  }
  const res = await post('/v1/completions', '{"prompt":"x","max_tokens":1}');
  assert.equal(res.status, 200, await res.text());
});

test('/v1/route refuses a model that is not a string the same way', async () => {
  const res = await post('/v1/route', '{"model":{"a":1},"prompt":"x"}', {
    authorization: `Bearer ${gateway.adminToken}`,
  });
  const text = await res.text();
  assert.equal(res.status, 400, text);
  assert.equal((JSON.parse(text) as { error: { param: string } }).error.param, 'model');
});
