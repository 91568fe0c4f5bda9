/**
 * A replica cut off from Redis decides admin worker changes itself and writes them back when
 * Redis is back; meanwhile the others' changes were decided in Redis. After the
 * resynchronisation every replica holds exactly the registry's records: a change Redis decided
 * while the replica was away wins over its write-back, a worker it holds with another record
 * is replaced by the registry's, and a drain or removal made while cut off applies only to the
 * record it was made on. Real Redis (127.0.0.1:6379, or CONTEXTFORGE_TEST_REDIS) behind a TCP proxy that
 * cuts the replica off; nothing mocked.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import type { Gateway } from '../../src/server/gateway.js';
import { RedisProxy } from '../faults/harness.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { adminCall, listedWorkers, registryReplica, registryWorkers } from '../helpers/registry-replicas.js';
import { testPrefixes } from '../helpers/state-host.js';
import { settled, until } from '../helpers/wait.js';

const prefixes = testPrefixes('resync-records');
const gateways: Gateway[] = [];
const proxies: RedisProxy[] = [];
const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
after(async () => {
  for (const g of gateways) await g.close();
  for (const p of proxies) await p.close().catch(() => {});
  await prefixes.drop();
  redis.disconnect();
});

/** A replica sharing the registry under `prefix` through the Redis (or proxy) at `url`. */
const replica = (url: string, prefix: string, id: string, log?: (m: string) => void) =>
  registryReplica(gateways, url, prefix, id, log);
const call = async (g: Gateway, method: 'GET' | 'POST' | 'DELETE', url: string, body?: unknown) => {
  const { status, text } = await adminCall(g, method, url, body);
  return `${status} ${text}`;
};

/** Waits (with a deadline) until every one of `replicas` lists `expected`, and checks it does. */
async function everyReplicaLists(replicas: Gateway[], expected: string[]): Promise<void> {
  for (const g of replicas)
    assert.deepEqual(
      await settled(
        () => listed(g),
        (l) => l.join() === expected.join(),
      ),
      expected,
    );
}

const listed = listedWorkers;

const registry = (prefix: string) => registryWorkers(redis, prefix);

/** Replica a (direct) and replica b (through a proxy that can cut it off), x added through a and heard by b. */
async function pair() {
  await redis.connect().catch(() => {});
  const prefix = prefixes.fresh();
  const proxy = await new RedisProxy(Number(new URL(REDIS_URL).port || 6379)).start();
  proxies.push(proxy);
  const logsB: string[] = [];
  const a = await replica(REDIS_URL, prefix, 'a');
  const b = await replica(proxy.url, prefix, 'b', (m) => logsB.push(m));
  assert.equal(await call(a, 'POST', '/admin/workers', { id: 'x', url: 'http://127.0.0.1:1' }), '201 {"id":"x"}');
  await until(() => b.router.hasWorker('x'), 'b hearing x added');
  const cut = async () => {
    await proxy.close();
    await until(() => logsB.some((l) => l.startsWith('state: lost redis')), 'b losing redis');
  };
  const reconnect = async () => {
    await proxy.start();
    await until(() => logsB.some((l) => l.startsWith('state: redis is back')), 'b resynchronising', {
      timeoutMs: 20_000,
    });
  };
  return { prefix, a, b, logsB, cut, reconnect };
}

test('after a resynchronisation both replicas hold the registry: changes Redis decided meanwhile win', async () => {
  const { prefix, a, b, logsB, cut, reconnect } = await pair();
  await cut();
  assert.equal(await call(a, 'DELETE', '/admin/workers/x'), '200 {"removed":"x"}');
  assert.equal(await call(a, 'POST', '/admin/workers', { id: 'x', url: 'http://127.0.0.1:2' }), '201 {"id":"x"}');
  assert.equal(await call(b, 'POST', '/admin/workers', { id: 'y', url: 'http://127.0.0.1:5' }), '201 {"id":"y"}');
  assert.equal(await call(a, 'POST', '/admin/workers', { id: 'y', url: 'http://127.0.0.1:6' }), '201 {"id":"y"}');
  // an id nobody else added is still written back and announced
  assert.equal(await call(b, 'POST', '/admin/workers', { id: 'z', url: 'http://127.0.0.1:7' }), '201 {"id":"z"}');
  await reconnect();
  const expected = ['e0 http://127.0.0.1:9', 'x http://127.0.0.1:2', 'y http://127.0.0.1:6', 'z http://127.0.0.1:7'];
  assert.deepEqual(await registry(prefix), expected, 'the changes Redis decided stay; z written back');
  await everyReplicaLists([a, b], expected);
  for (const id of ['x', 'y'])
    assert.equal(
      logsB.filter((l) => l === `worker '${id}' replaced by the shared registry's record`).length,
      1,
      `b says once that it replaced ${id}: ${JSON.stringify(logsB)}`,
    );
  assert.ok(!logsB.some((l) => l.includes("'z' replaced") || l.includes("'e0' replaced")), JSON.stringify(logsB));
});

test('a drain made while cut off is dropped when the worker was removed and added again meanwhile', async () => {
  const { prefix, a, b, cut, reconnect } = await pair();
  // a worker the registry still holds as drained here: its drain is written back
  assert.equal(await call(a, 'POST', '/admin/workers', { id: 'k', url: 'http://127.0.0.1:3' }), '201 {"id":"k"}');
  await until(() => b.router.hasWorker('k'), 'b hearing k added');
  await cut();
  assert.equal(await call(b, 'POST', '/admin/workers/x/drain'), '200 {"draining":"x"}');
  assert.equal(await call(b, 'POST', '/admin/workers/k/drain'), '200 {"draining":"k"}');
  assert.equal(await call(a, 'DELETE', '/admin/workers/x'), '200 {"removed":"x"}');
  assert.equal(await call(a, 'POST', '/admin/workers', { id: 'x', url: 'http://127.0.0.1:2' }), '201 {"id":"x"}');
  await reconnect();
  const expected = ['e0 http://127.0.0.1:9', 'k http://127.0.0.1:3 draining', 'x http://127.0.0.1:2'];
  assert.deepEqual(await registry(prefix), expected, "the drain of the old x is not the new x's");
  await everyReplicaLists([a, b], expected);
});

