import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runAgentWorkload } from '../../src/sim/agent-workload.js';

test('the demo workload is deterministic for a seed', async () => {
  const a = await runAgentWorkload('cost', { workflows: 20, seed: 3 });
  const b = await runAgentWorkload('cost', { workflows: 20, seed: 3 });
  assert.deepEqual(a, b);
  const c = await runAgentWorkload('cost', { workflows: 20, seed: 4 });
  assert.notDeepEqual(a, c);
});

test('every request is routed and accounted for', async () => {
  for (const policy of ['seed', 'cost']) {
    const r = await runAgentWorkload(policy, { workflows: 25, workers: 3 });
    assert.equal(r.requests, 100);
    assert.equal(
      r.assignments.reduce((x, y) => x + y, 0),
      100,
    );
    assert.ok(r.tokenHitRatio > 0 && r.tokenHitRatio < 1);
    assert.ok(r.peakLoad.every((l) => l <= 1));
  }
});

test('cost keeps workflow steps together more often than seed, and hits more KV', async () => {
  // measured over several seeds so that one lucky draw cannot carry it
  let seedCont = 0,
    costCont = 0,
    seedHit = 0,
    costHit = 0;
  for (const seed of [1, 2, 3, 7]) {
    const s = await runAgentWorkload('seed', { seed });
    const c = await runAgentWorkload('cost', { seed });
    seedCont += s.stepContinuity;
    costCont += c.stepContinuity;
    seedHit += s.tokenHitRatio;
    costHit += c.tokenHitRatio;
  }
  assert.ok(costCont > seedCont, `continuity cost ${costCont} vs seed ${seedCont}`);
  assert.ok(costHit > seedHit, `token hit cost ${costHit} vs seed ${seedHit}`);
});
