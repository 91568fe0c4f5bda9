import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createRng } from '../../src/core/rng.js';
import { createPolicy } from '../../src/core/policies/index.js';
import type { Candidate, RouteFeatures } from '../../src/core/policies/types.js';
import { WorkerState } from '../../src/core/worker-registry.js';
import { KVAwareRouter, POLICY_NAMES } from '../../src/index.js';

interface Spec {
  overlap?: number;
  offload?: number;
  load?: number;
  inFlight?: number;
  queued?: number;
  decode?: number;
  waiting?: number;
  entries?: number;
}

/** Candidates built by hand, as the policies' documentation describes the situations. */
function candidates(specs: Spec[]): Candidate[] {
  return specs.map((s, i) => {
    const w = new WorkerState(`w${i}`, {}, i);
    w.load = s.load ?? 0;
    w.inFlightRequests = s.inFlight ?? 0;
    w.queuedPrefillTokens = s.queued ?? 0;
    w.activeDecodeTokens = s.decode ?? 0;
    w.waitingRequests = s.waiting ?? 0;
    return {
      worker: w, holdsAnchor: false, overlapBlocks: s.overlap ?? 0, offloadBlocks: s.offload ?? 0, predictedBlocks: 0,
      anchorTokens: 0, cachedTokens: (s.overlap ?? 0) * 16, cachedFraction: 0, servesCla: false, continuity: false,
      indexEntries: s.entries ?? 0,
    };
  });
}
const request = (blocks: number, blockSize = 16): RouteFeatures => ({
  claGroup: null, promptTokens: blocks * blockSize, requestBlocks: blocks, blockSize, routingKey: 12345,
});
const policy = (name: string, options = {}) => createPolicy(name, options, { random: createRng(42) });

describe('peer and baseline policies', () => {
  test('the registry has every policy the simulator compares', () => {
    for (const p of ['cost', 'seed', 'dynamo', 'sglang', 'llmd', 'round-robin', 'random', 'least-loaded', 'power-of-two', 'consistent-hash']) {
      assert.ok(POLICY_NAMES.includes(p), p);
      assert.equal(policy(p).name, p);
    }
  });

  test('round-robin cycles through the workers', () => {
    const p = policy('round-robin');
    const cs = candidates([{}, {}, {}]);
    assert.deepEqual([0, 1, 2, 3, 4].map(() => p.choose(cs, request(1)).index), [0, 1, 2, 0, 1]);
  });

  test('random is seeded and covers every worker', () => {
    const cs = candidates([{}, {}, {}, {}]);
    const a = policy('random');
    const b = policy('random');
    const picks = Array.from({ length: 200 }, () => a.choose(cs, request(1)).index);
    assert.deepEqual(picks.slice(0, 20), Array.from({ length: 20 }, () => b.choose(cs, request(1)).index));
    assert.equal(new Set(picks).size, 4);
  });

  test('least-loaded takes the fewest outstanding requests, then the lowest KV usage', () => {
    const p = policy('least-loaded');
    assert.equal(p.choose(candidates([{ inFlight: 3 }, { inFlight: 1 }, { inFlight: 2 }]), request(1)).index, 1);
    assert.equal(p.choose(candidates([{ inFlight: 1, load: 0.5 }, { inFlight: 1, load: 0.2 }]), request(1)).index, 1);
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

  test("dynamo: the documentation's example picks the lowest prefill + decode cost", () => {
    // docs/router/kv_cache_routing.md: a 10-block prompt; cached 2 / 5 / 8 blocks, decode 10 / 5 / 9 blocks
    const p = policy('dynamo');
    const cs = candidates([
      { overlap: 2, decode: 10 * 16 },
      { overlap: 5, decode: 5 * 16 },
      { overlap: 8, decode: 9 * 16 },
    ]);
    const choice = p.choose(cs, request(10));
    assert.equal(choice.index, 1);
    assert.deepEqual(cs.map((c) => p.scoreTerms!(c, request(10)).cost), [18, 10, 11]);
  });

  test('dynamo: CPU-offloaded blocks earn 0.75 credit, and queued prefill counts', () => {
    const p = policy('dynamo');
    const cs = candidates([{ overlap: 8, offload: 8 }, { overlap: 7 }, { overlap: 10, queued: 9 * 16 }]);
    // costs: 10 − 6 = 4; 10 − 7 = 3; 10 + 9 − 10 = 9
    assert.deepEqual(cs.map((c) => p.scoreTerms!(c, request(10)).cost), [4, 3, 9]);
    assert.equal(p.choose(cs, request(10)).index, 1);
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
  });

  test('sglang: balanced load and match rate above 0.3 → the best prefix match', () => {
    const p = policy('sglang');
    const cs = candidates([{ inFlight: 10, overlap: 2 }, { inFlight: 40, overlap: 4 }, { inFlight: 20, overlap: 1 }]);
    assert.equal(p.choose(cs, request(10)).index, 1);
    assert.equal(p.choose(cs, request(10)).reason, 'cache-match');
  });

  test('sglang: match rate at or below 0.3 → the smallest tree', () => {
    const p = policy('sglang');
    const cs = candidates([{ overlap: 3, entries: 500 }, { overlap: 0, entries: 100 }, { overlap: 1, entries: 300 }]);
    assert.equal(p.choose(cs, request(10)).index, 1);
    // the absolute gap alone (70 > 64) is not imbalance when the ratio is under 1.5
    const near = candidates([{ inFlight: 200, overlap: 9 }, { inFlight: 140 }]);
    assert.equal(p.choose(near, request(10)).reason, 'cache-match');
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
    assert.deepEqual(scores.map((s) => Math.round(s * 1000) / 1000), [3.2, 5.1, 3]);
  });

  test('every policy routes through the router and respects availability', () => {
    for (const name of POLICY_NAMES) {
      const r = new KVAwareRouter({ policy: name });
      r.registerWorker('a');
      r.registerWorker('b');
      r.drainWorker('a');
      for (let i = 0; i < 5; i++) assert.equal(r.route({ tokens: Array.from({ length: 64 }, (_, k) => k + i) }).workerId, 'b', name);
    }
  });
});
