/**
 * Admin changes shared through Redis: a drain or resume on one replica holds at every replica
 * and at one that starts later, KV events posted to one replica reach the others, and a worker
 * removed through the admin API stays removed when a replica configured with it restarts.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { parseRedisUrl, RedisStateStore } from '../../src/state/redis-state-store.js';
import { RedisKeys } from '../../src/state/redis-wire.js';
import { RedisProcess } from '../faults/harness.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { channelOf, drainAndSettle, drainingAt, dropPrefixes, workerHost } from '../helpers/state-host.js';
import { settled, until } from '../helpers/wait.js';

const prefixes: string[] = [];
const stores: RedisStateStore[] = [];
after(async () => {
  for (const s of stores) await s.close();
  await dropPrefixes(prefixes);
});

/** Whether Redis's registry under `prefix` holds the worker. */
async function inRegistry(prefix: string, id: string): Promise<boolean> {
  const r = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
  await r.connect();
  try {
    return (await r.hexists(`${prefix}workers`, id)) === 1;
  } finally {
    r.disconnect();
  }
}

function freshPrefix(): string {
  const prefix = `cf-test-admin-${randomBytes(4).toString('hex')}:`;
  prefixes.push(prefix);
  return prefix;
}

/** A replica as the gateway binds it: configured with `configured` workers, sharing under `prefix`. */
async function replica(id: string, prefix: string, configured: string[], url = REDIS_URL) {
  const router = new KVAwareRouter({ blockSize: 16 });
  const posted: Array<[string, unknown]> = [];
  const { host, workers, unheldRemovals } = workerHost(router, configured, posted);
  const store = new RedisStateStore({ url, prefix, replicaId: id, syncIntervalMs: 60_000 });
  stores.push(store);
  await store.attach(host);
  return { id, router, store, host, workers, posted, unheldRemovals };
}
type Replica = Awaited<ReturnType<typeof replica>>;

const drained = (p: Replica) => drainingAt(p.router);
const ids = (p: Replica) => p.workers.map((w) => w.id).sort();

test('a drain or resume on one replica holds at every replica and at one that starts later', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, ['e0', 'e1']);
  const b = await replica('b', prefix, ['e0', 'e1']);
  assert.deepEqual(await drainAndSettle(a, b, 'e1'), ['e1']);
  const c = await replica('c', prefix, ['e0', 'e1']);
  assert.deepEqual(drained(c), ['e1'], 'the shared registry records the drain');
  c.router.resumeWorker('e1');
  c.store.workerDrained('e1', false);
  for (const p of [a, b])
    assert.deepEqual(
      await settled(
        () => drained(p),
        (d) => d.length === 0,
      ),
      [],
    );
  const d = await replica('d', prefix, ['e0', 'e1']);
  assert.deepEqual(drained(d), []);
});

test('KV events posted to one replica are given to the others', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, ['e0']);
  const b = await replica('b', prefix, ['e0']);
  const events = [{ type: 'AllBlocksCleared' }];
  a.store.kvEventsPosted('e0', events);
  assert.deepEqual(
    await settled(
      () => b.posted,
      (x) => x.length > 0,
    ),
    [['e0', events]],
  );
  assert.deepEqual(a.posted, []);
});

test('a posted batch of KV events larger than 1 MiB is applied only where it was posted, and said so once', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, ['e0']);
  const b = await replica('b', prefix, ['e0']);
  const logs: string[] = [];
  a.host.log = (m) => void logs.push(m);
  const stored = (i: number) => ({
    type: 'BlockStored',
    block_hashes: [String(1e15 + i)],
    parent_block_hash: null,
    token_ids: Array.from({ length: 16 }, (_, k) => 100_000 + k),
    block_size: 16,
  });
  const big = Array.from({ length: 8000 }, (_, i) => stored(i)); // about 1.3 MB of JSON
  assert.ok(JSON.stringify(big).length > 1 << 20);
  a.store.kvEventsPosted('e0', big);
  a.store.kvEventsPosted('e0', big);
  const small = [stored(0)];
  a.store.kvEventsPosted('e0', small);
  assert.deepEqual(
    await settled(
      () => b.posted,
      (x) => x.length > 0,
    ),
    [['e0', small]],
  );
  assert.equal(a.store.stats().eventBatchesNotShared, 2);
  assert.equal(logs.filter((m) => /not shared/.test(m)).length, 1, logs.join('\n'));
});

