/**
 * Content anchors leave the table when their TTL ends, not only when its capacity pushes them
 * out: the count the router reports (contentAnchorsTracked) is of anchors some worker may hold.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ContentAnchorIndex } from '../../src/core/content-anchors.js';
import { KVAwareRouter } from '../../src/index.js';

test('anchors whose holders have all expired leave the table as others are recorded', () => {
  const ns = new Uint32Array(2); // one namespace for all
  const index = new ContentAnchorIndex(100, 1000);
  index.record(0, [{ id: 'a', tokens: 10 }], ns, 0);
  index.record(1, [{ id: 'b', tokens: 10 }], ns, 0);
  index.record(0, [{ id: 'kept', tokens: 10 }], ns, 500);
  assert.equal(index.size, 3);
  // a and b expired at 1000; kept holds until 1500
  index.record(2, [{ id: 'c', tokens: 10 }], ns, 1200);
  assert.equal(index.size, 2);
  assert.equal(index.heldTokens(0, [{ id: 'kept', tokens: 10 }], ns, 1200), 10);
  assert.equal(index.evictions, 0, 'expiry is no eviction');
  index.record(2, [{ id: 'd', tokens: 10 }], ns, 5000);
  assert.equal(index.size, 1);
});

test("the router's count of content anchors falls once they expire", () => {
  const router = new KVAwareRouter({ contentAnchorTtlMs: 1000 });
  router.registerWorker('w0');
  for (let i = 0; i < 50; i++)
    router.route({ text: `passage ${i}`, contentAnchors: [{ id: `p${i}`, tokens: 64 }] }, { now: 0 });
  assert.equal(router.getStats().contentAnchorsTracked, 50);
  router.route({ text: 'later', contentAnchors: [{ id: 'late', tokens: 64 }] }, { now: 10_000 });
  router.route({ text: 'later still', contentAnchors: [{ id: 'later', tokens: 64 }] }, { now: 10_001 });
  assert.ok(router.getStats().contentAnchorsTracked < 50, `${router.getStats().contentAnchorsTracked}`);
});
