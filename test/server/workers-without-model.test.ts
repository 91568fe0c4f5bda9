/**
 * WorkerConnections.withoutModel(): the workers not serving a model, as their model lists are
 * now. The proxy asks at each attempt, so the answer for a model is kept until a list changes (a
 * worker added or removed, a /v1/models read listing other adapters), and a worker that comes to
 * list a request's LoRA adapter takes the requests kept for it.
 */
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { fakeEngine, type FakeEngine } from '../faults/harness.js';
import { keptRequest, quietConnections } from '../helpers/worker-connections.js';
import { until } from '../helpers/wait.js';

/** An engine whose /v1/models lists `listed.entries` (changed by the test), and connections with no polling of their own. */
async function listingEngine(t: TestContext) {
  const listed: { entries: Array<{ id: string; parent?: string }> } = { entries: [{ id: 'm' }] };
  const engine: FakeEngine = await fakeEngine((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ data: listed.entries }));
  });
  const { health, connections } = quietConnections();
  t.after(async () => {
    await connections.close();
    await engine.close();
  });
  return { listed, engine, health, connections };
}

const WITH_ADAPTER = [{ id: 'm' }, { id: 'm-lora', parent: 'm' }];

test('the workers not serving a model follow the adapters a worker lists, and the workers added and removed', async (t) => {
  const { listed, engine, connections } = await listingEngine(t);
  // nothing listens at a's URL: its adapters are never read
  connections.add({ id: 'a', url: 'http://127.0.0.1:9', models: ['m'] });
  connections.add({ id: 'b', url: engine.url, models: ['m'] });
  await connections.readAdapters('b');
  const before = connections.withoutModel('m-lora');
  assert.deepEqual([...before], ['a', 'b']);
  assert.equal(connections.withoutModel('m-lora'), before, 'the same answer while nothing changed');
  listed.entries = WITH_ADAPTER;
  await connections.readAdapters('b');
  assert.deepEqual([...connections.withoutModel('m-lora')], ['a'], 'b lists the adapter now');
  assert.deepEqual([...before], ['a', 'b'], 'an answer given earlier is not changed');
  connections.add({ id: 'c', url: 'http://127.0.0.1:9', models: ['m'] });
  assert.deepEqual([...connections.withoutModel('m-lora')], ['a', 'c'], 'the worker added');
  connections.remove('a');
  assert.deepEqual([...connections.withoutModel('m-lora')], ['c'], 'the worker removed');
  listed.entries = [{ id: 'm' }];
  await connections.readAdapters('b');
  assert.deepEqual([...connections.withoutModel('m-lora')], ['b', 'c'], 'b lists the adapter no more');
});

test('models no worker lists share one answer: the workers that list their models', async (t) => {
  const { connections } = await listingEngine(t);
  connections.add({ id: 'a', url: 'http://127.0.0.1:9', models: ['m'] });
  connections.add({ id: 'b', url: 'http://127.0.0.1:9' });
  const unknown = connections.withoutModel('made-up-1');
  assert.deepEqual([...unknown], ['a']);
  assert.equal(connections.withoutModel('made-up-2'), unknown);
  assert.deepEqual([...connections.withoutModel('m')], []);
  assert.deepEqual([...connections.withoutModel(null)], []);
});

test('a request kept for an adapter moves once a worker in rotation lists the adapter in its /v1/models', async (t) => {
  const { listed, engine, health, connections } = await listingEngine(t);
  connections.add({ id: 'a', url: 'http://127.0.0.1:9', models: ['m'] });
  connections.add({ id: 'b', url: engine.url, models: ['m'] });
  await connections.readAdapters('b');
  const moved = keptRequest(connections, 'a', 'm-lora');
  health.set('a', 'health-check', false, 'HTTP 500');
  assert.equal(moved(), 0, 'no worker in rotation lists the adapter: kept');
  listed.entries = WITH_ADAPTER;
  await connections.readAdapters('b');
  assert.equal(moved(), 1, 'moved once b lists the adapter');
  await connections.readAdapters('b');
  assert.equal(moved(), 1, 'a read listing the same adapters decides nothing again');
});

test('past the kept answers, a name listed is still answered from what is kept, not made again at every call', async (t) => {
  const { listed, engine, connections } = await listingEngine(t);
  connections.add({ id: 'a', url: 'http://127.0.0.1:9', models: ['m'] });
  connections.add({ id: 'b', url: engine.url, models: ['m'] });
  listed.entries = [{ id: 'm' }, ...Array.from({ length: 1100 }, (_, i) => ({ id: `lora-${i}`, parent: 'm' }))];
  await connections.readAdapters('b');
  // clients cycling through more adapters than are kept
  for (let i = 0; i < 1100; i++) assert.deepEqual([...connections.withoutModel(`lora-${i}`)], ['a']);
  const base = connections.withoutModel('m');
  assert.deepEqual([...base], []);
  assert.equal(connections.withoutModel('m'), base, 'the base model answered from what is kept');
  const adapter = connections.withoutModel('lora-7');
  assert.equal(connections.withoutModel('lora-7'), adapter);
});

test('without models=, the lists the engines gave decide; a worker whose list was never read takes every name', async (t) => {
  const { listed, engine, connections } = await listingEngine(t);
  const other = await fakeEngine((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ data: [{ id: 'm2' }] }));
  });
  t.after(() => other.close());
  // nothing listens at a's URL: its list is never read
  connections.add({ id: 'a', url: 'http://127.0.0.1:9' });
  connections.add({ id: 'b', url: engine.url });
  connections.add({ id: 'c', url: other.url });
  listed.entries = WITH_ADAPTER;
  await connections.readAdapters('b');
  await connections.readAdapters('c');
  assert.deepEqual([...connections.withoutModel('m')], ['c']);
  assert.deepEqual([...connections.withoutModel('m-lora')], ['c']);
  assert.deepEqual([...connections.withoutModel('m2')], ['b']);
  // a name no engine lists: the engines have the last word on it (SGLang's base:adapter names,
  // an adapter loaded since the last read)
  assert.deepEqual([...connections.withoutModel('made-up')], []);
});

test('a worker coming back into rotation has its list read again', async (t) => {
  const { listed, engine, health, connections } = await listingEngine(t);
  let up = false;
  const starting = await fakeEngine((req, res) => {
    req.resume();
    if (!up) return void res.writeHead(503).end();
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ data: listed.entries }));
  });
  t.after(() => starting.close());
  connections.add({ id: 'a', url: engine.url, models: ['m'] });
  connections.add({ id: 'b', url: starting.url, models: ['m'] });
  await connections.readAdapters('a');
  await connections.readAdapters('b');
  assert.deepEqual([...connections.withoutModel('m-lora')], ['a', 'b']);
  health.set('b', 'health-check', false, 'connection refused');
  listed.entries = WITH_ADAPTER;
  up = true;
  health.set('b', 'health-check', true);
  await until(() => !connections.withoutModel('m-lora').has('b'), 'b listing the adapter');
});