test('a replica holding a worker another replica announces with another record takes the announced one', async () => {
  const { prefix, a, b, logsB } = await pair();
  // as a write-back of a replica that was cut off announces a worker Redis took from it
  await redis.hset(`${prefix}workers`, 'x', JSON.stringify({ id: 'x', url: 'http://127.0.0.1:4' }));
  await redis.publish(
    `${prefix}events`,
    JSON.stringify({ r: 'c', k: 'wa', worker: { url: 'http://127.0.0.1:4', id: 'x' } }),
  );
  const expected = ['e0 http://127.0.0.1:9', 'x http://127.0.0.1:4'];
  await everyReplicaLists([a, b], expected);
  // the same record announced again (its fields in another order) changes nothing
  await redis.publish(
    `${prefix}events`,
    JSON.stringify({ r: 'c', k: 'wa', worker: { id: 'x', url: 'http://127.0.0.1:4' } }),
  );
  await call(b, 'GET', '/admin/workers');
  assert.deepEqual(
    logsB.filter((l) => l.includes("'x'")),
    ["worker 'x' added by another replica", "worker 'x' replaced by the shared registry's record"],
  );
});

test('a removal made while cut off is dropped when the worker was removed and added again meanwhile', async () => {
  const { prefix, a, b, logsB, cut, reconnect } = await pair();
  // k: removed through b alone (the registry still holds the record b removed): written back;
  // gone: removed through both (the registry holds none): recorded removed
  assert.equal(await call(a, 'POST', '/admin/workers', { id: 'k', url: 'http://127.0.0.1:3' }), '201 {"id":"k"}');
  assert.equal(await call(a, 'POST', '/admin/workers', { id: 'gone', url: 'http://127.0.0.1:4' }), '201 {"id":"gone"}');
  await until(() => b.router.hasWorker('k') && b.router.hasWorker('gone'), 'b hearing k and gone added');
  await cut();
  for (const id of ['x', 'k', 'gone'])
    assert.equal(await call(b, 'DELETE', `/admin/workers/${id}`), `200 {"removed":"${id}"}`);
  // the later decision: x removed and added again with another record through a
  assert.equal(await call(a, 'DELETE', '/admin/workers/x'), '200 {"removed":"x"}');
  assert.equal(await call(a, 'POST', '/admin/workers', { id: 'x', url: 'http://127.0.0.1:2' }), '201 {"id":"x"}');
  assert.equal(await call(a, 'DELETE', '/admin/workers/gone'), '200 {"removed":"gone"}');
  await reconnect();
  const expected = ['e0 http://127.0.0.1:9', 'x http://127.0.0.1:2'];
  assert.deepEqual(await registry(prefix), expected, "b's older removal of x does not undo a's addition");
  await everyReplicaLists([a, b], expected);
  assert.deepEqual(Object.keys(await redis.hgetall(`${prefix}removed`)).sort(), ['gone', 'k']);
  assert.ok(logsB.includes("worker 'x' from the shared registry"), JSON.stringify(logsB));
});

test('a removal made by a replica started while Redis was out of reach applies to the record it was configured with', async () => {
  await redis.connect().catch(() => {});
  const prefix = prefixes.fresh();
  const proxy = await new RedisProxy(Number(new URL(REDIS_URL).port || 6379)).start();
  proxies.push(proxy);
  const a = await replica(REDIS_URL, prefix, 'a');
  await proxy.close();
  const logsB: string[] = [];
  const b = await replica(proxy.url, prefix, 'b', (m) => logsB.push(m));
  assert.ok(
    logsB.some((l) => l.startsWith('state: redis unreachable at start')),
    JSON.stringify(logsB),
  );
  assert.equal(await call(b, 'DELETE', '/admin/workers/e0'), '200 {"removed":"e0"}');
  await proxy.start();
  await until(() => !a.router.hasWorker('e0'), 'a hearing e0 removed', { timeoutMs: 20_000 });
  assert.deepEqual(await registry(prefix), []);
  await everyReplicaLists([a, b], []);
});

test("a registry record whose id is not its field's is skipped, not added under its own id", async () => {
  const { prefix, a, b, logsB, cut, reconnect } = await pair();
  await cut();
  // written by hand (or by another program) while b was away: b reads the registry whole when it is back
  await redis.hset(`${prefix}workers`, 'e4', JSON.stringify({ id: 'other', url: 'http://127.0.0.1:8' }));
  await reconnect();
  await everyReplicaLists([b], ['e0 http://127.0.0.1:9', 'x http://127.0.0.1:1']);
  assert.ok(!b.router.hasWorker('other') && !b.router.hasWorker('e4'));
  assert.ok(
    logsB.some((l) => l.includes("the record of worker 'e4'") && l.includes('is not its own')),
    JSON.stringify(logsB),
  );
  // what b routes to is what its admin API lists
  assert.deepEqual(
    b.router
      .listWorkers()
      .map((w) => w.id)
      .sort(),
    ['e0', 'x'],
  );
  assert.ok(a.router.hasWorker('x'));
});
