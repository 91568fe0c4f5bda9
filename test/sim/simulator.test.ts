import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import fc from 'fast-check';
import { computeBounds } from '../../src/sim/bounds.js';
import { comparePolicies } from '../../src/sim/compare.js';
import { simulate } from '../../src/sim/simulator.js';
import { loadMooncakeTrace, type TraceRequest } from '../../src/sim/trace.js';

const head = await loadMooncakeTrace(fileURLToPath(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url)));

describe('simulator', () => {
  test('the same trace gives the same results, request for request', () => {
    const a = comparePolicies('head', head, ['cost', 'random', 'power-of-two'], { workers: 4 });
    const b = comparePolicies('head', head, ['cost', 'random', 'power-of-two'], { workers: 4 });
    assert.deepEqual(a.report, b.report);
    assert.deepEqual(a.results.map((r) => r.outcomes), b.results.map((r) => r.outcomes));
  });

  test('every request finishes once, on a valid worker, after it arrived', () => {
    const r = simulate(head, { workers: 3, policy: 'cost' });
    assert.equal(r.outcomes.filter(Boolean).length, head.length);
    for (const o of r.outcomes) {
      assert.ok(o.worker >= 0 && o.worker < 3);
      assert.ok(o.ttft > 0 && o.e2e >= o.ttft, `request ${o.request}`);
      assert.ok(o.cachedTokens >= 0 && o.cachedTokens <= o.promptTokens);
    }
    assert.deepEqual(new Set(r.outcomes.map((o) => o.request)).size, head.length);
  });

  test('a KV-aware policy beats round-robin on hit rate and TTFT on the real trace head', () => {
    const { report } = comparePolicies('head', head, ['cost', 'round-robin'], { workers: 4, engine: { kvTokens: 2_000_000 } });
    const [cost, rr] = report.policies;
    assert.ok(cost.hitRate > rr.hitRate, `hit ${cost.hitRate} vs ${rr.hitRate}`);
    assert.ok(cost.ttft.mean < rr.ttft.mean, `ttft ${cost.ttft.mean} vs ${rr.ttft.mean}`);
  });

  test('speed scales the arrival rate', () => {
    const slow = simulate(head, { workers: 2, policy: 'round-robin', speed: 0.25 });
    const fast = simulate(head, { workers: 2, policy: 'round-robin', speed: 8 });
    assert.ok(fast.ttft.mean > slow.ttft.mean);
  });

  test('no policy passes the bounds on random traces (property)', () => {
    const traceArb = fc
      .array(
        fc.record({
          gap: fc.integer({ min: 0, max: 2000 }),
          family: fc.nat(4),
          shared: fc.integer({ min: 0, max: 6 }),
          extra: fc.integer({ min: 1, max: 6 }),
          output: fc.integer({ min: 1, max: 200 }),
          tail: fc.nat(500),
        }),
        { minLength: 1, maxLength: 40 },
      )
      .map((rows) => {
        let t = 0;
        let fresh = 1000;
        return rows.map((r, index): TraceRequest => {
          t += r.gap;
          const ids = [...Array.from({ length: r.shared }, (_, k) => r.family * 100 + k), ...Array.from({ length: r.extra }, () => fresh++)];
          return { index, timestamp: t, inputLength: (ids.length - 1) * 64 + 1 + (r.tail % 64), outputLength: r.output, hashIds: ids, blockSize: 64 };
        });
      });
    fc.assert(
      fc.property(traceArb, fc.constantFrom('cost', 'seed', 'dynamo', 'sglang', 'llmd', 'round-robin'), (trace, policy) => {
        const engine = { kvTokens: 4096 };
        const bounds = computeBounds(trace, engine);
        const r = simulate(trace, { workers: 2, policy, engine });
        assert.ok(r.hitRate <= bounds.infiniteCacheHitRate + 1e-9, `${policy} hit ${r.hitRate} > ${bounds.infiniteCacheHitRate}`);
        assert.ok(r.ttft.mean >= bounds.idealTtftMean - 1e-9, `${policy} ttft ${r.ttft.mean} < ${bounds.idealTtftMean}`);
      }),
      { numRuns: 60 },
    );
  });
});
