/**
 * The database a redis:// URL names: one the server does not have fails the start with an
 * error naming it, and a reconnection that finds the server without it (restarted with fewer
 * databases) keeps the replica down rather than sharing database 0, another fleet's state.
 * Nothing is ever written to database 0 on the way.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { MAX_REDIS_DB, parseRedisUrl, RedisStateStore } from '../../src/state/redis-state-store.js';
import { RedisProcess } from '../faults/harness.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { workerHost } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

const prefix = `cf-test-db-${randomBytes(4).toString('hex')}:`;
const stores: RedisStateStore[] = [];
const servers: RedisProcess[] = [];
after(async () => {
  for (const s of stores) await s.close();
  for (const r of servers) await r.kill();
  for (const db of [0, 5]) {
    const keys = await withClient(REDIS_URL, db, (r) => r.keys(`${prefix}*`));
    if (keys.length > 0) await withClient(REDIS_URL, db, (r) => r.del(...keys));
  }
});

async function withClient<T>(url: string, db: number, use: (r: Redis) => Promise<T>): Promise<T> {
  const r = new Redis(`${url}/${db}`, { lazyConnect: true, maxRetriesPerRequest: 0 });
  await r.connect();
  try {
    return await use(r);
  } finally {
    r.disconnect();
  }
}

const keysIn = (url: string, db: number) => withClient(url, db, (r) => r.keys(`${prefix}*`));

/** A replica configured with worker e0 (written to the registry once up), logging into `logs`. */
function replica(url: string, replicaId = 'r1') {
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host } = workerHost(router, ['e0']);
  const logs: string[] = [];
  host.log = (m) => void logs.push(m);
  const store = new RedisStateStore({ url, prefix, replicaId, syncIntervalMs: 50 });
  stores.push(store);
  return { store, host, logs };
}

test('the URL names a database from 0 to 2147483647, in digits', () => {
  assert.equal(parseRedisUrl(`redis://h:1/${MAX_REDIS_DB}`).db, MAX_REDIS_DB);
  assert.equal(parseRedisUrl('redis://h:1').db, 0);
  for (const db of ['2147483648', '99999999999', '1e3', '0x10', '-1', '1.5']) {
    assert.throws(() => parseRedisUrl(`redis://h:1/${db}`), RangeError, db);
  }
});

test('a database the server does not have: the start fails naming it and --state; nothing is written to database 0', async () => {
  const { store, host } = replica(`${REDIS_URL}/16`);
  await assert.rejects(store.attach(host), (err: Error) => {
    assert.ok(err instanceof RangeError, String(err));
    assert.match(err.message, /database 16 of the --state URL/);
    assert.match(err.message, /DB index is out of range/);
    return true;
  });
  assert.equal(store.stats().connected, false);
  assert.deepEqual(await keysIn(REDIS_URL, 0), []);
});

test('database 5: the state is written there, and nothing in database 0', async () => {
  const { store, host } = replica(`${REDIS_URL}/5`);
  await store.attach(host);
  assert.equal(store.stats().connected, true);
  assert.equal(await withClient(REDIS_URL, 5, (r) => r.hexists(`${prefix}workers`, 'e0')), 1);
  await until(async () => (await keysIn(REDIS_URL, 5)).includes(`${prefix}load:r1`), 'the load snapshot in db 5');
  assert.deepEqual(await keysIn(REDIS_URL, 0), []);
  await store.close();
});

test('a reconnection to a server without the database stays down, writing nothing, until it has it again', async () => {
  const sixteen = new RedisProcess(['--databases', '16']);
  servers.push(sixteen);
  await sixteen.start();
  const { store, host, logs } = replica(`${sixteen.url}/5`);
  await store.attach(host);
  assert.equal(await withClient(sixteen.url, 5, (r) => r.hexists(`${prefix}workers`, 'e0')), 1);

  // restarted with 4 databases: every reconnection's SELECT 5 is refused
  await sixteen.kill();
  const four = new RedisProcess(['--databases', '4']);
  four.port = sixteen.port;
  servers.push(four);
  await four.start();
  await until(() => logs.some((m) => /refused database 5 of the --state URL/.test(m)), 'the refusal to be logged');
  // the replica changes the registry meanwhile: kept for later, not written to database 0
  store.workerAdded({ id: 'e1', url: 'http://e1' });
  const refusals = Number(store.stats().errors);
  await until(() => Number(store.stats().errors) >= refusals + 2, 'two more reconnections refused');
  assert.equal(store.stats().connected, false);
  assert.equal(await withClient(four.url, 0, (r) => r.dbsize()), 0);
  assert.equal(logs.filter((m) => /refused database 5/.test(m)).length, 1, 'logged once');

  // back with its databases: the replica writes back into database 5
  await four.kill();
  const again = new RedisProcess(['--databases', '16']);
  again.port = sixteen.port;
  servers.push(again);
  await again.start();
  await until(() => store.stats().connected === true, 'the replica to come back up');
  await until(
    async () => (await withClient(again.url, 5, (r) => r.hkeys(`${prefix}workers`))).sort().join() === 'e0,e1',
    'both workers in database 5',
  );
  assert.equal(await withClient(again.url, 0, (r) => r.dbsize()), 0);
  await store.close();
});

test('fleets on databases 0 and 5 with one prefix do not hear each other (channels are per server)', async () => {
  const zero = replica(REDIS_URL, 'zero');
  const five = replica(`${REDIS_URL}/5`, 'five');
  await zero.store.attach(zero.host);
  await five.store.attach(five.host);
  const added: string[] = [];
  const addTo = five.host.addWorkerFromState.bind(five.host);
  five.host.addWorkerFromState = (w) => {
    added.push(w.id);
    addTo(w);
  };
  zero.store.workerAdded({ id: 'only-in-zero', url: 'http://z' });
  five.store.workerAdded({ id: 'only-in-five', url: 'http://f' });
  // each fleet's own registry has its worker; the message of each went on its own channel
  await until(
    async () => (await withClient(REDIS_URL, 0, (r) => r.hexists(`${prefix}workers`, 'only-in-zero'))) === 1,
    'the db-0 worker written',
  );
  await until(
    async () => (await withClient(REDIS_URL, 5, (r) => r.hexists(`${prefix}workers`, 'only-in-five'))) === 1,
    'the db-5 worker written',
  );
  // a third replica on database 5 hears a change there: the channel works within the database
  const late = replica(`${REDIS_URL}/5`, 'late');
  const heard: string[] = [];
  const addLate = late.host.addWorkerFromState.bind(late.host);
  late.host.addWorkerFromState = (w) => {
    heard.push(w.id);
    addLate(w);
  };
  await late.store.attach(late.host);
  five.store.workerAdded({ id: 'second-in-five', url: 'http://f2' });
  await until(() => heard.includes('second-in-five'), 'the db-5 replica to hear its own fleet');
  assert.deepEqual(added, [], 'nothing from database 0 reached the database-5 fleet');
  for (const s of [zero, five, late]) await s.store.close();
});
