import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { createServer, type AddressInfo } from 'node:net';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { encodeHashes } from '../../src/state/redis-wire.js';
import { REDIS_URL, redisRouters } from '../helpers/redis-routers.js';
import { channelOf, fixedWorkersHost, testPrefixes } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

// What another "replica" (anything that can publish on the channel or write the keys) sends:
// nothing of a malformed message or key may reach the router, and the rest still works.
const routers = redisRouters();
const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
const prefixes = testPrefixes('hostile');
after(async () => {
  await routers.close();
  await prefixes.drop();
  redis.disconnect();
});

const hashes = encodeHashes(new Uint32Array([1, 2]), new Uint32Array([3, 4]));

test('decisions with fields of the wrong type or range are counted and apply nothing', async () => {
  const { router, store } = await routers.replica('B');
  const channel = channelOf(store);
  // more blocks than the longest prompt (1,048,576 tokens, 16 a block) can have
  const huge = encodeHashes(new Uint32Array(65_537).fill(7), new Uint32Array(65_537).fill(9));
  const bad: Array<Record<string, unknown>> = [
    { wf: { a: 1 }, s: 1 },
    { wf: 'wf-a', s: 'two' },
    { wf: 'wf-a', s: -3.5 },
    { a: 5 },
    { a: 'anchor-a', c: 'zz' },
    { ca: [{ id: 'p', tokens: -1 }] },
    { ca: 'passages' },
    { h: huge },
  ];
  for (const fields of bad)
    await redis.publish(channel, JSON.stringify({ r: 'x', k: 'd', w: 'e0', h: hashes, ...fields }));
  await until(() => (store.stats().malformedMessages as number) >= bad.length, 'every bad decision to be counted');
  const stats = router.getStats();
  assert.equal(store.stats().decisionsApplied, 0);
  assert.equal(stats.index.entries, 0, 'no block of a malformed decision is recorded');
  assert.equal(stats.workflowsTracked, 0);
  assert.equal(stats.anchorsTracked, 0);
  assert.equal(stats.contentAnchorsTracked, 0);
  // a well-formed one still applies
  await redis.publish(channel, JSON.stringify({ r: 'x', k: 'd', w: 'e0', h: hashes, wf: 'wf-a', s: 2 }));
  await until(() => store.stats().decisionsApplied === 1, 'the good decision to apply');
  assert.deepEqual(router.workflowAffinity('wf-a'), { workerId: 'e0', step: 2 });
  assert.equal(router.getStats().index.entries, 2);
});

test('messages with load amounts out of range are counted and move nothing; later messages still update the view', async () => {
  const { router, store } = await routers.replica('C');
  const channel = channelOf(store);
  const load = () => router.listWorkers()[0];
  const send = (m: object) => redis.publish(channel, JSON.stringify({ w: 'e0', ...m }));
  // two replicas claiming 1e308 tokens each would sum to Infinity, which the router refuses
  await send({ r: 'x', k: 'd', h: '', q: 1e308 });
  await send({ r: 'y', k: 'd', h: '', q: 1e308 });
  await send({ r: 'x', k: 'd', h: '', q: -5 });
  await send({ r: 'x', k: 'pd', q: '5', d: 7 });
  await send({ r: 'x', k: 'rl', q: 1, d: -1e300 });
  await send({ r: 'z', k: 'd', h: '', q: 300 });
  await until(() => load().inFlightRequests > 0, 'the good decision to count');
  assert.equal(load().inFlightRequests, 1);
  assert.equal(load().queuedPrefillTokens, 300);
  // each counted among the malformed, as the process channel counts them (message-checks.ts)
  assert.equal(store.stats().malformedMessages, 5);
  await send({ r: 'z', k: 'rl', q: 300 });
  await until(() => load().inFlightRequests === 0, 'its release to count');
  assert.equal(load().queuedPrefillTokens, 0);
});

test('a message longer than any replica sends is refused unread; the longest decision still applies', async () => {
  const { router, store } = await routers.replica('E');
  const channel = channelOf(store);
  // the defaults (1,048,576 tokens, 16 a block): 8 MiB, what the other kinds of message need
  const oversize = `{"r":"x","k":"d","w":"e0","h":"${'A'.repeat(9 * 1024 * 1024)}"}`;
  await redis.publish(channel, oversize);
  await until(() => store.stats().oversizeMessages === 1, 'the long message to be refused');
  assert.equal(store.stats().malformedMessages, 1, 'counted among the malformed');
  // the longest decision the router takes (65,536 blocks, 699,052 characters of hashes) applies
  const blocks = 1_048_576 / 16;
  const hi = Uint32Array.from({ length: blocks }, (_, i) => i);
  const longest = { r: 'x', k: 'd', w: 'e0', h: encodeHashes(hi, hi), q: 1_048_576, i: 'longest' };
  await redis.publish(channel, JSON.stringify(longest));
  await until(() => store.stats().decisionsApplied === 1, 'the longest decision to apply');
  assert.equal(router.getStats().index.entries, blocks);
  // a worker of one token a block may have 16 times as many blocks: the bound grows with it
  store.workerAdded({ id: 'e1', url: 'http://e1', blockSize: 1 });
  await redis.publish(channel, oversize);
  await until(() => (store.stats().malformedMessages as number) === 2, 'the message to be read');
  assert.equal(store.stats().oversizeMessages, 1, 'read, not refused for its length');
});

