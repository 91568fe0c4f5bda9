/**
 * A choice of a caller's own policy is read once, checked, and used as read; its reason is a
 * bounded string, and the reasons counted apart in decisionsByReason are bounded too.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Candidate, PolicyChoice, RoutingPolicy } from '../../src/core/policies/types.js';
import { KVAwareRouter } from '../../src/index.js';

function routerWith(choose: (candidates: readonly Candidate[]) => unknown): KVAwareRouter {
  const policy = { name: 'mine', choose } as RoutingPolicy;
  const router = new KVAwareRouter({ policy, blockSize: 16 });
  router.registerWorker('a');
  router.registerWorker('b');
  return router;
}

const prompt = { tokens: Array.from({ length: 64 }, (_, i) => i) };

describe("a policy's choice", () => {
  test('is read once: a getter answering otherwise the second time does not decide', () => {
    let reads = 0;
    const router = routerWith(() => ({
      get index() {
        return reads++ === 0 ? 1 : 99;
      },
      confidence: 0.5,
      reason: 'getter',
    }));
    const d = router.route(prompt, { explain: true });
    assert.equal(reads, 1);
    assert.equal(d.workerId, 'b');
    assert.equal(d.noWorker, undefined);
    assert.equal(d.explain!.find((e) => e.chosen)!.worker, 'b');
    assert.equal(router.getStats().inFlightRequests, 1);
  });

  test('confidence and reason are read once too', () => {
    let confidenceReads = 0;
    let reasonReads = 0;
    const router = routerWith(() => ({
      index: 0,
      get confidence() {
        return confidenceReads++ === 0 ? 0.25 : NaN;
      },
      get reason() {
        return reasonReads++ === 0 ? 'first' : { toString: () => 'second' };
      },
    }));
    const d = router.route(prompt);
    assert.equal(d.confidence, 0.25);
    assert.equal(d.reason, 'first');
    assert.deepEqual(router.getStats().decisionsByReason, { first: 1 });
    assert.equal(confidenceReads, 1);
    assert.equal(reasonReads, 1);
  });

  test('a reason that is no string of 1 to 64 characters is refused, naming the policy and the reason', () => {
    const cases: Array<[unknown, ErrorConstructor, RegExp]> = [
      [
        undefined,
        TypeError,
        /^policy 'mine' chose a reason of type undefined; it must be a string of 1 to 64 characters$/,
      ],
      [{ toString: () => 'evil' }, TypeError, /^policy 'mine' chose a reason of type object/],
      [7, TypeError, /^policy 'mine' chose a reason of type number/],
      ['', RangeError, /^policy 'mine' chose a reason of 0 characters; it must be a string of 1 to 64 characters$/],
      ['r'.repeat(65), RangeError, /^policy 'mine' chose a reason of 65 characters/],
      ['r'.repeat(1_000_000), RangeError, /^policy 'mine' chose a reason of 1000000 characters/],
    ];
    for (const [reason, type, message] of cases) {
      const router = routerWith(() => ({ index: 0, confidence: 0.5, reason }));
      assert.throws(
        () => router.route(prompt),
        (e: unknown) => {
          assert.ok(e instanceof type, `${String(e)}`);
          assert.match((e as Error).message, message);
          return true;
        },
      );
      // nothing recorded
      assert.equal(router.getStats().inFlightRequests, 0);
      assert.equal(router.getStats().index.entries, 0);
      assert.deepEqual(router.getStats().decisionsByReason, {});
    }
    const ok = routerWith(() => ({ index: 0, confidence: 0.5, reason: 'r'.repeat(64) }));
    assert.equal(ok.route(prompt).reason, 'r'.repeat(64));
  });

  test("decisionsByReason counts at most 64 reasons apart, the others under 'other'", () => {
    let n = 0;
    let replay: string | undefined = undefined;
    const router = routerWith(() => ({ index: 0, confidence: 0.5, reason: replay ?? `custom-${n++}` }));
    for (let i = 0; i < 1000; i++) router.route(prompt, { track: false });
    const counts = router.getStats().decisionsByReason as Record<string, number>;
    assert.equal(Object.keys(counts).length, 65);
    for (let i = 0; i < 64; i++) assert.equal(counts[`custom-${i}`], 1);
    assert.equal(counts.other, 1000 - 64);
    // a reason counted apart still counts apart
    replay = 'custom-3';
    router.route(prompt, { track: false });
    assert.equal((router.getStats().decisionsByReason as Record<string, number>)['custom-3'], 2);
  });

  test("a decision taken again in place of one counted under 'other' takes it off 'other'", () => {
    let reason = '';
    let index = 0;
    const router = routerWith(() => ({ index, confidence: 0.5, reason }) as PolicyChoice);
    for (let i = 0; i < 64; i++) {
      reason = `r${i}`;
      router.route(prompt, { track: false });
    }
    reason = 'declined';
    index = -1;
    const none = router.route(prompt);
    assert.equal(none.workerId, '');
    assert.equal((router.getStats().decisionsByReason as Record<string, number>).other, 1);
    reason = 'again';
    index = 0;
    router.route(prompt, { replaces: none as never, track: false });
    const counts = router.getStats().decisionsByReason as Record<string, number>;
    assert.equal(counts.other, 1); // -1 for 'declined', +1 for 'again'
    assert.equal(Object.keys(counts).length, 65);
  });
});
