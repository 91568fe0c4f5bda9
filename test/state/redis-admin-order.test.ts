/**
 * Admin worker changes through replicas sharing a Redis registry are decided in Redis, one at a
 * time, against the registry: two replicas adding one id at once get one 201 and one 409 and
 * both keep the winner's URL, a delete through one replica right after an add through another
 * finds the worker, and any interleaving of adds, removes and drains leaves every replica
 * holding the registry. Real Redis (127.0.0.1:6379, or CONTEXTFORGE_TEST_REDIS), nothing
 * mocked; under CI nothing is skipped.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import {
  adminCall,
  listedWorkers,
  REGISTRY_ADMIN_TOKEN as TOKEN,
  registryReplica,
  registryWorkers,
} from '../helpers/registry-replicas.js';
import { testPrefixes } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

const prefixes = testPrefixes('admin-order');
const gateways: Gateway[] = [];
const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
after(async () => {
  for (const g of gateways) await g.close();
  await prefixes.drop();
  redis.disconnect();
});

/** A replica sharing the registry under `prefix` in the machine's Redis. */
const replica = (prefix: string, id: string, log?: (message: string) => void) =>
  registryReplica(gateways, REDIS_URL, prefix, id, log);
const call = async (g: Gateway, method: 'GET' | 'POST' | 'DELETE', url: string, body?: unknown) => {
  const { status, body: json } = await adminCall(g, method, url, body);
  return { status, body: json };
};
const listed = listedWorkers;
const registry = (prefix: string) => registryWorkers(redis, prefix);

test('racing adds of one id through two replicas: one 201, one 409, and both keep the winner', async () => {
  await redis.connect().catch(() => {});
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'a');
  const b = await replica(prefix, 'b');
  for (let i = 0; i < 20; i++) {
    const id = `raced-${i}`;
    const [ra, rb] = await Promise.all([
      call(a, 'POST', '/admin/workers', { id, url: 'http://127.0.0.1:1' }),
      call(b, 'POST', '/admin/workers', { id, url: 'http://127.0.0.1:2' }),
    ]);
    assert.deepEqual([ra.status, rb.status].sort(), [201, 409], `one add made: ${JSON.stringify([ra, rb])}`);
    const loser = ra.status === 409 ? ra : rb;
    assert.deepEqual(loser.body, {
      error: { message: `worker '${id}' exists`, type: 'invalid_request_error', param: 'id', code: null },
    });
    const url = ra.status === 201 ? 'http://127.0.0.1:1' : 'http://127.0.0.1:2';
    // as they answered: no wait
    for (const g of [a, b]) assert.equal(g.router.hasWorker(id), true);
    const held = (await listed(a)).filter((w) => w.startsWith(`${id} `));
    assert.deepEqual(held, [`${id} ${url}`]);
    assert.deepEqual(await listed(b), await listed(a));
    assert.equal(JSON.parse((await redis.hget(`${prefix}workers`, id))!).url, url);
  }
});

test('a delete through one replica right after an add through the other finds the worker', async () => {
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'a');
  const b = await replica(prefix, 'b');
  const answers: string[] = [];
  for (let i = 0; i < 50; i++) {
    const [first, second] = i % 2 === 0 ? [a, b] : [b, a];
    const added = await call(first, 'POST', '/admin/workers', { id: 'cycled', url: 'http://127.0.0.1:3' });
    const removed = await call(second, 'DELETE', '/admin/workers/cycled');
    answers.push(`${added.status} ${removed.status}`);
    // and one drain right after an add
    const again = await call(second, 'POST', '/admin/workers', { id: 'drained', url: 'http://127.0.0.1:4' });
    const drained = await call(first, 'POST', '/admin/workers/drained/drain');
    const gone = await call(second, 'DELETE', '/admin/workers/drained');
    answers.push(`${again.status} ${drained.status} ${gone.status}`);
  }
  assert.deepEqual(
    answers.filter((x) => x !== '201 200' && x !== '201 200 200'),
    [],
    'every add made and every change right after it found the worker',
  );
  const expected = ['e0 http://127.0.0.1:9'];
  assert.deepEqual(await registry(prefix), expected);
  for (const g of [a, b]) assert.deepEqual(await listed(g), expected);
});

