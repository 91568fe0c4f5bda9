import assert from 'node:assert/strict';
import { test } from 'node:test';
import { percentile } from '../../src/sim/percentile.js';
import { percentiles } from '../../src/sim/simulator.js';
import { percentile as benchPercentile } from '../../bench/stats.js';

test('one nearest-rank percentile for the simulator, the live demo and the benchmarks', () => {
  const ten = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
  // nearest rank: the smallest value with at least p% of the values at or below it
  assert.equal(percentile(ten, 90), 9);
  assert.equal(percentile(ten, 50), 5);
  assert.equal(percentile(ten, 99), 10);
  assert.equal(percentile(ten, 10), 1);
  assert.equal(percentile(ten, 100), 10);
  assert.equal(percentile([7], 1), 7);
  assert.equal(percentile(Float64Array.from([0.5, 1.5, 2.5, 3.5]), 75), 2.5);
  assert.ok(Number.isNaN(percentile([], 50)));
  assert.throws(() => percentile(ten, 0), /p must be in \(0, 100\]/);
  assert.throws(() => percentile(ten, 101), RangeError);
  assert.deepEqual(percentiles([10, 9, 8, 7, 6, 5, 4, 3, 2, 1]), { mean: 5.5, p50: 5, p90: 9, p99: 10 });
  assert.equal(benchPercentile, percentile);
});
