import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { MAX_TIME_LEAD_MS } from '../../src/core/router/kv-aware-router.js';
import { createPolicy, DEFAULT_COST_WEIGHTS, KVAwareRouter, type RoutingPolicy } from '../../src/index.js';

async function fleet(n: number, opts: ConstructorParameters<typeof KVAwareRouter>[0] = {}): Promise<KVAwareRouter> {
  const r = new KVAwareRouter(opts);
  for (let i = 0; i < n; i++) r.registerWorker(`w${i}`);
  return r;
}

describe("policy 'cost'", () => {
  test('is the default', () => {
    assert.equal(new KVAwareRouter().getStats().policy, 'cost');
  });

  test('keeps an anchor on its worker under moderate load', async () => {
    const r = await fleet(3);
    await r.broadcastNewBlocks('doc', ['b1', 'b2'], 'w2');
    await r.updateWorkerState('w2', 0.6);
    const d = await r.selectWorker('doc');
    assert.equal(d.targetWorkerId, 'w2');
    assert.equal(d.confidence, 1);
  });

  test('moves a hot anchor off a worker under VRAM pressure', async () => {
    const r = await fleet(3);
    await r.broadcastNewBlocks('doc', ['b1'], 'w2');
    await r.updateWorkerState('w2', 0.9);
    const d = await r.selectWorker('doc');
    assert.notEqual(d.targetWorkerId, 'w2');
    assert.equal(d.confidence, 0);
  });

  test('confidence is the estimated fraction of the KV on the chosen worker', async () => {
    const r = await fleet(2, { blockSize: 16 });
    // the seed's block ids are opaque labels, not blocks of blockSize tokens: the anchor's home
    // holds its whole prompt, as the seed scores it (1.0)
    await r.broadcastNewBlocks('doc', ['b1', 'b2', 'b3', 'b4'], 'w1');
    const d = await r.selectWorker('doc', { tokenLength: 256 });
    assert.equal(d.targetWorkerId, 'w1');
    assert.equal(d.confidence, 1);
    // the request's own blocks, where the index has them, say how much a worker holds
    const tokens = Array.from({ length: 256 }, (_, i) => i);
    const held = r.route({ tokens: tokens.slice(0, 64) }, { track: false });
    const e = r.route({ tokens }, { dryRun: true });
    assert.equal(e.workerId, held.workerId);
    assert.equal(e.confidence, 0.25);
  });

  test('KV made under another CLA group does not count as cached', async () => {
    const r = await fleet(2);
    await r.selectWorker('doc', { claGroup: 1 }); // homed on some worker under group 1
    const home = r.getWorkerForAnchor('doc')!;
    const d = await r.selectWorker('doc', { claGroup: 2 });
    assert.equal(d.confidence, 0);
    const same = await r.selectWorker('doc', { claGroup: 2 });
    assert.equal(same.confidence, 1); // now made under group 2 where it went
    assert.ok(home);
  });

  test('prefers workers serving the CLA group', async () => {
    const r = await fleet(4);
    await r.updateWorkerState('w3', 0.2, { claGroup: 5 });
    const d = await r.selectWorker('x', { claGroup: 5 });
    assert.equal(d.targetWorkerId, 'w3');
  });

  test('excludes workers at or above the pressure ceiling unless all are', async () => {
    const r = await fleet(2, { costWeights: { recompute: 100 } });
    await r.broadcastNewBlocks('doc', ['b'], 'w0');
    await r.updateWorkerState('w0', 0.95);
    await r.updateWorkerState('w1', 0.94);
    assert.equal((await r.selectWorker('doc')).targetWorkerId, 'w1');
    await r.updateWorkerState('w1', 1);
    assert.equal((await r.selectWorker('other')).targetWorkerId, 'w0'); // all saturated: least bad
  });

  test('ties rotate instead of always favouring the first worker', async () => {
    const r = await fleet(4);
    const picks = new Set<string>();
    for (let i = 0; i < 8; i++) picks.add((await r.selectWorker(`fresh-${i}`)).targetWorkerId);
    assert.equal(picks.size, 4);
  });

  test('counts the blocks recorded on each worker, distinct per anchor, and moves them with the anchor', async () => {
    const r = await fleet(2);
    await r.broadcastNewBlocks('a', ['b1', 'b2'], 'w0');
    await r.broadcastNewBlocks('a', ['b2', 'b3'], 'w0');
    await r.broadcastNewBlocks('c', ['b9'], 'w1');
    let s = r.getStats();
    assert.equal(s.workerLoads.w0.activeBlocks, 3);
    assert.equal(s.workerLoads.w1.activeBlocks, 1);
    await r.broadcastNewBlocks('a', ['b7'], 'w1'); // re-homed: w0's record of it is gone
    s = r.getStats();
    assert.equal(s.workerLoads.w0.activeBlocks, 0);
    assert.equal(s.workerLoads.w1.activeBlocks, 2);
  });

  test('weights are validated', () => {
    assert.throws(() => new KVAwareRouter({ costWeights: { recompute: -1 } }), RangeError);
    assert.throws(
      () => new KVAwareRouter({ costWeights: { prefillTokensPerSecond: 0 } }),
      /prefillTokensPerSecond must be >= 1/,
    );
    // weights past which the costs overflow to Infinity and NaN, and no worker is ever chosen
    assert.throws(
      () => new KVAwareRouter({ costWeights: { attention: 1e308 } }),
      /costWeights.attention must be <= 1000000/,
    );
    assert.throws(
      () => new KVAwareRouter({ costWeights: { pressure: 1e307 } }),
      /costWeights.pressure must be <= 1000000/,
    );
    assert.throws(
      () => new KVAwareRouter({ costWeights: { prefillTokensPerSecond: 5e-324 } }),
      /prefillTokensPerSecond must be >= 1/,
    );
    assert.throws(
      () => new KVAwareRouter({ costWeights: { lateGraceTokens: 1e10 } }),
      /lateGraceTokens must be <= 1000000000/,
    );
    // at the bounds every request still finds a worker
    const bounded = new KVAwareRouter({
      policy: 'cost',
      costWeights: {
        attention: 1e6,
        decode: 1e6,
        recompute: 1e6,
        load: 1e6,
        pressure: 1e6,
        cla: 1e6,
        workflow: 1e6,
        newSessionSlack: 1e6,
        prefillTokensPerSecond: 1,
        kvCapacityTokens: 1e9,
        lateGraceTokens: 1e9,
      },
    });
    bounded.registerWorker('w0');
    bounded.registerWorker('w1');
    for (let i = 0; i < 20; i++) {
      const tokens = Array.from({ length: 64 + 50 * i }, (_, j) => (j * 7 + i) % 1000);
      const routed = bounded.route({ tokens }, { now: 1000 * i });
      assert.ok(routed.workerId === 'w0' || routed.workerId === 'w1', `request ${i} routed, got ${routed.workerId}`);
      if (routed.ticket) bounded.release(routed.ticket);
    }
    assert.throws(
      () => new KVAwareRouter({ costWeights: { attention: Number.NaN } }),
      /costWeights.attention must be a finite number/,
    );
    assert.throws(() => new KVAwareRouter({ costWeights: { bogus: 1 } as never }), /costWeights.bogus/);
    assert.throws(() => new KVAwareRouter({ costWeights: { pressureKnee: 1 } }), /pressureKnee/);
    assert.equal(DEFAULT_COST_WEIGHTS.pressureCeiling, 0.95);
  });
});