test('interleaved adds, removes and drains through two replicas leave both holding the Redis registry', async () => {
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'a');
  const b = await replica(prefix, 'b');
  let seed = 11;
  const next = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), Math.floor((seed / 2 ** 31) * n));
  const counts: Record<string, number> = {};
  for (let batch = 0; batch < 40; batch++) {
    await Promise.all(
      Array.from({ length: 6 }, async () => {
        const id = `x${next(3)}`;
        const g = next(2) === 0 ? a : b;
        const op = next(4);
        const res =
          op <= 1
            ? await call(g, 'POST', '/admin/workers', { id, url: `http://127.0.0.1:${1000 + next(1000)}` })
            : op === 2
              ? await call(g, 'DELETE', `/admin/workers/${id}`)
              : await call(g, 'POST', `/admin/workers/${id}/${next(2) === 0 ? 'drain' : 'resume'}`);
        const key = `${['add', 'add', 'remove', 'drain'][op]} ${res.status}`;
        counts[key] = (counts[key] ?? 0) + 1;
      }),
    );
    // between batches: both replicas list what the registry holds
    const shared = await registry(prefix);
    for (const g of [a, b]) assert.deepEqual(await listed(g), shared, `after batch ${batch}`);
  }
  for (const key of ['add 201', 'add 409', 'remove 200', 'remove 404', 'drain 200', 'drain 404'])
    assert.ok(counts[key] > 0, `the interleavings include ${key}: ${JSON.stringify(counts)}`);
  assert.deepEqual(
    Object.keys(counts).filter((k) => !/^(add (201|409)|remove (200|404)|drain (200|404))$/.test(k)),
    [],
    JSON.stringify(counts),
  );
  const shared = await registry(prefix);
  // what each replica's router holds
  const held = (g: Gateway) =>
    g.router
      .listWorkers()
      .map((w) => `${w.id}${w.draining ? ' draining' : ''}`)
      .sort();
  const ids = shared.map((w) => w.replace(/ http:\S+/, ''));
  for (const g of [a, b]) assert.deepEqual(await listed(g), shared);
  // a GET answers once the replica has heard every change made before it: its router holds them too
  for (const g of [a, b]) assert.deepEqual(held(g), ids);
});

test('a worker change Redis refuses is answered 503 naming the problem, and changes nothing', async () => {
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'a');
  // the registry's key holds another kind of value: the script fails in Redis
  await redis.del(`${prefix}workers`);
  await redis.set(`${prefix}workers`, 'not a hash');
  const res = await call(a, 'POST', '/admin/workers', { id: 'refused', url: 'http://127.0.0.1:5' });
  assert.equal(res.status, 503, JSON.stringify(res.body));
  const error = res.body.error as { message: string; type: string };
  assert.match(error.message, /redis at 127\.0\.0\.1:\d+ refused the addition of worker 'refused' \(WRONGTYPE/);
  assert.equal(a.router.hasWorker('refused'), false);
  const removed = await call(a, 'DELETE', '/admin/workers/e0');
  assert.equal(removed.status, 503, JSON.stringify(removed.body));
  assert.equal(a.router.hasWorker('e0'), true);
});

test('a change whose second key holds another kind of value writes nothing of itself: Redis does not roll a script back', async () => {
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'a');
  const b = await replica(prefix, 'b');
  assert.equal((await call(a, 'POST', '/admin/workers', { id: 'x', url: 'http://127.0.0.1:5' })).status, 201);
  // the record of removals holds a string: the removal is refused before the worker leaves the registry
  await redis.set(`${prefix}removed`, 'not a hash');
  const removed = await call(a, 'DELETE', '/admin/workers/x');
  assert.equal(removed.status, 503, JSON.stringify(removed.body));
  assert.match((removed.body.error as { message: string }).message, /refused the removal of worker 'x' \(WRONGTYPE/);
  assert.deepEqual(await registry(prefix), ['e0 http://127.0.0.1:9', 'x http://127.0.0.1:5']);
  for (const g of [a, b]) assert.equal(g.router.hasWorker('x'), true);
  // the record of drains holds a string: neither an addition nor a drain is made
  await redis.del(`${prefix}removed`);
  await redis.set(`${prefix}draining`, 'not a hash');
  const added = await call(a, 'POST', '/admin/workers', { id: 'z', url: 'http://127.0.0.1:7' });
  assert.equal(added.status, 503, JSON.stringify(added.body));
  assert.equal((await call(b, 'POST', '/admin/workers/x/drain')).status, 503);
  // a refused change published no mark: nothing waits for one
  for (const g of [a, b]) assert.equal((g.state.stats() as { adminChangesPending: number }).adminChangesPending, 0);
  assert.deepEqual(Object.keys(await redis.hgetall(`${prefix}workers`)).sort(), ['e0', 'x']);
  for (const g of [a, b]) assert.equal(g.router.hasWorker('z'), false);
  await redis.del(`${prefix}draining`);
});

