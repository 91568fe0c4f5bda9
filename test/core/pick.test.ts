import assert from 'node:assert/strict';
import { test } from 'node:test';
import { pickMaxScore, pickWithRandomTies } from '../../src/core/policies/pick.js';

test('pickWithRandomTies: -1 when no score is a number, even after a pick that filled the scratch', () => {
  const scratch: number[] = [];
  assert.equal(
    pickWithRandomTies(Float64Array.of(1, 5, 2), 3, 1, () => 0, scratch),
    1,
  );
  assert.equal(
    pickWithRandomTies(Float64Array.of(NaN, NaN, NaN), 3, 1, () => 0, scratch),
    -1,
  );
  assert.equal(
    pickWithRandomTies(Float64Array.of(NaN, NaN), 2, -1, () => 0, scratch),
    -1,
  );
  // ties are broken by the random source, among the tied only
  assert.equal(
    pickWithRandomTies(Float64Array.of(3, 1, 3, 1), 4, -1, () => 0.99, scratch),
    3,
  );
});

test('pickMaxScore: -1 when no score is a number, even after a pick that filled the scratch', () => {
  const scratch: number[] = [];
  const tieBreak = { cursor: 0 };
  assert.equal(pickMaxScore(Float64Array.of(1, 5, 2), 3, tieBreak, scratch), 1);
  assert.equal(pickMaxScore(Float64Array.of(NaN, NaN, NaN), 3, tieBreak, scratch), -1);
});
