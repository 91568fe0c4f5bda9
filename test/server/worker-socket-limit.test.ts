/**
 * ZeroMQ's context refuses sockets past its max_sockets, a replay's included. A worker with KV
 * events whose subscriber would leave another no room for its replay is refused with a 503
 * naming the limit, and one ZeroMQ refuses a socket anyway (out of sockets or descriptors) the
 * same: the workers already there keep theirs.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { context, Dealer } from 'zeromq';
import { SOCKETS_PER_SUBSCRIBER, subscriberRoom } from '../../src/engines/kv-events/subscriber.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';

// before any socket of this process: room for three subscribers beside the spare sockets
const SPARE = 2 * SOCKETS_PER_SUBSCRIBER;
context.maxSockets = SPARE + 3 * SOCKETS_PER_SUBSCRIBER;

const adminToken = 'worker-socket-limit-admin';
const gateway = await createGateway({
  adminToken,
  router: new KVAwareRouter({ blockSize: 16 }),
  tokenize: 'engine',
  kvEvents: true,
  metricsIntervalMs: 0,
  healthCheckIntervalMs: 0,
});
const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
after(() => gateway.close());

const admin = async (method: string, path: string, body?: unknown) => {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, text: await res.text() };
};
// an engine that is not there: its subscriber retries, its sockets open all the same (each
// worker its own endpoint: two workers never share an engine's stream)
const add = (id: string) =>
  admin('POST', '/admin/workers', {
    id,
    url: 'http://127.0.0.1:1',
    events: `tcp://127.0.0.1:${65500 + Number(id.slice(1))}`,
  });
const ids = () =>
  gateway.router
    .listWorkers()
    .map((w) => w.id)
    .sort();

test('a worker with events past the socket budget is refused with a 503 naming the limit; removing one makes room', async () => {
  for (const id of ['e0', 'e1', 'e2']) assert.equal((await add(id)).status, 201, id);
  const refused = await add('e3');
  assert.equal(refused.status, 503, refused.text);
  assert.match(refused.text, new RegExp(`max_sockets ${context.maxSockets}`));
  assert.deepEqual(ids(), ['e0', 'e1', 'e2']);
  assert.equal((await admin('DELETE', '/admin/workers/e0')).status, 200);
  // room comes back once ZeroMQ has released e0's socket
  await until(() => subscriberRoom().room > 0, 'room for a subscriber');
  assert.equal((await add('e3')).status, 201);
  assert.deepEqual(ids(), ['e1', 'e2', 'e3']);
});

test('a worker whose socket ZeroMQ refuses is refused with a 503; the others keep theirs', async () => {
  assert.equal((await admin('DELETE', '/admin/workers/e3')).status, 200);
  await until(() => subscriberRoom().room > 0, 'room for a subscriber');
  // the context's sockets all taken by something else
  const held: Dealer[] = [];
  try {
    await until(() => {
      try {
        held.push(new Dealer({ linger: 0 }));
        return false;
      } catch (err) {
        return (err as { code?: unknown }).code === 'EMFILE';
      }
    }, 'every socket taken');
    const refused = await add('e4');
    assert.equal(refused.status, 503, refused.text);
    assert.match(refused.text, /max_sockets/);
    assert.deepEqual(ids(), ['e1', 'e2']);
  } finally {
    for (const d of held) d.close();
  }
  // ZeroMQ frees the held sockets in its own thread. A try made while only a few are free opens
  // the subscriber's socket but not its observer's, and that socket is kept open for good
  // (subscriber.ts, start()): with this context's room, one such try leaves e4 no room at all. So
  // a try is made only once twice a subscriber's sockets could be opened: closed again, those
  // wait for ZeroMQ's thread too, and a subscriber's worth stays free beside them
  let last = { status: 0, text: '' };
  const socketsFree = (n: number): boolean => {
    const probes: Dealer[] = [];
    try {
      for (let i = 0; i < n; i++) probes.push(new Dealer({ linger: 0 }));
      return true;
    } catch {
      return false;
    } finally {
      for (const d of probes) d.close();
    }
  };
  await until(
    async () => {
      if (!socketsFree(2 * SOCKETS_PER_SUBSCRIBER)) return false;
      last = await add('e4');
      return last.status === 201;
    },
    'e4 added once sockets are free',
    { timeoutMs: 30_000, intervalMs: 250 },
  ).catch((err: Error) => {
    throw new Error(`${err.message}; last answer ${last.status} ${last.text}`);
  });
  assert.deepEqual(ids(), ['e1', 'e2', 'e4']);
});
