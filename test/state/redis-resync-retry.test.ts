/**
 * A resynchronisation that fails is tried again later, whatever became of its connection: here
 * the path to Redis goes silent (nothing passes either way, the close of the connection
 * included) as the resynchronisation starts, for longer than the first retry's delay, and the
 * replica shares again once the path is back.
 */
import assert from 'node:assert/strict';
import { createConnection, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { after, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { parseRedisUrl, RedisStateStore } from '../../src/state/redis-state-store.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { fixedWorkersHost, testPrefixes } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

const prefixes = testPrefixes('resync-retry');
const stores: RedisStateStore[] = [];
const servers: Server[] = [];
after(async () => {
  for (const s of stores) await s.close();
  for (const s of servers) s.close();
  await prefixes.drop();
});

/**
 * A TCP proxy to `port` on `host` whose path goes silent for `freezeMs` once armed and a client
 * sends bytes holding `trigger`: nothing is passed either way meanwhile, ends and closes
 * included (a network path dropping packets), and then everything held is. Armed with `cut`,
 * that client's connection is dropped instead.
 */
async function silentPathProxy(host: string, port: number, trigger: string, freezeMs: number) {
  let armed: 'freeze' | 'cut' | undefined;
  let frozenUntil = 0;
  const frozen = () => Date.now() < frozenUntil;
  const flushers = new Set<() => void>();
  const pump = setInterval(() => {
    for (const f of flushers) f();
  }, 10);
  pump.unref();
  const server = createServer({ allowHalfOpen: true }, (client: Socket) => {
    const upstream = createConnection({ host, port, allowHalfOpen: true });
    const up: Buffer[] = [];
    const down: Buffer[] = [];
    let upEnd = false;
    let downEnd = false;
    const flush = () => {
      if (frozen()) return;
      for (const d of up.splice(0)) upstream.write(d);
      for (const d of down.splice(0)) client.write(d);
      if (upEnd) upstream.end();
      if (downEnd) client.end();
      upEnd = downEnd = false;
    };
    flushers.add(flush);
    const done = () => {
      flushers.delete(flush);
      client.destroy();
      upstream.destroy();
    };
    client.on('data', (d: Buffer) => {
      if (armed !== undefined && d.includes(trigger)) {
        const cut = armed === 'cut';
        armed = undefined;
        if (cut) return done();
        frozenUntil = Date.now() + freezeMs;
      }
      up.push(d);
      flush();
    });
    upstream.on('data', (d: Buffer) => {
      down.push(d);
      flush();
    });
    client.on('end', () => ((upEnd = true), flush()));
    upstream.on('end', () => ((downEnd = true), flush()));
    // a reset from the client reaches the server only once the path is back
    client.on('close', () => (frozen() ? setTimeout(done, frozenUntil - Date.now()) : done()));
    upstream.on('close', done);
    client.on('error', () => {});
    upstream.on('error', () => {});
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const sockets = new Set<Socket>();
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  return {
    url: `redis://127.0.0.1:${(server.address() as AddressInfo).port}`,
    arm: (how: 'freeze' | 'cut' = 'freeze') => void (armed = how),
    /** Drops every connection made through it (the replica reconnects, and resynchronises). */
    drop: () => {
      for (const s of sockets) s.destroy();
    },
  };
}

/** A replica `A` through a silentPathProxy() in front of the tests' Redis, up. */
async function replicaBehindProxy() {
  const prefix = prefixes.fresh();
  const { host: redisHost, port } = parseRedisUrl(REDIS_URL);
  // silent for longer than the first retry's delay (1 s) and shorter than the test's deadline
  const proxy = await silentPathProxy(redisHost ?? '127.0.0.1', port ?? 6379, `${prefix}settings`, 2500);
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: proxy.url, prefix, replicaId: 'A', syncIntervalMs: 50 });
  stores.push(store);
  await store.attach(host);
  assert.equal(store.stats().connected, true);
  return { proxy, store, logs };
}

test('a resynchronisation that failed on a path gone silent is tried again, and the replica shares again', async () => {
  const { proxy, store, logs } = await replicaBehindProxy();

  // the resynchronisation's first command (the settings check) finds the path silent
  proxy.arm();
  proxy.drop();
  await until(() => (store.stats().resyncFailures as number) >= 1, 'the resynchronisation to fail');
  assert.equal(store.stats().connected, false);
  await until(() => store.stats().connected === true, 'the replica to share again', { timeoutMs: 15_000 });
  assert.ok(
    logs.some((l) => /redis is back; state written back and reloaded \(after \d+ failed attempts?\)/.test(l)),
    logs.join('\n'),
  );
});

test('a resynchronisation whose connection was lost under it is tried again, and later outages still reconnect', async () => {
  const { proxy, store } = await replicaBehindProxy();
  // the connection carrying the resynchronisation's first command is dropped
  proxy.arm('cut');
  proxy.drop();
  await until(() => (store.stats().resyncFailures as number) >= 1, 'the resynchronisation to fail');
  await until(() => store.stats().connected === true, 'the replica to share again', { timeoutMs: 15_000 });
  // an outage after that is one like any other: ioredis reconnects, the replica resynchronises
  const resyncs = store.stats().resyncs as number;
  proxy.drop();
  await until(() => (store.stats().resyncs as number) > resyncs && store.stats().connected === true, 'a reconnection', {
    timeoutMs: 15_000,
  });
});

test('a wall clock set back while a reconnection waits does not hold the replica off Redis', async () => {
  const { proxy, store } = await replicaBehindProxy();
  proxy.arm('cut');
  proxy.drop();
  await until(() => (store.stats().resyncFailures as number) >= 1, 'the resynchronisation to fail');
  // an hour back (an NTP step, an operator's date): the wait before reconnecting is on the
  // monotonic clock, and so is this test's deadline
  const wallClock = Date.now;
  Date.now = () => wallClock() - 3_600_000;
  try {
    const start = performance.now();
    while (store.stats().connected !== true) {
      assert.ok(performance.now() - start < 15_000, 'the replica to share again within 15 s of the clock set back');
      await sleep(20);
    }
  } finally {
    Date.now = wallClock;
  }
});
