/**
 * The models each engine lists in its /v1/models decide where a request goes: with or without
 * `models=`, a request goes only to workers whose engines serve its model (their LoRA adapters
 * included), and a worker's list is read again when it comes into rotation, so an adapter the
 * gateway's own /v1/models lists is served as soon as its worker is.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { fakeEngine, freePort, OK_COMPLETION } from '../faults/harness.js';
import { until } from '../helpers/wait.js';

const complete = (url: string, model: string) =>
  fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt: 'same prompt', max_tokens: 1 }),
  });

test('without models=, each request goes to a worker whose engine lists its model or adapter', async (t) => {
  const a = await new MockEngine({ model: 'm1', loraModules: ['l1'] }).start();
  const b = await new MockEngine({ model: 'm2' }).start();
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [
      { id: 'a', url: `http://127.0.0.1:${a.port}` },
      { id: 'b', url: `http://127.0.0.1:${b.port}` },
    ],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  t.after(async () => {
    await gw.close();
    await a.close();
    await b.close();
  });
  const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  const auth = { authorization: `Bearer ${gw.adminToken}` };
  // the lists are read when the workers are added: the dry run shows when they have been
  const routedTo = async (model: string) =>
    (
      (await (
        await fetch(`${url}/v1/route`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...auth },
          body: JSON.stringify({ model, prompt: 'x' }),
        })
      ).json()) as { worker: string }
    ).worker;
  await until(async () => (await routedTo('m2')) === 'b' && (await routedTo('m1')) === 'a', 'the lists read');
  for (const model of ['m1', 'l1', 'm2', 'm1', 'l1', 'm2']) {
    const r = await complete(url, model);
    assert.equal(r.status, 200, `model ${model}: ${await r.clone().text()}`);
    assert.equal(r.headers.get('x-contextforge-worker'), model === 'm2' ? 'b' : 'a', `model ${model}`);
    await r.arrayBuffer();
  }
});

test('an adapter is served as soon as its worker, whose engine started after the gateway, is in rotation', async (t) => {
  const portA = await freePort();
  const b = await new MockEngine({ model: 'm2' }).start();
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [
      { id: 'a', url: `http://127.0.0.1:${portA}`, models: ['m1'] },
      { id: 'b', url: `http://127.0.0.1:${b.port}`, models: ['m2'] },
    ],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 50,
  });
  const started: MockEngine[] = [];
  t.after(async () => {
    await gw.close();
    for (const e of started) await e.close();
    await b.close();
  });
  const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  const available = async () =>
    ((await (await fetch(`${url}/readyz`)).json()) as { availableWorkers: number }).availableWorkers;
  // a's engine is not up: its health check takes it out, and its adapters could not be read
  await until(async () => (await available()) === 1, 'a out of rotation');
  started.push(await new MockEngine({ model: 'm1', loraModules: ['l1'], port: portA }).start());
  await until(async () => (await available()) === 2, 'a back in rotation');
  const r = await complete(url, 'l1');
  assert.equal(r.status, 200, await r.clone().text());
  assert.equal(r.headers.get('x-contextforge-worker'), 'a');
  await r.arrayBuffer();
});

test('an adapter loaded after its engine was read is served: the lists are read again before a 404', async (t) => {
  const listed = { entries: [{ id: 'm1' }] as Array<{ id: string; parent?: string }> };
  const a = await fakeEngine((req, res) => {
    req.resume();
    if (req.url === '/v1/models')
      return void res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ data: listed.entries }));
    res.writeHead(200, { 'content-type': 'application/json' }).end(OK_COMPLETION);
  });
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'a', url: a.url, models: ['m1'] }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  t.after(async () => {
    await gw.close();
    await a.close();
  });
  const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  await until(() => a.requests > 0, 'the list read when the worker was added');
  const unknown = await complete(url, 'l1');
  assert.equal(unknown.status, 404, 'no engine lists it');
  await unknown.arrayBuffer();
  // loaded at the engine (vLLM's /v1/load_lora_adapter): the next re-read finds it
  listed.entries = [{ id: 'm1' }, { id: 'l1', parent: 'm1' }];
  await until(async () => {
    const r = await complete(url, 'l1');
    await r.arrayBuffer();
    return r.status === 200;
  }, 'l1 served');
});
