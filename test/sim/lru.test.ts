import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LruSet } from '../../src/sim/lru.js';

test('LruSet evicts the least recently used key and reports it', () => {
  const lru = new LruSet(3);
  const evicted: number[] = [];
  for (const k of [1, 2, 3])
    assert.equal(
      lru.touch(k, (e) => evicted.push(e)),
      false,
    );
  assert.equal(lru.touch(1), true); // 1 is now the most recent
  lru.touch(4, (e) => evicted.push(e));
  assert.deepEqual(evicted, [2]);
  assert.equal(lru.has(2), false);
  assert.ok(lru.has(1) && lru.has(3) && lru.has(4));
  assert.equal(lru.size, 3);
  assert.throws(() => new LruSet(0), RangeError);
});
