import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { DEFAULT_COST_WEIGHTS } from '../../src/index.js';
import { MIN_HELD_OUT_GAIN, renderWeightsConfig, tuneCostWeights } from '../../src/sim/tune.js';
import { generateWorkflowTrace } from '../../src/sim/workflows.js';
import { CLI } from '../helpers/cli-entry.js';

const trace = generateWorkflowTrace({ workflows: 60, seed: 3 });

test('tune searches on the first part, checks on the rest, and is deterministic', () => {
  const a = tuneCostWeights(trace, { workers: 3, trials: 6 });
  const b = tuneCostWeights(trace, { workers: 3, trials: 6 });
  assert.deepEqual(a, b);
  assert.equal(a.trials, 6);
  assert.equal(a.trainRequests + a.validationRequests, trace.length);
  assert.ok(a.train.tuned.objective <= a.train.default.objective, 'the search never ends worse than where it started');
  // it recommends the tuned weights only when they also win on the held-out part
  if (a.recommended === 'tuned')
    assert.ok(a.validation.tuned.objective < a.validation.default.objective * (1 - MIN_HELD_OUT_GAIN));
  else assert.deepEqual(a.weights, { ...DEFAULT_COST_WEIGHTS });
  const block = renderWeightsConfig('wf', a);
  assert.match(block, /^policy: cost$/m);
  for (const k of Object.keys(DEFAULT_COST_WEIGHTS))
    assert.match(block, new RegExp(`^  ${k}: [0-9.]+(e-[0-9]+)?$`, 'm'));
});

test('tune keeps the defaults when the tuned weights win on the held-out requests by a hair', () => {
  // on this run the tuned weights' held-out objective is 0.03% lower than the defaults'
  const run = spawnSync(process.execPath, [...CLI, 'tune', '--trace', 'workflows:40', '--trials', '4'], {
    encoding: 'utf8',
  });
  assert.equal(run.status, 0, run.stderr);
  assert.match(
    run.stdout,
    /did not beat the defaults on the held-out requests by 1% or more \(objective 0\.03% lower\)/,
  );
  assert.match(run.stdout, new RegExp(`^  recompute: ${DEFAULT_COST_WEIGHTS.recompute}$`, 'm'));
});

test('tune rejects bad settings', () => {
  assert.throws(() => tuneCostWeights(trace, { workers: 2, trainFraction: 1 }), /trainFraction/);
  assert.throws(() => tuneCostWeights(trace, { workers: 2, trials: 0 }), /trials/);
});

test('contextforge-router tune prints a config block, or a clear error', () => {
  const ok = spawnSync(
    process.execPath,
    [...CLI, 'tune', '--trace', 'workflows:40', '--workers', '2', '--trials', '3'],
    { encoding: 'utf8' },
  );
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /^costWeights:$/m);
  const bad = spawnSync(process.execPath, [...CLI, 'tune', '--trace', 'workflows:40', '--train-fraction', '1.5'], {
    encoding: 'utf8',
  });
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /--train-fraction/);
});