test('a replica starting over keys that hold garbage loads the rest and comes up', async () => {
  const prefix = prefixes.fresh();
  const chain = (id: string) => JSON.stringify({ r: 'other', k: 'd', w: 'e0', h: hashes, i: id });
  await redis
    .multi()
    .set(`${prefix}workers`, 'not a hash')
    .set(`${prefix}wf:`, JSON.stringify({ w: 'e0', s: 1 }))
    .set(`${prefix}wf:null`, 'null')
    .set(`${prefix}wf:neg`, JSON.stringify({ w: 'e0', s: -1 }))
    .set(`${prefix}wf:good`, JSON.stringify({ w: 'e0', s: 3 }))
    .hset(`${prefix}wf:hash`, 'w', 'e0')
    // the index of workflows by last use names each, and one whose key is gone
    .zadd(`${prefix}workflows`, '1', '', '2', 'null', '3', 'neg', '4', 'good', '5', 'hash', '6', 'gone')
    .set(`${prefix}chain:e0:junk`, '{"r": 5}')
    .set(`${prefix}chain:e0:good`, chain('1'))
    .zadd(`${prefix}replicas`, String(Date.now() + 60_000), 'ghost')
    .set(`${prefix}load:ghost`, 'not a hash')
    .exec();
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: 'D', syncIntervalMs: 20 });
  try {
    await store.attach(host);
    assert.equal(store.stats().connected, true, logs.join('\n'));
    assert.equal(store.stats().resyncs, 1);
    assert.deepEqual(router.workflowAffinity('good'), { workerId: 'e0', step: 3 });
    assert.deepEqual(router.workflowAffinity('neg'), { workerId: 'e0', step: null });
    assert.equal(router.workflowAffinity('null'), undefined);
    assert.equal(router.getStats().index.entries, 2, 'the good chain is loaded');
    // the load sync goes on past the unreadable snapshot: it sees the ghost replica
    await until(() => store.stats().replicasSeen === 2, 'the load sync to see the other replica');
    assert.ok(logs.some((l) => l.includes(`${prefix}workers`)));
  } finally {
    await store.close();
  }
});

test('shared keys found holding another kind of value are deleted and written anew, each logged once', async () => {
  const prefix = prefixes.fresh();
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: 'K', syncIntervalMs: 20 });
  try {
    await store.attach(host);
    assert.deepEqual(await redis.hkeys(`${prefix}workers`), ['e0']);
    // written by hand, or another program under the prefix, while the replica runs
    await redis
      .multi()
      .set(`${prefix}workers`, 'x')
      .set(`${prefix}removed`, 'x')
      .set(`${prefix}draining`, 'x')
      .set(`${prefix}workflows`, 'x')
      .exec();
    await until(
      async () => (await redis.type(`${prefix}workers`)) === 'hash' && (store.stats().resyncs as number) >= 2,
      'the registry to be written back',
    );
    assert.deepEqual(await redis.hkeys(`${prefix}workers`), ['e0']);
    for (const key of ['removed', 'draining', 'workflows'])
      assert.notEqual(await redis.type(`${prefix}${key}`), 'string', `${key} repaired`);
    assert.equal(store.stats().wrongKindRepairs, 4);
    for (const key of ['workers', 'removed', 'draining', 'workflows'])
      assert.equal(
        logs.filter((l) => l.includes(`${prefix}${key} in redis holds a string (WRONGTYPE)`)).length,
        1,
        logs.join('\n'),
      );
    // an admin change is decided in Redis again
    const verdict = await store.orderWorkerChange({ op: 'drain', id: 'e0', draining: true }, (v) => v);
    assert.equal(verdict.ok, true);
  } finally {
    await store.close();
  }
});

test('a server that answers with control characters: the log repeats them escaped, not raw', async () => {
  // whatever listens on the address (a stranger, garbage) answers every command with an error
  // holding terminal controls, a NUL and a line separator
  const server = createServer((socket) => {
    socket.on('error', () => {});
    socket.on('data', () => socket.write('-ERR \x1b[2J\x07evil\x00 \u2028x\r\n'));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  const { host, logs } = fixedWorkersHost(new KVAwareRouter({ blockSize: 16 }), ['e0']);
  const store = new RedisStateStore({ url: `redis://127.0.0.1:${port}`, prefix: prefixes.fresh() });
  try {
    await store.attach(host);
    await until(() => logs.some((l) => l.includes('refused the connection')), 'the refusal to be logged');
    const said = logs.filter((l) => l.includes('evil'));
    assert.ok(said.length > 0, logs.join('\n'));
    // eslint-disable-next-line no-control-regex -- what must not reach the log
    for (const l of said) assert.doesNotMatch(l, /[\u0000-\u001f\u2028]/, JSON.stringify(l));
    assert.ok(
      said.every((l) => l.includes('\\x1b[2J\\x07evil')),
      JSON.stringify(said),
    );
  } finally {
    await store.close();
    server.close();
  }
});
