import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createRng } from '../../src/core/rng.js';
import { createPolicy } from '../../src/core/policies/index.js';
import { SmgPolicy } from '../../src/core/policies/smg.js';
import type { Candidate, RouteFeatures } from '../../src/core/policies/types.js';
import { KVAwareRouter, POLICY_NAMES } from '../../src/index.js';
import { candidates } from '../helpers/candidates.js';

const BLOCK = 16;

/** Block hashes first..first+n−1 as the router would pass them (high half 0). */
const range = (first: number, n: number) => Array.from({ length: n }, (_, i) => first + i);
const request = (ids: number[], promptTokens = ids.length * BLOCK, blockSize = BLOCK): RouteFeatures => ({
  claGroup: null,
  promptTokens,
  requestBlocks: ids.length,
  blockSize,
  routingKey: 1,
  blocks: { hi: new Uint32Array(ids.length), lo: Uint32Array.from(ids), length: ids.length },
});

const policy = (options: Record<string, unknown> = {}, seed = 42) =>
  createPolicy('smg', { smg: options }, { random: createRng(seed) }) as SmgPolicy;

/** choose() then onRouted() for the chosen worker, as the router does; returns the choice. */
function route(p: SmgPolicy, cs: Candidate[], r: RouteFeatures, now = 0) {
  const choice = p.choose(cs, r);
  p.onRouted(cs[choice.index].worker, r, 0, now);
  return choice;
}