describe("policy 'cost' given a time that is no finite number", () => {
  // route() rejects such a time; the policy, usable on its own, keeps none of it in its state
  for (const bad of [NaN, Infinity, -Infinity]) {
    test(`${bad}: the decision counts and later decisions still choose a worker`, () => {
      const cost = createPolicy('cost', {}, { random: Math.random });
      let given: number | undefined = bad;
      const policy: RoutingPolicy = {
        name: 'cost-given-times',
        speculative: cost.speculative,
        readsBlocks: cost.readsBlocks,
        choose: (candidates, request) => {
          if (given !== undefined) (request as { now?: number }).now = given;
          return cost.choose(candidates, request);
        },
        onRouted: (worker, request, ticket, now) => cost.onRouted!(worker, request, ticket, given ?? now),
        onReleased: (ticket) => cost.onReleased!(ticket),
        onPrefillDone: (ticket) => cost.onPrefillDone!(ticket),
        onWorkerRemoved: (worker) => cost.onWorkerRemoved!(worker),
      };
      const r = new KVAwareRouter({ policy, blockSize: 16 });
      r.registerWorker('w0');
      r.registerWorker('w1');
      const prompt = (n: number): number[] => Array.from({ length: 64 }, (_, i) => n * 1000 + i);
      for (let i = 0; i < 3; i++) assert.notEqual(r.route({ tokens: prompt(i) }).workerId, '');
      given = undefined;
      for (let i = 3; i < 9; i++) {
        const x = r.route({ tokens: prompt(i) });
        assert.equal(x.noWorker, undefined, JSON.stringify(x.noWorker));
        assert.match(x.workerId, /^w[01]$/);
        r.release(x.ticket);
      }
    });
  }
});

