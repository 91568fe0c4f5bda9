import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import fc from 'fast-check';
import { computeBounds, pooledLruHitRate } from '../../src/sim/bounds.js';
import { comparePolicies } from '../../src/sim/compare.js';
import { simulate } from '../../src/sim/simulator.js';
import type { TraceRequest } from '../../src/sim/trace.js';

const request = (
  index: number,
  timestamp: number,
  hashIds: number[],
  inputLength: number,
  outputLength = 1,
  extra: Partial<TraceRequest> = {},
): TraceRequest => ({
  index,
  timestamp,
  inputLength,
  outputLength,
  hashIds,
  blockSize: 64,
  ...extra,
});

describe('simulator: context limit', () => {
  test('requests over --max-model-len are rejected, counted, and left out of every figure', () => {
    const trace = [
      request(0, 0, [1, 2, 3], 180, 10),
      request(1, 10, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], 1000, 10), // prompt ≥ limit
      request(2, 20, [1, 2, 3, 4], 250, 900), // prompt + output > limit
      request(3, 30, [1, 2, 3, 4], 250, 10),
    ];
    const engine = { maxModelLen: 1000 };
    const r = simulate(trace, { workers: 2, policy: 'cost', engine });
    assert.equal(r.rejected, 2);
    assert.deepEqual(r.outcomes.map((o) => o.request).sort(), [0, 3]);
    const { report } = comparePolicies('t', trace, ['cost', 'round-robin'], { workers: 2, engine });
    assert.deepEqual(
      report.policies.map((p) => p.rejected),
      [2, 2],
    );
    // the KV capacity caps the limit too: 960 tokens of KV refuse the same two
    assert.equal(simulate(trace, { workers: 1, policy: 'cost', engine: { kvTokens: 960 } }).rejected, 2);
    assert.equal(simulate(trace, { workers: 1, policy: 'cost' }).rejected, 0);
  });
});

describe('simulator: scrapes', () => {
  test('a scrape during a long prefill step reads the engine as it is then', () => {
    // one 100k-token prompt prefilled in a single step of tens of seconds
    const ids = Array.from({ length: 1563 }, (_, i) => i + 1);
    const r = simulate([request(0, 0, ids, 100_000, 1)], {
      workers: 1,
      policy: 'round-robin',
      engine: { maxBatchTokens: 200_000 },
    });
    assert.ok(r.outcomes[0].ttft > 10, `ttft ${r.outcomes[0].ttft}`);
    const during = r.loadTimeline.find((s) => s.t >= 5 && s.t < r.outcomes[0].ttft)!;
    // the prompt's blocks are held while it computes; after the step the request is gone
    assert.ok(
      Math.abs(during.kvUsage[0] - Math.ceil(100_000 / 64) / Math.floor(300_000 / 64)) < 1e-9,
      `${during.kvUsage[0]}`,
    );
  });
});

