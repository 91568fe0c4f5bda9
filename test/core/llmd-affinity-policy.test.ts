import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createRng } from '../../src/core/rng.js';
import { createPolicy } from '../../src/core/policies/index.js';
import { LlmdAffinityPolicy } from '../../src/core/policies/llmd-affinity.js';
import type { RouteFeatures } from '../../src/core/policies/types.js';
import { KVAwareRouter, POLICY_NAMES } from '../../src/index.js';
import { candidates } from '../helpers/candidates.js';

const BLOCK = 16;

const request = (blocks: number, extraTokens = 0): RouteFeatures => ({
  claGroup: null,
  promptTokens: blocks * BLOCK + extraTokens,
  requestBlocks: blocks,
  blockSize: BLOCK,
  routingKey: 1,
});

const policy = (options: Record<string, unknown> = {}, seed = 42) =>
  createPolicy('llmd-affinity', { 'llmd-affinity': options }, { random: createRng(seed) }) as LlmdAffinityPolicy;

describe('llmd-affinity: prefix-cache-affinity-filter, then token-load-scorer', () => {
  test("is a policy by name, with the precise guide's defaults", () => {
    assert.ok(POLICY_NAMES.includes('llmd-affinity'));
    const p = policy();
    assert.equal(p.name, 'llmd-affinity');
    assert.deepEqual(
      [p.affinityThreshold, p.maxTtftPenaltyMs, p.peakPrefillThroughput, p.tokenLoadCapacity, p.scrapeIntervalMs],
      [0.8, 18_000, 15_926, 4_194_304, 50],
    );
    assert.equal(p.speculative, true);
    assert.equal(policy({ speculativeIndexing: false }).speculative, false);
  });

  test('affinity keeps a request on an endpoint at or above the threshold even when it is loaded', () => {
    const p = policy();
    // w0 holds 8 of 10 blocks (0.8, sticky) with 200k tokens in flight: 12.6 s of TTFT, under 18 s
    const cs = candidates([{ overlap: 8, queued: 200_000, load: 0.95, waiting: 30 }, { overlap: 7 }, {}]);
    assert.equal(p.choose(cs, request(10)).index, 0);
    assert.equal(p.choose(cs, request(10)).reason, 'cache-match');
    assert.equal(p.scoreTerms(cs[1], request(10)).kept, false);
    // always stick (the optimized-baseline guide's maxTTFTPenaltyMs 0): past the scorer's capacity too
    const always = policy({ maxTtftPenaltyMs: 0 });
    const heavy = candidates([{ overlap: 10, queued: 5_000_000 }, {}]);
    assert.equal(always.choose(heavy, request(10)).index, 0);
  });

  test('the TTFT load gate keeps every endpoint when the best sticky one is too far behind', () => {
    const p = policy();
    // 300k in-flight tokens are 18.84 s at 15,926 tokens/s: 0.84 s past the 18 s allowed
    const cs = candidates([{ overlap: 10, queued: 300_000 }, { queued: 0 }]);
    const choice = p.choose(cs, request(10));
    assert.equal(choice.index, 1);
    assert.equal(choice.reason, 'least-loaded');
    // the gate compares the best of each group: a lighter non-sticky endpoint only counts by its own TTFT
    const close = candidates([{ overlap: 10, queued: 300_000 }, { queued: 100_000 }]);
    assert.equal(p.choose(close, request(10)).index, 0);
    // a wider allowance keeps the sticky endpoint
    assert.equal(policy({ maxTtftPenaltyMs: 20_000 }).choose(cs, request(10)).index, 0);
  });

  test("below the threshold the token load decides: in-flight tokens plus the request's uncached ones", () => {
    const p = policy();
    // 7 of 10 blocks is not sticky: w0 has 1,000 + 48 tokens, w1 none in flight + 160 uncached
    const cs = candidates([{ overlap: 7, queued: 1_000 }, {}]);
    assert.equal(p.choose(cs, request(10)).index, 1);
    // with the same in-flight tokens, the endpoint holding more of the prompt has fewer to compute
    const same = candidates([{ overlap: 5, queued: 1_000 }, { queued: 1_000 }]);
    assert.equal(p.choose(same, request(10)).index, 0);
    const terms = p.scoreTerms(same[0], request(10, 5));
    assert.equal(terms.requestTokens, 5 * BLOCK + 5); // the unindexed tail counts
    assert.equal(terms.score, 1 - (1_000 + 85) / 4_194_304);
    // among sticky endpoints too
    const sticky = candidates([{ overlap: 10, queued: 5_000 }, { overlap: 9, queued: 100 }, {}]);
    assert.equal(p.choose(sticky, request(10)).index, 1);
  });

  test("only this router's own in-flight tokens count, not engine metrics nor other replicas'", () => {
    const p = policy();
    const cs = candidates([{ queued: 3_000, remoteQueued: 3_000, load: 0.9, waiting: 50 }, { queued: 10 }]);
    assert.equal(p.scoreTerms(cs[0], request(4)).inFlightTokens, 0);
    assert.equal(p.choose(cs, request(4)).index, 0);
  });

  test('offloaded blocks count 0.8 each in the prefix score, truncated to whole blocks', () => {
    const p = policy();
    const cs = candidates([{ overlap: 10, offload: 10, queued: 1_000 }, {}]);
    assert.equal(p.scoreTerms(cs[0], request(10)).prefixScore, 0.8);
    assert.equal(p.choose(cs, request(10)).index, 0);
    const less = candidates([{ overlap: 9, offload: 9, queued: 1_000 }, {}]);
    assert.equal(p.scoreTerms(less[0], request(10)).prefixScore, 0.7);
    assert.equal(p.choose(less, request(10)).index, 1);
  });

  test('ties go at random among the equals only', () => {
    const seen = new Set<number>();
    for (let seed = 1; seed <= 40; seed++) {
      const p = policy({}, seed);
      // none sticky; w0..w2 have the same token load, w3 more
      const cs = candidates([{ overlap: 2 }, { overlap: 2 }, { overlap: 2 }, { overlap: 2, queued: 1 }]);
      seen.add(p.choose(cs, request(10)).index);
    }
    assert.deepEqual([...seen].sort(), [0, 1, 2]);
    // sticky equals, one non-sticky idle endpoint never chosen
    const sticky = new Set<number>();
    for (let seed = 1; seed <= 40; seed++)
      sticky.add(policy({}, seed).choose(candidates([{}, { overlap: 10 }, { overlap: 10 }]), request(10)).index);
    assert.deepEqual([...sticky].sort(), [1, 2]);
  });

  test('a lone candidate, a threshold of 0 or a request without full blocks keeps every endpoint', () => {
    assert.equal(policy().choose(candidates([{ queued: 9_000_000 }]), request(4)).index, 0);
    const cs = candidates([{ overlap: 10, queued: 5_000 }, {}]);
    assert.equal(policy({ affinityThreshold: 0 }).choose(cs, request(10)).index, 1);
    assert.equal(policy().choose(candidates([{ queued: 5 }, {}]), request(0, 12)).index, 1);
    assert.equal(policy().choose([], request(4)).index, -1);
  });

  test('options are checked, a bad one named', () => {
    const bad: [Record<string, unknown>, RegExp, typeof Error][] = [
      [{ affinityThreshold: 1.5 }, /llmd-affinity\.affinityThreshold/, RangeError],
      [{ affinityThreshold: -0.1 }, /llmd-affinity\.affinityThreshold/, RangeError],
      [{ maxTtftPenaltyMs: -1 }, /llmd-affinity\.maxTtftPenaltyMs/, RangeError],
      [{ peakPrefillThroughput: 0 }, /llmd-affinity\.peakPrefillThroughput/, RangeError],
      [{ tokenLoadCapacity: 0 }, /llmd-affinity\.tokenLoadCapacity/, RangeError],
      [{ scrapeIntervalMs: 0 }, /llmd-affinity\.scrapeIntervalMs/, RangeError],
      [{ affinityTreshold: 0.5 }, /llmd-affinity\.affinityTreshold is not an option/, RangeError],
      [{ speculativeIndexing: 'yes' }, /llmd-affinity\.speculativeIndexing/, TypeError],
    ];
    for (const [options, message, type] of bad) {
      assert.throws(() => policy(options), type, JSON.stringify(options));
      assert.throws(() => policy(options), message);
      assert.throws(
        () => new KVAwareRouter({ policy: 'llmd-affinity', policyOptions: { 'llmd-affinity': options } }),
        message,
      );
    }
    // the constructor checks as much when called directly
    const ctx = { random: createRng(1) };
    assert.throws(() => new LlmdAffinityPolicy(ctx, { tokenLoadCapacity: 2.5 }), /llmd-affinity\.tokenLoadCapacity/);
    assert.throws(() => new LlmdAffinityPolicy(ctx, { peakPrefillThroughput: 0 }), RangeError);
    assert.throws(() => new LlmdAffinityPolicy(ctx, { maxTtftPenaltyMs: Infinity }), RangeError);
  });

  test('peakPrefillThroughput 0 is taken with maxTtftPenaltyMs 0 (the gate off), as upstream validates', () => {
    const off = { maxTtftPenaltyMs: 0, peakPrefillThroughput: 0 };
    const ctx = { random: createRng(1) };
    for (const p of [policy(off), new LlmdAffinityPolicy(ctx, off)]) {
      assert.equal(p.peakPrefillThroughput, 0);
      // the sticky endpoint keeps the request however loaded: no TTFT is divided out
      const cs = candidates([{ overlap: 10, queued: 9_000_000 }, {}]);
      assert.deepEqual(p.choose(cs, request(10)), { index: 0, confidence: 0, reason: 'cache-match' });
      for (const c of cs)
        for (const [term, v] of Object.entries(p.scoreTerms(c, request(10))))
          assert.ok(typeof v === 'boolean' || Number.isFinite(v), `${term}: ${v}`);
    }
    const router = new KVAwareRouter({ policy: 'llmd-affinity', policyOptions: { 'llmd-affinity': off } });
    router.registerWorker('a');
    router.registerWorker('b');
    assert.ok(router.route({ tokens: Array.from({ length: 64 }, (_, k) => k) }, { explain: true }).workerId);
    // with the gate on (the default penalty, or one given) 0 is still refused, naming the option
    for (const options of [{ peakPrefillThroughput: 0 }, { peakPrefillThroughput: 0, maxTtftPenaltyMs: 5 }]) {
      assert.throws(() => policy(options), /llmd-affinity\.peakPrefillThroughput must be > 0 unless/);
      assert.throws(() => new LlmdAffinityPolicy(ctx, options), /llmd-affinity\.peakPrefillThroughput/);
      assert.throws(
        () => new KVAwareRouter({ policy: 'llmd-affinity', policyOptions: { 'llmd-affinity': options } }),
        /llmd-affinity\.peakPrefillThroughput/,
      );
    }
  });

  test("through the router: a routed prompt's uncached tokens weigh on its worker until its first token", () => {
    const r = new KVAwareRouter({ policy: 'llmd-affinity', blockSize: BLOCK });
    r.registerWorker('a');
    r.registerWorker('b');
    const prompt = (first: number, n: number) => Array.from({ length: n }, (_, k) => first + k);
    const first = r.route({ tokens: prompt(0, 640) });
    const other = first.workerId === 'a' ? 'b' : 'a';
    // the same prefix sticks (the router's own prediction holds it) though its worker is busy
    const next = r.route({ tokens: prompt(0, 700) });
    assert.equal(next.workerId, first.workerId);
    assert.equal(next.reason, 'cache-match');
    // an unrelated prompt goes where fewer tokens are in flight
    const unrelated = r.route({ tokens: prompt(100_000, 320) });
    assert.equal(unrelated.workerId, other);
    // once the first two have their first token, their tokens no longer count
    r.markPrefillDone(first.ticket);
    r.markPrefillDone(next.ticket);
    assert.equal(r.route({ tokens: prompt(200_000, 320) }, { dryRun: true }).workerId, first.workerId);
  });
});