test('while Redis is out of reach the replica decides worker changes against its own view, as before', async () => {
  const prefix = prefixes.fresh();
  // nothing listens on port 1: the replica starts on its local state
  const a = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'e0', url: 'http://127.0.0.1:9' }],
    state: new RedisStateStore({ url: 'redis://127.0.0.1:1', prefix, replicaId: 'a', syncIntervalMs: 60_000 }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: TOKEN,
    log: () => {},
  });
  gateways.push(a);
  assert.equal(a.state.stats().connected, false);
  const answers = [
    await call(a, 'POST', '/admin/workers', { id: 'local', url: 'http://127.0.0.1:6' }),
    await call(a, 'POST', '/admin/workers', { id: 'local', url: 'http://127.0.0.1:7' }),
    await call(a, 'POST', '/admin/workers/local/drain'),
    await call(a, 'DELETE', '/admin/workers/local'),
    await call(a, 'DELETE', '/admin/workers/local'),
  ].map((r) => r.status);
  assert.deepEqual(answers, [201, 409, 200, 200, 404]);
  assert.deepEqual(await listed(a), ['e0 http://127.0.0.1:9']);
});

test('a worker Redis took that the asking replica cannot is taken back from every replica, and the refusal answered', async () => {
  const prefix = prefixes.fresh();
  const allowing = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'e0', url: 'http://127.0.0.1:9' }],
    state: new RedisStateStore({ url: REDIS_URL, prefix, replicaId: 'allowing', syncIntervalMs: 60_000 }),
    env: { CF_K_1: 'engine-key' },
    engineKeyEnvs: ['CF_K_*'],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: TOKEN,
    log: () => {},
  });
  gateways.push(allowing);
  // may not read the worker's engine-key variable
  const strict = await replica(prefix, 'strict');
  const res = await call(strict, 'POST', '/admin/workers', {
    id: 'keyed',
    url: 'http://127.0.0.1:3',
    apiKeyEnv: 'CF_K_1',
  });
  assert.equal(res.status, 400, JSON.stringify(res.body));
  assert.match((res.body.error as { message: string }).message, /--engine-key-envs/);
  const expected = ['e0 http://127.0.0.1:9'];
  assert.deepEqual(await registry(prefix), expected);
  for (const g of [allowing, strict]) assert.deepEqual(await listed(g), expected);
  // through the replica that can take it, it is made
  assert.equal(
    (await call(allowing, 'POST', '/admin/workers', { id: 'keyed', url: 'http://127.0.0.1:3', apiKeyEnv: 'CF_K_1' }))
      .status,
    201,
  );
});

test("an addition past the router's worker bound, counted in the registry's ranks, is refused 409", async () => {
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'a');
  // workers written by hand, unknown to the replica: the registry's word counts; e0 is one more
  const fields: string[] = [];
  for (let i = 0; i < 4092; i++) fields.push(`w${i}`, JSON.stringify({ id: `w${i}`, url: 'http://127.0.0.1:8' }));
  fields.push('dp', JSON.stringify({ id: 'dp', url: 'http://127.0.0.1:8', dpSize: 2 }));
  await redis.hset(`${prefix}workers`, ...fields);
  const res = await call(a, 'POST', '/admin/workers', { id: 'two', url: 'http://127.0.0.1:8', dpSize: 2 });
  assert.equal(res.status, 409, JSON.stringify(res.body));
  assert.deepEqual(res.body.error, {
    message:
      "worker 'two' not added: the router holds at most 4096 workers (each data-parallel rank is one), 4095 are registered and this one has 2 ranks",
    type: 'invalid_request_error',
    param: 'dpSize',
    code: null,
  });
  assert.equal((await call(a, 'POST', '/admin/workers', { id: 'one', url: 'http://127.0.0.1:8' })).status, 201);
  assert.equal((await call(a, 'POST', '/admin/workers', { id: 'more', url: 'http://127.0.0.1:8' })).status, 409);
});

test('a worker another replica adds is logged added, not also resumed; its drain and resume are logged', async () => {
  await redis.connect().catch(() => {});
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'a');
  const logs: string[] = [];
  const b = await replica(prefix, 'b', (m) => logs.push(m));
  const seen = (line: string) => logs.some((l) => l.includes(line));
  assert.equal((await call(a, 'POST', '/admin/workers', { id: 'x', url: 'http://127.0.0.1:3' })).status, 201);
  await until(() => seen("worker 'x' added by another replica"), 'b to hear of the addition');
  assert.equal((await call(a, 'POST', '/admin/workers/x/drain')).status, 200);
  await until(() => seen("worker 'x' drained by another replica"), 'b to hear of the drain');
  assert.equal((await call(a, 'POST', '/admin/workers/x/resume')).status, 200);
  await until(() => seen("worker 'x' resumed by another replica"), 'b to hear of the resumption');
  // the addition's own announcement that the worker is not draining changed nothing at b
  assert.equal(logs.filter((l) => l.includes("worker 'x' resumed")).length, 1, logs.join('\n'));
  assert.ok(b.router.hasWorker('x'));
});