describe('bounds and the pooled-LRU reference count as the engine counts', () => {
  test('pooled LRU: a finished request leaves its prefix head most recent (tail-first)', () => {
    const trace = [request(0, 0, [1, 2, 3], 192), request(1, 1, [4, 5], 128), request(2, 2, [1, 2, 6], 192)];
    // 4 blocks: after the first request 3, 2, 1 (oldest first); the second evicts 3; the
    // third finds 1 and 2 (capped at 2 blocks of its 3): 128 of 512 prompt tokens
    assert.equal(pooledLruHitRate(trace, 256), 128 / 512);
  });

  test('anchors, CLA groups and isolation: a passage is shared only within its namespace', () => {
    const passage = [{ id: 'p1', tokens: 128 }];
    const base = (i: number, extra: Partial<TraceRequest>) =>
      request(i, i, [100 + i], 64 + 128 + 64, 1, { anchors: passage, ...extra });
    const hit = (trace: TraceRequest[]) => computeBounds(trace).infiniteCacheHitRate;
    // the second request reuses the passage less its 15% recompute (20 of 128 tokens)
    assert.equal(hit([base(0, {}), base(1, {})]), (128 - 20) / 512);
    assert.equal(hit([base(0, { claGroup: 1 }), base(1, { claGroup: 2 })]), 0);
    assert.equal(hit([base(0, {}), base(1, { isolate: true })]), 0);
    assert.equal(computeBounds([base(0, {}), base(1, {})], { blendRecompute: 0 }).infiniteCacheHitRate, 128 / 512);
  });

  test("a trace's model keys its KV: another model's requests reuse none of it, under every policy", () => {
    const ids = [1, 2, 3, 4];
    const trace = [
      request(0, 0, ids, 250, 1, { model: 'base' }),
      request(1, 5000, ids, 250, 1, { model: 'base' }),
      request(2, 10_000, ids, 250, 1, { model: 'adapter-a' }),
      request(3, 15_000, ids, 250, 1),
    ];
    // the second request finds the first's three full blocks; the other model's and the unnamed one's find nothing
    assert.equal(computeBounds(trace).infiniteCacheHitRate, 192 / 1000);
    for (const policy of ['cost', 'seed', 'dynamo', 'sglang', 'llmd', 'round-robin']) {
      const r = simulate(trace, { workers: 1, policy });
      assert.deepEqual(
        r.outcomes.map((o) => o.cachedTokens),
        [0, 192, 0, 0],
        policy,
      );
    }
    // ids as long as a trace line may give them reach every policy's router, the seed's anchor too
    const long = (c: string) => c.repeat(1024);
    const named = [0, 1].map((i) =>
      request(i, i * 5000, ids, 250, 1, { model: long('m'), sessionId: long('s'), agentRole: long('r') }),
    );
    for (const policy of ['cost', 'seed'])
      assert.deepEqual(
        simulate(named, { workers: 2, policy }).outcomes.map((o) => o.cachedTokens),
        [0, 192],
        policy,
      );
  });

  test('no policy passes the bounds on random traces with anchors, CLA groups, isolation and refusals (property)', () => {
    const traceArb = fc
      .array(
        fc.record({
          gap: fc.integer({ min: 0, max: 2000 }),
          family: fc.nat(4),
          shared: fc.integer({ min: 0, max: 6 }),
          extra: fc.integer({ min: 1, max: 6 }),
          output: fc.integer({ min: 1, max: 300 }),
          tail: fc.nat(63),
          passages: fc.array(fc.nat(5), { maxLength: 2 }),
          cla: fc.constantFrom(undefined, 0, 1),
          isolate: fc.boolean(),
          huge: fc.integer({ min: 0, max: 9 }),
        }),
        { minLength: 1, maxLength: 30 },
      )
      .map((rows) => {
        let t = 0;
        let fresh = 1000;
        return rows.map((r, index): TraceRequest => {
          t += r.gap;
          const ids = [
            ...Array.from({ length: r.shared }, (_, k) => r.family * 100 + k),
            ...Array.from({ length: r.extra }, () => fresh++),
          ];
          const anchors = [...new Set(r.passages)].map((p) => ({ id: `p${p}`, tokens: 40 + p * 30 }));
          const anchorTokens = anchors.reduce((a, x) => a + x.tokens, 0);
          // one request in ten is over the 3,000-token limit
          const input = (r.huge === 0 ? 3000 : (ids.length - 1) * 64 + 1 + r.tail) + anchorTokens;
          return request(index, t, ids, input, r.output, {
            anchors,
            ...(r.cla !== undefined ? { claGroup: r.cla } : {}),
            ...(r.isolate && r.family === 0 ? { isolate: true } : {}),
          });
        });
      });
    fc.assert(
      fc.property(
        traceArb,
        fc.constantFrom('cost', 'seed', 'dynamo', 'sglang', 'llmd', 'round-robin'),
        // or workers of 1,024 KV tokens each, given per worker: requests of more blocks are refused;
        // or of different sizes, where a policy may send a request to the one too small for it:
        // its figures are then held to the bounds over the requests it did not refuse
        fc.constantFrom(undefined, [1024, 1024], [1024, 4096]),
        (trace, policy, workerKvTokens) => {
          const engine = { kvTokens: 4096, maxModelLen: 3000 };
          const scenario = workerKvTokens ? { workerKvTokens } : undefined;
          const r = simulate(trace, { workers: 2, policy, engine, scenario });
          const bounds = computeBounds(trace, engine, workerKvTokens, new Set(r.refused));
          assert.ok(
            r.hitRate <= bounds.infiniteCacheHitRate + 1e-9,
            `${policy} hit ${r.hitRate} > ${bounds.infiniteCacheHitRate}`,
          );
          assert.ok(
            r.ttft.mean >= bounds.idealTtftMean - 1e-9,
            `${policy} ttft ${r.ttft.mean} < ${bounds.idealTtftMean}`,
          );
          assert.equal(r.outcomes.length + r.rejected, trace.length);
        },
      ),
      { numRuns: 60 },
    );
  });
});
