/**
 * The shared registry while a replica resynchronises with Redis: what another replica changes
 * meanwhile is not undone by the resynchronising replica's older read, what this replica's
 * admin API changes meanwhile still reaches Redis and the others, a worker removed and added
 * again while Redis is out of reach is not drained, and `{prefix}removed` holds only admin
 * removals, for a day.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { drainingAt, workerHost, sharedStateScope } from '../helpers/state-host.js';
import { settled, until } from '../helpers/wait.js';

const { prefixes, stores, redis } = sharedStateScope('races');

async function replica(id: string, prefix: string, configured: string[]) {
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, workers } = workerHost(router, configured);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: id, syncIntervalMs: 60_000 });
  stores.push(store);
  await store.attach(host);
  return { id, router, store, host, workers };
}
type Replica = Awaited<ReturnType<typeof replica>>;

const drained = (p: Replica) => drainingAt(p.router);
const ids = (p: Replica) => p.workers.map((w) => w.id).sort();

/** Runs `during` right after the store read the registry (its pipeline answered, the answer not yet used). */
function afterRead(p: Replica, during: () => Promise<void> | void): void {
  type Batch = { exec(): Promise<unknown>; _queue?: Array<{ name: string }> };
  const cmd = (p.store as unknown as { cmd: { pipeline(): Batch } }).cmd;
  const pipeline = cmd.pipeline.bind(cmd);
  let armed = true;
  cmd.pipeline = () => {
    const batch = pipeline();
    const exec = batch.exec.bind(batch);
    batch.exec = async () => {
      const read = batch._queue?.some((c) => c.name === 'hgetall') === true;
      const res = await exec();
      if (armed && read) {
        armed = false;
        await during();
      }
      return res;
    };
    return batch;
  };
}

/** What a reconnection (or a write-back after Redis lost its data) runs. */
const resync = (p: Replica) => (p.store as unknown as { resync(): Promise<void> }).resync();

test("a drain another replica makes while this one resynchronises is not undone by this one's older read", async () => {
  const prefix = prefixes.fresh();
  const a = await replica('a', prefix, ['e0', 'e1']);
  const b = await replica('b', prefix, ['e0', 'e1']);
  afterRead(a, async () => {
    b.router.drainWorker('e1');
    b.store.workerDrained('e1', true);
    await until(() => drained(a).includes('e1'), 'A to hear the drain');
  });
  await resync(a);
  assert.deepEqual(drained(a), ['e1']);
});

test('a removal and an addition another replica makes while this one resynchronises hold at this one', async () => {
  const prefix = prefixes.fresh();
  const a = await replica('a', prefix, ['e0', 'e1']);
  const b = await replica('b', prefix, ['e0', 'e1']);
  afterRead(a, async () => {
    b.host.removeWorkerFromState('e1');
    b.store.workerRemoved('e1');
    b.host.addWorkerFromState({ id: 'e2', url: 'http://e2' });
    b.store.workerAdded({ id: 'e2', url: 'http://e2' });
    await until(() => ids(a).join() === 'e0,e2', 'A to hear the removal and the addition');
  });
  await resync(a);
  assert.deepEqual(ids(a), ['e0', 'e2']);
});

test("a drain made through this replica's admin API while it resynchronises reaches Redis and the others", async () => {
  const prefix = prefixes.fresh();
  await redis.connect().catch(() => {});
  const a = await replica('a', prefix, ['e0', 'e1']);
  const b = await replica('b', prefix, ['e0', 'e1']);
  afterRead(a, () => {
    assert.equal(a.store.stats().connected, false, 'the drain comes while A is not up');
    a.router.drainWorker('e1');
    a.store.workerDrained('e1', true);
  });
  // a reconnection: A resynchronises, and is up only once it has
  (a.store as unknown as { cmd: Redis }).cmd.disconnect(true);
  await until(() => a.store.stats().connected === false, 'A to see the connection gone');
  await until(() => a.store.stats().connected === true, 'A to resynchronise');
  assert.deepEqual(
    await settled(
      () => drained(b),
      (d) => d.length > 0,
    ),
    ['e1'],
  );
  assert.deepEqual(await redis.hgetall(`${prefix}draining`), { e1: '1' });
});

test('a drained worker removed and added again while Redis is out of reach is not drained when it is back', async () => {
  const prefix = prefixes.fresh();
  const a = await replica('a', prefix, ['e0', 'e1']);
  const b = await replica('b', prefix, ['e0', 'e1']);
  a.router.drainWorker('e1');
  a.store.workerDrained('e1', true);
  await until(() => drained(b).includes('e1'), 'B to hear the drain');
  // cut off, as wentDown() leaves it: the changes wait for the resynchronisation
  (a.store as unknown as { up: boolean }).up = false;
  a.host.removeWorkerFromState('e1');
  a.store.workerRemoved('e1');
  a.host.addWorkerFromState({ id: 'e1', url: 'http://e1' });
  a.store.workerAdded({ id: 'e1', url: 'http://e1' });
  await resync(a);
  (a.store as unknown as { up: boolean }).up = true;
  assert.deepEqual(drained(a), []);
  assert.deepEqual(
    await settled(
      () => drained(b),
      (d) => d.length === 0,
    ),
    [],
    'the worker added again is not draining at the others either',
  );
  const c = await replica('c', prefix, ['e0']);
  assert.deepEqual([ids(c), drained(c)], [['e0', 'e1'], []]);
});

test('only admin removals are recorded in {prefix}removed, and a resynchronisation forgets those older than a day', async () => {
  const prefix = prefixes.fresh();
  await redis.connect().catch(() => {});
  const a = await replica('a', prefix, ['e0', 'e1', 'e2']);
  const b = await replica('b', prefix, ['e0', 'e1', 'e2']);
  a.host.removeWorkerFromState('e1');
  a.store.workerRemoved('e1', { record: false }); // gone from DNS discovery
  a.host.removeWorkerFromState('e2');
  a.store.workerRemoved('e2');
  await until(() => ids(b).join() === 'e0', 'B to hear both removals');
  assert.deepEqual(Object.keys(await redis.hgetall(`${prefix}removed`)), ['e2']);
  const dayAndMore = String(Date.now() - 25 * 3_600_000);
  await redis.hset(`${prefix}removed`, 'old', dayAndMore, 'garbage', 'x');
  await resync(a);
  assert.deepEqual(Object.keys(await redis.hgetall(`${prefix}removed`)), ['e2']);
});

test('a worker this replica writes back is not written over a removal another replica recorded since the read', async () => {
  const prefix = prefixes.fresh();
  await redis.connect().catch(() => {});
  const a = await replica('a', prefix, ['e0', 'e1']);
  const b = await replica('b', prefix, ['e0', 'e1']);
  await redis.hdel(`${prefix}workers`, 'e1'); // as if Redis lost it: A writes it back
  afterRead(a, () => {
    b.host.removeWorkerFromState('e1');
    b.store.workerRemoved('e1');
  });
  await resync(a);
  await until(async () => (await redis.hexists(`${prefix}removed`, 'e1')) === 1, 'the removal to be recorded');
  assert.deepEqual(ids(a), ['e0']);
  assert.deepEqual(Object.keys(await redis.hgetall(`${prefix}workers`)), ['e0']);
  assert.deepEqual(ids(b), ['e0'], 'no write-back of it announced');
});