test("policy 'cost': a decision timed far from the clock does not keep its worker from later ones", () => {
  // e.g. a caller's `now` on another clock: times before a worker's last decision do not inflate
  // its arrivals. One far ahead of the router's time or before 0 is refused (hostile-input.test.ts)
  for (const skewed of [0, 1_000_000 + MAX_TIME_LEAD_MS]) {
    let time = 1_000_000;
    const r = new KVAwareRouter({ blockSize: 16, indexMode: 'precise', clock: () => time });
    r.registerWorker('w0');
    r.registerWorker('w1');
    const held = Array.from({ length: 256 }, (_, i) => i + 1);
    r.applyStored('w1', r.hashTokens(held));
    const first = r.route({ tokens: held }, { now: skewed });
    assert.equal(first.workerId, 'w1');
    r.release(first.ticket);
    for (let i = 0; i < 4; i++) {
      time += 1_000;
      const x = r.route({ tokens: [...held, 5_000 + i] });
      assert.equal(x.workerId, 'w1', `after a decision at ${skewed}, the worker holding the prompt is chosen`);
      r.release(x.ticket);
    }
  }
});

describe('workflow continuity', () => {
  test('consecutive steps of a workflow stay on the worker of the previous step', async () => {
    const r = await fleet(4);
    const first = await r.selectWorker('retrieve', { workflowId: 'wf', workflowStep: 0 });
    for (let step = 1; step < 4; step++) {
      const d = await r.selectWorker(`step-${step}`, { workflowId: 'wf', workflowStep: step });
      assert.equal(d.targetWorkerId, first.targetWorkerId, `step ${step}`);
    }
  });

  test("with a prompt, a step on other tokens goes to the previous step's worker when costs tie", () => {
    const r = new KVAwareRouter({ blockSize: 4 });
    for (let i = 0; i < 4; i++) r.registerWorker(`w${i}`);
    const prompt = (from: number) => Array.from({ length: 16 }, (_, k) => from + k);
    const first = r.route({ tokens: prompt(0), workflowId: 'wf', workflowStep: 0 });
    r.release(first.ticket);
    // nothing of the next steps' prompts is cached anywhere: every idle worker costs the same,
    // and the rotation alone sent step 1 elsewhere
    for (let step = 1; step < 4; step++) {
      const d = r.route({ tokens: prompt(1000 * step), workflowId: 'wf', workflowStep: step }, { explain: true });
      assert.equal(d.workerId, first.workerId, `step ${step}`);
      r.release(d.ticket);
    }
  });

  test('with a prompt, a CLA group goes to a worker serving it when costs tie', () => {
    const r = new KVAwareRouter({ blockSize: 4 });
    r.registerWorker('w0', { claGroups: [1] });
    r.registerWorker('w1', { claGroups: [2] });
    r.registerWorker('w2');
    for (let i = 0; i < 6; i++) {
      const d = r.route({ tokens: Array.from({ length: 16 }, (_, k) => 100 * i + k), claGroup: 2 });
      assert.equal(d.workerId, 'w1', `request ${i}`);
      r.release(d.ticket);
    }
  });

  test("a new session's workflow step and CLA group keep their worker though its other terms cost a little more", () => {
    const r = new KVAwareRouter({ blockSize: 4 });
    r.registerWorker('w0', { claGroups: [1] });
    r.registerWorker('w1', { claGroups: [2] });
    r.registerWorker('w2');
    const prompt = (from: number) => Array.from({ length: 64 }, (_, k) => from + k);
    // requests that each finish before the next: the worker they ran on holds their blocks (its
    // cache fuller than the others', a cost of a fraction of a percent), and reuse is learned
    const first = r.route({ tokens: prompt(0), workflowId: 'wf', workflowStep: 0 });
    r.release(first.ticket);
    const again = r.route({ tokens: prompt(0), workflowId: 'other', workflowStep: 0 });
    r.release(again.ticket);
    for (let step = 1; step < 5; step++) {
      const d = r.route({ tokens: prompt(1000 * step), workflowId: 'wf', workflowStep: step }, { explain: true });
      assert.equal(d.workerId, first.workerId, `step ${step}`);
      r.release(d.ticket);
    }
    // a judge's step reuses nothing there: no worker is its own
    const judge = r.route(
      { tokens: prompt(50_000), workflowId: 'wf', workflowStep: 5, isolate: true },
      { dryRun: true, explain: true },
    );
    assert.ok(
      judge.explain!.every((e) => !e.continuity),
      'an isolated step has no continuity worker',
    );
    for (let i = 0; i < 6; i++) {
      const d = r.route({ tokens: prompt(100_000 + 100 * i), claGroup: 2 });
      assert.equal(d.workerId, 'w1', `group 2, request ${i}`);
      r.release(d.ticket);
    }
  });

  test("a new session's step leaves its previous worker when that worker's KV is past the knee", () => {
    const r = new KVAwareRouter({ blockSize: 4 });
    for (let i = 0; i < 3; i++) r.registerWorker(`w${i}`);
    const prompt = (from: number) => Array.from({ length: 4096 }, (_, k) => from + k);
    const first = r.route({ tokens: prompt(0), workflowId: 'wf', workflowStep: 0 });
    r.release(first.ticket);
    // within the TTFT bound, but the pressure past the knee costs it more than the slack
    for (let i = 0; i < 3; i++)
      r.updateWorkerMetrics(`w${i}`, {
        kvUsage: `w${i}` === first.workerId ? 0.9 : 0.3,
        kvCapacityTokens: 60_000,
      });
    const d = r.route({ tokens: prompt(100_000), workflowId: 'wf', workflowStep: 1 }, { dryRun: true });
    assert.notEqual(d.workerId, first.workerId);
  });

  test("an isolated step (a judge) does not become its workflow's worker", () => {
    const r = new KVAwareRouter({ blockSize: 4 });
    for (let i = 0; i < 3; i++) r.registerWorker(`w${i}`);
    const prompt = (from: number) => Array.from({ length: 16 }, (_, k) => from + k);
    const first = r.route({ tokens: prompt(0), workflowId: 'wf', workflowStep: 0 });
    r.release(first.ticket);
    const judge = r.route(
      { tokens: prompt(500), workflowId: 'wf', workflowStep: 1, isolate: true },
      { exclude: new Set([first.workerId]) },
    );
    r.release(judge.ticket);
    assert.equal(r.workflowAffinity('wf')?.workerId, first.workerId);
    const next = r.route({ tokens: prompt(1000), workflowId: 'wf', workflowStep: 2 });
    assert.equal(next.workerId, first.workerId);
  });

  test('a step moves when the previous worker is overloaded', async () => {
    const r = await fleet(2);
    const first = await r.selectWorker('s0', { workflowId: 'wf', workflowStep: 0 });
    await r.updateWorkerState(first.targetWorkerId, 0.85);
    const next = await r.selectWorker('s1', { workflowId: 'wf', workflowStep: 1 });
    assert.notEqual(next.targetWorkerId, first.targetWorkerId);
  });

  test('a late, older step does not pull the workflow back', async () => {
    const r = await fleet(2);
    await r.selectWorker('s0', { workflowId: 'wf', workflowStep: 0 });
    const s2 = await r.selectWorker('s2', { workflowId: 'wf', workflowStep: 2 });
    // the old step lands elsewhere because its worker is full...
    await r.updateWorkerState(s2.targetWorkerId, 0.99);
    const late = await r.selectWorker('s1', { workflowId: 'wf', workflowStep: 1 });
    assert.notEqual(late.targetWorkerId, s2.targetWorkerId);
    await r.updateWorkerState(s2.targetWorkerId, 0.1);
    await r.updateWorkerState(late.targetWorkerId, 0.1);
    // ...but the next step still follows step 2
    const s3 = await r.selectWorker('s3', { workflowId: 'wf', workflowStep: 3 });
    assert.equal(s3.targetWorkerId, s2.targetWorkerId);
  });

  test('the workflow table is bounded', async () => {
    const r = await fleet(2, { workflowCapacity: 3 });
    for (let i = 0; i < 10; i++) await r.selectWorker(`a${i}`, { workflowId: `wf${i}`, workflowStep: 0 });
    assert.equal(r.getStats().workflowsTracked, 3);
  });
});

