/**
 * What a replica recovers from on the machine's Redis without losing its connection: its
 * subscriber alone cut off (messages missed), its own keys holding another kind of value,
 * garbage heartbeats in the replica set, and chain entries too large to read in one command.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { registerStateMetrics } from '../../src/server/metrics.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { MemoryStateStore } from '../../src/state/state-store.js';
import { encodeLoadEntry } from '../../src/state/redis-wire.js';
import type { RemoteLoad } from '../../src/state/remote-load.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { channelOf, fixedWorkersHost, testPrefixes } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
const prefixes = testPrefixes('recovery');
const stores: RedisStateStore[] = [];
after(async () => {
  for (const s of stores) await s.close();
  await prefixes.drop();
  redis.disconnect();
});

/** A replica with worker `e0`, under `prefix`. */
async function replica(id: string, prefix: string, syncIntervalMs = 50) {
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: id, syncIntervalMs });
  stores.push(store);
  await store.attach(host);
  const view = () => router.listWorkers().find((x) => x.id === 'e0')!;
  return { router, store, logs, view };
}

const remoteOf = (store: RedisStateStore) => (store as unknown as { remote: RemoteLoad }).remote;

/** The id Redis gives the connection named `name` (CLIENT LIST). */
async function clientId(name: string): Promise<string> {
  const list = (await redis.call('CLIENT', 'LIST')) as string;
  const line = list.split('\n').find((l) => l.includes(` name=${name} `));
  assert.ok(line, `a connection named ${name}`);
  return /\bid=(\d+)/.exec(line)![1];
}

test("a replica whose subscriber alone was cut off resynchronises: the others' tallies converge", async () => {
  const prefix = prefixes.fresh();
  const a = await replica('A', prefix);
  const b = await replica('B', prefix);
  // A has read B's heartbeat: B's tally is kept from here on, not dropped and seeded anew
  await until(() => a.store.stats().replicasSeen === 2, "A to see B's heartbeat");
  const route = (text: string) => b.router.route({ text: text.repeat(4000), promptTokens: 1000 }, { share: true });
  const ended = route('x');
  const running = route('y');
  b.store.decisionMade(ended.shared!);
  b.store.decisionMade(running.shared!);
  await until(() => a.view().inFlightRequests === 2, "A to count B's two requests");
  const outages = a.store.stats().outages as number;

  // only A's subscriber is dropped (as Redis drops a slow one past its output buffer limit),
  // and B's release is published before it is back: A never hears it
  await redis.call('CLIENT', 'KILL', 'ID', await clientId('contextforge-A-sub'));
  b.router.release(ended.ticket);
  b.store.decisionEnded(ended.shared!);

  await until(() => a.view().inFlightRequests === 1, "A to count only B's request still running", {
    timeoutMs: 5000,
  });
  assert.equal(a.view().queuedPrefillTokens, b.router.localLoad('e0').queuedPrefillTokens);
  assert.equal(a.store.stats().outages, outages + 1);
  assert.equal(a.store.stats().connected, true);
  assert.equal(a.logs.filter((l) => /subscription/.test(l)).length, 1, a.logs.join('\n'));
});

test('a replica set holding another kind of value is deleted and rewritten: a stopped replica is dropped', async () => {
  const prefix = prefixes.fresh();
  await redis
    .multi()
    .zadd(`${prefix}replicas`, String(Date.now()), 'X')
    .hset(`${prefix}load:X`, 'e0', encodeLoadEntry(3, 30, 0))
    .exec();
  const a = await replica('A', prefix, 20);
  await until(() => a.view().inFlightRequests === 3, "X's load from its snapshot");
  // X stops; something writes a string where the replica set was
  await redis.set(`${prefix}replicas`, 'garbage');
  await until(() => a.view().inFlightRequests === 0, "X's load to be dropped", { timeoutMs: 5000 });
  assert.equal(await redis.type(`${prefix}replicas`), 'zset');
  assert.deepEqual(await redis.zrange(`${prefix}replicas`, '0', '-1'), ['A']);
  const named = a.logs.filter((l) => l.includes(`${prefix}replicas`));
  assert.equal(named.length, 1, a.logs.join('\n'));
});

test('heartbeats dated far ahead are trimmed, and replicas without a snapshot are not tallied', async () => {
  const prefix = prefixes.fresh();
  const far = '4000000000000';
  for (let at = 0; at < 50_000; at += 5000) {
    const args: string[] = [];
    for (let i = at; i < at + 5000; i++) args.push(far, `fake${i}`);
    await redis.zadd(`${prefix}replicas`, ...args);
  }
  // within the window, but with no load snapshot: nothing to tally
  const soon = String(Date.now() + 500);
  await redis.zadd(`${prefix}replicas`, soon, 'quiet1', soon, 'quiet2');
  const a = await replica('A', prefix, 20);
  await until(async () => (await redis.zcard(`${prefix}replicas`)) <= 3, 'the future heartbeats to be trimmed');
  assert.equal(remoteOf(a.store).size, 0);
  assert.equal(a.store.stats().remoteLoadRefused, 0);
  assert.equal(a.view().inFlightRequests, 0);
});

