/**
 * A Redis that stops answering without closing its connections (SIGSTOP: the kernel keeps the
 * TCP connections open, nothing is read or answered). The replicas must notice, stop sending
 * commands into the dead connection (they would pile up in the client for as long as the stall
 * lasts) and stop waiting on workflow lookups, then write back and reload when it answers again.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import type { Gateway } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { post, RedisProcess, RedisProxy, stateReplica, stateReplicas } from './harness.js';
import { fixedWorkersHost } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

test('Redis paused (SIGSTOP): the replicas drop it and route locally; resumed: they resynchronise', async () => {
  const redis = await new RedisProcess().start();
  const engine = await new MockEngine({ decodeTokS: 2000 }).start();
  const stores = [0, 1].map(() => new RedisStateStore({ url: redis.url, prefix: 'cf-stall:', syncIntervalMs: 50 }));
  const logs: string[][] = [[], []];
  const gateways: Gateway[] = [];
  try {
    const bases = await stateReplicas(stores, `http://127.0.0.1:${engine.port}`, gateways, logs);
    let n = 0;
    const request = async (base: string) => {
      const i = n++;
      const r = await post(base, '/v1/completions', {
        prompt: `paused redis ${i} `.repeat(8),
        max_tokens: 1,
        contextforge: { workflowId: `stall-wf-${i}`, workflowStep: 0 },
      });
      assert.equal(r.status, 200, r.text);
    };

    redis.pause();
    // requests go on through the stall; every replica gives up on the silent connection
    await until(
      async () => {
        await Promise.all(bases.map(request));
        return stores.every((s) => s.stats().connected === false);
      },
      'every replica to drop the paused Redis',
      { timeoutMs: 20_000 },
    );
    for (const s of stores) assert.equal(s.stats().stalls, 1, JSON.stringify(s.stats()));
    for (const l of logs) assert.equal(l.filter((m) => m.includes('stopped answering')).length, 1, l.join('\n'));
    // from then on nothing waits for Redis: new workflows are not looked up
    const lookups = stores.map((s) => s.stats().workflowLookups);
    for (let i = 0; i < 10; i++) await Promise.all(bases.map(request));
    assert.deepEqual(
      stores.map((s) => s.stats().workflowLookups),
      lookups,
    );

    redis.resume();
    await until(
      () => stores.every((s) => s.stats().connected === true && (s.stats().resyncs as number) >= 2),
      'the replicas to resynchronise',
      { timeoutMs: 20_000 },
    );
    const heard = stores[1].stats().decisionsApplied as number;
    await until(async () => {
      await request(bases[0]);
      return (stores[1].stats().decisionsApplied as number) > heard;
    }, 'the second replica to hear the first again');
  } finally {
    redis.resume();
    for (const g of gateways) await g.close();
    await engine.close();
    await redis.kill();
  }
});

test('a path that goes silent (packets dropped, connections left open): both connections are made again', async () => {
  const redis = await new RedisProcess().start();
  const proxy = await new RedisProxy(redis.port).start();
  const engine = await new MockEngine({ decodeTokS: 2000 }).start();
  // A through the path that goes silent, B straight to Redis
  const stores = [proxy.url, redis.url].map(
    (url) => new RedisStateStore({ url, prefix: 'cf-silent:', syncIntervalMs: 50 }),
  );
  const gateways: Gateway[] = [];
  try {
    const bases: string[] = [];
    for (const state of stores) {
      const { gateway, base } = await stateReplica(state, `http://127.0.0.1:${engine.port}`);
      gateways.push(gateway);
      bases.push(base);
    }
    const base = bases[1];
    await until(() => stores.every((s) => s.stats().connected === true), 'the replicas to connect');
    proxy.blackhole();
    await until(() => stores[0].stats().stalls === 1, 'A to give up on its silent connection');
    await until(() => stores[0].stats().connected === true, 'A to connect again');
    // B's decisions reach A only through a subscriber connection made again
    const heard = stores[0].stats().decisionsApplied as number;
    let n = 0;
    await until(async () => {
      const r = await post(base, '/v1/completions', { prompt: `silent path ${n++} `.repeat(8), max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
      return (stores[0].stats().decisionsApplied as number) > heard;
    }, 'A to hear B again');
  } finally {
    for (const g of gateways) await g.close();
    await engine.close();
    await proxy.close();
    await redis.kill();
  }
});

test('after a stall that lost nothing, a replica does not write back the block entries Redis still holds', async () => {
  const redis = await new RedisProcess().start();
  const admin = new Redis({ port: redis.port, lazyConnect: true, maxRetriesPerRequest: 0 });
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: redis.url, prefix: 'cf-kept:', syncIntervalMs: 50 });
  try {
    await admin.connect();
    await store.attach(host);
    // 1,000 decisions of long prompts: some 8 KB a block entry
    for (let i = 0; i < 1000; i++) {
      const d = router.route({ text: `kept ${i} `.repeat(1200), promptTokens: 4000 }, { share: true });
      store.decisionMade(d.shared!);
      // a few at a time: 8 MB at once would outlast the command timeout
      if (i % 20 === 19) await until(() => store.stats().decisionsPublished === i + 1, 'the decisions to be written');
    }
    const sets = async () => Number(/cmdstat_set:calls=(\d+)/.exec(await admin.info('commandstats'))?.[1] ?? 0);
    const before = await sets();

    redis.pause();
    await until(() => store.stats().connected === false, 'the replica to drop the paused Redis');
    redis.resume();
    await until(() => store.stats().connected === true && store.stats().resyncs === 2, 'the replica to resynchronise', {
      timeoutMs: 30_000,
    });
    assert.equal(store.stats().stateLost, 0, logs.join('\n'));
    // the load syncs' epoch writes (SET NX) only: not the 1,000 entries again
    const written = (await sets()) - before;
    assert.ok(written < 500, `${written} SETs after the stall\n${logs.join('\n')}`);
    assert.equal(await admin.eval("return #redis.call('KEYS', 'cf-kept:chain:*')", 0), 1000);
  } finally {
    await store.close();
    admin.disconnect();
    redis.resume();
    await redis.kill();
  }
});

test('a Redis restarted from a snapshot keeps its epoch but not what came after: the replica writes that back', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-snapshot-'));
  const redis = await new RedisProcess(['--dir', dir]).start();
  const admin = new Redis({ port: redis.port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => 100 });
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: redis.url, prefix: 'cf-snap:', syncIntervalMs: 50 });
  const chains = async () =>
    Number(await admin.eval("return #redis.call('KEYS', 'cf-snap:chain:*')", 0).catch(() => -1));
  const decide = async (from: number, to: number) => {
    for (let i = from; i < to; i++)
      store.decisionMade(router.route({ text: `snapshot ${i} `.repeat(40) }, { share: true }).shared!);
    await until(() => store.stats().decisionsPublished === to, 'the decisions to be written');
  };
  try {
    await admin.connect();
    await store.attach(host);
    await decide(0, 50);
    // a snapshot with the epoch and the first 50 entries; the next 50 are written after it
    await admin.save();
    await decide(50, 100);
    assert.equal(await chains(), 100);
    // the server restarts from its snapshot: same epoch, a new run, the last 50 entries gone
    await redis.kill();
    await redis.start();
    await until(() => store.stats().connected === true && store.stats().resyncs === 2, 'the replica to resynchronise', {
      timeoutMs: 30_000,
    });
    assert.equal(store.stats().stateLost, 0, 'the epoch came back with the snapshot');
    await until(async () => (await chains()) === 100, `the lost entries written back\n${logs.join('\n')}`);
  } finally {
    await store.close();
    admin.disconnect();
    await redis.kill();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a replica whose own event loop is held past the stall timeout does not take Redis for stalled', async () => {
  const redis = await new RedisProcess().start();
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: redis.url, prefix: 'cf-busy:', syncIntervalMs: 50 });
  const internals = store as unknown as { syncing: boolean; syncLoad(): Promise<void> };
  try {
    await store.attach(host);
    for (let i = 0; i < 3; i++) {
      await until(() => !internals.syncing, 'no load sync in flight');
      // a load sync sent, then the loop held for 1.5 s (a burst of work, a long collection):
      // Redis answers at once, but the answer is read only after the command timeout fired
      void internals.syncLoad();
      const end = Date.now() + 1500;
      while (Date.now() < end);
      await until(() => !internals.syncing, 'the load sync to end');
    }
    assert.equal(store.stats().stalls, 0, logs.join('\n'));
    assert.equal(store.stats().outages, 0, logs.join('\n'));
    assert.equal(store.stats().connected, true);
  } finally {
    await store.close();
    await redis.kill();
  }
});
