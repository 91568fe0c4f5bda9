/**
 * What a replica reads of the fleet's keys at every load sync and resynchronisation is bounded,
 * whatever the keys hold: anything that can write under the prefix can fill them.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { MAX_REMOTE_REPLICAS } from '../../src/state/remote-load.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { fixedWorkersHost, sharedStateScope } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

const { prefixes, stores, redis } = sharedStateScope('key-bounds');

/** A replica with worker `e0`, under `prefix`. */
async function replica(id: string, prefix: string) {
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: id, syncIntervalMs: 20 });
  stores.push(store);
  await store.attach(host);
  return { router, store, logs };
}

test('a replica set of 20,000 heartbeats is read only as far as the replicas tallied', async () => {
  const prefix = prefixes.fresh();
  // dated half a minute ahead: within the window, and newer than any replica's own
  const at = String(Date.now() + 30_000);
  for (let from = 0; from < 20_000; from += 5000) {
    const args: string[] = [];
    for (let i = from; i < from + 5000; i++) args.push(at, `fake-${i}`);
    await redis.zadd(`${prefix}replicas`, ...args);
  }
  const a = await replica('A', prefix);
  const syncs = () => a.store.stats().replicasSeen as number;
  await until(() => syncs() > 1, "A's load sync to read the set");
  assert.ok(syncs() <= MAX_REMOTE_REPLICAS + 1, `read ${syncs()} heartbeats`);
  // and what crosses the connection: the set read whole is some 400 KB a sync (20,000 members
  // with their scores); its newest 258 about 6 KB
  // a replica whose own timer stays quiet: each of its load syncs here is counted alone
  const router = new KVAwareRouter({ blockSize: 16 });
  const quiet = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: 'B', syncIntervalMs: 600_000 });
  stores.push(quiet);
  await quiet.attach(fixedWorkersHost(router, ['e0']).host);
  const store = quiet as unknown as { cmd: { stream: { bytesRead: number } }; syncLoad(): Promise<void> };
  const reads: number[] = [];
  for (let i = 0; i < 3; i++) {
    const before = store.cmd.stream.bytesRead;
    await store.syncLoad();
    reads.push(store.cmd.stream.bytesRead - before);
  }
  assert.ok(Math.max(...reads) < 65_536, `a load sync read ${reads.join(', ')} bytes`);
  assert.equal(a.store.stats().remoteLoadRefused, 0);
  const said = a.logs.filter((l) => l.includes(`${prefix}replicas holds more than`));
  assert.equal(said.length, 1, a.logs.join('\n'));
});

test('an epoch marker of 10 MB is not read: replaced as no marker, and the loss told as any', async () => {
  const prefix = prefixes.fresh();
  const huge = 'A'.repeat(10_000_000);
  await redis.set(`${prefix}epoch`, huge);
  const a = await replica('A', prefix);
  assert.equal(a.store.stats().connected, true);
  // written anew (by A's load sync, which reads it in the same pipeline)
  const short = async () => {
    const epoch = await redis.get(`${prefix}epoch`);
    return epoch !== null && epoch.length <= 256;
  };
  await until(short, 'the epoch to be written anew');
  // written there again while A runs: its load sync replaces it, and A writes its state back
  const lost = a.store.stats().stateLost as number;
  await redis.set(`${prefix}epoch`, huge);
  await until(async () => (a.store.stats().stateLost as number) > lost && (await short()), 'the loss to be told');
  assert.equal(a.store.stats().connected, true);
  const said = a.logs.filter((l) => l.includes(`${prefix}epoch in redis holds a value of 10000000 bytes`));
  assert.equal(said.length, 1, a.logs.join('\n'));
});

test("a workflow's value of 30 MB is skipped unread: the replica comes up with the others", async () => {
  const prefix = prefixes.fresh();
  await redis
    .multi()
    .set(`${prefix}wf:huge`, JSON.stringify({ w: 'e0', s: 1, pad: 'x'.repeat(30_000_000) }), 'PX', 600_000)
    .set(`${prefix}wf:fine`, JSON.stringify({ w: 'e0', s: 3 }), 'PX', 600_000)
    .zadd(`${prefix}workflows`, '1', 'huge', '2', 'fine')
    .exec();
  const a = await replica('A', prefix);
  assert.equal(a.store.stats().connected, true);
  assert.deepEqual(a.router.workflowAffinity('fine'), { workerId: 'e0', step: 3 });
  assert.equal(a.router.workflowAffinity('huge'), undefined);
  assert.equal(a.store.stats().workflowsSkipped, 1);
  assert.equal(a.logs.filter((l) => /1 workflow in redis could not be read/.test(l)).length, 1, a.logs.join('\n'));
});

test("a workflow's value of 30 MB is not read on first sight of the workflow: it is none", async () => {
  const prefix = prefixes.fresh();
  const a = await replica('A', prefix);
  await redis.set(`${prefix}wf:huge`, JSON.stringify({ w: 'e0', s: 1, pad: 'x'.repeat(30_000_000) }), 'PX', 600_000);
  const stream = (a.store as unknown as { cmd: { stream: { bytesRead: number } } }).cmd.stream;
  const before = stream.bytesRead;
  await a.store.beforeRoute({ workflowId: 'huge', text: 'x' });
  assert.ok(stream.bytesRead - before < 65_536, `read ${stream.bytesRead - before} bytes`);
  assert.equal(a.router.workflowAffinity('huge'), undefined);
});