test('chain entries too large for one read are loaded in batches', async () => {
  const prefix = prefixes.fresh();
  // 300 entries of 64 KiB of hashes (some 87 KB of JSON each): 26 MB, past one read in 250 ms
  const h = Buffer.alloc(8192 * 8, 7).toString('base64');
  for (let at = 0; at < 300; at += 50) {
    const m = redis.pipeline();
    for (let i = at; i < at + 50; i++)
      m.set(`${prefix}chain:e0:${i}`, JSON.stringify({ r: 'X', k: 'd', w: 'e0', h }), 'PX', 60_000);
    await m.exec();
  }
  const a = await replica('A', prefix);
  assert.equal(a.store.stats().connected, true, a.logs.join('\n'));
  assert.equal(a.store.stats().decisionsApplied, 300);
});

test('a read of block entries that times out is read again in halves; an entry that fails alone is skipped', async () => {
  const prefix = prefixes.fresh();
  const h = Buffer.alloc(64, 7).toString('base64');
  const m = redis.pipeline();
  for (let i = 0; i < 300; i++)
    m.set(`${prefix}chain:e0:${i}`, JSON.stringify({ r: 'X', k: 'd', w: 'e0', h }), 'PX', 60_000);
  await m.exec();
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: 'H', syncIntervalMs: 50 });
  stores.push(store);
  // a read of more than 10 entries outlasts the command timeout (large entries, a busy Redis),
  // and so does any read of entry 7
  type Reads = { readChainBatch: (keys: string[]) => Promise<Array<string | number | null>> };
  const read = (store as unknown as Reads).readChainBatch.bind(store);
  const reads: number[] = [];
  (store as unknown as Reads).readChainBatch = async (keys) => {
    reads.push(keys.length);
    if (keys.length > 10 || keys.includes(`${prefix}chain:e0:7`)) throw new Error('Command timed out');
    return read(keys);
  };
  await store.attach(host);
  assert.equal(store.stats().connected, true, logs.join('\n'));
  assert.equal(store.stats().decisionsApplied, 299, `reads of ${reads.join(', ')} keys`);
  assert.equal(store.stats().chainsSkipped, 1);
  assert.ok(Math.max(...reads) <= 100, 'no read of more than 100 entries');
  assert.equal(logs.filter((l) => /could not be read in time/.test(l)).length, 1, logs.join('\n'));

  // a Redis too slow for any read: a handful of reads, every entry skipped, the replica up
  const stuck = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: 'S', syncIntervalMs: 50 });
  stores.push(stuck);
  let stuckReads = 0;
  (stuck as unknown as { readChainBatch: () => Promise<never> }).readChainBatch = async () => {
    stuckReads++;
    throw new Error('Command timed out');
  };
  await stuck.attach(fixedWorkersHost(new KVAwareRouter({ blockSize: 16 }), ['e0']).host);
  assert.equal(stuck.stats().connected, true);
  assert.equal(stuck.stats().chainsSkipped, 300);
  assert.equal(stuck.stats().decisionsApplied, 0);
  assert.ok(stuckReads <= 10, `${stuckReads} reads`);
});

test('a block entry longer than any replica writes is skipped unread and counted', async () => {
  const prefix = prefixes.fresh();
  // three entries of 9 MiB (past the 8 MiB a decision message may hold with the defaults), and one good
  const huge = JSON.stringify({
    r: 'X',
    k: 'd',
    w: 'e0',
    h: Buffer.alloc(((9 * 1024 * 1024 * 3) / 4) & ~7, 7).toString('base64'),
  });
  for (let i = 0; i < 3; i++) await redis.set(`${prefix}chain:e0:big${i}`, huge, 'PX', 60_000);
  const h = Buffer.alloc(64, 7).toString('base64');
  await redis.set(`${prefix}chain:e0:good`, JSON.stringify({ r: 'X', k: 'd', w: 'e0', h }), 'PX', 60_000);
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: 'O', syncIntervalMs: 50 });
  stores.push(store);
  type Reads = { readChainBatch: (keys: string[]) => Promise<Array<string | number | null>> };
  const read = (store as unknown as Reads).readChainBatch.bind(store);
  let longest = 0;
  (store as unknown as Reads).readChainBatch = async (keys) => {
    const answers = await read(keys);
    for (const v of answers) if (typeof v === 'string') longest = Math.max(longest, v.length);
    return answers;
  };
  // an oversize entry's length is asked (STRLEN), so its value is never copied into the script;
  // the shared-state tests run one at a time, so no other test asks meanwhile
  const lengthsAsked = async () =>
    Number(/cmdstat_strlen:calls=(\d+)/.exec(await redis.info('commandstats'))?.[1] ?? 0);
  const asked = await lengthsAsked();
  await store.attach(host);
  assert.ok((await lengthsAsked()) - asked >= 4, 'every entry measured before it is read');
  assert.equal(store.stats().connected, true, logs.join('\n'));
  assert.equal(store.stats().decisionsApplied, 1);
  assert.equal(store.stats().chainsSkipped, 3);
  assert.equal(store.stats().chainsOversize, 3);
  assert.ok(longest < 1024 * 1024, `no oversize entry reached the replica (${longest} bytes read)`);
  assert.equal(logs.filter((l) => /longer than any replica writes/.test(l)).length, 1, logs.join('\n'));
  await redis.del(`${prefix}chain:e0:big0`, `${prefix}chain:e0:big1`, `${prefix}chain:e0:big2`);
});

