import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { MAX_REMOTE_LOAD } from '../../src/core/router/in-flight.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { MAX_REMOTE_REPLICAS, MAX_REPLICA_ID_LENGTH, type RemoteLoad } from '../../src/state/remote-load.js';
import { encodeLoadEntry } from '../../src/state/redis-wire.js';
import { REDIS_URL, redisRouters } from '../helpers/redis-routers.js';
import { channelOf, fixedWorkersHost, testPrefixes } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

// What other "replicas" on the machine's Redis claim of their in-flight work, and the worker
// ids they name: sums past what the router takes are clamped (and counted), never thrown inside
// a message handler or the load sync's timer; ids the router would refuse are skipped; ids that
// are names of Object.prototype are ids like any other.
const routers = redisRouters();
const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
const prefixes = testPrefixes('load-bounds');
const stores: RedisStateStore[] = [];
after(async () => {
  for (const s of stores) await s.close();
  await routers.close();
  await prefixes.drop();
  redis.disconnect();
});

/** A replica with its own router and workers, under a fresh prefix. */
async function replica(id: string, workerIds: string[], syncIntervalMs: number, prefix = prefixes.fresh()) {
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, workerIds);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: id, syncIntervalMs });
  stores.push(store);
  await store.attach(host);
  const view = (w: string) => router.listWorkers().find((x) => x.id === w)!;
  return { router, store, logs, prefix, view };
}

test('decisions whose amounts sum past MAX_REMOTE_LOAD are clamped and counted, not refused', async () => {
  const { router, store } = await routers.replica('A');
  const channel = channelOf(store);
  const load = () => router.listWorkers()[0];
  const send = (m: object) => redis.publish(channel, JSON.stringify({ w: 'e0', h: '', ...m }));
  // each in range, their sum (2^41) past what setRemoteLoad() takes
  await send({ r: 'x', k: 'd', q: MAX_REMOTE_LOAD });
  await send({ r: 'y', k: 'd', q: MAX_REMOTE_LOAD });
  await until(() => load().inFlightRequests === 2, 'both decisions to count');
  assert.equal(load().queuedPrefillTokens, MAX_REMOTE_LOAD);
  assert.equal(store.stats().malformedMessages, 0);
  assert.ok((store.stats().remoteLoadClamped as number) >= 1, 'the clamped sum counted');
  // the view follows the next messages
  await send({ r: 'y', k: 'rl', q: MAX_REMOTE_LOAD });
  await until(() => load().inFlightRequests === 1, 'the release to count');
  assert.equal(load().queuedPrefillTokens, MAX_REMOTE_LOAD);
  await send({ r: 'x', k: 'rl', q: MAX_REMOTE_LOAD });
  await until(() => load().inFlightRequests === 0, 'the other release to count');
  assert.equal(load().queuedPrefillTokens, 0);
});

test('snapshots whose sum is past MAX_REMOTE_LOAD are clamped in the load sync; every worker is updated', async () => {
  const prefix = prefixes.fresh();
  const far = String(Date.now() + 60_000);
  for (const r of ['x', 'y'])
    await redis
      .multi()
      .zadd(`${prefix}replicas`, far, r)
      .hset(`${prefix}load:${r}`, 'e0', encodeLoadEntry(1, MAX_REMOTE_LOAD, 0), 'e1', encodeLoadEntry(1, 5, 0))
      .exec();
  const { store, logs, view } = await replica('S', ['e0', 'e1'], 20, prefix);
  await until(() => view('e1').inFlightRequests === 2, "e1's load from the snapshots");
  assert.equal(view('e1').queuedPrefillTokens, 10);
  assert.equal(view('e0').inFlightRequests, 2);
  assert.equal(view('e0').queuedPrefillTokens, MAX_REMOTE_LOAD);
  assert.ok((store.stats().remoteLoadClamped as number) >= 1, 'the clamped sum counted');
  assert.equal(store.stats().errors, 0, logs.join('\n'));
});