describe("smg: SMG's cache_aware (smg-project/smg)", () => {
  test("is registered, with `smg launch`'s defaults", () => {
    assert.ok(POLICY_NAMES.includes('smg'));
    const p = policy();
    assert.equal(p.name, 'smg');
    assert.deepEqual(
      [
        p.mode,
        p.cacheThreshold,
        p.balanceAbsThreshold,
        p.balanceRelThreshold,
        p.balanceTokenUsageThreshold,
        p.overloadTokenUsageThreshold,
        p.evictionIntervalMs,
        p.maxTreeSize,
      ],
      ['text', 0.3, 64, 1.5, 1, 1, 60_000, 2 ** 26],
    );
    assert.equal(p.readsBlocks, true);
    assert.equal(policy({ mode: 'events' }).speculative, false, 'SMG keeps no predicted entries');
  });

  test('a cache hit goes to the least-loaded worker holding the matched prefix, not the least-loaded worker', () => {
    const p = policy();
    const prompt = range(1, 10);
    const idle = candidates([{}, {}, {}]);
    assert.equal(route(p, idle, request(prompt)).index, 0, 'a miss: the first of equal workers');
    // the holder is far past the mean: the gate spills the hit to worker 1, which then holds it too
    const hot = candidates([{ inFlight: 200 }, {}, {}]);
    assert.deepEqual(route(p, hot, request(prompt)), { index: 1, confidence: 0, reason: 'balance' });
    // both hold it: the less loaded of the two wins, though worker 2 is idle
    const cs = candidates([{ inFlight: 5 }, { inFlight: 2 }, {}]);
    assert.deepEqual(p.choose(cs, request(prompt)), { index: 1, confidence: 0, reason: 'cache-match' });
    // a prefix of it (4 of 10 blocks matched: 0.4 > 0.3) is a hit as well; 3 of 10 is not
    assert.equal(p.choose(cs, request([...range(1, 4), ...range(50, 6)])).index, 1);
    assert.deepEqual(p.choose(cs, request([...range(1, 3), ...range(70, 7)])).reason, 'least-loaded');
    // holders with equal load: drawn at random from the seeded source
    const even = candidates([{ inFlight: 3 }, { inFlight: 3 }, {}]);
    const picks = Array.from({ length: 100 }, () => p.choose(even, request(prompt)).index);
    assert.deepEqual([...new Set(picks)].sort(), [0, 1]);
  });

  test('the load is the gateway’s own: requests other replicas reported are left out', () => {
    const p = policy();
    const prompt = range(1, 8);
    route(p, candidates([{}, {}]), request(prompt));
    route(p, candidates([{ inFlight: 200 }, {}]), request(prompt));
    const cs = candidates([{ inFlight: 9, remoteInFlight: 8 }, { inFlight: 3 }]);
    assert.equal(p.choose(cs, request(prompt)).index, 0, 'worker 0 has 1 request of its own');
  });

  test('the count-pressure gate needs both margins over the mean load', () => {
    const p = policy();
    const prompt = range(1, 8);
    route(p, candidates([{}, {}, {}]), request(prompt));
    // 10 > 1.5 × mean 3.3, but not > mean + 64: no spill
    assert.equal(p.choose(candidates([{ inFlight: 10 }, {}, {}]), request(prompt)).index, 0);
    // 300 > mean 266.7 + 64 − no: 300 < 1.5 × 266.7: no spill
    const deep = candidates([{ inFlight: 300 }, { inFlight: 250 }, { inFlight: 250 }]);
    assert.equal(p.choose(deep, request(prompt)).index, 0);
    // 400 > 1.5 × 200 and > 200 + 64: spills to the least-loaded worker
    const spill = candidates([{ inFlight: 400 }, { inFlight: 101 }, { inFlight: 100 }]);
    assert.deepEqual(p.choose(spill, request(prompt)), { index: 2, confidence: 0, reason: 'balance' });
    // no fleet-wide request-count imbalance check any more: a miss still takes the least loaded
    const skew = candidates([{ inFlight: 100 }, {}, { inFlight: 1 }]);
    assert.deepEqual(p.choose(skew, request(range(500, 8))), { index: 1, confidence: 0, reason: 'least-loaded' });
  });

  test('a miss takes the minimum of (load, processed, index): no random draw', () => {
    const noDraw = () => {
      throw new Error('a miss draws nothing');
    };
    const p = new SmgPolicy({}, { random: noDraw });
    const cs = candidates([{}, {}, {}]);
    const order = Array.from({ length: 6 }, (_, k) => route(p, cs, request(range(100 * (k + 1), 4))).index);
    assert.deepEqual(order, [0, 1, 2, 0, 1, 2], 'equal loads: the fewest processed, then the first');
    assert.deepEqual(
      [0, 1, 2].map((s) => p.processedCount(s)),
      [2, 2, 2],
    );
    const loaded = candidates([{}, { inFlight: 1 }, {}]);
    assert.equal(route(p, loaded, request(range(900, 4))).index, 0);
    assert.equal(route(p, loaded, request(range(950, 4))).index, 2, 'worker 0 has processed one more');
  });

  test('max_tree_size is one budget for all the workers, trimmed least recently used first', () => {
    const p = policy({ maxTreeSize: 8 * BLOCK * 4, evictionIntervalSecs: 10 });
    const cs = candidates([{}, {}, {}]);
    // three 4-block prompts on three workers: 12 blocks, each worker's 4 under the budget of 8
    for (let k = 0; k < 3; k++) assert.equal(route(p, cs, request(range(100 * (k + 1), 4)), k).index, k);
    assert.equal(p.totalTreeSize(), 12 * BLOCK * 4);
    // the pass at t ≥ 10 s drops the oldest prompt (worker 0's) whole, not a part of each
    assert.equal(route(p, cs, request(range(200, 4)), 11_000).index, 1, "worker 1's prompt again");
    assert.deepEqual(
      [0, 1, 2].map((s) => p.treeSize(s)),
      [0, 4 * BLOCK * 4, 4 * BLOCK * 4],
    );
    assert.equal(p.totalTreeSize(), 8 * BLOCK * 4);
  });

  test('requests of different block sizes: the shared size counts what the trees hold and stays within the cap', () => {
    const p = policy({ maxTreeSize: 4000, evictionIntervalSecs: 1 });
    const cs = candidates([{}, {}, {}]);
    const rng = createRng(5);
    const sizes = [16, 32, 64, 1024];
    const prompts: Array<{ ids: number[]; chars: number }> = [];
    /** Leading blocks of `ids` the worker's tree holds. */
    const held = (slot: number, ids: number[]) =>
      Math.round(Number(p.scoreTerms(cs[slot], request(ids)).matchRate) * ids.length);
    for (let i = 0; i < 600; i++) {
      const blockSize = sizes[Math.floor(rng() * sizes.length)];
      const ids = range(1 + i * 100, 1 + Math.floor(rng() * 30));
      prompts.push({ ids, chars: blockSize * 4 });
      route(p, cs, request(ids, ids.length * blockSize, blockSize), i * 250);
      // distinct prompts on one worker each, every tree prefix-closed
      const chars = prompts.reduce((sum, q) => sum + cs.reduce((n, _, s) => n + held(s, q.ids), 0) * q.chars, 0);
      assert.equal(p.totalTreeSize(), chars, `request ${i}`);
      assert.ok(p.totalTreeSize() <= p.hardMaxTreeSize, `request ${i}: ${p.totalTreeSize()} > ${p.hardMaxTreeSize}`);
    }
  });

  test('the match counts workers that cannot take the request; with no eligible holder, the first worker and no insert', () => {
    const p = policy();
    const all = candidates([{}, {}, {}]);
    route(p, all, request(range(1, 8)));
    // worker 0 (slot 0) is draining: the hit's only holder is not a candidate
    const rest = candidates([{ inFlight: 3 }, {}], [1, 2]);
    assert.deepEqual(p.choose(rest, request(range(1, 8))), { index: 0, confidence: 0, reason: 'cache-match' });
    p.onRouted(rest[0].worker, request(range(1, 8)), 0, 1);
    assert.deepEqual(
      [0, 1, 2].map((s) => p.treeSize(s)),
      [8 * BLOCK * 4, 0, 0],
    );
    assert.equal(p.processedCount(1), 0);
  });

  test('at most 8 holders of the matched node are considered', () => {
    // a KV spread trigger sends the prompt to the least-loaded worker, each in turn
    const p = policy({ balanceTokenUsageThreshold: 0.01 });
    const prompt = range(1, 4);
    for (let k = 0; k < 9; k++) {
      const seed = candidates(Array.from({ length: 9 }, (_, i) => ({ inFlight: i === k ? 0 : 1 })));
      seed[0].worker.metricsAt = 0;
      seed[0].worker.load = 1;
      seed[1].worker.metricsAt = 0;
      assert.equal(route(p, seed, request(prompt)).index, k);
    }
    // worker 8 is the only idle one, but is the ninth holder
    const busy = candidates(Array.from({ length: 9 }, (_, k) => ({ inFlight: k === 8 ? 0 : 1 })));
    const picks = new Set(Array.from({ length: 50 }, () => p.choose(busy, request(prompt)).index));
    assert.ok(!picks.has(8), [...picks].join());
  });

  test('KV-usage triggers: off by default; set, they send the request to the least-loaded worker', () => {
    const prompt = range(1, 8);
    const build = (options: Record<string, unknown>) => {
      const p = policy(options);
      route(p, candidates([{}, {}]), request(prompt));
      return p;
    };
    const skew = candidates([
      { load: 1, metricsAt: 0, inFlight: 1 },
      { load: 0, metricsAt: 0, inFlight: 2 },
    ]);
    assert.equal(build({}).choose(skew, request(prompt)).reason, 'cache-match');
    assert.deepEqual(build({ balanceTokenUsageThreshold: 0.5 }).choose(skew, request(prompt)), {
      index: 0,
      confidence: 0,
      reason: 'balance',
    });
    const hot = candidates([
      { load: 0.95, metricsAt: 0 },
      { load: 0.9, metricsAt: 0, inFlight: 1 },
    ]);
    assert.equal(build({ overloadTokenUsageThreshold: 0.9 }).choose(hot, request(range(40, 4))).reason, 'balance');
    // a worker never scraped is left out
    const unscraped = candidates([{ load: 0.2, metricsAt: 0 }, {}]);
    unscraped[1].worker.load = 1;
    assert.equal(build({ balanceTokenUsageThreshold: 0.5 }).choose(unscraped, request(prompt)).reason, 'cache-match');
  });

  test('events mode: most leading blocks by the KV events, then the lower load, then at random; none: the least loaded', () => {
    const p = policy({ mode: 'events' });
    assert.equal(p.readsBlocks, false);
    const r = request(range(1, 10));
    const cs = candidates([
      { overlap: 4, entries: 9 },
      { overlap: 6, inFlight: 3, entries: 9 },
      { overlap: 6, inFlight: 2, entries: 9 },
      { entries: 9 },
    ]);
    assert.deepEqual(p.choose(cs, r), { index: 2, confidence: 0, reason: 'cache-match' });
    // predictions are not in SMG's index
    const predicted = candidates([
      { overlap: 6, predicted: 5, entries: 9 },
      { overlap: 3, entries: 9 },
    ]);
    assert.equal(p.choose(predicted, r).index, 1);
    const tie = candidates([{ overlap: 5, entries: 9 }, { overlap: 5, entries: 9 }, { entries: 9 }]);
    const picks = new Set(Array.from({ length: 50 }, () => p.choose(tie, r).index));
    assert.deepEqual([...picks].sort(), [0, 1]);
    const none = candidates([{ inFlight: 1, entries: 9 }, { entries: 9 }, { entries: 9 }]);
    assert.deepEqual(p.choose(none, r), { index: 1, confidence: 0, reason: 'least-loaded' });
    // no tree is kept from these decisions
    p.onRouted(cs[2].worker, r, 0, 0);
    assert.equal(p.totalTreeSize(), 0);
  });

  test('events mode: a gated overlap winner spills to the least loaded, yet is the one credited', () => {
    const p = policy({ mode: 'events' });
    const cs = candidates([
      { overlap: 8, inFlight: 400, entries: 9 },
      { inFlight: 100, entries: 9 },
      { inFlight: 100, entries: 9 },
    ]);
    assert.deepEqual(route(p, cs, request(range(1, 8))), { index: 1, confidence: 0, reason: 'balance' });
    assert.deepEqual(
      [0, 1, 2].map((s) => p.processedCount(s)),
      [1, 0, 0],
    );
  });

  test('events mode: while the index is empty the token tree decides, sized in tokens', () => {
    const p = policy({ mode: 'events' });
    const empty = candidates([{}, {}]);
    route(p, empty, request(range(1, 8)));
    route(p, candidates([{}, { inFlight: 1 }]), request(range(30, 8)));
    assert.equal(p.treeSize(0), 16 * BLOCK, 'tokens, not characters');
    const busyHome = candidates([{ inFlight: 2 }, { inFlight: 1 }]);
    assert.deepEqual(p.choose(busyHome, request(range(1, 8))), { index: 0, confidence: 0, reason: 'cache-match' });
    // once the index holds anything, the KV events decide
    const indexed = candidates([{ inFlight: 2, entries: 1 }, { inFlight: 1 }]);
    assert.equal(p.choose(indexed, request(range(1, 8))).index, 1);
  });

  test('a removed worker takes its tree and its counts with it', () => {
    const p = policy();
    const cs = candidates([{}, {}]);
    route(p, cs, request(range(1, 8)));
    p.onWorkerRemoved(cs[0].worker);
    assert.deepEqual([p.treeSize(0), p.processedCount(0), p.totalTreeSize()], [0, 0, 0]);
  });

  test('through the router: a repeated prompt goes home, and the decision is explained', () => {
    const router = new KVAwareRouter({ policy: 'smg', blockSize: 16, indexMode: 'precise' });
    router.registerWorker('a');
    router.registerWorker('b');
    const tokens = Array.from({ length: 6 * 16 }, (_, k) => k);
    const first = router.route({ tokens }, { now: 0 });
    const again = router.route({ tokens }, { now: 1, explain: true });
    assert.equal(again.workerId, first.workerId);
    assert.equal(again.reason, 'cache-match');
    const terms = again.explain!.find((e) => e.worker === first.workerId)!.terms;
    assert.equal(terms.matchRate, 1);
  });

  test('options are checked, each error naming smg.<option>', () => {
    for (const [options, message] of [
      [{ mode: 'grpc' }, /smg\.mode must be 'text', 'tokens' or 'events'/],
      [{ cacheThreshold: 1.5 }, /smg\.cacheThreshold must be within \[0, 1\]/],
      [{ balanceAbsThreshold: -1 }, /smg\.balanceAbsThreshold must be a finite number >= 0/],
      [{ balanceRelThreshold: 0.9 }, /smg\.balanceRelThreshold must be >= 1/],
      [{ balanceTokenUsageThreshold: 0 }, /smg\.balanceTokenUsageThreshold must be > 0/],
      [{ overloadTokenUsageThreshold: Infinity }, /smg\.overloadTokenUsageThreshold must be a finite number/],
      [{ evictionIntervalSecs: 0.5 }, /smg\.evictionIntervalSecs must be a whole number of seconds/],
      [{ maxTreeSize: 0 }, /smg\.maxTreeSize must be at least 1/],
    ] as const) {
      assert.throws(() => new SmgPolicy(options as never), message);
    }
    assert.throws(() => policy({ maxTreSize: 5 }), /smg\.maxTreSize is not an option of smg/);
  });
});
