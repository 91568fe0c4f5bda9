/**
 * A worker announced on the channel (`wa`) is added at once, but only the registry says it is
 * registered: anything that can publish can announce one. A resynchronisation writes back only
 * the workers the replica was configured with, added itself or read in the registry, and drops
 * one it only heard of that the registry lacks. Real Redis.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { channelOf, workerHost, sharedStateScope } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

const { prefixes, stores, redis } = sharedStateScope('heard-workers');

async function replica(prefix: string, id: string, configured: string[]) {
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, workers } = workerHost(router, configured);
  const logs: string[] = [];
  host.log = (m) => logs.push(m);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: id, syncIntervalMs: 50 });
  stores.push(store);
  await store.attach(host);
  return { router, store, workers, logs, ids: () => workers.map((w) => w.id).sort() };
}

/** Cuts `id`'s subscriber off: it subscribes again and the replica resynchronises. */
async function resyncOf(r: { store: RedisStateStore }, id: string): Promise<void> {
  const before = r.store.stats().resyncs as number;
  const list = (await redis.call('CLIENT', 'LIST')) as string;
  const line = list.split('\n').find((l) => l.includes(` name=contextforge-${id}-sub `));
  assert.ok(line, `${id}'s subscriber`);
  await redis.call('CLIENT', 'KILL', 'ID', /\bid=(\d+)/.exec(line)![1]);
  await until(() => (r.store.stats().resyncs as number) > before, `${id}'s resynchronisation`);
}

test('a worker only heard of on the channel is not written into the registry, and is dropped once it is found absent', async () => {
  await redis.connect().catch(() => {});
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'A', ['e0']);
  const b = await replica(prefix, 'B', ['e1']);
  // B adds a worker itself: A hears it and takes it from the registry
  b.workers.push({ id: 'real', url: 'http://real' });
  b.router.registerWorker('real');
  b.store.workerAdded({ id: 'real', url: 'http://real' });
  await until(() => a.ids().includes('real'), "A to hear of B's worker");

  // a bare announcement, which no registry write came with
  await redis.publish(
    channelOf(a.store),
    JSON.stringify({ r: 'x', k: 'wa', worker: { id: 'ghost', url: 'http://127.0.0.1:9/' } }),
  );
  await until(() => a.ids().includes('ghost') && b.ids().includes('ghost'), 'the announcement to be heard');
  await resyncOf(a, 'A');
  await resyncOf(b, 'B');
  assert.deepEqual((await redis.hkeys(`${prefix}workers`)).sort(), ['e0', 'e1', 'real']);
  assert.deepEqual(a.ids(), ['e0', 'e1', 'real']);
  assert.deepEqual(b.ids(), ['e0', 'e1', 'real']);
  assert.equal(a.store.stats().workersUnregistered, 1);
  assert.equal(a.logs.filter((l) => l.includes("'ghost'")).length, 1, a.logs.join('\n'));

  // Redis loses the registry with B gone: A writes back what it was configured with and what it
  // read in the registry (B's worker included), nothing it only heard of
  await b.store.close();
  await redis.publish(
    channelOf(a.store),
    JSON.stringify({ r: 'x', k: 'wa', worker: { id: 'ghost2', url: 'http://127.0.0.1:9/' } }),
  );
  await until(() => a.ids().includes('ghost2'), 'the second announcement to be heard');
  await redis.del(`${prefix}workers`, `${prefix}epoch`);
  await until(() => a.store.stats().stateLost === 1 && a.store.stats().resyncs === 3, 'the write-back');
  assert.deepEqual((await redis.hkeys(`${prefix}workers`)).sort(), ['e0', 'e1', 'real']);
  assert.deepEqual(a.ids(), ['e0', 'e1', 'real']);
});
