/**
 * A request kept on a worker out of rotation for a LoRA adapter no worker in rotation lists
 * moves once a worker in rotation lists it: re-reading a worker's /v1/models is a way a worker
 * comes to serve a request, as coming back into rotation is.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fakeEngine } from '../faults/harness.js';
import { keptRequest, quietConnections } from '../helpers/worker-connections.js';

test('a request kept for an adapter moves once a worker in rotation lists the adapter in its /v1/models', async (t) => {
  // b's /v1/models: its base model, then the adapter too
  let listed: Array<{ id: string; parent?: string }> = [{ id: 'm' }];
  const b = await fakeEngine((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ data: listed }));
  });
  const { health, connections } = quietConnections();
  t.after(async () => {
    await connections.close();
    await b.close();
  });
  // nothing listens at a's URL: the request there is a stand-in
  connections.add({ id: 'a', url: 'http://127.0.0.1:9', models: ['m'] });
  connections.add({ id: 'b', url: b.url, models: ['m'] });
  await connections.readAdapters('b');
  const moved = keptRequest(connections, 'a', 'm-lora');
  health.set('a', 'health-check', false, 'HTTP 500');
  assert.equal(moved(), 0, 'no worker in rotation lists the adapter: kept');
  listed = [{ id: 'm' }, { id: 'm-lora', parent: 'm' }];
  await connections.readAdapters('b');
  assert.equal(connections.loraOf('m-lora'), 'm-lora', 'b lists it');
  assert.equal(moved(), 1, 'moved once b lists the adapter');
});
