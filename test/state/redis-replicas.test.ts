import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { after, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { generateWorkflowTrace } from '../../src/sim/workflows.js';
import type { TraceRequest } from '../../src/sim/trace.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { settled, until } from '../helpers/wait.js';
import { freePort, ReplayTally } from '../helpers/workflow-replay.js';
import { MemoryStateStore, type StateStore } from '../../src/state/state-store.js';

// Router replicas sharing state on a real Redis server: the machine's (127.0.0.1:6379, which
// .ci/run starts when nothing answers there) for the fleet test, and one this test starts
// and stops itself for the outage test. Nothing is mocked; under CI nothing is skipped.
const REDIS_URL = process.env.CONTEXTFORGE_TEST_REDIS ?? 'redis://127.0.0.1:6379';
const ADMIN_TOKEN = 'replica-test-admin-token';
const cleanup: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanup.reverse()) await c().catch(() => {});
});

async function deleteKeys(url: string, prefix: string): Promise<void> {
  const r = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0 });
  await r.connect();
  let cursor = '0';
  do {
    const [next, keys] = await r.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await r.del(...keys);
  } while (cursor !== '0');
  r.disconnect();
}

interface Fleet {
  engines: MockEngine[];
  gateways: Gateway[];
  bases: string[];
  stores: StateStore[];
}

async function startFleet(replicas: number, store: () => StateStore, engineCount = 4): Promise<Fleet> {
  const engines: MockEngine[] = [];
  for (let i = 0; i < engineCount; i++)
    engines.push(await new MockEngine({ kvBlocks: 4096, prefillTokS: 200_000, decodeTokS: 4000 }).start());
  const gateways: Gateway[] = [];
  const bases: string[] = [];
  const stores: StateStore[] = [];
  for (let r = 0; r < replicas; r++) {
    const s = store();
    const gw = await createGateway({
      router: new KVAwareRouter({ blockSize: 16 }),
      workers: engines.map((e, i) => ({ id: `engine-${i}`, url: `http://127.0.0.1:${e.port}` })),
      state: s,
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      adminToken: ADMIN_TOKEN,
    });
    gateways.push(gw);
    stores.push(s);
    bases.push(await gw.app.listen({ host: '127.0.0.1', port: 0 }));
  }
  const fleet = { engines, gateways, bases, stores };
  cleanup.push(() => stopFleet(fleet));
  return fleet;
}

async function stopFleet(f: Fleet): Promise<void> {
  for (const g of f.gateways.splice(0)) await g.close();
  for (const e of f.engines.splice(0)) await e.close();
}

type Outcome = ReplayTally;

/** Replays the workload through HTTP, request i to replica i mod n; hit rate as the engines report it. */
async function replay(
  bases: string[],
  trace: TraceRequest[],
  speed: number,
  during?: (sent: number) => Promise<void> | void,
): Promise<Outcome> {
  const tally = new ReplayTally();
  const start = performance.now();
  const t0 = trace[0].timestamp;
  let sent = 0;
  await Promise.all(
    trace.map(async (r, i) => {
      const due = (r.timestamp - t0) / speed - (performance.now() - start);
      if (due > 0) await sleep(due); // the trace's own arrival times: the workload, not a wait
      sent++;
      await during?.(sent);
      await tally.send(bases[i % bases.length], r);
    }),
  );
  return tally;
}

const split = (o: Outcome) => o.split();

test('3 replicas on one Redis, fed round-robin, route like one replica: hit rate within 2 points, workflows split no more', async (t) => {
  const trace = generateWorkflowTrace({ workflows: 40, seed: 7 });
  const single = await startFleet(1, () => new MemoryStateStore());
  const one = await replay(single.bases, trace, 4);
  await stopFleet(single);

  const prefix = `cf-test-${randomBytes(4).toString('hex')}:`;
  cleanup.push(() => deleteKeys(REDIS_URL, prefix));
  const fleet = await startFleet(3, () => new RedisStateStore({ url: REDIS_URL, prefix, syncIntervalMs: 20 }));
  const three = await replay(fleet.bases, trace, 4);
  const stats = fleet.stores.map((s) => s.stats());

  assert.equal(one.failed, 0);
  assert.equal(three.failed, 0);
  // the cost policy moves a step off a busy engine when another holds its document, so even
  // one replica splits a few workflows; sharing replicas must not split (many) more
  const slack = Math.ceil(0.1 * new Set(trace.map((r) => r.sessionId)).size);
  assert.ok(
    split(three).length <= split(one).length + slack,
    `workflows split: 1 replica ${split(one).length}, 3 sharing ${split(three).length}`,
  );
  assert.ok(
    Math.abs(three.hitRate - one.hitRate) <= 0.02,
    `hit rate: 1 replica ${one.hitRate.toFixed(4)}, 3 replicas ${three.hitRate.toFixed(4)}`,
  );
  for (const s of stats) {
    assert.equal(s.connected, true);
    assert.ok((s.decisionsApplied as number) > 0, 'every replica learnt from the others');
    assert.equal(s.replicasSeen, 3);
  }
  // without sharing, the same fleet scatters: the comparison is not vacuous
  const isolated = await startFleet(3, () => new MemoryStateStore());
  const apart = await replay(isolated.bases, trace, 4);
  t.diagnostic(
    `hit rate: 1 replica ${one.hitRate.toFixed(4)}; 3 sharing ${three.hitRate.toFixed(4)}; 3 not sharing ${apart.hitRate.toFixed(4)} with ${split(apart).length} workflows split`,
  );
  assert.ok(
    split(apart).length > split(one).length + slack || apart.hitRate < one.hitRate - 0.02,
    `replicas without shared state: hit rate ${apart.hitRate.toFixed(4)}, ${split(apart).length} workflows split`,
  );
  await stopFleet(isolated);
});

