import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createRng } from '../../src/core/rng.js';
import { createPolicy } from '../../src/core/policies/index.js';
import type { RouteFeatures } from '../../src/core/policies/types.js';
import { KVAwareRouter, POLICY_NAMES } from '../../src/index.js';
import type { DynamoPolicy } from '../../src/core/policies/dynamo.js';
import type { LlmdPolicy } from '../../src/core/policies/llmd.js';
import type { SglangPolicy } from '../../src/core/policies/sglang.js';
import { candidates } from '../helpers/candidates.js';

/** Block hashes 1..n as the router would pass them (high half 0). */
const range = (first: number, n: number) => Array.from({ length: n }, (_, i) => first + i);
const request = (blocks: number, blockSize = 16, ids?: number[]): RouteFeatures => ({
  claGroup: null,
  promptTokens: blocks * blockSize,
  requestBlocks: blocks,
  blockSize,
  routingKey: 12345,
  ...(ids ? { blocks: { hi: new Uint32Array(ids.length), lo: Uint32Array.from(ids), length: ids.length } } : {}),
});
const policy = (name: string, options: Record<string, unknown> = {}) =>
  createPolicy(name, options, { random: createRng(42) });

describe('peer and baseline policies', () => {
  test('the registry has every policy the simulator compares', () => {
    for (const p of [
      'cost',
      'seed',
      'dynamo',
      'sglang',
      'llmd',
      'round-robin',
      'random',
      'least-loaded',
      'power-of-two',
      'consistent-hash',
    ]) {
      assert.ok(POLICY_NAMES.includes(p), p);
      assert.equal(policy(p).name, p);
    }
  });

  test('round-robin cycles through the workers', () => {
    const p = policy('round-robin');
    const cs = candidates([{}, {}, {}]);
    assert.deepEqual(
      [0, 1, 2, 3, 4].map(() => p.choose(cs, request(1)).index),
      [0, 1, 2, 0, 1],
    );
  });

  test('random is seeded and covers every worker', () => {
    const cs = candidates([{}, {}, {}, {}]);
    const a = policy('random');
    const b = policy('random');
    const picks = Array.from({ length: 200 }, () => a.choose(cs, request(1)).index);
    assert.deepEqual(
      picks.slice(0, 20),
      Array.from({ length: 20 }, () => b.choose(cs, request(1)).index),
    );
    assert.equal(new Set(picks).size, 4);
  });

  test('least-loaded takes the fewest outstanding requests, then the lowest KV usage', () => {
    const p = policy('least-loaded');
    assert.equal(p.choose(candidates([{ inFlight: 3 }, { inFlight: 1 }, { inFlight: 2 }]), request(1)).index, 1);
    assert.equal(
      p.choose(
        candidates([
          { inFlight: 1, load: 0.5 },
          { inFlight: 1, load: 0.2 },
        ]),
        request(1),
      ).index,
      1,
    );
  });

  test('power-of-two never takes the busier of the two it samples', () => {
    const p = policy('power-of-two');
    const cs = candidates([{ inFlight: 9 }, { inFlight: 0 }]);
    for (let i = 0; i < 50; i++) assert.equal(p.choose(cs, request(1)).index, 1);
  });

  test('consistent-hash: same opening blocks → same worker; removing one worker moves only its keys', () => {
    const p = policy('consistent-hash');
    const four = candidates([{}, {}, {}, {}]);
    const three = four.filter((c) => c.worker.id !== 'w2');
    let moved = 0;
    let onW2 = 0;
    for (let key = 0; key < 2000; key++) {
      const r = { ...request(4), routingKey: Math.imul(key + 1, 0x9e3779b1) >>> 0 };
      const before = four[p.choose(four, r).index].worker.id;
      assert.equal(four[p.choose(four, r).index].worker.id, before);
      const after = three[p.choose(three, r).index].worker.id;
      if (before === 'w2') onW2++;
      else if (after !== before) moved++;
    }
    assert.equal(moved, 0, 'keys of the remaining workers stay put');
    assert.ok(onW2 > 300 && onW2 < 700, `w2 held about a quarter of the keys (${onW2})`);
  });

  test("dynamo: the documentation's example picks the lowest prefill + potential decode cost", () => {
    // docs/router/kv_cache_routing.md: a 10-block prompt; cached 2 / 5 / 8 blocks; live
    // requests holding 10 / 5 / 9 other blocks. Potential decode = live blocks + the
    // request's 10 blocks (none shared with the live ones): 20 / 15 / 19.
    const p = policy('dynamo') as DynamoPolicy;
    const cs = candidates([{ overlap: 2 }, { overlap: 5 }, { overlap: 8 }]);
    let ticket = 1;
    [10, 5, 9].forEach((live, w) => p.onRouted(cs[w].worker, request(live, 16, range(1000 * (w + 1), live)), ticket++));
    const r = request(10, 16, range(1, 10));
    assert.deepEqual(
      cs.map((c) => p.scoreTerms(c, r).cost),
      [8 + 20, 5 + 15, 2 + 19],
    );
    assert.equal(p.choose(cs, r).index, 1);
  });

  test('dynamo: live blocks are deduplicated across requests sharing a prefix, prefilling ones included, until release', () => {
    const router = new KVAwareRouter({ policy: 'dynamo', blockSize: 16 });
    router.registerWorker('a');
    router.registerWorker('b');
    const tokens = (head: number, n: number) =>
      Array.from({ length: n * 16 }, (_, k) => (k < 4 * 16 ? k : head * 100_000 + k));
    // two requests sharing 4 of their 8 blocks go to 'a' (the second by overlap credit
    // would be a tie breaker; pin by draining 'b') and stay prefilling
    router.drainWorker('b');
    const t1 = router.route({ tokens: tokens(1, 8) });
    const t2 = router.route({ tokens: tokens(2, 8) });
    router.resumeWorker('b');
    const p = router.policy as DynamoPolicy;
    assert.equal(p.activeBlocks(0), 4 + 4 + 4, 'unique blocks: the shared 4 once, each tail once');
    // a third request sharing the 4-block head: 'a' adds 4 new blocks, 'b' would add all 8
    const explain = router.route({ tokens: tokens(3, 8) }, { dryRun: true, explain: true }).explain!;
    assert.deepEqual(
      explain.map((e) => e.terms.potentialDecodeBlocks),
      [12 + 4, 0 + 8],
    );
    router.release(t1.ticket);
    assert.equal(p.activeBlocks(0), 8);
    router.release(t2.ticket);
    assert.equal(p.activeBlocks(0), 0);
  });

  test('dynamo: CPU-offloaded blocks earn 0.75, predicted ones nothing (predict-on-route is off), queued prefill counts', () => {
    const p = policy('dynamo') as DynamoPolicy;
    const cs = candidates([
      { overlap: 8, offload: 8 },
      { overlap: 7 },
      { overlap: 10, queued: 9 * 16 },
      { overlap: 10, predicted: 10 },
    ]);
    const r = request(10, 16, range(1, 10));
    // prefill: 10 − 6 = 4; 10 − 7 = 3; 10 + 9 − 10 = 9; 10 − 0 = 10; plus 10 potential decode blocks each
    assert.deepEqual(
      cs.map((c) => p.scoreTerms(c, r).cost),
      [14, 13, 19, 20],
    );
    assert.equal(p.choose(cs, r).index, 1);
    const withPredictions = policy('dynamo', { dynamo: { predictedCredit: 1 } }) as DynamoPolicy;
    assert.equal(withPredictions.scoreTerms(cs[3], r).cost, 10);
  });

  test('dynamo records no speculative entries unless predictions earn credit (predict-on-route off upstream)', () => {
    const tokens = Array.from({ length: 64 }, (_, k) => k);
    for (const [options, entries] of [
      [{}, 0],
      [{ dynamo: { predictedCredit: 1 } }, 4],
    ] as const) {
      const router = new KVAwareRouter({
        policy: 'dynamo',
        indexMode: 'precise',
        blockSize: 16,
        policyOptions: options,
      });
      router.registerWorker('a');
      router.route({ tokens });
      assert.equal(router.index.entriesFor(0), entries);
    }
  });

  test('dynamo: with temperature the choice is sampled, favouring low cost', () => {
    const p = policy('dynamo', { dynamo: { temperature: 0.5 } });
    const cs = candidates([{ overlap: 0 }, { overlap: 10 }]);
    const counts = [0, 0];
    for (let i = 0; i < 400; i++) counts[p.choose(cs, request(10)).index]++;
    assert.ok(counts[1] > counts[0] && counts[0] > 0, `sampled ${counts}`);
  });

  test('sglang: imbalanced load → shortest queue, whatever the cache', () => {
    const p = policy('sglang');
    // max − min = 100 > 64 and 100 > 1.5 × 0
    const cs = candidates([{ inFlight: 100, overlap: 10 }, { inFlight: 0 }, { inFlight: 50 }]);
    assert.deepEqual(p.choose(cs, request(10)), { index: 1, confidence: 0, reason: 'balance' });
    // the absolute gap alone (70 > 64) is not imbalance when the ratio is under 1.5
    const near = candidates([{ inFlight: 200 }, { inFlight: 140 }]);
    assert.notEqual(p.choose(near, request(10)).reason, 'balance');
  });

  test('sglang: the match is against its own routing history, over the whole prompt, and > 0.3 wins', () => {
    const p = policy('sglang') as SglangPolicy;
    const cs = candidates([{}, {}, {}]);
    p.onRouted(cs[1].worker, request(10, 16, range(1, 10)), 0, 0);
    // 4 of 10 blocks matched: 0.4 > 0.3 → the matching worker, although the index says nothing
    const r = request(10, 16, [...range(1, 4), ...range(50, 6)]);
    assert.deepEqual([p.choose(cs, r).index, p.choose(cs, r).reason], [1, 'cache-match']);
    // the same 4 blocks in a prompt twice as long (text past the hashed blocks): 0.2 → the least loaded
    const long = { ...r, promptTokens: 20 * 16 };
    assert.equal(p.choose(cs, long).reason, 'least-loaded');
    const busy = candidates([{ inFlight: 2 }, { inFlight: 1 }, { inFlight: 3 }]);
    assert.equal(p.choose(busy, long).index, 1, 'worker 1 has the biggest tree but the fewest requests');
    // exactly 0.3 is not above the threshold
    const edge = request(10, 16, [...range(1, 3), ...range(70, 7)]);
    assert.equal(p.choose(cs, edge).reason, 'least-loaded');
  });

  test('sglang: the tree never hears of engine evictions; its own LRU eviction trims it on schedule', () => {
    const router = new KVAwareRouter({
      policy: 'sglang',
      blockSize: 16,
      indexMode: 'precise',
      policyOptions: { sglang: { maxTreeSize: 8 * 16 * 4, evictionIntervalSecs: 10 } },
    });
    router.registerWorker('a');
    router.registerWorker('b');
    const p = router.policy as SglangPolicy;
    const first = Array.from({ length: 6 * 16 }, (_, k) => k);
    router.route({ tokens: first }, { now: 0 });
    const home = router.route({ tokens: first }, { now: 1, dryRun: true }).workerId;
    const slot = home === 'a' ? 0 : 1;
    // the engine evicts everything: the tree does not know, the request still goes home
    router.applyCleared(home);
    assert.equal(router.route({ tokens: first }, { now: 2 }).workerId, home);
    assert.equal(p.treeSize(slot), 6 * 16 * 4);
    // a second prompt on the same worker takes it past max_tree_size (8 blocks); the eviction
    // pass at t ≥ 10 s drops the least recently used leaves (the first prompt's tail) first
    const second = Array.from({ length: 6 * 16 }, (_, k) => 1_000_000 + k);
    router.route({ tokens: second }, { now: 3, exclude: new Set([home === 'a' ? 'b' : 'a']) });
    assert.equal(p.treeSize(slot), 12 * 16 * 4);
    router.route({ tokens: [9, 9, 9] }, { now: 11_000 });
    assert.ok(p.treeSize(slot) <= 8 * 16 * 4, `trimmed to ${p.treeSize(slot)}`);
    const explain = router.route({ tokens: second }, { now: 11_001, dryRun: true, explain: true }).explain!;
    assert.equal(explain[slot].terms.matchRate, 1, 'the recent prompt survives');
  });

  test("sglang: upstream's own cases (cache_aware.rs tests): repeat and prefix go home; imbalance wins; a cache miss takes the least-loaded worker, not the smallest tree", () => {
    const p = policy('sglang', { sglang: { cacheThreshold: 0.5 } }) as SglangPolicy;
    const cs = candidates([{}, {}]);
    const first = p.choose(cs, request(8, 16, range(1, 8))).index;
    p.onRouted(cs[first].worker, request(8, 16, range(1, 8)), 0, 0);
    assert.equal(p.choose(cs, request(8, 16, range(1, 8))).index, first, 'the same request');
    assert.equal(p.choose(cs, request(5, 16, range(1, 5))).index, first, 'its prefix');
    const imbalanced = policy('sglang', {
      sglang: { cacheThreshold: 0.5, balanceAbsThreshold: 5, balanceRelThreshold: 2 },
    }) as SglangPolicy;
    const loaded = candidates([{ inFlight: 20 }, {}]);
    imbalanced.onRouted(loaded[0].worker, request(4, 16, range(1, 4)), 0, 0);
    for (let i = 0; i < 5; i++) assert.equal(imbalanced.choose(loaded, request(4, 16, range(1, 4))).index, 1);
    // load 50 vs 0 under thresholds 100 / 10 (balanced), a short tree vs a long one: the miss
    // goes to the idle worker, whatever its tree (before sgl-project/sglang#14650 it went to the
    // busy worker with the smaller tree)
    const flaw = policy('sglang', {
      sglang: { cacheThreshold: 0.5, balanceAbsThreshold: 100, balanceRelThreshold: 10 },
    }) as SglangPolicy;
    const pair = candidates([{ inFlight: 50 }, {}]);
    flaw.onRouted(pair[0].worker, request(1, 16, [500]), 0, 0);
    flaw.onRouted(pair[1].worker, request(60, 16, range(600, 60)), 0, 0);
    assert.deepEqual(flaw.choose(pair, request(3, 16, range(900, 3))), {
      index: 1,
      confidence: 0,
      reason: 'least-loaded',
    });
  });

  test('sglang: a cache miss among equally loaded workers is drawn at random (seeded, so runs repeat)', () => {
    const cs = candidates([{ inFlight: 1 }, {}, {}, {}, { inFlight: 1 }]);
    const draw = (p: SglangPolicy) =>
      Array.from({ length: 200 }, (_, k) => p.choose(cs, request(4, 16, range(1000 + 10 * k, 4))).index);
    const picks = draw(policy('sglang') as SglangPolicy);
    assert.deepEqual([...new Set(picks)].sort(), [1, 2, 3], 'every idle worker is drawn, no busy one');
    assert.deepEqual(draw(policy('sglang') as SglangPolicy), picks, 'the same seed draws the same workers');
    // the imbalance branch keeps the first least-loaded worker (upstream's min_by_key)
    const skew = candidates([{ inFlight: 100 }, {}, {}]);
    for (let k = 0; k < 20; k++) assert.equal(policy('sglang').choose(skew, request(4)).index, 1);
  });

  test('sglang: among equal matches the worker that touched the prefix last wins', () => {
    const p = policy('sglang') as SglangPolicy;
    const cs = candidates([{}, {}]);
    p.onRouted(cs[0].worker, request(8, 16, range(1, 8)), 0, 0);
    p.onRouted(cs[1].worker, request(8, 16, range(1, 8)), 0, 1);
    assert.equal(p.choose(cs, request(8, 16, range(1, 8))).index, 1);
  });

  test("dynamo, sglang: a removed worker's blocks and tree go with it (a new worker reusing its slot starts empty)", () => {
    for (const name of ['dynamo', 'sglang'] as const) {
      const router = new KVAwareRouter({ policy: name, blockSize: 16 });
      router.registerWorker('a');
      const t = router.route({ tokens: Array.from({ length: 64 }, (_, k) => k) });
      router.removeWorker('a');
      router.registerWorker('b'); // takes slot 0
      router.release(t.ticket);
      const left =
        name === 'dynamo'
          ? (router.policy as DynamoPolicy).activeBlocks(0)
          : (router.policy as SglangPolicy).treeSize(0);
      assert.equal(left, 0, name);
    }
  });

  test('seed: the queue-inclusive load signal treats a worker with waiting requests as full', () => {
    const kv = policy('seed');
    const queue = policy('seed', { seed: { loadSignal: 'queue-inclusive' } });
    const cs = candidates([{ load: 0.5, waiting: 3 }, { load: 0.6 }]);
    cs[0].holdsAnchor = true;
    assert.equal(kv.choose(cs, request(4)).reason, 'locality');
    assert.deepEqual([queue.choose(cs, request(4)).index, queue.choose(cs, request(4)).reason], [1, 'least-loaded']);
    assert.throws(() => policy('seed', { seed: { loadSignal: 'vram' } }), /loadSignal/);
  });

  test("peer options: defaults are upstream's, misspelt or invalid knobs are rejected", () => {
    const d = policy('dynamo') as DynamoPolicy;
    assert.deepEqual(
      [d.prefillLoadScale, d.temperature, d.gpuCredit, d.offloadCredit, d.predictedCredit, d.activeRequestWeight],
      [1, 0, 1, 0.75, 0, 0],
    );
    const s = policy('sglang') as SglangPolicy;
    assert.deepEqual(
      [s.cacheThreshold, s.balanceAbsThreshold, s.balanceRelThreshold, s.evictionIntervalMs, s.maxTreeSize],
      [0.3, 64, 1.5, 60_000, 67_108_864],
    );
    assert.equal((policy('llmd') as LlmdPolicy).scrapeIntervalMs, 50);
    assert.throws(() => policy('sglang', { sglang: { cacheTreshold: 0.5 } }), /sglang\.cacheTreshold is not an option/);
    assert.throws(() => policy('dynamo', { dynamo: { gpuCredit: 1.5 } }), /gpuCredit/);
    assert.throws(() => policy('llmd', { vllm: {} }), /policyOptions\.vllm/);
    assert.throws(
      () => new KVAwareRouter({ policy: 'llmd', policyOptions: { llmd: { queueWeight: -1 } } }),
      /queueWeight/,
    );
  });

  test('llmd: 3 × prefix fraction + 2 × (1 − KV usage) + 2 × normalised queue', () => {
    const p = policy('llmd');
    const cs = candidates([
      { overlap: 10, load: 0.9, waiting: 8 }, // 3·1 + 2·0.1 + 2·0 = 3.2
      { overlap: 5, load: 0.2, waiting: 0 }, // 3·0.5 + 2·0.8 + 2·1 = 5.1
      { overlap: 0, load: 0.0, waiting: 4 }, // 0 + 2 + 2·0.5 = 3
    ]);
    assert.equal(p.choose(cs, request(10)).index, 1);
    const scores = cs.map((c) => p.scoreTerms!(c, request(10)).score as number);
    assert.deepEqual(
      scores.map((s) => Math.round(s * 1000) / 1000),
      [3.2, 5.1, 3],
    );
  });

  test('every policy routes through the router and respects availability', () => {
    for (const name of POLICY_NAMES) {
      const r = new KVAwareRouter({ policy: name });
      r.registerWorker('a');
      r.registerWorker('b');
      r.drainWorker('a');
      for (let i = 0; i < 5; i++)
        assert.equal(r.route({ tokens: Array.from({ length: 64 }, (_, k) => k + i) }).workerId, 'b', name);
    }
  });
});
