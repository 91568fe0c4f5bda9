/**
 * Redis killed (SIGKILL, nothing saved) and restarted under load: two router replicas share
 * state on a redis-server this test starts on a free port. No request may fail while Redis is
 * gone or when it comes back empty; the replicas reconnect and write their state back.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { post, RedisProcess, RedisProxy } from './harness.js';
import { workerHost } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

/** One gateway per store, each routing over `engines` with its own router. */
async function replicaGateways(
  stores: readonly RedisStateStore[],
  engines: readonly MockEngine[],
  extra: { adminToken?: string } = {},
): Promise<Gateway[]> {
  const gateways: Gateway[] = [];
  for (const state of stores)
    gateways.push(
      await createGateway({
        router: new KVAwareRouter({ blockSize: 16 }),
        state,
        metricsIntervalMs: 0,
        healthCheckIntervalMs: 0,
        ...extra,
        workers: engines.map((e, i) => ({ id: `e${i}`, url: `http://127.0.0.1:${e.port}` })),
      }),
    );
  return gateways;
}

test('Redis killed and restarted under load: 0 failed requests, the replicas reconnect', async () => {
  const redis = await new RedisProcess().start();
  const engines = [
    await new MockEngine({ decodeTokS: 2000 }).start(),
    await new MockEngine({ decodeTokS: 2000 }).start(),
  ];
  const stores = [0, 1].map(() => new RedisStateStore({ url: redis.url, prefix: 'cf-faults:', syncIntervalMs: 50 }));
  const gateways = await replicaGateways(stores, engines, { adminToken: 'redis-fault-admin' });
  const bases = await Promise.all(gateways.map((g) => g.app.listen({ host: '127.0.0.1', port: 0 })));
  const statuses: number[] = [];
  let sent = 0;
  const TOTAL = 300;
  const client = async () => {
    while (sent < TOTAL) {
      const i = sent++;
      const r = await post(bases[i % 2], '/v1/completions', {
        prompt: `shared system prompt ${i % 7} `.repeat(8) + `question ${i}`,
        max_tokens: 2,
        contextforge: { workflowId: `wf-${i % 20}`, workflowStep: i % 3 },
      });
      statuses.push(r.status);
    }
  };
  const load = Promise.all(Array.from({ length: 8 }, client));
  await until(() => sent >= TOTAL / 3, 'a third of the load', { timeoutMs: 60_000 });
  await redis.kill();
  await until(() => stores.every((s) => (s.stats().outages as number) >= 1), 'every replica to notice the outage', {
    timeoutMs: 30_000,
  });
  await until(() => sent >= (2 * TOTAL) / 3, 'two thirds of the load', { timeoutMs: 60_000 });
  await redis.restart();
  await load;
  assert.equal(statuses.length, TOTAL);
  assert.deepEqual(
    statuses.filter((s) => s !== 200),
    [],
    'no request failed',
  );
  await until(
    () => stores.every((s) => s.stats().connected === true && (s.stats().resyncs as number) >= 2),
    'the replicas reconnected and resynchronised',
    { timeoutMs: 30_000 },
  );
  for (const g of gateways) await g.close();
  for (const e of engines) await e.close();
  await redis.kill();
});

test('a replica closed while its subscriber resubscribes leaves no promise unhandled', async () => {
  const redis = await new RedisProcess().start();
  const proxy = await new RedisProxy(redis.port).start();
  const engine = await new MockEngine().start();
  const state = new RedisStateStore({ url: proxy.url, prefix: 'cf-resubscribe:', syncIntervalMs: 50 });
  const gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    state,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
  });
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  try {
    await until(() => state.stats().connected === true, 'the replica to connect');
    // the subscriber reconnects and subscribes again; Redis's answer never comes back
    proxy.withhold('subscribe');
    proxy.drop();
    await until(() => proxy.withheld >= 1, 'the subscriber to resubscribe', { timeoutMs: 10_000 });
    await gateway.close(); // fails the subscription in flight
    for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
    assert.deepEqual(unhandled.map(String), []);
  } finally {
    process.off('unhandledRejection', onUnhandled);
    await engine.close();
    await proxy.close();
    await redis.kill();
  }
});

test('after their connections drop, the replicas subscribe again and hear each other', async () => {
  const redis = await new RedisProcess().start();
  const proxy = await new RedisProxy(redis.port).start();
  const engine = await new MockEngine({ decodeTokS: 2000 }).start();
  const stores = [0, 1].map(() => new RedisStateStore({ url: proxy.url, prefix: 'cf-redrop:', syncIntervalMs: 50 }));
  const gateways: Gateway[] = [];
  try {
    gateways.push(...(await replicaGateways(stores, [engine])));
    const base = await gateways[0].app.listen({ host: '127.0.0.1', port: 0 });
    await until(() => stores.every((s) => s.stats().connected === true), 'the replicas to connect');
    proxy.drop();
    await until(
      () => stores.every((s) => s.stats().connected === true && (s.stats().resyncs as number) >= 2),
      'the replicas to reconnect',
      { timeoutMs: 10_000 },
    );
    const heard = stores[1].stats().decisionsApplied as number;
    // a decision made now reaches the other replica only through a subscription made again
    await until(
      async () => {
        const r = await post(base, '/v1/completions', { prompt: 'after the drop '.repeat(8), max_tokens: 1 });
        assert.equal(r.status, 200);
        return (stores[1].stats().decisionsApplied as number) > heard;
      },
      'the second replica to hear a decision of the first',
      { timeoutMs: 10_000, intervalMs: 50 },
    );
  } finally {
    for (const g of gateways) await g.close();
    await engine.close();
    await proxy.close();
    await redis.kill();
  }
});

test('a command Redis does not answer is logged with what it was, once a minute, and counted', async () => {
  const redis = await new RedisProcess().start();
  const proxy = await new RedisProxy(redis.port).start();
  const logs: string[] = [];
  const router = new KVAwareRouter({ blockSize: 16 });
  const { host } = workerHost(router, ['e0']);
  const store = new RedisStateStore({ url: proxy.url, prefix: 'cf-unanswered:', syncIntervalMs: 60_000 });
  try {
    await store.attach({ ...host, log: (m) => logs.push(m) });
    await until(() => store.stats().connected === true, 'the replica to connect');
    const before = Number(store.stats().errors);
    // the lookup of a workflow this replica has not met gets no answer
    proxy.withhold('wf-never-answered');
    await store.beforeRoute({ workflowId: 'wf-never-answered-1', text: 'x' });
    await store.beforeRoute({ workflowId: 'wf-never-answered-2', text: 'x' });
    assert.ok(Number(store.stats().errors) >= before + 2, JSON.stringify(store.stats()));
    const lines = logs.filter((l) => l.includes('did not answer'));
    assert.equal(lines.length, 1, logs.join('\n'));
    // what timed out first on that connection: the lookup, or a message sent just before it
    assert.match(lines[0], /^state: redis did not answer [a-z' ]+ \(Command timed out\); routing goes on/);
  } finally {
    await store.close();
    await proxy.close();
    await redis.kill();
  }
});