test("/metrics shows the shared state's connection, outages, errors, malformed and oversize messages and load corrections", async () => {
  const prefix = prefixes.fresh();
  const a = await replica('M', prefix);
  const registry = new Registry();
  registerStateMetrics(registry, a.store);
  const value = async (name: string) => {
    const line = (await registry.metrics()).split('\n').find((l) => l.startsWith(`${name} `));
    assert.ok(line, `${name} on the page`);
    return Number(line.split(' ')[1]);
  };
  assert.equal(await value('contextforge_state_connected'), 1);
  assert.equal(await value('contextforge_state_outages_total'), 0);
  assert.equal(await value('contextforge_state_errors_total'), 0);
  assert.equal(await value('contextforge_state_oversize_messages_total'), 0);
  assert.equal(await value('contextforge_state_remote_load_corrections_total'), 0);
  for (const name of [
    'stalls',
    'refusals',
    'chains_skipped',
    'chains_oversize',
    'wrong_kind_repairs',
    'workers_unregistered',
    'settings_mismatches',
  ])
    assert.equal(await value(`contextforge_state_${name}_total`), 0, name);
  await redis.publish(channelOf(a.store), 'not json');
  await until(async () => (await value('contextforge_state_malformed_messages_total')) === 1, 'the malformed message');
  await redis.publish(channelOf(a.store), Buffer.alloc(9 * 1024 * 1024, 'x'));
  await until(async () => (await value('contextforge_state_oversize_messages_total')) === 1, 'the oversize message');
  await redis.call('CLIENT', 'KILL', 'ID', await clientId('contextforge-M-sub'));
  await until(async () => (await value('contextforge_state_outages_total')) === 1, 'the outage to show');
  // the in-memory store has no shared state to report
  const memory = new Registry();
  registerStateMetrics(memory, new MemoryStateStore());
  assert.equal((await memory.metrics()).trim(), '');
});

test('a heartbeat the others dropped (a replica only slow) is no loss: nothing is written back', async () => {
  const prefix = prefixes.fresh();
  const a = await replica('A', prefix);
  await until(async () => (await redis.zscore(`${prefix}replicas`, 'A')) !== null, 'the heartbeat to be written');
  // what a replica that pruned A after a pause of A's does
  await redis.zrem(`${prefix}replicas`, 'A');
  const dropped = Date.now();
  await until(
    async () => Number(await redis.zscore(`${prefix}replicas`, 'A')) > dropped,
    'the heartbeat to be written again',
  );
  const after = Date.now();
  // and a sync more, which would have noticed a loss by then
  await until(async () => Number(await redis.zscore(`${prefix}replicas`, 'A')) > after, 'another heartbeat');
  assert.equal(a.store.stats().stateLost, 0, a.logs.join('\n'));
  assert.equal(a.store.stats().resyncs, 1);
  assert.ok(!a.logs.some((l) => l.includes('lost the shared state')), a.logs.join('\n'));
  // a loss is still told: the epoch goes with the data
  await redis.del(`${prefix}epoch`);
  await until(() => a.store.stats().stateLost === 1 && a.store.stats().resyncs === 2, 'the write-back');
});

test('a replica whose heartbeat is a few seconds old is still counted, with its load', async () => {
  const prefix = prefixes.fresh();
  const a = await replica('A', prefix);
  await until(() => a.store.stats().replicasSeen === 1, 'the first load sync');
  // B was held (its event loop, a failed resynchronisation) for 2 s with a request on e0
  await redis.hset(`${prefix}load:B`, 'e0', encodeLoadEntry(1, 100, 0));
  const written = Date.now();
  await redis.zadd(`${prefix}replicas`, String(written - 2000), 'B');
  await until(
    async () => Number(await redis.zscore(`${prefix}replicas`, 'A')) > written,
    "a load sync after B's heartbeat",
  );
  assert.notEqual(await redis.zscore(`${prefix}replicas`, 'B'), null, "B's heartbeat is kept");
  await until(() => a.view().inFlightRequests === 1, "A to count B's request");
});
