/**
 * The admin API given a data-parallel rank's id (`ID#r`) with shared state: a drain or resume
 * acts on the whole worker at every replica (Redis) and every process (--processes), as it
 * does at the one that took it, and a removal by a rank's id is refused naming the worker.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { ClusterRelay, ClusterStateStore, type ClusterMessage } from '../../src/state/cluster-state-store.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import type { StateStore, WorkerRecord } from '../../src/state/state-store.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { dropPrefixes } from '../helpers/state-host.js';
import { settled } from '../helpers/wait.js';

const TOKEN = 'rank-admin-test-token-0123456789abcdef';
const DEFAULT_WORKERS: WorkerRecord[] = [
  { id: 'dp', url: 'http://127.0.0.1:1', dpSize: 2 },
  { id: 'solo', url: 'http://127.0.0.1:2' },
];
const gateways: Gateway[] = [];
const prefixes: string[] = [];
after(async () => {
  for (const g of gateways) await g.close();
  await dropPrefixes(prefixes);
});

async function gateway(state: StateStore, workers: WorkerRecord[] = DEFAULT_WORKERS): Promise<Gateway> {
  const g = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers,
    state,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: TOKEN,
    log: () => {},
  });
  gateways.push(g);
  return g;
}

const admin = (g: Gateway, method: 'POST' | 'DELETE', url: string) =>
  g.app.inject({ method, url, headers: { authorization: `Bearer ${TOKEN}` } });
const drained = (g: Gateway) =>
  g.router
    .listWorkers()
    .filter((w) => w.draining)
    .map((w) => w.id)
    .sort();
const workerIds = (g: Gateway) =>
  g.router
    .listWorkers()
    .map((w) => w.id)
    .sort();

/** Two gateway processes and the primary's relay, in this thread. */
function clusterStores(): [ClusterStateStore, ClusterStateStore] {
  const relay = new ClusterRelay();
  const store = (id: string) => {
    const listeners = new Set<(m: unknown) => void>();
    relay.add({ id, send: (m) => queueMicrotask(() => listeners.forEach((l) => l(structuredClone(m)))) });
    return new ClusterStateStore({
      replicaId: id,
      channel: {
        send: (m: ClusterMessage) => queueMicrotask(() => relay.receive(id, structuredClone(m))),
        onMessage: (l) => void listeners.add(l),
        offMessage: (l) => void listeners.delete(l),
      },
    });
  };
  return [store('1'), store('2')];
}

function redisStore(prefix: string): RedisStateStore {
  return new RedisStateStore({ url: REDIS_URL, prefix, syncIntervalMs: 60_000 });
}

for (const kind of ['redis', 'cluster'] as const) {
  test(`${kind}: a drain or resume by a rank's id acts on the whole worker at every replica`, async () => {
    const prefix = `cf-test-rank-${randomBytes(4).toString('hex')}:`;
    prefixes.push(prefix);
    const [sa, sb] = kind === 'redis' ? [redisStore(prefix), redisStore(prefix)] : clusterStores();
    const a = await gateway(sa);
    const b = await gateway(sb);
    const res = await admin(a, 'POST', '/admin/workers/dp%231/drain');
    assert.equal(res.statusCode, 200, res.body);
    assert.deepEqual(drained(a), ['dp#0', 'dp#1']);
    assert.deepEqual(
      await settled(
        () => drained(b),
        (d) => d.length === 2,
      ),
      ['dp#0', 'dp#1'],
    );
    if (kind === 'redis') {
      const r = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
      await r.connect();
      assert.deepEqual(await r.hgetall(`${prefix}draining`), { dp: '1' }, 'recorded by the worker id');
      r.disconnect();
    }
    assert.equal((await admin(b, 'POST', '/admin/workers/dp%230/resume')).statusCode, 200);
    assert.deepEqual(
      await settled(
        () => drained(a),
        (d) => d.length === 0,
      ),
      [],
    );
  });

  test(`${kind}: removing a worker by a rank's id is refused, naming the worker`, async () => {
    const prefix = `cf-test-rank-${randomBytes(4).toString('hex')}:`;
    prefixes.push(prefix);
    const [sa, sb] = kind === 'redis' ? [redisStore(prefix), redisStore(prefix)] : clusterStores();
    const a = await gateway(sa);
    const b = await gateway(sb);
    const res = await admin(a, 'DELETE', '/admin/workers/dp%231');
    assert.equal(res.statusCode, 400, res.body);
    const error = res.json().error as { message: string; param: string };
    assert.equal(error.param, 'id');
    assert.match(error.message, /'dp#1' is a rank of worker 'dp'; remove 'dp'/);
    assert.deepEqual(workerIds(a), ['dp#0', 'dp#1', 'solo']);
    assert.equal((await admin(a, 'DELETE', '/admin/workers/dp')).statusCode, 200);
    assert.deepEqual(
      await settled(
        () => workerIds(b),
        (ids) => ids.length === 1,
      ),
      ['solo'],
    );
  });

  test(`${kind}: the ranks of a worker with dp-start-rank S are its ids ID#S…, drained by any of them`, async () => {
    const prefix = `cf-test-rank-${randomBytes(4).toString('hex')}:`;
    prefixes.push(prefix);
    const [sa, sb] = kind === 'redis' ? [redisStore(prefix), redisStore(prefix)] : clusterStores();
    const workers: WorkerRecord[] = [{ id: 'node', url: 'http://127.0.0.1:3', dpSize: 2, dpStartRank: 4 }];
    const a = await gateway(sa, workers);
    const b = await gateway(sb, workers);
    assert.deepEqual(workerIds(a), ['node#4', 'node#5']);
    // a rank the worker does not have names nothing, here or in the shared state
    assert.equal((await admin(a, 'POST', '/admin/workers/node%231/drain')).statusCode, 404);
    assert.deepEqual(drained(b), []);
    const res = await admin(a, 'POST', '/admin/workers/node%235/drain');
    assert.equal(res.statusCode, 200, res.body);
    assert.deepEqual(drained(a), ['node#4', 'node#5']);
    assert.deepEqual(
      await settled(
        () => drained(b),
        (d) => d.length === 2,
      ),
      ['node#4', 'node#5'],
    );
    assert.equal((await admin(b, 'POST', '/admin/workers/node%234/resume')).statusCode, 200);
    assert.deepEqual(
      await settled(
        () => drained(a),
        (d) => d.length === 0,
      ),
      [],
    );
  });
}