test('in-flight work counted by one replica is seen by the others', async () => {
  const prefix = `cf-test-${randomBytes(4).toString('hex')}:`;
  cleanup.push(() => deleteKeys(REDIS_URL, prefix));
  const fleet = await startFleet(2, () => new RedisStateStore({ url: REDIS_URL, prefix, syncIntervalMs: 20 }), 2);
  // three long requests through replica A, all to one engine (a shared long prefix)
  const body = JSON.stringify({ model: 'mock', prompt: 'held '.repeat(400), max_tokens: 2000, stream: true });
  const controllers = [0, 1, 2].map(() => new AbortController());
  const responses = await Promise.all(
    controllers.map((c) =>
      fetch(`${fleet.bases[0]}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
        signal: c.signal,
      }),
    ),
  );
  const busy = responses[0].headers.get('x-contextforge-worker')!;
  const workersOf = async (base: string) =>
    (
      (await (
        await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })
      ).json()) as { workers: Array<{ id: string; inFlightRequests: number }> }
    ).workers;
  const busyAtB = async () => (await workersOf(fleet.bases[1])).find((w) => w.id === busy)!.inFlightRequests;
  assert.equal(await settled(busyAtB, (n) => n >= 3), 3, "replica B counts replica A's requests");
  for (const c of controllers) c.abort();
  assert.equal(await settled(busyAtB, (n) => n === 0), 0, 'and forgets them when they end');
});

async function startRedis(port: number): Promise<ChildProcess> {
  const child = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
    { stdio: 'ignore' },
  );
  child.once('error', (err) => assert.fail(`redis-server could not start: ${err.message}`));
  for (let i = 0; i < 100; i++) {
    const probe = new Redis({ port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => {});
    try {
      await probe.connect();
      await probe.ping();
      return child;
    } catch {
      await sleep(50); // the server is still starting: probe again (at most 100 times)
    } finally {
      probe.disconnect();
    }
  }
  throw new Error(`redis-server on ${port} did not answer`);
}

test('Redis stopped mid-run: no request fails; restarted: the replicas write back and converge', async () => {
  const port = await freePort();
  const url = `redis://127.0.0.1:${port}`;
  let redis = await startRedis(port);
  cleanup.push(async () => void redis.kill('SIGKILL'));
  const fleet = await startFleet(3, () => new RedisStateStore({ url, prefix: 'cf:', syncIntervalMs: 50 }));
  const trace = generateWorkflowTrace({ workflows: 30, seed: 3 });
  const outcome = await replay(fleet.bases, trace, 8, async (sent) => {
    if (sent === Math.floor(trace.length / 3)) {
      const exited = new Promise((r) => redis.once('exit', r));
      redis.kill('SIGTERM');
      await exited;
    }
  });
  assert.equal(outcome.failed, 0, 'no request failed while Redis was down');
  for (const s of fleet.stores) assert.ok((s.stats().outages as number) >= 1, 'every replica noticed the outage');

  redis = await startRedis(port); // empty: it kept nothing on disk
  for (const s of fleet.stores) {
    await until(
      () => s.stats().connected === true && (s.stats().resyncs as number) >= 2,
      'the replica to reconnect and resynchronise',
      { timeoutMs: 5000, intervalMs: 25 },
    );
    assert.equal(s.stats().connected, true);
    assert.ok((s.stats().resyncs as number) >= 2, 'resynchronised after the restart');
  }
  // one view of every workflow: no replica disagrees with Redis. A replica that resynchronised
  // before another wrote back a workflow it never saw does not hold it yet; it reads it from
  // Redis the first time a step of it comes (the store's first-sight lookup), so it still
  // routes it where Redis says
  const check = new Redis(url, { maxRetriesPerRequest: 0, retryStrategy: () => null });
  check.on('error', () => {});
  cleanup.push(async () => check.disconnect());
  const workflows = [...new Set(trace.map((r) => r.sessionId!))];
  const routers = fleet.gateways.map((g) => g.router);
  const redisWorker = new Map<string, string>();
  let unseen = 0;
  for (const id of workflows) {
    const stored = await check.get(`cf:wf:${id}`);
    assert.ok(stored, `${id} is back in Redis`);
    const { w } = JSON.parse(stored!) as { w: string };
    redisWorker.set(id, w);
    for (const r of routers) {
      const held = r.workflowAffinity(id)?.workerId;
      if (held !== undefined) assert.equal(held, w, `${id}: every replica follows Redis`);
      else unseen++;
    }
  }
  // most of the fleet's view is back at once: only workflows a replica never saw can be missing
  assert.ok(unseen < workflows.length, `${unseen} of ${workflows.length * routers.length} views missing`);
  assert.ok((await check.hlen('cf:workers')) === 4, 'the registry was written back');
  assert.ok((await check.keys('cf:chain:*')).length > 0, 'recent block entries were written back');
  // a replica that starts now loads the same state
  const late = new RedisStateStore({ url, prefix: 'cf:' });
  const lateGateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    state: late,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    workers: fleet.engines.map((e, i) => ({ id: `engine-${i}`, url: `http://127.0.0.1:${e.port}` })),
  });
  for (const id of workflows)
    assert.equal(
      lateGateway.router.workflowAffinity(id)?.workerId,
      redisWorker.get(id),
      `${id}: a new replica loads Redis's view`,
    );
  assert.ok(lateGateway.router.index.entryCount > 0, 'and the shared block entries');
  await lateGateway.close();
});