test('channel messages naming a worker id the router would refuse are counted as malformed', async () => {
  const { router, store } = await routers.replica('M');
  const channel = channelOf(store);
  const before = store.stats().malformedMessages as number;
  const bad = [{ a: 1 }, 'x'.repeat(257), '', '\uD800', 5];
  for (const w of bad) {
    await redis.publish(channel, JSON.stringify({ r: 'x', k: 'pd', w, q: 1, d: 1 }));
    await redis.publish(channel, JSON.stringify({ r: 'x', k: 'rl', w, q: 1 }));
  }
  await until(
    () => (store.stats().malformedMessages as number) >= before + 2 * bad.length,
    'every message to be counted',
  );
  assert.equal(router.listWorkers()[0].inFlightRequests, 0);
});

test("a worker named __proto__ has its load in this replica's snapshot, and the others count it", async () => {
  const a = await replica('P1', ['__proto__', 'constructor'], 20);
  const d = a.router.route({ tokens: Array.from({ length: 64 }, (_, i) => i), promptTokens: 64 }, { share: true });
  assert.ok(d.ticket > 0);
  const loadKey = `${a.prefix}load:P1`;
  let fields: Record<string, string> = {};
  await until(async () => Object.keys((fields = await redis.hgetall(loadKey))).length > 0, "A's snapshot");
  assert.deepEqual(Object.keys(fields).sort(), ['__proto__', 'constructor']);
  assert.equal(Object.getOwnPropertyDescriptor(fields, d.workerId)?.value, encodeLoadEntry(1, 64, 0));
  // a replica that starts later seeds its view from that snapshot
  const b = await replica('P2', ['__proto__', 'constructor'], 20, a.prefix);
  await until(() => b.view(d.workerId).inFlightRequests === 1, "B to count A's request");
  assert.equal(b.view(d.workerId).queuedPrefillTokens, 64);
});

test('tallies are kept only for workers this replica has, and for at most MAX_REMOTE_REPLICAS replicas; the refusal is logged once', async () => {
  const { router, store, logs, view } = await replica('T', ['e0'], 60_000);
  const channel = channelOf(store);
  const remote = (store as unknown as { remote: RemoteLoad }).remote;
  const send = (m: object) => redis.publish(channel, JSON.stringify({ k: 'd', h: '', q: 1, ...m }));
  // well-formed ids no worker here has: nothing kept
  for (let i = 0; i < 500; i++) await send({ r: 'x', w: `nowhere-${i}` });
  // more replica ids than are tallied, each with one request on e0
  for (let i = 0; i < MAX_REMOTE_REPLICAS + 20; i++) await send({ r: `peer-${i}`, w: 'e0' });
  await until(
    () => (store.stats().remoteLoadUnknownWorkers as number) + (store.stats().remoteLoadRefused as number) >= 520,
    'every message to be taken or refused',
  );
  assert.equal(store.stats().remoteLoadUnknownWorkers, 500);
  assert.equal(store.stats().remoteLoadRefused, 20);
  assert.equal(remote.size, MAX_REMOTE_REPLICAS);
  assert.deepEqual([...new Set([...remote.entries()].map(([, id]) => id))], ['e0']);
  await until(() => view('e0').inFlightRequests === MAX_REMOTE_REPLICAS, "the tallied replicas' requests on e0");
  assert.equal(logs.filter((l) => l.includes('refused past a bound')).length, 1, logs.join('\n'));
  assert.equal(store.stats().malformedMessages, 0);
  // a worker registered here later counts from the next messages about it
  router.registerWorker('late');
  await send({ r: 'peer-0', w: 'late', q: 30 });
  await until(() => view('late').inFlightRequests === 1, "the late worker's request");
  assert.equal(view('late').queuedPrefillTokens, 30);
  // and a worker removed here has its tallies forgotten
  router.removeWorker('late');
  store.workerRemoved('late', { record: false });
  assert.equal(
    [...remote.entries()].some(([, id]) => id === 'late'),
    false,
  );
});

test('a replica id the others would refuse is refused when the store is made', () => {
  assert.throws(
    () => new RedisStateStore({ url: REDIS_URL, replicaId: 'r'.repeat(MAX_REPLICA_ID_LENGTH + 1) }),
    /replicaId must be at most 256 characters/,
  );
});
