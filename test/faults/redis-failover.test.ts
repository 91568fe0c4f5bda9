/**
 * A Redis failover behind one address (Sentinel, a managed Redis, a Kubernetes Service whose
 * endpoint moves to the promoted replica): new connections reach the new primary, but a
 * connection made before stays on the demoted server, which refuses every write with
 * READONLY. A replica connected before the failover and one connected after must hear each
 * other's decisions again, so the first must leave the demoted server (commands and subscriber).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { post, RedisProcess, RedisProxy, stateReplica, unhandledRejections } from './harness.js';
import { until } from '../helpers/wait.js';

/** A replica saves the primary's snapshot where it runs: a directory of the test's own, not the checkout. */
const dataDir = mkdtempSync(join(tmpdir(), 'cf-failover-'));
process.on('exit', () => rmSync(dataDir, { recursive: true, force: true }));
const redisArgs = ['--dir', dataDir];

test('Redis failed over behind one address: a replica left on the demoted server reconnects, and the replicas hear each other again', async () => {
  const first = await new RedisProcess(redisArgs).start();
  const second = await new RedisProcess(redisArgs).start();
  // the address the replicas know: new connections go where it points, open ones stay
  const address = await new RedisProxy(first.port).start();
  const engine = await new MockEngine({ decodeTokS: 2000 }).start();
  const admins = [first, second].map((r) => new Redis({ port: r.port, lazyConnect: true, maxRetriesPerRequest: 0 }));
  const [adminFirst, adminSecond] = admins;
  const stores: RedisStateStore[] = [];
  const gateways: Gateway[] = [];
  const bases: string[] = [];
  const logs: string[][] = [[], []];
  const unhandled = unhandledRejections();
  const replica = async () => {
    const i = stores.length;
    // the demoted server loads the new primary's snapshot before it answers again: on a busy
    // machine that takes over the default second of silence, and the replica would leave it as a
    // stalled server instead of on the READONLY this test is about
    const state = new RedisStateStore({
      url: address.url,
      prefix: 'cf-fo:',
      syncIntervalMs: 50,
      stallTimeoutMs: 15_000,
      commandTimeoutMs: 2_000,
    });
    stores.push(state);
    const { gateway, base } = await stateReplica(state, `http://127.0.0.1:${engine.port}`, (m) => logs[i].push(m));
    gateways.push(gateway);
    bases.push(base);
    await until(() => state.stats().connected === true, `replica ${i} to connect`);
  };
  let sent = 0;
  /** Routes a new request through replica `from` until replica `to` has applied one of them. */
  const heard = async (from: number, to: number) => {
    const before = stores[to].stats().decisionsApplied as number;
    await until(
      async () => {
        const r = await post(bases[from], '/v1/completions', {
          prompt: `failover ${sent++} `.repeat(8),
          max_tokens: 1,
        });
        assert.equal(r.status, 200, r.text);
        return (stores[to].stats().decisionsApplied as number) > before;
      },
      `replica ${to} to hear replica ${from}'s decisions`,
      { intervalMs: 50 },
    );
  };
  try {
    await Promise.all(admins.map((a) => a.connect()));
    await adminSecond.replicaof('127.0.0.1', first.port);
    await until(
      async () => (await adminSecond.info('replication')).includes('master_link_status:up'),
      'the second server to replicate the first',
    );
    await replica(); // on the first server, through the address

    // the failover: the second server is promoted, the first demoted to its replica, and the
    // address passes new connections to the second; replica 0's stay on the first
    await adminSecond.replicaof('NO', 'ONE');
    await adminFirst.replicaof('127.0.0.1', second.port);
    address.targetPort = second.port;
    await replica(); // on the second server

    await heard(0, 1);
    await heard(1, 0);
    // both subscribers on the new primary: on the demoted server one hears only what
    // replication brings it, and nothing once that link breaks
    await until(
      async () => (await adminSecond.pubsub('NUMSUB', 'cf-fo:events'))[1] === 2,
      'both subscribers to be on the new primary',
    );
    assert.equal(logs[0].filter((m) => m.includes('read-only replica now')).length, 1, logs[0].join('\n'));
    assert.ok((stores[0].stats().refused as number) > 0);
    assert.deepEqual(unhandled.seen.map(String), []);
  } finally {
    unhandled.stop();
    for (const a of admins) a.disconnect();
    for (const g of gateways) await g.close();
    await engine.close();
    await address.close();
    await first.kill();
    await second.kill();
  }
});

test('Redis URL naming a read-only replica: the replica routes, and reconnects only now and then, not in a loop', async () => {
  const primary = await new RedisProcess(redisArgs).start();
  const readOnly = await new RedisProcess(redisArgs).start();
  const engine = await new MockEngine({ decodeTokS: 2000 }).start();
  const admin = new Redis({ port: readOnly.port, lazyConnect: true, maxRetriesPerRequest: 0 });
  const state = new RedisStateStore({ url: readOnly.url, prefix: 'cf-ro:', syncIntervalMs: 50 });
  const logs: string[] = [];
  let gateway: Gateway | undefined;
  try {
    await admin.connect();
    await admin.replicaof('127.0.0.1', primary.port);
    gateway = await createGateway({
      router: new KVAwareRouter({ blockSize: 16 }),
      state,
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      log: (m) => logs.push(m),
      workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
    });
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    await until(() => state.stats().connected === true, 'the replica to connect');
    const r = await post(base, '/v1/completions', { prompt: 'read-only '.repeat(8), max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
    // every load sync is refused (three refusals each, 50 ms apart): sixty of them take a second
    // or more, in which a reconnection on every refusal would have come a dozen times
    await until(() => (state.stats().refused as number) >= 60, 'sixty refused writes');
    assert.ok((state.stats().outages as number) <= 2, `${String(state.stats().outages)} reconnections`);
    assert.equal(state.stats().lastRefusal, 'READONLY');
  } finally {
    admin.disconnect();
    await gateway?.close();
    await engine.close();
    await readOnly.kill();
    await primary.kill();
  }
});
