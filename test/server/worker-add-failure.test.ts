/**
 * A worker whose KV-event endpoints ZeroMQ would refuse (a wildcard host is for binding, a NUL
 * ends ZeroMQ's string, a path too long for a Unix socket) is refused as a whole, with a 400
 * naming the field: nothing of it stays registered or open. The replay endpoint is checked the
 * same way, though ZeroMQ meets it only when a replay is asked for; and what ZeroMQ itself
 * refuses when the subscriber connects names `events` too.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Subscriber } from 'zeromq';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { allServed } from '../helpers/all-served.js';

const adminToken = 'worker-add-failure-admin';

async function withGateway(run: (gateway: Gateway, base: string, enginePort: number) => Promise<void>) {
  const engine = await new MockEngine().start();
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 16 }),
    tokenize: 'engine',
    kvEvents: true,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    workers: [{ id: 'good', url: `http://127.0.0.1:${engine.port}` }],
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    await run(gateway, base, engine.port);
  } finally {
    await gateway.close();
    await engine.close();
  }
}

/** Adds worker `bad` with `fields`: expects a 400 naming `param`, and nothing of the worker left. */
async function refused(gateway: Gateway, base: string, body: Record<string, unknown>, param: string) {
  const res = await fetch(`${base}/admin/workers`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
    body: JSON.stringify({ id: 'bad', ...body }),
  });
  const text = await res.text();
  assert.equal(res.status, 400, text);
  assert.equal((JSON.parse(text) as { error: { param: string | null } }).error.param, param, text);
  assert.deepEqual(
    gateway.router.listWorkers().map((w) => w.id),
    ['good'],
    'the refused worker is not in the router',
  );
  assert.equal(gateway.connections.has('bad'), false);
}

test('events and replay endpoints ZeroMQ cannot connect to refuse the worker, naming the field, and leave nothing behind', async () => {
  await withGateway(async (gateway, base, port) => {
    const url = `http://127.0.0.1:${port}`;
    for (const events of ['tcp://*:5557', 'tcp://%00:5557', 'tcp://127.0.0.1:5557\u0000', `ipc:///${'a'.repeat(200)}`])
      await refused(gateway, base, { url, events }, 'events');
    for (const replay of ['tcp://*:5558', 'tcp://-x:5558', 'tcp://exämple:5558'])
      await refused(gateway, base, { url, events: 'tcp://127.0.0.1:5557', replay }, 'replay');
    await allServed(base, 8);
  });
});

test('an events endpoint ZeroMQ refuses when the subscriber connects names events, and leaves nothing behind', async () => {
  const endpoint = 'tcp://127.0.0.1:5557';
  const connect = Subscriber.prototype.connect;
  // ZeroMQ has the last word on an endpoint: its refusal, made for this one (Socket's connect
  // is read-only: shadowed on Subscriber's prototype)
  Object.defineProperty(Subscriber.prototype, 'connect', {
    configurable: true,
    value(this: Subscriber, address: string) {
      if (address === endpoint) throw new Error('Invalid argument');
      connect.call(this, address);
    },
  });
  try {
    await withGateway(async (gateway, base, port) => {
      await refused(gateway, base, { url: `http://127.0.0.1:${port}`, events: endpoint }, 'events');
      await allServed(base, 8);
    });
  } finally {
    delete (Subscriber.prototype as { connect?: unknown }).connect;
  }
});

test('a subscriber refused its endpoint closes its socket', async () => {
  const { KvEventSubscriber } = await import('../../src/engines/kv-events/subscriber.js');
  const { KvEventApplier } = await import('../../src/engines/kv-events/applier.js');
  const router = new KVAwareRouter({ blockSize: 16 });
  router.registerWorker('w', { url: 'http://127.0.0.1:1' });
  const subscriber = new KvEventSubscriber({
    workerId: 'w',
    endpoint: 'tcp://*:5557',
    applier: new KvEventApplier(router),
  });
  assert.throws(() => subscriber.start(), RangeError);
  assert.equal((subscriber as unknown as { sub: { closed: boolean } }).sub.closed, true);
  await subscriber.close();
});
