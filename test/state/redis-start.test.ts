/**
 * A replica's start against a Redis that is not there, or not answering, and a refusal of its
 * credentials after the start: the start never waits on Redis for longer than the stall timeout
 * (requests never wait for Redis), says why Redis was out of reach, and a refusal that comes
 * on a reconnection is logged once and counted, never with the password, and retried.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/index.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { freePort, RedisProcess } from '../faults/harness.js';
import { workerHost } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

/** A host with worker e0 whose log lines go to `logs`. */
function host() {
  const logs: string[] = [];
  const { host } = workerHost(new KVAwareRouter({ blockSize: 16 }), ['e0']);
  host.log = (m) => void logs.push(m);
  return { host, logs };
}

/**
 * Attaches `store`; fails unless the start ends within `withinMs`: a bound well past the stall
 * timeout (a loaded machine) and well short of how long Redis stays silent (a start that waits for it).
 */
async function attachWithin(store: RedisStateStore, h: ReturnType<typeof host>['host'], withinMs: number) {
  let ended = false;
  const attached = store.attach(h).finally(() => (ended = true));
  attached.catch(() => {}); // awaited below, once ended
  await until(() => ended, `the start to end within ${withinMs} ms`, { timeoutMs: withinMs });
  await attached;
}

async function workersIn(url: string, prefix: string): Promise<number> {
  const r = new Redis(url, { maxRetriesPerRequest: 0, lazyConnect: true });
  await r.connect();
  try {
    return await r.hlen(`${prefix}workers`);
  } finally {
    r.disconnect();
  }
}

test('Redis stopped (SIGSTOP) at start: the start ends within the stall timeout; resumed, the replica resynchronises', async () => {
  const redis = await new RedisProcess().start();
  const prefix = 'cf-start-stopped:';
  // a command timeout past the stall timeout: the handshake's commands would wait it out
  const store = new RedisStateStore({
    url: redis.url,
    prefix,
    syncIntervalMs: 50,
    stallTimeoutMs: 500,
    commandTimeoutMs: 5000,
  });
  const { host: h, logs } = host();
  try {
    redis.pause();
    await attachWithin(store, h, 5000);
    assert.equal(store.stats().connected, false);
    const unreachable = logs.filter((m) => m.includes('unreachable at start'));
    assert.equal(unreachable.length, 1, logs.join('\n'));
    assert.match(unreachable[0], /did not answer within 500 ms/, unreachable[0]);
    redis.resume();
    await until(() => store.stats().connected === true, 'the replica to connect once Redis answers');
    assert.equal(await workersIn(redis.url, prefix), 1, 'its registry was written on the resynchronisation');
    assert.equal(logs.filter((m) => m.includes('unreachable')).length, 1, logs.join('\n'));
    // the replica says when the shared state is there after all, once
    await until(() => logs.some((m) => m.includes('redis connected')), 'the connection to be logged');
    assert.equal(logs.filter((m) => m.includes('redis connected')).length, 1, logs.join('\n'));
  } finally {
    redis.resume();
    await store.close();
    await redis.kill();
  }
});

test('Redis paused (CLIENT PAUSE) at start: the start ends within the stall timeout, not the pause', async () => {
  const redis = await new RedisProcess().start();
  const prefix = 'cf-start-paused:';
  const admin = new Redis(redis.url, { maxRetriesPerRequest: 0 });
  const store = new RedisStateStore({ url: redis.url, prefix, syncIntervalMs: 50, stallTimeoutMs: 500 });
  const { host: h, logs } = host();
  try {
    await admin.call('CLIENT', 'PAUSE', '12000', 'ALL');
    await attachWithin(store, h, 5000);
    assert.equal(store.stats().connected, false);
    const unreachable = logs.filter((m) => m.includes('unreachable at start'));
    assert.equal(unreachable.length, 1, logs.join('\n'));
    assert.match(unreachable[0], /timed out|did not answer/, unreachable[0]);
    await until(() => store.stats().connected === true, 'the replica to connect once the pause ends', {
      timeoutMs: 30_000,
    });
    assert.equal(await workersIn(redis.url, prefix), 1);
  } finally {
    admin.disconnect();
    await store.close();
    await redis.kill();
  }
});

test('nothing listening at start: the log names the cause (ECONNREFUSED), not a closed connection', async () => {
  const port = await freePort();
  const store = new RedisStateStore({ url: `redis://127.0.0.1:${port}`, prefix: 'cf-start-refused:' });
  const { host: h, logs } = host();
  try {
    await attachWithin(store, h, 5000);
    const unreachable = logs.filter((m) => m.includes('unreachable at start'));
    assert.equal(unreachable.length, 1, logs.join('\n'));
    assert.match(unreachable[0], /ECONNREFUSED/, unreachable[0]);
    assert.doesNotMatch(unreachable[0], /Connection is closed/, unreachable[0]);
  } finally {
    await store.close();
  }
});

test('a password Redis refuses after the start: logged once without it, counted, retried until it is taken again', async () => {
  const PASSWORD = 'cf-start-secret-5d1e';
  const CHANGED = 'cf-start-changed-9b7c';
  const redis = await new RedisProcess(['--requirepass', PASSWORD]).start();
  const admin = new Redis({ port: redis.port, password: PASSWORD, maxRetriesPerRequest: 0 });
  const url = `redis://:${PASSWORD}@127.0.0.1:${redis.port}`;
  const store = new RedisStateStore({ url, prefix: 'cf-start-auth:', syncIntervalMs: 50 });
  const { host: h, logs } = host();
  try {
    await store.attach(h);
    assert.equal(store.stats().connected, true);
    // the password changes, and the replica's connections drop: every reconnection is refused
    await admin.config('SET', 'requirepass', CHANGED);
    await admin.call('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes');
    await until(
      () => (store.stats().refused as number) >= 2,
      'the refusal to be counted on two reconnections (it is retried)',
    );
    const stats = store.stats();
    assert.equal(stats.connected, false);
    assert.equal(stats.lastRefusal, 'WRONGPASS');
    assert.ok((stats.errors as number) >= (stats.refused as number), JSON.stringify(stats));
    const refusals = logs.filter((m) => m.includes('WRONGPASS'));
    assert.equal(refusals.length, 1, logs.join('\n'));
    assert.match(refusals[0], new RegExp(`127\\.0\\.0\\.1:${redis.port}`), refusals[0]);
    for (const m of logs) {
      assert.doesNotMatch(m, new RegExp(PASSWORD));
      assert.doesNotMatch(m, new RegExp(CHANGED));
    }
    // the password taken again: the next reconnection resynchronises
    const resyncs = stats.resyncs as number;
    const admin2 = new Redis({ port: redis.port, password: CHANGED, maxRetriesPerRequest: 0 });
    await admin2.config('SET', 'requirepass', PASSWORD);
    admin2.disconnect();
    await until(
      () => store.stats().connected === true && (store.stats().resyncs as number) > resyncs,
      'the replica to reconnect once its password is taken',
    );
    assert.equal(logs.filter((m) => m.includes('WRONGPASS')).length, 1, logs.join('\n'));
  } finally {
    admin.disconnect();
    await store.close();
    await redis.kill();
  }
});