test('a removed worker stays removed when a replica configured with it restarts; what it writes back it announces', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, ['e0', 'e1']);
  a.host.removeWorkerFromState('e1');
  a.store.workerRemoved('e1');
  await until(async () => (await inRegistry(prefix, 'e1')) === false, "e1's removal to reach Redis");
  // a replica restarted with its flags: e1 (removed since) and e2 (new to the fleet)
  const b = await replica('b', prefix, ['e0', 'e1', 'e2']);
  assert.deepEqual(ids(b), ['e0', 'e2'], 'e1 was removed: it does not come back');
  assert.deepEqual(
    await settled(
      () => ids(a),
      (x) => x.includes('e2'),
    ),
    ['e0', 'e2'],
    'the worker B wrote to the registry is announced to A',
  );
  // added again through the admin API: a replica that starts later keeps it
  a.host.addWorkerFromState({ id: 'e1', url: 'http://e1' });
  a.store.workerAdded({ id: 'e1', url: 'http://e1' });
  assert.deepEqual(
    await settled(
      () => ids(b),
      (x) => x.includes('e1'),
    ),
    ['e0', 'e1', 'e2'],
  );
  const c = await replica('c', prefix, ['e1']);
  assert.deepEqual(ids(c), ['e0', 'e1', 'e2']);
});

test('a removal and a drain made while Redis is down reach Redis and the other replicas when it is back', async () => {
  const redis = await new RedisProcess().start();
  try {
    const prefix = 'cf-admin-outage:';
    const a = await replica('a', prefix, ['e0', 'e1'], redis.url);
    const b = await replica('b', prefix, ['e0', 'e1'], redis.url);
    await redis.kill();
    await until(() => !a.store.stats().connected && !b.store.stats().connected, 'both replicas to see Redis gone');
    a.host.removeWorkerFromState('e0');
    a.store.workerRemoved('e0');
    a.router.drainWorker('e1');
    a.store.workerDrained('e1', true);
    await redis.start(); // empty: whichever replica resynchronises first, they converge
    for (const p of [a, b]) {
      await until(() => p.store.stats().connected === true, `${p.id} to resynchronise`);
      assert.deepEqual(
        await settled(
          () => [ids(p), drained(p)],
          ([w, d]) => w.length === 1 && d.length === 1,
        ),
        [['e1'], ['e1']],
        p.id,
      );
    }
    const c = await replica('c', prefix, ['e0', 'e1'], redis.url);
    assert.deepEqual([ids(c), drained(c)], [['e1'], ['e1']]);
  } finally {
    for (const s of stores.splice(0)) await s.close();
    await redis.kill();
  }
});

test('a drain message that is not well formed is counted and changes nothing', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, ['e0']);
  const r = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
  await r.connect();
  try {
    for (const m of [
      { r: 'x', k: 'dr', id: 5, on: true },
      { r: 'x', k: 'dr', id: 'e0', on: 'yes' },
      { r: 'x', k: 'ev', w: 7, e: [] },
    ])
      await r.publish(channelOf(a.store), JSON.stringify(m));
    await until(() => a.store.stats().malformedMessages === 3, 'the three messages to be counted');
    assert.deepEqual(drained(a), []);
    assert.deepEqual(a.posted, []);
  } finally {
    r.disconnect();
  }
});

test('a worker removed through another replica while this one resynchronises is removed here once', async () => {
  // the removal lands between this replica's registry read and its write-back: the write-back
  // answers "removed" (-1) and the removal's message is heard too; the host is asked once
  const rounds = 12;
  const watcher = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
  const writer = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
  await watcher.connect();
  await writer.connect();
  try {
    for (let round = 0; round < rounds; round++) {
      const prefix = freshPrefix();
      // a removal recorded long ago: forgetting it costs the resynchronisation a round trip
      // between its read and its write-back, in which the removal lands
      await writer.hset(`${prefix}removed`, 'gone', '0');
      // the store's channel (per database: not `${prefix}events` on a database other than 0)
      const channel = new RedisKeys(prefix, parseRedisUrl(REDIS_URL).db ?? 0).channel;
      await watcher.subscribe(channel);
      const removedThere = new Promise<void>((resolve) => {
        const onMessage = (_channel: string, raw: string) => {
          const m = JSON.parse(raw) as { r: string; k: string };
          if (m.r !== 'b' || m.k !== 'rm') return;
          watcher.off('message', onMessage);
          void writer
            .multi()
            .hdel(`${prefix}workers`, 'e0')
            .hset(`${prefix}removed`, 'e0', String(Date.now()))
            .publish(channel, JSON.stringify({ r: 'a', k: 'wr', id: 'e0' }))
            .exec()
            .then(() => resolve());
        };
        watcher.on('message', onMessage);
      });
      const b = await replica('b', prefix, ['e0', 'e1']);
      await removedThere;
      await watcher.unsubscribe(channel);
      assert.deepEqual(
        await settled(
          () => ids(b),
          (x) => x.length === 1,
        ),
        ['e1'],
        `round ${round}`,
      );
      assert.deepEqual(b.unheldRemovals, [], `round ${round}: removals of workers it no longer held`);
    }
  } finally {
    watcher.disconnect();
    writer.disconnect();
  }
});
