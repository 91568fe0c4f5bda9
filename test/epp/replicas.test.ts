import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { generateWorkflowTrace } from '../../src/sim/workflows.js';
import type { TraceRequest } from '../../src/sim/trace.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { MemoryStateStore, type StateStore } from '../../src/state/state-store.js';
import { startLoopbackEnvoy, type LoopbackEnvoy } from './loopback-envoy.js';
import { ReplayTally } from '../helpers/workflow-replay.js';
import { EnvoyRole } from './envoy-role.js';
import { startPickerFleet, type PickerFleet } from './harness.js';
import { until } from '../helpers/wait.js';

// Endpoint-picker replicas active-active on one Redis (the machine's, 127.0.0.1:6379, which
// .ci/run starts when nothing answers): fed round-robin through loopback gateways, two
// replicas route a multi-agent workload like one replica, and see each other's in-flight work.

const REDIS_URL = process.env.CONTEXTFORGE_TEST_REDIS ?? 'redis://127.0.0.1:6379';
const cleanup: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanup.reverse()) await c().catch(() => {});
});

async function deleteKeys(prefix: string): Promise<void> {
  const r = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
  await r.connect();
  let cursor = '0';
  do {
    const [next, keys] = await r.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await r.del(...keys);
  } while (cursor !== '0');
  r.disconnect();
}

async function startReplicas(
  n: number,
  state: () => StateStore,
): Promise<{ fleet: PickerFleet; envoys: LoopbackEnvoy[]; close(): Promise<void> }> {
  const fleet = await startPickerFleet({ engines: 4, replicas: n, state });
  const envoys: LoopbackEnvoy[] = [];
  for (const a of fleet.addresses) envoys.push(await startLoopbackEnvoy({ extProc: a }));
  const close = async () => {
    for (const e of envoys) await e.close();
    await fleet.close();
  };
  cleanup.push(close);
  return { fleet, envoys, close };
}

/**
 * Replays the workload in trace order, one request at a time, request i through gateway
 * i mod n. One at a time: with requests in parallel the policy also moves workflows for load,
 * which on a busy machine varies from run to run and would hide what is compared here —
 * whether a replica knows what the other decided.
 */
async function replay(urls: string[], trace: TraceRequest[]): Promise<ReplayTally> {
  const tally = new ReplayTally();
  for (const [i, r] of trace.entries()) await tally.send(urls[i % urls.length], r);
  return tally;
}

const split = (o: ReplayTally) => o.split();

test('2 endpoint-picker replicas on one Redis route like one: hit rate within 2 points, workflows kept together', async (t) => {
  const trace = generateWorkflowTrace({ workflows: 20, seed: 11 });
  const single = await startReplicas(1, () => new MemoryStateStore());
  const one = await replay(
    single.envoys.map((e) => e.url),
    trace,
  );
  await single.close();

  const prefix = `cf-epp-test-${randomBytes(4).toString('hex')}:`;
  cleanup.push(() => deleteKeys(prefix));
  const shared = await startReplicas(2, () => new RedisStateStore({ url: REDIS_URL, prefix, syncIntervalMs: 20 }));
  const two = await replay(
    shared.envoys.map((e) => e.url),
    trace,
  );
  const stats = shared.fleet.gateways.map((g) => g.state.stats());
  await shared.close();

  assert.equal(one.failed, 0);
  assert.equal(two.failed, 0);
  assert.deepEqual(split(one), [], 'one replica keeps workflows together');
  assert.deepEqual(
    split(two).map((id) => [id, [...two.workerOf.get(id)!]]),
    [],
    'no workflow is split across engines by the two replicas',
  );
  assert.ok(
    Math.abs(two.hitRate - one.hitRate) <= 0.02,
    `hit rate: 1 replica ${one.hitRate.toFixed(4)}, 2 replicas ${two.hitRate.toFixed(4)}`,
  );
  for (const s of stats) {
    assert.equal(s.connected, true);
    assert.ok((s.decisionsApplied as number) > 0, 'each replica learnt from the other');
  }
  // without shared state the same two replicas scatter: the comparison is not vacuous
  const apartFleet = await startReplicas(2, () => new MemoryStateStore());
  const apart = await replay(
    apartFleet.envoys.map((e) => e.url),
    trace,
  );
  await apartFleet.close();
  t.diagnostic(
    `hit rate: 1 replica ${one.hitRate.toFixed(4)} (${split(one).length} workflows split); 2 sharing ${two.hitRate.toFixed(4)} (${split(two).length}); 2 not sharing ${apart.hitRate.toFixed(4)} with ${split(apart).length} workflows split`,
  );
  assert.ok(
    split(apart).length > 0 || apart.hitRate < one.hitRate - 0.02,
    `replicas without shared state: hit rate ${apart.hitRate.toFixed(4)}, ${split(apart).length} workflows split`,
  );
});

test('in-flight work routed by one picker replica is counted by the other until the response ends', async () => {
  const prefix = `cf-epp-test-${randomBytes(4).toString('hex')}:`;
  cleanup.push(() => deleteKeys(prefix));
  const { fleet, close } = await startReplicas(
    2,
    () => new RedisStateStore({ url: REDIS_URL, prefix, syncIntervalMs: 20 }),
  );
  const [a, b] = fleet.addresses.map((address) => new EnvoyRole(address));
  try {
    const held = [];
    for (let i = 0; i < 3; i++) {
      const out = await a.request({
        headers: {},
        body: JSON.stringify({ model: 'mock', prompt: 'held '.repeat(300) }),
      });
      assert.equal(out.kind, 'routed');
      if (out.kind === 'routed') held.push(out);
    }
    const busy = fleet.workerAt.get(held[0].endpoints[0])!;
    assert.ok(
      held.every((h) => fleet.workerAt.get(h.endpoints[0]) === busy),
      'one prefix, one engine',
    );
    const countAtB = () => fleet.gateways[1].router.listWorkers().find((w) => w.id === busy)!.inFlightRequests;
    await until(() => countAtB() === 3, "replica B to count replica A's three requests");
    for (const h of held) {
      await h.stream.respond({ served: h.endpoints[0], chunks: ['{}'] });
      await h.stream.end();
    }
    await until(() => countAtB() === 0, 'replica B to see them end');
  } finally {
    a.close();
    b.close();
    await close();
  }
});
