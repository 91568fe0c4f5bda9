/**
 * A request names at most maxContentAnchors content anchors (default 128, the gateway's
 * default --max-anchors): a longer list is refused before any anchor is read, and nothing
 * recorded is lost.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { DEFAULT_MAX_CONTENT_ANCHORS, MAX_CONTENT_ANCHORS } from '../../src/core/router/options-schema.js';
import { KVAwareRouter } from '../../src/index.js';

const anchors = (n: number, prefix = 'c') => Array.from({ length: n }, (_, i) => ({ id: `${prefix}${i}`, tokens: 1 }));

function make(options: ConstructorParameters<typeof KVAwareRouter>[0] = {}): KVAwareRouter {
  const router = new KVAwareRouter({ blockSize: 16, ...options });
  router.registerWorker('a');
  router.registerWorker('b');
  return router;
}

describe('content anchors per request', () => {
  test('128 by default; more are refused with a RangeError naming contentAnchors and the bound', () => {
    assert.equal(DEFAULT_MAX_CONTENT_ANCHORS, 128);
    const router = make();
    assert.equal(router.maxContentAnchors, 128);
    const held = router.route({ promptTokens: 1000, contentAnchors: anchors(128, 'kept') }, { track: false });
    assert.equal(router.getStats().contentAnchorsTracked, 128);
    for (const n of [129, 1_000_000]) {
      assert.throws(() => router.route({ promptTokens: 100, contentAnchors: anchors(n) }), {
        name: 'RangeError',
        message: `contentAnchors must hold at most 128 anchors (the router's maxContentAnchors), got ${n}`,
      });
    }
    // the refused requests changed nothing: the anchors recorded before are all still there
    const stats = router.getStats();
    assert.equal(stats.contentAnchorsTracked, 128);
    assert.equal(stats.inFlightRequests, 0);
    const again = router.route({ promptTokens: 1000, contentAnchors: anchors(128, 'kept') }, { dryRun: true });
    assert.equal(again.workerId, held.workerId);
    assert.equal(again.cachedTokens, 128);
  });

  test('the bound is refused before any anchor is read', () => {
    const router = make();
    const list = anchors(129);
    let reads = 0;
    Object.defineProperty(list, 0, {
      get() {
        reads++;
        return { id: 'x', tokens: 1 };
      },
    });
    assert.throws(() => router.route({ contentAnchors: list }), RangeError);
    assert.equal(reads, 0);
  });

  test('the seed-compatible selectWorker() and a shared decision keep to it too', () => {
    const router = make({ maxContentAnchors: 2 });
    assert.throws(() => router.route({ contentAnchors: anchors(3) }), /at most 2 anchors/);
    assert.equal(router.route({ contentAnchors: anchors(2) }).workerId !== '', true);
    assert.throws(
      () =>
        router.applySharedDecision({
          workerId: 'a',
          hi: new Uint32Array(0),
          lo: new Uint32Array(0),
          claGroup: null,
          workflowStep: null,
          contentAnchors: anchors(3, 'shared'),
        }),
      { name: 'RangeError', message: /^contentAnchors must hold at most 2 anchors/ },
    );
    assert.equal(router.getStats().contentAnchorsTracked, 2);
  });

  test('maxContentAnchors is an integer from 1 to MAX_CONTENT_ANCHORS (4096)', () => {
    assert.equal(MAX_CONTENT_ANCHORS, 4096);
    assert.equal(make({ maxContentAnchors: 4096 }).route({ contentAnchors: anchors(4096) }).noWorker, undefined);
    for (const bad of [0, 4097, 1.5, -1])
      assert.throws(() => new KVAwareRouter({ maxContentAnchors: bad }), /maxContentAnchors/);
  });
});
