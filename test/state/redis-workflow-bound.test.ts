import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { RedisStateStore, type RedisStateOptions } from '../../src/state/redis-state-store.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { dropPrefixes, workerHost } from '../helpers/state-host.js';
import { settled, until } from '../helpers/wait.js';

// Workflow ids are the client's to choose: every new one is a Redis entry. However many a
// client sends, Redis holds a bounded number of them, the least recently used dropped, and a
// replica that starts loads the newest ones only, as many as it keeps in memory. Real Redis
// (127.0.0.1:6379, which .ci/run starts when nothing answers there); nothing is skipped.
const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
const prefixes: string[] = [];
const stores: RedisStateStore[] = [];
after(async () => {
  for (const s of stores) await s.close();
  await dropPrefixes(prefixes);
  redis.disconnect();
});

function freshPrefix(): string {
  const prefix = `cf-test-wfbound-${randomBytes(4).toString('hex')}:`;
  prefixes.push(prefix);
  return prefix;
}

/** A replica with workers e0 and e1 remembering `capacity` workflows, sharing under `prefix`. */
async function replica(id: string, prefix: string, capacity: number, options: Partial<RedisStateOptions> = {}) {
  const router = new KVAwareRouter({ blockSize: 16, workflowCapacity: capacity });
  const { host } = workerHost(router, ['e0', 'e1']);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: id, syncIntervalMs: 60_000, ...options });
  stores.push(store);
  await store.attach(host);
  return { router, store };
}

type Replica = Awaited<ReturnType<typeof replica>>;

/** Routes one step as the gateway does: look the workflow up, decide, share. */
async function step(r: Replica, workflowId: string, workflowStep: number) {
  await r.store.beforeRoute({ workflowId, text: `${workflowId} step ${workflowStep} `.repeat(4) });
  const d = r.router.route({ text: `${workflowId} `.repeat(8), workflowId, workflowStep }, { share: true });
  r.store.decisionMade(d.shared!);
  return d;
}

/** The workflow ids Redis holds a `wf:` key for under `prefix`. */
async function storedWorkflows(prefix: string): Promise<string[]> {
  const keys = await redis.keys(`${prefix}wf:*`);
  return keys.map((k) => k.slice(`${prefix}wf:`.length)).sort();
}

const published = (s: RedisStateStore) => s.stats().decisionsPublished as number;

test('many workflow ids from one replica: Redis keeps the bound, dropping the least recently used', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, 10, { sharedWorkflows: 25 });
  for (let i = 0; i < 40; i++) await step(a, `wf-${i}`, 0);
  await step(a, 'wf-0', 1); // wf-0 used again: wf-1 is now the least recently used
  for (let i = 40; i < 60; i++) await step(a, `wf-${i}`, 0);
  await until(() => published(a.store) === 61, 'every decision to be written');
  const kept = await storedWorkflows(prefix);
  const expected = ['wf-0', ...Array.from({ length: 24 }, (_, i) => `wf-${36 + i}`)].sort();
  assert.deepEqual(kept, expected, 'the 25 most recently used, wf-0 among them');
  assert.deepEqual((await redis.zrange(`${prefix}workflows`, '0', '-1')).sort(), expected, 'the index names the same');
});

test('by default Redis keeps four times the workflows a replica remembers', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, 5);
  for (let i = 0; i < 30; i++) await step(a, `wf-${i}`, 0);
  await until(() => published(a.store) === 30, 'every decision to be written');
  assert.equal((await storedWorkflows(prefix)).length, 20);
});

test('two replicas writing at once stay within the bound together', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, 10, { sharedWorkflows: 20 });
  const b = await replica('b', prefix, 10, { sharedWorkflows: 20 });
  const run = async (r: Replica, name: string) => {
    for (let i = 0; i < 100; i++) await step(r, `${name}-${i}`, 0);
  };
  await Promise.all([run(a, 'a'), run(b, 'b')]);
  await until(() => published(a.store) === 100 && published(b.store) === 100, 'every decision to be written');
  const kept = await storedWorkflows(prefix);
  assert.equal(kept.length, 20);
  assert.deepEqual((await redis.zrange(`${prefix}workflows`, '0', '-1')).sort(), kept, 'the index names the same');
  // the least recently used were dropped: of each replica's workflows, its last ones are kept
  for (const name of ['a', 'b']) {
    const mine = kept.filter((id) => id.startsWith(`${name}-`)).map((id) => Number(id.slice(2)));
    const last = Array.from({ length: mine.length }, (_, i) => 100 - mine.length + i);
    assert.deepEqual(
      mine.sort((x, y) => x - y),
      last,
      `${name}'s last ${mine.length}`,
    );
  }
});

test('a replica that starts loads only the newest workflows, as many as it remembers, newest last', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, 100, { sharedWorkflows: 100 });
  for (let i = 0; i < 60; i++) await step(a, `wf-${i}`, 0);
  await until(() => published(a.store) === 60, 'every decision to be written');
  const b = await replica('b', prefix, 10);
  const loaded = [...b.router.workflowAffinities()].map(([id]) => id);
  // least recently used first: the router's own order, so its next eviction drops the oldest
  assert.deepEqual(
    loaded,
    Array.from({ length: 10 }, (_, i) => `wf-${50 + i}`),
  );
});

test('a workflow an earlier release wrote (a wf: key alone) is not loaded at start but followed on first sight', async () => {
  const prefix = freshPrefix();
  await redis.set(`${prefix}wf:old`, JSON.stringify({ w: 'e1', s: 4 }), 'PX', 60_000);
  const b = await replica('b', prefix, 10);
  assert.equal(b.router.workflowAffinity('old'), undefined);
  await b.store.beforeRoute({ workflowId: 'old', text: 'x' });
  assert.deepEqual(b.router.workflowAffinity('old'), { workerId: 'e1', step: 4 });
});