describe('anchor table bound', () => {
  for (const policy of ['cost', 'seed']) {
    test(`${policy}: least recently used anchors are evicted at capacity and counted`, async () => {
      const r = await fleet(2, { policy, anchorCapacity: 3 });
      await r.selectWorker('a');
      await r.selectWorker('b');
      await r.selectWorker('c');
      await r.selectWorker('a'); // a is now the most recently used
      await r.selectWorker('d'); // evicts b
      const s = r.getStats();
      assert.equal(s.anchorsTracked, 3);
      assert.equal(s.anchorEvictions, 1);
      assert.equal(r.getWorkerForAnchor('b'), undefined);
      assert.ok(r.getWorkerForAnchor('a'));
      assert.ok(r.getWorkerForAnchor('d'));
    });
  }

  test('evicted anchors take their block counts with them', async () => {
    const r = await fleet(1, { anchorCapacity: 1 });
    await r.broadcastNewBlocks('a', ['1', '2'], 'w0');
    await r.broadcastNewBlocks('b', ['3'], 'w0');
    assert.equal(r.getStats().workerLoads.w0.activeBlocks, 1);
  });
});

describe('remove and drain', () => {
  for (const policy of ['cost', 'seed']) {
    test(`${policy}: a draining worker gets no new requests and its anchors are re-homed on use`, async () => {
      const r = await fleet(2, { policy });
      await r.broadcastNewBlocks('doc', ['b'], 'w0');
      r.drainWorker('w0');
      assert.deepEqual(r.getStats().drainingWorkers, ['w0']);
      const d = await r.selectWorker('doc');
      assert.equal(d.targetWorkerId, 'w1');
      assert.equal(r.getWorkerForAnchor('doc'), 'w1');
      r.resumeWorker('w0');
      assert.deepEqual(r.getStats().drainingWorkers, []);
    });

    test(`${policy}: with every worker draining there is no target`, async () => {
      const r = await fleet(2, { policy });
      r.drainWorker('w0');
      r.drainWorker('w1');
      const d = await r.selectWorker('doc');
      assert.equal(d.targetWorkerId, '');
      assert.equal(d.confidence, 0);
    });

    test(`${policy}: a removed worker is forgotten with its anchors`, async () => {
      const r = await fleet(2, { policy });
      await r.broadcastNewBlocks('doc', ['b'], 'w0');
      assert.equal(r.removeWorker('w0'), true);
      assert.equal(r.removeWorker('w0'), false);
      assert.equal(r.getWorkerForAnchor('doc'), undefined);
      assert.equal(r.getStats().numWorkers, 1);
      assert.equal((await r.selectWorker('doc')).targetWorkerId, 'w1');
    });
  }

  test('draining an unknown worker is an error naming it', async () => {
    const r = await fleet(1);
    assert.throws(() => r.drainWorker('nope'), /workerId 'nope' is not registered/);
  });
});
