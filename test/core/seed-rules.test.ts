import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';

function seedRouter(opts: { enableClaAffinity?: boolean; enableAnchorLocality?: boolean } = {}): KVAwareRouter {
  return new KVAwareRouter({ policy: 'seed', ...opts });
}

describe("policy 'seed': anchor locality", () => {
  test('holds while the preferred worker is below 0.95, at confidence 0.9', async () => {
    const r = seedRouter();
    r.registerWorker('w0');
    r.registerWorker('w1');
    await r.broadcastNewBlocks('a', ['b1'], 'w1');
    await r.updateWorkerState('w1', 0.9499);
    const d = await r.selectWorker('a');
    assert.deepEqual(d, { targetWorkerId: 'w1', anchorHash: 'a', claGroup: null, confidence: 0.9, preRope: true });
  });

  test('is given up at exactly 0.95: the anchor is re-homed on the least-loaded worker', async () => {
    const r = seedRouter();
    r.registerWorker('w0');
    r.registerWorker('w1');
    await r.broadcastNewBlocks('a', [], 'w0');
    await r.updateWorkerState('w0', 0.95);
    await r.updateWorkerState('w1', 0.2);
    const d = await r.selectWorker('a');
    assert.equal(d.targetWorkerId, 'w1');
    assert.equal(d.confidence, 0.5);
    assert.equal(r.getWorkerForAnchor('a'), 'w1');
  });

  test('a preferred worker that is not registered is skipped', async () => {
    const r = seedRouter();
    r.registerWorker('w0');
    await r.broadcastNewBlocks('a', ['x'], 'ghost'); // the seed records it anyway
    assert.equal(r.getWorkerForAnchor('a'), 'ghost');
    assert.equal(r.getStats().anchorsTracked, 1);
    const d = await r.selectWorker('a');
    assert.equal(d.targetWorkerId, 'w0');
    assert.equal(d.confidence, 0.5);
  });

  test('with locality off, a known anchor does not pin the request', async () => {
    const r = seedRouter({ enableAnchorLocality: false });
    r.registerWorker('w0');
    r.registerWorker('w1');
    await r.broadcastNewBlocks('a', [], 'w1');
    await r.updateWorkerState('w0', 0.1);
    await r.updateWorkerState('w1', 0.2);
    const d = await r.selectWorker('a');
    assert.equal(d.targetWorkerId, 'w0');
    assert.equal(d.confidence, 0.5);
  });
});

describe("policy 'seed': CLA affinity", () => {
  test('takes the first registered worker serving the group below 0.8, at 0.75, and homes the anchor', async () => {
    const r = seedRouter();
    for (const w of ['w0', 'w1', 'w2']) r.registerWorker(w);
    await r.updateWorkerState('w1', 0.5, { claGroup: 2 });
    await r.updateWorkerState('w2', 0.0, { claGroup: 2 });
    const d = await r.selectWorker('a', { claGroup: 2 });
    assert.equal(d.targetWorkerId, 'w1'); // registration order, not load
    assert.equal(d.confidence, 0.75);
    assert.equal(d.claGroup, 2);
    assert.equal(r.getWorkerForAnchor('a'), 'w1');
  });

  test('skips a worker at exactly 0.8', async () => {
    const r = seedRouter();
    for (const w of ['w0', 'w1', 'w2']) r.registerWorker(w);
    await r.updateWorkerState('w0', 0.3);
    await r.updateWorkerState('w1', 0.8, { claGroup: 2 });
    await r.updateWorkerState('w2', 0.79, { claGroup: 2 });
    assert.equal((await r.selectWorker('a', { claGroup: 2 })).targetWorkerId, 'w2');
    await r.updateWorkerState('w2', 0.8);
    const d = await r.selectWorker('b', { claGroup: 2 });
    assert.equal(d.targetWorkerId, 'w0'); // nobody below 0.8 serves the group: least loaded
    assert.equal(d.confidence, 0.5);
  });

  test('group 0 is a real group, not "no group"', async () => {
    const r = seedRouter();
    r.registerWorker('w0');
    r.registerWorker('w1');
    await r.updateWorkerState('w1', 0.5, { claGroup: 0 });
    assert.equal((await r.selectWorker('a', { claGroup: 0 })).targetWorkerId, 'w1');
  });

  test('with CLA affinity off, the group is ignored', async () => {
    const r = seedRouter({ enableClaAffinity: false });
    r.registerWorker('w0');
    r.registerWorker('w1');
    await r.updateWorkerState('w1', 0.5, { claGroup: 2 });
    const d = await r.selectWorker('a', { claGroup: 2 });
    assert.equal(d.targetWorkerId, 'w0');
    assert.equal(d.confidence, 0.5);
  });
});

describe("policy 'seed': fallback and state", () => {
  test('least-loaded ties go to the earliest registered worker', async () => {
    const r = seedRouter();
    for (const w of ['w2', 'w0', 'w1']) r.registerWorker(w);
    await r.updateWorkerState('w2', 0.4);
    await r.updateWorkerState('w0', 0.2);
    await r.updateWorkerState('w1', 0.2);
    assert.equal((await r.selectWorker('a')).targetWorkerId, 'w0');
  });

  test('no workers: empty target, confidence 0, nothing recorded', async () => {
    const r = seedRouter();
    const d = await r.selectWorker('a', { claGroup: 1 });
    assert.deepEqual(d, { targetWorkerId: '', anchorHash: 'a', claGroup: 1, confidence: 0, preRope: true });
    assert.equal(r.getWorkerForAnchor('a'), undefined);
    assert.equal(r.getStats().anchorsTracked, 0);
  });

  test('updateWorkerState clamps load above 1, registers unknown workers, records group and step', async () => {
    const r = seedRouter();
    await r.updateWorkerState('new', 7.5, { claGroup: 3, workflowStep: 4 });
    await r.updateWorkerState('new', 2, { claGroup: 3 });
    const s = r.getStats();
    assert.equal(s.numWorkers, 1);
    assert.deepEqual(s.workerLoads.new, { load: 1, claGroups: 1, activeBlocks: 0 });
  });

  test('getStats rounds load to 3 decimals half-even, like Python', async () => {
    const r = seedRouter();
    await r.updateWorkerState('w', 0.0625);
    assert.equal(r.getStats().workerLoads.w.load, 0.062);
    await r.updateWorkerState('w', 0.1875);
    assert.equal(r.getStats().workerLoads.w.load, 0.188);
    await r.updateWorkerState('w', 0.12345);
    assert.equal(r.getStats().workerLoads.w.load, 0.123);
  });

  test('getStats has the seed fields', () => {
    const s = seedRouter({ enableClaAffinity: false }).getStats();
    assert.equal(s.numWorkers, 0);
    assert.equal(s.anchorsTracked, 0);
    assert.equal(s.claAffinityEnabled, false);
    assert.equal(s.anchorLocalityEnabled, true);
    assert.deepEqual(s.workerLoads, {});
  });
});