test('lookups never followed by a decision do not stop later workflows being claimed atomically', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, 10);
  const b = await replica('b', prefix, 10);
  // requests that looked their workflow up and then were not routed (no worker, client gone)
  for (let batch = 0; batch < 101; batch++)
    await Promise.all(
      Array.from({ length: 1000 }, (_, i) => a.store.beforeRoute({ workflowId: `lost-${batch}-${i}`, text: 'x' })),
    );
  // both look the new workflow up before either has claimed it; B claims it first
  await a.store.beforeRoute({ workflowId: 'wf-x', text: 'x' });
  await b.store.beforeRoute({ workflowId: 'wf-x', text: 'x' });
  const fromB = b.router.route({ text: 'wf-x '.repeat(8), workflowId: 'wf-x', workflowStep: 0 }, { share: true });
  b.store.decisionMade(fromB.shared!);
  await until(() => published(b.store) === 1, "B's claim to be written");
  const fromA = a.router.route({ text: 'wf-x '.repeat(8), workflowId: 'wf-x', workflowStep: 0 }, { share: true });
  a.store.decisionMade(fromA.shared!);
  await until(() => published(a.store) === 1, "A's decision to be written");
  assert.equal(a.store.stats().workflowClaimsLost, 1, 'A lost the claim to B');
  const stored = JSON.parse((await redis.get(`${prefix}wf:wf-x`))!) as { w: string };
  assert.equal(stored.w, fromB.workerId, "Redis keeps B's claim");
  const followed = await settled(
    () => a.router.workflowAffinity('wf-x')?.workerId,
    (w) => w === fromB.workerId,
  );
  assert.equal(followed, fromB.workerId, 'A follows it');
});

test('an index of workflows that is not a sorted set is skipped at start: the replica comes up', async () => {
  const prefix = freshPrefix();
  await redis.set(`${prefix}workflows`, 'not a sorted set');
  const logs: string[] = [];
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host } = workerHost(router, ['e0']);
  host.log = (m) => logs.push(m);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: 'c', syncIntervalMs: 60_000 });
  stores.push(store);
  await store.attach(host);
  assert.equal(store.stats().connected, true, logs.join('\n'));
  assert.ok(
    logs.some((l) => l.includes(`${prefix}workflows`)),
    logs.join('\n'),
  );
});

test('a replica writing its workflows back after Redis lost them keeps the newest within the bound', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, 1200, { sharedWorkflows: 1000, syncIntervalMs: 50 });
  for (let i = 0; i < 1200; i++) await step(a, `wf-${i}`, 0);
  await until(() => published(a.store) === 1200, 'every decision to be written');
  await until(async () => (await redis.zcard(`${prefix}replicas`)) === 1, 'the heartbeat to be written');
  const lost = await redis.keys(`${prefix}*`);
  await redis.del(...lost);
  await until(() => a.store.stats().stateLost === 1 && a.store.stats().resyncs === 2, 'the write-back');
  const kept = await storedWorkflows(prefix);
  assert.deepEqual(
    kept,
    Array.from({ length: 1000 }, (_, i) => `wf-${200 + i}`).sort(),
    'its 1,000 most recently used',
  );
  assert.equal(a.router.getStats().workflowsTracked, 1200, 'the replica still remembers its own');
});

test('a replica with a smaller bound trims what a larger one left, down to its own', async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, 100, { sharedWorkflows: 2500 });
  for (let batch = 0; batch < 25; batch++)
    await Promise.all(Array.from({ length: 100 }, (_, i) => step(a, `wf-${batch * 100 + i}`, 0)));
  await until(() => published(a.store) === 2500, 'every decision to be written');
  assert.equal((await storedWorkflows(prefix)).length, 2500);
  const b = await replica('b', prefix, 10, { sharedWorkflows: 5 });
  await step(b, 'wf-b', 0);
  await until(() => published(b.store) === 1, 'its decision to be written');
  const kept = await storedWorkflows(prefix);
  assert.equal(kept.length, 5);
  assert.ok(kept.includes('wf-b'));
  assert.equal(await redis.zcard(`${prefix}workflows`), 5);
});

test("a step lower than the workflow's latest does not move it in Redis either: a replica that starts later agrees", async () => {
  const prefix = freshPrefix();
  const a = await replica('a', prefix, 10);
  const b = await replica('b', prefix, 10);
  /** One step routed by `r` to the worker `to`, the other held out (a drain, say). */
  const stepOn = async (r: Replica, workflowStep: number, to: string) => {
    await r.store.beforeRoute({ workflowId: 'late', text: 'late step '.repeat(4) });
    const d = r.router.route(
      { text: `late ${workflowStep} `.repeat(8), workflowId: 'late', workflowStep },
      { share: true, exclude: new Set([to === 'e0' ? 'e1' : 'e0']) },
    );
    assert.equal(d.workerId, to);
    r.store.decisionMade(d.shared!);
  };
  await stepOn(a, 5, 'e0');
  await until(() => published(a.store) === 1, 'step 5 written');
  // a retry of an earlier step, late, through the other replica, on the other worker
  await stepOn(b, 3, 'e1');
  await until(() => published(b.store) === 1, 'step 3 written');
  assert.deepEqual(JSON.parse((await redis.get(`${prefix}wf:late`))!), { w: 'e0', s: 5 });
  const c = await replica('c', prefix, 10);
  await c.store.beforeRoute({ workflowId: 'late', text: 'late step '.repeat(4) });
  const next = c.router.route({ text: 'late 6 '.repeat(8), workflowId: 'late', workflowStep: 6 }, { dryRun: true });
  assert.equal(next.workerId, 'e0', 'the replica started later follows step 5, as the running ones do');
});
