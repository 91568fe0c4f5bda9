/**
 * The four regimes of docs/routing.md ("The cost policy, worked"), with the same numbers:
 * each test builds the fleet the example describes and checks the decision and its terms.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { CostPolicy, DEFAULT_COST_WEIGHTS, prefillWork } from '../../src/core/policies/cost.js';
import type { Candidate, RouteFeatures } from '../../src/core/policies/types.js';
import { KVAwareRouter } from '../../src/index.js';
import { candidates as fleet } from '../helpers/candidates.js';

const request = (promptTokens: number, sharedPrefixKey = 0): RouteFeatures => ({
  claGroup: null,
  promptTokens,
  requestBlocks: Math.floor(promptTokens / 16),
  blockSize: 16,
  routingKey: 1,
  sharedPrefixKey,
});

/** A policy that has routed `n` requests of 1,000 uncached tokens each (its mean work), none cached. */
function warmed(n = 64, key = 0, inFlight = 0): CostPolicy {
  const p = new CostPolicy();
  const [c] = fleet([{ inFlight }]);
  for (let i = 0; i < n; i++) {
    p.choose([c], request(1000, key));
    p.onRouted(c.worker, request(1000, key));
  }
  return p;
}

/** The lateness every engine's step may add to a first token, in seconds. */
const GRACE = DEFAULT_COST_WEIGHTS.lateGraceTokens / DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
const terms = (p: CostPolicy, c: Candidate, r: RouteFeatures) => p.scoreTerms(c, r) as Record<string, number>;

describe('cost policy regimes', () => {
  test('prefill work: attention makes a long recompute cost more than its tokens', () => {
    const a = DEFAULT_COST_WEIGHTS.attention;
    assert.equal(prefillWork(0, 1000, a), 0);
    assert.ok(Math.abs(prefillWork(1000, 1000, a) - 1000 * (1 + a * 500)) < 1e-9);
    // the last 10k tokens of a 400k context cost more per token than the whole 10k prompt
    assert.ok(prefillWork(10_000, 400_000, a) / 10_000 > 10 * (prefillWork(10_000, 10_000, a) / 10_000));
  });

  test('light load: a busy holder loses the request to an idle worker once its queue costs more than the recompute', () => {
    const p = warmed();
    const cs = fleet([{ cached: 4096, queued: 6000 }, {}, {}, {}]);
    const r = request(4608);
    const choice = p.choose(cs, r);
    assert.notEqual(choice.index, 0);
    assert.equal(choice.reason, 'replicate');
    const held = terms(p, cs[0], r);
    const moved = terms(p, cs[choice.index], r);
    assert.equal(moved.saturation, 0, 'no other worker has a queue');
    assert.equal(moved.replicate, true);
    assert.ok(moved.estimatedTtftSeconds < held.estimatedTtftSeconds, 'it is faster for the request');
    // the same holder with a short queue keeps it
    const calm = fleet([{ cached: 4096, queued: 1000 }, {}, {}, {}]);
    assert.deepEqual(p.choose(calm, r), { index: 0, confidence: 0, reason: 'cost' });
  });

  test('saturation: with every worker queued, the prefix stays with its holder', () => {
    const p = warmed();
    const cs = fleet([{ cached: 4096, queued: 9000 }, { queued: 3000 }, { queued: 3000 }, { queued: 3000 }]);
    const r = request(4608);
    const choice = p.choose(cs, r);
    assert.equal(choice.index, 0);
    assert.equal(choice.reason, 'cost');
    const other = terms(p, cs[1], r);
    assert.ok(
      Math.abs(other.saturation - 3) < 0.01,
      `3 requests of 1,000 tokens queued per worker, got ${other.saturation}`,
    );
    assert.ok(
      other.estimatedTtftSeconds < terms(p, cs[0], r).estimatedTtftSeconds,
      'the request alone would have been faster elsewhere...',
    );
    assert.ok(other.recomputeSeconds > 0, '...but the recompute delays the requests queued behind it');
    // the holder's own queue does not shield it: as long as the others are idle it spreads
    const piled = fleet([{ cached: 4096, queued: 60_000 }, {}, {}, {}]);
    assert.notEqual(p.choose(piled, r).index, 0);
  });

  test('hot prefix: replicated to a second worker when the queue it saves costs more than the recompute', () => {
    const cs = () =>
      fleet([
        { cached: 4096, queued: 9000, inFlight: 10 },
        { queued: 3000, inFlight: 10 },
        { queued: 3000, inFlight: 10 },
        { queued: 3000, inFlight: 10 },
      ]);
    const HOT = 77;
    // cold: few requests share the prefix, the recompute would delay the queued requests for nothing
    const cold = warmed(200, 5);
    assert.equal(cold.choose(cs(), request(4608, HOT)).index, 0);
    // hot: most recent requests share it and 40 are in flight, so one recompute serves many
    const hot = warmed(200, HOT);
    const hc = cs();
    const choice = hot.choose(hc, request(4608, HOT));
    assert.notEqual(choice.index, 0);
    assert.equal(choice.reason, 'replicate');
    const t = terms(hot, hc[choice.index], request(4608, HOT));
    assert.ok(t.hotness > 15, `hotness ${t.hotness}`);
    assert.equal(t.replicate, true);
    const holder = terms(hot, hc[0], request(4608, HOT));
    assert.equal(holder.replicate, false);
    assert.ok(t.costSeconds < holder.costSeconds);
  });

  test('a prefix queued on a worker counts as held there until its request finishes', () => {
    // a conversation's first turn (4,096 tokens) was sent to w0 and waits in its queue; the
    // index knows nothing yet (w0 has not computed it), and every worker is busy
    const p = warmed();
    const blocks = (n: number, salt = 0) => ({
      hi: Array.from({ length: n }, (_, i) => i + salt),
      lo: Array.from({ length: n }, (_, i) => 7 * i + 1 + salt),
      length: n,
    });
    const turn = (promptTokens: number, salt = 0): RouteFeatures => ({
      ...request(promptTokens, 1),
      blocks: blocks(promptTokens / 16, salt),
    });
    const cs = fleet([
      { queued: 9000, inFlight: 3 },
      { queued: 3000, inFlight: 3 },
      { queued: 3000, inFlight: 3 },
      { queued: 3000, inFlight: 3 },
    ]);
    const first = turn(4096);
    // routed before (the router's ticket 41); the mean work per request stays 1,000 tokens
    p.onRouted(cs[0].worker, first, 41);
    // the second turn (4,608 tokens) extends it: only its last 512 tokens are new on w0
    const second = turn(4608);
    assert.equal(p.choose(cs, second).index, 0);
    const held = terms(p, cs[0], second);
    assert.equal(held.pendingTokens, 4096);
    assert.equal(held.uncachedTokens, 512);
    const other = terms(p, cs[1], second);
    assert.equal(other.pendingTokens, 0);
    assert.ok(
      Math.abs(other.saturation - 4) < 0.01,
      `3 queued requests per worker + the busy share, got ${other.saturation}`,
    );
    assert.ok(Math.abs(held.costSeconds - 0.522) < 0.001, `w0 ${held.costSeconds}`);
    assert.ok(Math.abs(other.costSeconds - 1.452) < 0.001, `w1 ${other.costSeconds}`);
    // a prompt the first turn does not start is not credited
    p.choose(cs, turn(4608, 1000));
    assert.equal(terms(p, cs[0], turn(4608, 1000)).pendingTokens, 0);
    // finished: the engine's own reports (the index) take over, the pending prefix is forgotten
    p.onReleased(41);
    p.choose(cs, second);
    assert.equal(terms(p, cs[0], second).pendingTokens, 0);
    // an untracked decision (ticket 0) never runs as far as the router knows: nothing pending
    p.onRouted(cs[0].worker, first, 0);
    p.choose(cs, second);
    assert.equal(terms(p, cs[0], second).pendingTokens, 0);
  });

  test('a pending history is not made hot by the system prompt every request shares', () => {
    // every recent request shared the first block (key 1, a system prompt) and 40 are in flight
    const p = warmed(200, 1, 10);
    const hi = Array.from({ length: 288 }, (_, i) => i);
    const lo = Array.from({ length: 288 }, (_, i) => 3 * i + 5);
    const conversation = (n: number): RouteFeatures => ({ ...request(n * 16, 1), blocks: { hi, lo, length: n } });
    const cs = fleet([
      { cached: 16, queued: 9000, inFlight: 10 },
      { cached: 16, queued: 3000, inFlight: 10 },
      { cached: 16, queued: 3000, inFlight: 10 },
      { cached: 16, queued: 3000, inFlight: 10 },
    ]);
    p.choose(cs, conversation(256));
    p.onRouted(cs[0].worker, conversation(256), 7);
    const next = conversation(288);
    assert.equal(p.choose(cs, next).index, 0, 'the history stays with the worker about to hold it');
    assert.ok(terms(p, cs[1], next).hotness < 1, 'no other request shares the history');
  });

  test('long prompt: stays where the session KV is, even behind a long queue', () => {
    const p = warmed();
    // 400k-token context, 390k cached on w0 behind 200k tokens of queue; w1 idle
    const r = request(400_000);
    const cs = fleet([{ cached: 390_000, queued: 200_000, capacity: 1_000_000 }, { capacity: 1_000_000 }]);
    assert.equal(p.choose(cs, r).index, 0);
    const t = terms(p, cs[1], r);
    assert.ok(t.prefillSeconds > 200, `recomputing 400k tokens takes minutes (${t.prefillSeconds} s)`);
    // w0's free KV (half of 500k) cannot hold it now: it waits for KV, and still wins
    const busy = fleet([{ cached: 390_000, queued: 200_000, capacity: 500_000, load: 0.5 }, { capacity: 1_000_000 }]);
    assert.equal(p.choose(busy, r).index, 0);
    assert.ok(terms(p, busy[0], r).kvWaitSeconds > 0);
  });

  test('long prompt: a worker whose whole KV cannot hold it is left out, unless none can', () => {
    const p = warmed();
    const r = request(400_000);
    const cs = fleet([{ cached: 390_000, capacity: 300_000 }, { capacity: 1_000_000 }]);
    assert.equal(p.choose(cs, r).index, 1, 'the session worker truly cannot take it');
    const t = terms(p, cs[0], r);
    assert.equal(t.fits, false);
    assert.equal(t.excluded, true);
    assert.ok(Number.isNaN(t.score));
    const none = fleet([{ cached: 390_000, capacity: 300_000 }, { capacity: 300_000 }]);
    assert.equal(p.choose(none, r).index, 0, 'nobody can: the engine rejects it, from the session worker');
  });

  test('full workers: the pressure charges what the request holds there, a hot prefix shared by its siblings', () => {
    // small workers past the pressure knee: w0 holds a hot 10,240-token prefix its siblings in
    // flight pin, w1 holds none of it and its KV is at the knee
    const HOT = 91;
    const r = request(10_700, HOT);
    const cs = () =>
      fleet([
        { cached: 10_240, queued: 2000, load: 0.97, capacity: 40_000, inFlight: 30, entries: 2400 },
        { queued: 2000, load: 0.8, capacity: 40_000, inFlight: 30, entries: 2400 },
      ]);
    const hot = warmed(200, HOT, 30);
    const hc = cs();
    // thirty siblings this router sent w0 are running there (past their first token)
    for (let ticket = 1; ticket <= 30; ticket++) {
      hot.choose(hc, r);
      hot.onRouted(hc[0].worker, r, ticket, 0);
      hot.onPrefillDone(ticket);
    }
    assert.equal(hot.choose(hc, r).index, 0, 'the sibling stays with the prefix its siblings hold');
    const holder = terms(hot, hc[0], r);
    assert.ok(holder.hotness > 15, `hotness ${holder.hotness}`);
    // its own 460 tokens and a share of the prefix: under a tenth of the prompt
    assert.ok(holder.kvFootprintTokens > 460 && holder.kvFootprintTokens < 1070, `${holder.kvFootprintTokens}`);
    assert.equal(terms(hot, hc[1], r).kvFootprintTokens, 10_700, 'a copy holds the whole prompt');
    // a session's history is held by its turn alone: the whole prompt counts on a full holder
    const cold = warmed(200, 5, 30);
    const cc = cs();
    cold.choose(cc, r);
    const history = terms(cold, cc[0], r);
    assert.ok(history.hotness < 1, `hotness ${history.hotness}`);
    assert.ok(history.kvFootprintTokens > 10_000, `${history.kvFootprintTokens}`);
    assert.ok(history.guardSeconds > holder.guardSeconds + 1);
  });

  test("pressure: priced at the recompute of what the request holds, a long session's token costs more than a chat's", () => {
    const a = DEFAULT_COST_WEIGHTS.attention;
    const tps = DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
    const others = (capacity: number) => [
      { queued: 1000, load: 0.5, capacity, inFlight: 6 },
      { queued: 1000, load: 0.5, capacity, inFlight: 6 },
    ];
    // a chat turn of 7,000 tokens, 5,000 cached on a small worker 90% full (half-way past the knee)
    const p = warmed();
    const chats = fleet([{ cached: 5_000, queued: 1000, load: 0.9, capacity: 60_000, inFlight: 6 }, ...others(60_000)]);
    const chat = request(7_000);
    assert.equal(p.choose(chats, chat).index, 0, 'the chat stays: recomputing its 7,000 tokens is cheap to win back');
    const c = terms(p, chats[0], chat);
    const expected = DEFAULT_COST_WEIGHTS.pressure * 0.5 * prefillWork(c.kvFootprintTokens, 7_000, a);
    assert.ok(
      Math.abs(c.pressureSeconds * tps - expected) < 1e-6 * expected,
      `${c.pressureSeconds * tps} vs ${expected}`,
    );
    // a 100,000-token agent turn, 95,000 cached on a worker 93% full
    const q = warmed();
    const holders = fleet([
      { cached: 95_000, queued: 1000, load: 0.93, capacity: 300_000, inFlight: 6 },
      ...others(300_000),
    ]);
    const turn = request(100_000);
    assert.notEqual(
      q.choose(holders, turn).index,
      0,
      'the long turn leaves: a token of its history costs ~3.5× a chat token to win back',
    );
    const l = terms(q, holders[0], turn);
    const perToken = (t: Record<string, number>, overKnee: number) =>
      t.pressureSeconds / overKnee / t.kvFootprintTokens;
    assert.ok(perToken(l, 0.65) > 3 * perToken(c, 0.5), `${perToken(l, 0.65)} vs ${perToken(c, 0.5)} s per token`);
  });

  test('uneven fleet: a long session leaves a full holder for an idle worker, charged for the queue an arrival finds', () => {
    const p = warmed();
    // an 80k agent turn, 73.6k cached on w0, whose KV 40 requests of several sessions fill and
    // 48k tokens wait on; w1 and w2 have 6 requests queued each, w3 and w4 are idle
    const r = request(80_000);
    const cs = fleet([
      { cached: 73_600, queued: 48_000, load: 0.99, capacity: 300_000, inFlight: 40 },
      { queued: 6000, load: 0.5, capacity: 300_000, inFlight: 8 },
      { queued: 6000, load: 0.5, capacity: 300_000, inFlight: 8 },
      { capacity: 300_000 },
      { capacity: 300_000 },
    ]);
    const choice = p.choose(cs, r);
    assert.ok(choice.index === 3 || choice.index === 4, `an idle worker, got w${choice.index}`);
    assert.equal(choice.reason, 'replicate');
    const idle = terms(p, cs[choice.index], r);
    const holder = terms(p, cs[0], r);
    assert.ok(holder.kvWaitSeconds > 0, 'the holder cannot take the prompt now');
    // the other idle worker takes arrivals: only the busy share (3 of 5 workers) counts
    assert.ok(Math.abs(idle.saturation - 0.6) < 1e-9, `saturation ${idle.saturation}`);
    assert.ok(idle.costSeconds < holder.costSeconds);
    // in a saturated fleet (w3 and w4 queued too, 3,000 tokens each: σ = 4.5 + the busy share 1)
    // the move costs more than staying on the full holder
    const saturated = fleet([
      { cached: 73_600, queued: 48_000, load: 0.99, capacity: 300_000, inFlight: 40 },
      { queued: 6000, load: 0.5, capacity: 300_000, inFlight: 8 },
      { queued: 6000, load: 0.5, capacity: 300_000, inFlight: 8 },
      { queued: 3000, capacity: 300_000, inFlight: 1 },
      { queued: 3000, capacity: 300_000, inFlight: 1 },
    ]);
    assert.equal(p.choose(saturated, r).index, 0);
    assert.ok(Math.abs(terms(p, saturated[3], r).saturation - 5.5) < 1e-9);
    // with w4 the last idle worker, a recompute there meets a saturated fleet (4.5 requests
    // queued per worker); one on w3 (6 requests queued) leaves w4 free for arrivals
    const busy = fleet([
      { cached: 73_600, queued: 48_000, load: 0.99, capacity: 300_000, inFlight: 40 },
      { queued: 6000, load: 0.5, capacity: 300_000, inFlight: 8 },
      { queued: 6000, load: 0.5, capacity: 300_000, inFlight: 8 },
      { queued: 6000, capacity: 300_000, inFlight: 1 },
      { capacity: 300_000 },
    ]);
    assert.equal(p.choose(busy, r).index, 3);
    assert.ok(Math.abs(terms(p, busy[4], r).saturation - (18 / 4 + 4 / 5)) < 1e-9);
    assert.ok(Math.abs(terms(p, busy[3], r).saturation - 4 / 5) < 1e-9);
  });

  test('idle capacity: a worker with nothing queued but no free KV for an arrival absorbs no recompute', () => {
    const p = warmed(); // routed prompts of 1,000 tokens: an arrival needs 1,000 tokens of free KV
    const r = request(80_000);
    // w0 holds the turn behind a queue; w1 has 6 requests queued; w2 has nothing queued, its
    // KV full of running requests (300 tokens free) or half free; w3 is empty
    const withW2 = (load: number) =>
      fleet([
        { cached: 73_600, queued: 48_000, load: 0.99, capacity: 300_000, inFlight: 40 },
        { queued: 6000, load: 0.5, capacity: 300_000, inFlight: 8 },
        { load, capacity: 300_000, inFlight: 30 },
        { capacity: 300_000 },
      ]);
    /** σ of each candidate, as the decision over the whole fleet sees it. */
    const saturations = (policy: CostPolicy, cs: Candidate[]) => {
      policy.choose(cs, r);
      return cs.map((c) => terms(policy, c, r).saturation);
    };
    const close = (a: number, b: number) => Math.abs(a - b) < 1e-9;
    // with room, w2 takes arrivals: a recompute on w3 is charged the busy share (3 of 4) alone
    const roomy = saturations(p, withW2(0.5));
    assert.ok(close(roomy[3], 0.75), `w3 σ ${roomy[3]}`);
    // full, w2 admits an arrival only once its requests end: the fleet is saturated for w3's
    // recompute (6,000 tokens queued over the 3 other workers: 2 requests of 1,000 each, + 0.75)
    const full = saturations(p, withW2(0.999));
    assert.ok(close(full[3], 2.75), `w3 σ ${full[3]}`);
    // on w1 (queued) and w2 (full), w3 is the idle worker that takes the arrivals
    assert.ok(close(full[1], 0.75) && close(full[2], 0.75), `w1 σ ${full[1]}, w2 σ ${full[2]}`);
    // with w2's KV capacity unknown, its empty queue is enough, as before
    const unknownCapacity = fleet([
      { cached: 73_600, queued: 48_000, load: 0.99, capacity: 300_000, inFlight: 40 },
      { queued: 6000, load: 0.5, capacity: 300_000, inFlight: 8 },
      { load: 0.999, inFlight: 30 },
      { capacity: 300_000 },
    ]);
    const unknown = saturations(p, unknownCapacity);
    assert.ok(close(unknown[3], 0.75), `w3 σ ${unknown[3]}`);
  });

  test('a copy is charged for the cache it displaces, which an empty worker does not have', () => {
    // a history of high hit rates: cached tokens are worth keeping
    const p = new CostPolicy();
    const [h] = fleet([{ cached: 900 }]);
    for (let i = 0; i < 200; i++) {
      p.choose([h], request(1000));
      p.onRouted(h.worker, request(1000));
    }
    const cs = fleet([{ cached: 4096, queued: 6000 }, {}, {}]);
    cs[0].indexEntries = 10_000;
    cs[1].indexEntries = 10_000; // as full as the holder
    cs[2].indexEntries = 0; // a fresh worker
    const r = request(4608);
    assert.equal(p.choose(cs, r).index, 2);
    const full = terms(p, cs[1], r);
    const empty = terms(p, cs[2], r);
    assert.ok(full.reuse > 2, `reuse ${full.reuse}`);
    assert.equal(full.cacheFullness, 1);
    assert.equal(empty.cacheFullness, 0);
    assert.ok(full.recomputeSeconds > 0 && empty.recomputeSeconds === 0);
  });

  test('workflow and CLA affinity stand in for the cache only when the prompt has no blocks (seed API)', () => {
    const p = warmed();
    const cs = fleet([{}, {}]);
    cs[0].continuity = true;
    cs[0].servesCla = true;
    const hashed = request(4096);
    p.choose(cs, hashed);
    assert.equal(terms(p, cs[0], hashed).guardSeconds, 0, 'with blocks, cachedTokens already counts the previous step');
    const seedApi: RouteFeatures = { ...hashed, requestBlocks: 0 };
    assert.equal(p.choose(cs, seedApi).index, 0);
    const g = terms(p, cs[0], seedApi).guardSeconds;
    assert.ok(
      Math.abs(
        g +
          (4096 * (DEFAULT_COST_WEIGHTS.workflow + DEFAULT_COST_WEIGHTS.cla)) /
            DEFAULT_COST_WEIGHTS.prefillTokensPerSecond,
      ) < 1e-9,
    );
  });

  test('choose() allocates nothing per candidate and learns only when the router acts on it', () => {
    const p = warmed();
    const cs = fleet([{ cached: 4096, queued: 6000 }, { queued: 100 }]);
    const r = request(4608);
    p.choose(cs, r);
    const before = terms(p, cs[1], r);
    for (let i = 0; i < 100; i++) p.choose(cs, request(50_000));
    p.choose(cs, r);
    assert.deepEqual(terms(p, cs[1], r), before, 'choosing alone changes no estimate');
  });

  test('explain through the router shows every term per candidate, and the replicate reason', () => {
    const r = new KVAwareRouter({ indexMode: 'precise', blockSize: 16 });
    for (const id of ['w0', 'w1']) r.registerWorker(id);
    const tokens = Array.from({ length: 300 * 16 }, (_, i) => i);
    r.applyStored('w0', r.hashTokens(tokens));
    r.setRemoteLoad('w0', { inFlightRequests: 5, queuedPrefillTokens: 50_000, activeDecodeTokens: 0 });
    const d = r.route({ tokens }, { explain: true });
    assert.equal(d.explain!.find((e) => e.worker === 'w0')!.cachedTokens, 300 * 16);
    assert.equal(d.workerId, 'w1');
    assert.equal(d.reason, 'replicate');
    for (const e of d.explain!) {
      for (const k of [
        'queueSeconds',
        'latenessSeconds',
        'prefillSeconds',
        'decodeSlowdown',
        'kvWaitSeconds',
        'saturation',
        'reuse',
        'hotness',
        'recomputeSeconds',
        'pendingTokens',
        'kvFootprintTokens',
        'guardSeconds',
        'pressureSeconds',
        'arrivalDelaySeconds',
        'estimatedTtftSeconds',
        'costSeconds',
        'score',
      ]) {
        assert.equal(typeof e.terms[k], 'number', `${e.worker}: ${k}`);
      }
      assert.equal(typeof e.terms.replicate, 'boolean');
    }
    assert.equal(d.explain!.find((e) => e.worker === 'w1')!.terms.replicate, true);
    assert.equal(r.getStats().decisionsByReason.replicate, 1);
  });

  test('through the router: a follow-up joins its queued first turn, which the index does not know', () => {
    let now = 0;
    const r = new KVAwareRouter({ indexMode: 'precise', blockSize: 16, clock: () => now });
    for (const id of ['w0', 'w1']) r.registerWorker(id);
    const history = Array.from({ length: 300 * 16 }, (_, i) => i);
    const first = r.route({ tokens: history });
    // a minute later the first turn is still answering: its first token came, no KV event did;
    // the cost policy wrote no speculative entries for it (its pending prefixes hold the whole prompt)
    r.markPrefillDone(first.ticket);
    now = 60_000;
    const next = [...history, ...Array.from({ length: 32 * 16 }, (_, i) => 100_000 + i)];
    const probe = r.route({ tokens: next }, { dryRun: true, explain: true });
    const there = probe.explain!.find((e) => e.worker === first.workerId)!;
    assert.equal(there.cachedTokens, 0, 'the index does not know the history');
    // pending prefixes keep every 8th block between 256 and 512: the 296th is the deepest kept
    assert.equal(there.terms.pendingTokens, 296 * 16);
    const second = r.route({ tokens: next });
    assert.equal(second.workerId, first.workerId);
    // once both turns finished, only what the engine reported counts
    const pendingOn = () =>
      r.route({ tokens: next }, { dryRun: true, explain: true }).explain!.find((e) => e.worker === first.workerId)!
        .terms.pendingTokens;
    r.release(first.ticket);
    assert.equal(pendingOn(), 328 * 16, 'the second turn (332 blocks) is still in flight there');
    r.release(second.ticket);
    assert.equal(pendingOn(), 0);
  });

  test('precise mode: the pending prefix stands in for speculative entries, except for untracked requests', () => {
    const r = new KVAwareRouter({ indexMode: 'precise', blockSize: 16 });
    r.registerWorker('w0');
    const prompt = (from: number) => Array.from({ length: 64 * 16 }, (_, i) => from + i);
    const tracked = r.route({ tokens: prompt(0) }, { share: true });
    assert.equal(r.index.entryCount, 0, 'no speculative entries for a tracked request');
    // the other replicas, which do not see this router's pending prefixes, still get the stretch
    assert.equal(tracked.shared!.hi.length, 16);
    r.route({ tokens: prompt(100_000) }, { track: false });
    assert.equal(r.index.entryCount, 16, 'an untracked request gets its speculative stretch');
    // a policy that does not keep pending prefixes gets speculative entries for every decision
    const d = new KVAwareRouter({ indexMode: 'precise', blockSize: 16, policy: 'least-loaded' });
    d.registerWorker('w0');
    d.route({ tokens: prompt(0) });
    assert.equal(d.index.entryCount, 16);
  });

  test('dry runs teach the policy nothing; routed requests do', () => {
    const r = new KVAwareRouter({ blockSize: 16 });
    for (const id of ['w0', 'w1']) r.registerWorker(id);
    const tokens = Array.from({ length: 64 * 16 }, (_, i) => i);
    const probe = () => r.route({ tokens }, { dryRun: true, explain: true }).explain![0].terms;
    r.setRemoteLoad('w1', { inFlightRequests: 1, queuedPrefillTokens: 5000, activeDecodeTokens: 0 });
    const before = probe();
    for (let i = 0; i < 50; i++) r.route({ tokens: tokens.map((t) => t + i * 7919) }, { dryRun: true });
    assert.deepEqual(probe(), before);
    for (let i = 0; i < 5; i++) r.route({ tokens: tokens.map((t) => t + i * 7919) }, { track: false });
    assert.ok((probe().saturation as number) > 0, 'the mean work per request is known once requests were routed');
  });
  test('arrival delay: a long recompute goes to the idle worker that receives no requests', () => {
    const p = new CostPolicy();
    const system = 9728; // a system prompt every worker holds
    // ten turns of sessions that live on w1 (50k of their 60k tokens held there only), 2 s apart
    for (let i = 0; i < 10; i++) {
      const cs = fleet([{ cached: system }, { cached: 50_000 }, { cached: system }]);
      const r = request(60_000);
      assert.equal(p.choose(cs, r).index, 1);
      p.onRouted(cs[1].worker, r, 0, 2000 * i);
    }
    // a 118k-token turn held on w0, whose queue costs more than recomputing it on an idle worker
    const cs = fleet([{ cached: 91_200, queued: 2_000_000 }, { cached: system }, { cached: system }]);
    const r = request(118_453);
    const choice = p.choose(cs, r);
    assert.equal(choice.index, 2, 'not w1, whose next requests would wait behind the 30 s recompute');
    assert.equal(choice.reason, 'replicate');
    const w1 = terms(p, cs[1], r);
    const w2 = terms(p, cs[2], r);
    assert.equal(w2.arrivalDelaySeconds, 0);
    // 10 requests routed to w1, decayed over a minute from 0-18 s ago
    let routed = 0;
    for (let i = 0; i < 10; i++) routed += Math.exp(-(18_000 - 2000 * i) / 60_000);
    const perToken = (routed / 60_000) * (1000 / DEFAULT_COST_WEIGHTS.prefillTokensPerSecond);
    const work = prefillWork(118_453 - system, 118_453, DEFAULT_COST_WEIGHTS.attention);
    // each of them would leave at the cost of recomputing the 50k it held there beyond the system
    // prompt every worker holds (M < the prefill): an arrival at a uniform time waits
    // E[min(U, M)] = M·(1 − M/(2·work))
    const leave = prefillWork(50_000 - system, 50_000, DEFAULT_COST_WEIGHTS.attention);
    const expected = (perToken * work * leave * (1 - leave / (2 * work))) / DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
    assert.ok(
      Math.abs(w1.arrivalDelaySeconds - expected) < 1e-6 * expected,
      `${w1.arrivalDelaySeconds} vs ${expected}`,
    );
    assert.ok(Math.abs(w1.costSeconds - w2.costSeconds - w1.arrivalDelaySeconds) < 1e-9, 'the only difference');
  });

  test('arrival delay: the rate is read when the decision is made, not when the last request was routed', () => {
    const p = new CostPolicy();
    const system = 9728;
    for (let i = 0; i < 10; i++) {
      const cs = fleet([{ cached: system }, { cached: 50_000 }, { cached: system }]);
      const r = request(60_000);
      p.choose(cs, r);
      p.onRouted(cs[1].worker, r, 0, 2000 * i);
    }
    const cs = fleet([{ cached: 91_200 }, { cached: system }, { cached: system }]);
    const at = (now: number | undefined) => {
      const r: RouteFeatures = { ...request(118_453), now };
      p.choose(cs, r);
      return terms(p, cs[1], r).arrivalDelaySeconds as number;
    };
    const atLast = at(18_000);
    assert.ok(atLast > 0);
    // a quiet minute later w1 has received nothing for 60 s: its rate has decayed by e
    const later = at(78_000);
    assert.ok(Math.abs(later - atLast / Math.E) < 1e-9 * atLast, `${later} vs ${atLast / Math.E}`);
    // a decision stamped before the last one never moves the clock back
    assert.equal(at(40_000), later);
  });

  test('arrival delay: arrivals that can leave cheaply count for what leaving costs them, not for the wait', () => {
    const p = new CostPolicy();
    const system = 9728; // a system prompt every worker holds
    // w0 receives twenty short chats a minute, each holding 2k tokens there (cheap to move);
    // w1 receives three turns of one long session, each holding 110k there (a recompute of minutes)
    for (let i = 0; i < 20; i++) {
      const cs = fleet([{ cached: system + 2048 }, { cached: system }, { cached: system }]);
      const r = request(system + 3000);
      assert.equal(p.choose(cs, r).index, 0);
      p.onRouted(cs[0].worker, r, 0, 3000 * i);
    }
    for (let i = 0; i < 3; i++) {
      const cs = fleet([{ cached: system }, { cached: 110_000 }, { cached: system }]);
      const r = request(120_000);
      assert.equal(p.choose(cs, r).index, 1);
      p.onRouted(cs[1].worker, r, 0, 20_000 * i);
    }
    // a new 100k-token session: w2 is 20% slower (outside the slack), w0 and w1 equally fast
    const work = prefillWork(100_000 - system, 100_000, DEFAULT_COST_WEIGHTS.attention);
    const cs = fleet([{ cached: system }, { cached: system }, { cached: system, queued: 0.2 * work }]);
    const r: RouteFeatures = { ...request(100_000), now: 60_000 };
    const [w0, w1] = cs.map((c) => terms(p, c, r));
    // counted by the wait alone, w0's twenty arrivals would weigh more than w1's three
    assert.ok(
      (w0.arrivalDelaySeconds as number) < (w1.arrivalDelaySeconds as number),
      `${w0.arrivalDelaySeconds} vs ${w1.arrivalDelaySeconds}`,
    );
    assert.equal(p.choose(cs, r).index, 0, 'w0: its chats go elsewhere for little; the long session cannot');
  });

  test('arrival delay: requests that held nothing on the worker delay nothing there', () => {
    const p = new CostPolicy();
    const system = 9728;
    // w1 received ten new sessions (nothing of theirs held anywhere beyond the system prompt)
    for (let i = 0; i < 10; i++) {
      const cs = fleet([
        { cached: system, queued: 1_000_000 },
        { cached: system },
        { cached: system, queued: 1_000_000 },
      ]);
      const r = request(system);
      assert.equal(p.choose(cs, r).index, 1);
      p.onRouted(cs[1].worker, r, 0, 1000 * i);
    }
    const r: RouteFeatures = { ...request(60_000), now: 10_000 };
    const cs = fleet([{ cached: system }, { cached: system }, { cached: system }]);
    p.choose(cs, r);
    assert.equal(terms(p, cs[1], r).arrivalDelaySeconds, 0);
  });

  test('new session: within its TTFT slack, it keeps off the worker whose sessions would wait behind it', () => {
    const p = new CostPolicy();
    const system = 9728; // a system prompt every worker holds: held nowhere more than everywhere
    // ten turns of sessions that live on w1, 1 s apart
    for (let i = 0; i < 10; i++) {
      const cs = fleet([{ cached: system }, { cached: 50_000 }, { cached: system }]);
      const r = request(60_000);
      assert.equal(p.choose(cs, r).index, 1);
      p.onRouted(cs[1].worker, r, 0, 1000 * i);
    }
    const work = prefillWork(60_000 - system, 60_000, DEFAULT_COST_WEIGHTS.attention);
    const r: RouteFeatures = { ...request(60_000), now: 9000 };
    // w1 idle (the lowest TTFT), w2 5% later, w0 50% later; only w1 receives requests
    const near = fleet([
      { cached: system, queued: 0.5 * work },
      { cached: system },
      { cached: system, queued: 0.05 * work },
    ]);
    assert.equal(p.choose(near, r).index, 2, 'w2: 5% later than w1, within the 10% slack, and delays nobody');
    const [w0, w1, w2] = near.map((c) => terms(p, c, r));
    assert.equal(w1.newSession, true);
    assert.ok(w1.arrivalDelaySeconds > 1, `its sessions' turns would wait behind it: ${w1.arrivalDelaySeconds} s`);
    assert.equal(w2.arrivalDelaySeconds, 0);
    assert.deepEqual([w0.outsideNewSessionSlack, w0.excluded, w0.score], [true, true, NaN], 'w0: 50% later');
    assert.deepEqual([w1.outsideNewSessionSlack, w2.outsideNewSessionSlack], [false, false]);
    // 20% later is more than the slack allows: the session takes the fastest worker after all
    const far = fleet([
      { cached: system, queued: 0.5 * work },
      { cached: system },
      { cached: system, queued: 0.2 * work },
    ]);
    assert.equal(p.choose(far, r).index, 1);
    assert.equal(terms(p, far[2], r).outsideNewSessionSlack, true);
    // with no slack it takes the fastest worker too
    const strict = new CostPolicy({ ...DEFAULT_COST_WEIGHTS, newSessionSlack: 0 });
    for (let i = 0; i < 10; i++) {
      const cs = fleet([{ cached: system }, { cached: 50_000 }, { cached: system }]);
      const turn = request(60_000);
      strict.choose(cs, turn);
      strict.onRouted(cs[1].worker, turn, 0, 1000 * i);
    }
    assert.equal(strict.choose(near, r).index, 1);
    // a prompt without blocks (the seed API) whose workflow ran on w1 has a worker of its own:
    // no bound, and its affinity, not its arrivals, decides, as before
    const seedApi: RouteFeatures = { ...r, requestBlocks: 0 };
    const affine = fleet([{ cached: system, queued: 0.5 * work }, { cached: system }, { cached: system }]).map(
      (c, i) => ({
        ...c,
        continuity: i === 1,
      }),
    );
    p.choose(affine, seedApi);
    assert.deepEqual(
      affine.map((c) => [terms(p, c, seedApi).newSession, terms(p, c, seedApi).arrivalDelaySeconds]),
      [
        [false, 0],
        [false, 0],
        [false, 0],
      ],
    );
    // a request some worker holds more of is no new session: no bound, every worker considered
    const held = fleet([{ cached: system, queued: 0.5 * work }, { cached: 20_000 }, { cached: system }]);
    p.choose(held, r);
    assert.deepEqual(
      held.map((c) => [terms(p, c, r).newSession, terms(p, c, r).outsideNewSessionSlack]),
      [
        [false, false],
        [false, false],
        [false, false],
      ],
    );
  });
  test('queue by work: a long context queued by this router counts its attention until its first token', () => {
    const r = new KVAwareRouter({ indexMode: 'precise', blockSize: 16 });
    for (const id of ['w0', 'w1']) r.registerWorker(id);
    const context = Array.from({ length: 6250 * 16 }, (_, i) => i); // 100,000 tokens
    const first = r.route({ tokens: context });
    const other = first.workerId === 'w0' ? 'w1' : 'w0';
    const probe = () => {
      const e = r.route({ tokens: [1, 2, 3] }, { dryRun: true, explain: true }).explain!;
      return Object.fromEntries(e.map((c) => [c.worker, c.terms]));
    };
    const a = DEFAULT_COST_WEIGHTS.attention;
    const attention = prefillWork(100_000, 100_000, a) - 100_000; // 325,000: 4.25x the tokens in all
    let t = probe();
    assert.equal(t[first.workerId].queuedPrefillTokens, 100_000);
    assert.ok(Math.abs((t[first.workerId].queuedAttentionTokens as number) - attention) < 1e-6);
    assert.equal(t[other].queuedAttentionTokens, 0);
    const seconds = (100_000 + attention) / DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
    assert.ok(Math.abs((t[first.workerId].queueSeconds as number) - seconds) < 1e-9);
    // a second long context goes to the other worker, as it would with the queue in tokens
    const second = r.route({ tokens: context.map((x) => x + 1_000_000) });
    assert.equal(second.workerId, other);
    // the first token ends the prefill: its attention no longer queues; releasing it twice changes nothing
    r.markPrefillDone(first.ticket);
    t = probe();
    assert.equal(t[first.workerId].queuedAttentionTokens, 0);
    assert.ok((t[other].queuedAttentionTokens as number) > 0);
    r.release(first.ticket);
    r.release(second.ticket);
    r.release(second.ticket);
    t = probe();
    assert.equal(t[other].queuedAttentionTokens, 0);
    assert.equal(t[first.workerId].queuedAttentionTokens, 0);
  });

  test('KV wait: the cached prefixes of the requests queued before a request take the free KV first', () => {
    const p = new CostPolicy();
    // w0 has 300,000 tokens of KV, half held by running requests: 150,000 free
    // it holds the turn's 60,000 and the two queued turns' 96,000 each (16-token blocks)
    const cs = fleet([{ cached: 60_000, load: 0.5, capacity: 300_000, entries: 15_750 }, { capacity: 300_000 }]);
    const w0 = cs[0];
    const turn = request(64_000);
    const kvWait = () => terms(p, w0, turn).kvWaitSeconds * DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
    p.choose(cs, turn);
    assert.equal(terms(p, w0, turn).queuedCachedTokens, 0);
    assert.ok(kvWait() < 1e-6, 'alone, the turn fits in the free KV');
    // two other sessions' turns routed to w0 and queued there, each with 96,000 of its 100,000
    // tokens cached: vLLM counts those idle prefixes as free until it admits the turns
    for (const ticket of [1, 2]) {
      const queued = request(100_000);
      p.choose([{ ...w0, cachedTokens: 96_000 }], queued);
      p.onRouted(w0.worker, queued, ticket, 0);
    }
    p.choose(cs, turn);
    assert.equal(terms(p, w0, turn).queuedCachedTokens, 192_000);
    assert.equal(terms(p, cs[1], turn).queuedCachedTokens, 0);
    // 192,000 + 64,000 tokens against 150,000 free
    assert.ok(Math.abs(kvWait() - 106_000) < 1e-6);
    // admitted (first token), a queued turn's prefix is in the KV usage the engine reports
    p.onPrefillDone(1);
    assert.ok(Math.abs(kvWait() - 10_000) < 1e-6);
    p.onReleased(2);
    p.onReleased(2);
    assert.ok(kvWait() < 1e-6);
    assert.equal(terms(p, w0, turn).queuedCachedTokens, 0);
  });

  test('KV wait: a prefix shared by queued requests counts once, whoever brought it', () => {
    const p = new CostPolicy();
    // w0: 100,000 tokens of KV, half held (50,000 free), and a 30,000-token prefix cached
    // (the index holds 4,000 blocks for it: the prefix and other sessions')
    const cs = fleet([{ cached: 30_000, load: 0.5, capacity: 100_000, entries: 4_000 }, { capacity: 100_000 }]);
    const w0 = cs[0];
    // 2,000 blocks: the first 1,875 (30,000 tokens) shared, the rest the sibling's own
    const sibling = (n: number): RouteFeatures => ({
      ...request(32_000),
      blocks: {
        hi: Array.from({ length: 2000 }, (_, i) => (i < 1875 ? i : n * 1_000_000 + i)),
        lo: Array.from({ length: 2000 }, (_, i) => (i < 1875 ? 3 * i + 1 : n * 1_000_000 + 3 * i)),
        length: 2000,
      },
    });
    // eight siblings of one 30,000-token context (each 2,000 tokens of its own) queued on w0
    for (let n = 1; n <= 8; n++) {
      const r = sibling(n);
      p.choose([w0], r);
      p.onRouted(w0.worker, r, n, 0);
    }
    const ninth = sibling(9);
    p.choose(cs, ninth);
    // the first pins the prefix when admitted; the others reuse it in flight: 30,000 once, not
    // eight times (240,000). Pending prefixes are kept at positions that thin out with depth, so
    // each sibling adds the few blocks between the last kept position and the end of the prefix
    const queued = terms(p, w0, ninth).queuedCachedTokens;
    assert.ok(queued >= 30_000 && queued < 33_000, `one prefix queued, got ${queued}`);
    const kvWait = terms(p, w0, ninth).kvWaitSeconds * DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
    // and the ninth, whose prefix the queued siblings bring, needs free KV for its own 2,000
    // tokens only: K + 2,000 against 50,000 free leaves it nothing to wait for
    const pending = terms(p, w0, ninth).pendingTokens;
    assert.ok(pending >= 29_000 && pending <= 30_000, `the prefix is pending, got ${pending}`);
    assert.equal(kvWait, Math.max(0, queued + 32_000 - pending - 50_000));
    assert.equal(kvWait, 0);
    assert.equal(p.choose(cs, ninth).index, 0, 'the ninth sibling joins its context');
    // with nothing to wait for, nothing of its prefix is at risk
    assert.equal(terms(p, w0, ninth).prefixAtRiskTokens, 0);
    // with 20,000 free, it waits for what K and its own tokens lack
    const [tight] = fleet([{ cached: 30_000, load: 0.8, capacity: 100_000, entries: 4_000 }]);
    const tightWait = terms(p, tight, ninth).kvWaitSeconds * DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
    assert.ok(Math.abs(tightWait - (queued + 32_000 - pending - 20_000)) < 1e-6, `got ${tightWait}`);
    // the siblings queued before it hold the prefix when it is admitted: only the blocks past the
    // last position the pending table keeps are at risk
    assert.equal(terms(p, tight, ninth).prefixAtRiskTokens, 30_000 - pending);
  });

  test('prefix at risk: a turn on a holder short of free KV may lose up to the shortfall of its prefix, a bound in its cost', () => {
    const p = new CostPolicy();
    const a = DEFAULT_COST_WEIGHTS.attention;
    const tps = DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
    const near = (x: number, y: number, what: string, eps = 1e-6) =>
      assert.ok(Math.abs(x - y) < eps, `${what}: expected ${y}, got ${x}`);
    // w0 holds 60,000 tokens of a 64,000-token turn; 300,000 tokens of KV, 90% held: 30,000 free
    const cs = fleet([{ cached: 60_000, load: 0.9, capacity: 300_000, entries: 3_750 }, { capacity: 300_000 }]);
    const turn = request(64_000);
    p.choose(cs, turn);
    const t = terms(p, cs[0], turn);
    // 64,000 against 30,000 free: 34,000 short, all of which may come out of the 60,000 held
    near(t.kvWaitSeconds * tps, 34_000, 'KV wait');
    near(t.prefixAtRiskTokens, 34_000, 'prefix at risk');
    const risk = (prefillWork(4_000 + 34_000, 64_000, a) - prefillWork(4_000, 64_000, a)) / tps;
    near(t.prefixAtRiskSeconds, risk, 'its recompute', 1e-9);
    // recomputed at the end of the context, it costs more than its tokens
    assert.ok(t.prefixAtRiskSeconds > (2 * 34_000) / tps, `${t.prefixAtRiskSeconds} s for 34,000 tokens`);
    // a bound, left out of the estimated TTFT and charged in the cost, term by term
    near(t.estimatedTtftSeconds, t.queueSeconds + t.prefillSeconds + t.latenessSeconds + t.kvWaitSeconds, 'TTFT', 1e-9);
    const sum =
      t.estimatedTtftSeconds + t.prefixAtRiskSeconds + t.recomputeSeconds + t.guardSeconds + t.arrivalDelaySeconds;
    near(t.costSeconds, sum, 'cost', 1e-9);
    // the worker without the prefix has room and risks nothing
    assert.equal(terms(p, cs[1], turn).prefixAtRiskTokens, 0);
    // at most what it holds: a 4,000-token prefix on a worker 34,000 short
    const little = fleet([{ cached: 4_000, load: 0.9, capacity: 300_000, entries: 250 }, { capacity: 300_000 }]);
    p.choose(little, turn);
    assert.equal(terms(p, little[0], turn).prefixAtRiskTokens, 4_000);
    // with room for the prompt nothing is at risk
    const roomy = fleet([{ cached: 60_000, load: 0.5, capacity: 300_000, entries: 3_750 }, { capacity: 300_000 }]);
    p.choose(roomy, turn);
    assert.equal(terms(p, roomy[0], turn).prefixAtRiskTokens, 0);
    assert.equal(terms(p, roomy[0], turn).prefixAtRiskSeconds, 0);
  });

  test('prefix at risk: charged, it sends a long turn off a holder short of KV that it would stay on otherwise', () => {
    const tps = DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
    // w0 holds 90,000 tokens of a 100,000-token turn and has 40,000 tokens of KV free, at the
    // pressure knee (no pressure charged); w1 has room
    const cs = fleet([
      { cached: 90_000, load: 0.8, capacity: 200_000, entries: 5_625 },
      { load: 0.1, capacity: 200_000 },
    ]);
    const turn = request(100_000);
    const p = new CostPolicy();
    const choice = p.choose(cs, turn);
    const held = terms(p, cs[0], turn);
    const moved = terms(p, cs[1], turn);
    // 60,000 short on w0: that much of its 90,000-token prefix is at risk
    assert.ok(Math.abs(held.prefixAtRiskTokens - 60_000) < 1e-6, `at risk: ${held.prefixAtRiskTokens}`);
    assert.equal(held.pressureSeconds, 0, 'at the knee');
    assert.ok(held.prefixAtRiskSeconds * tps > 60_000, 'recomputed at the end of the context');
    // without the risk w0 is the cheaper; with it, w1
    assert.ok(
      held.costSeconds - held.prefixAtRiskSeconds < moved.costSeconds,
      `w0 ${held.costSeconds - held.prefixAtRiskSeconds} s without the risk against w1 ${moved.costSeconds} s`,
    );
    assert.ok(
      held.costSeconds > moved.costSeconds,
      `w0 ${held.costSeconds} s with it against w1 ${moved.costSeconds} s`,
    );
    assert.equal(choice.index, 1);
  });

  test('prefix at risk: a hot prefix is kept by the in-flight requests that reuse it there, not by those elsewhere', () => {
    // every recent decision shared the prefix (key 42), and eight requests are in flight
    const hot = () => warmed(64, 42, 8);
    const cs = fleet([
      { cached: 60_000, load: 0.9, capacity: 300_000, entries: 3_750, inFlight: 8 },
      { capacity: 300_000, inFlight: 8 },
    ]);
    const sibling = request(64_000, 42);
    // eight siblings sent to `to` under tickets 1-8, past their prefill (running, holding the prefix)
    const sendSiblings = (p: CostPolicy, to: Candidate) => {
      for (let ticket = 1; ticket <= 8; ticket++) {
        p.choose(cs, sibling);
        p.onRouted(to.worker, sibling, ticket, 0);
        p.onPrefillDone(ticket);
      }
    };
    // a warmed policy, the siblings sent to `to` if any, then the sibling to route
    const withSiblingsOn = (to?: Candidate) => {
      const p = hot();
      if (to) sendSiblings(p, to);
      p.choose(cs, sibling);
      return p;
    };
    // 34,000 short (64,000 against 30,000 free), all of it out of the 60,000 held: no request
    // this router sent runs there to keep it, however hot the prefix is fleet-wide
    const alone = withSiblingsOn();
    const unkept = terms(alone, cs[0], sibling);
    assert.ok(unkept.hotness >= 1, `hotness ${unkept.hotness}`);
    assert.equal(unkept.prefixSharersHere, 0);
    assert.ok(Math.abs(unkept.prefixAtRiskTokens - 34_000) < 1e-6, `at risk ${unkept.prefixAtRiskTokens}`);
    // its siblings running on the other worker keep their own copy there, not this one
    const elsewhere = withSiblingsOn(cs[1]);
    const other = terms(elsewhere, cs[0], sibling);
    assert.equal(other.prefixSharersHere, 0);
    assert.equal(terms(elsewhere, cs[1], sibling).prefixSharersHere, 8);
    assert.ok(Math.abs(other.prefixAtRiskTokens - 34_000) < 1e-6, `at risk ${other.prefixAtRiskTokens}`);
    // running there, they keep it: only the request's share, 60,000 / (1 + 8), is at risk
    const here = withSiblingsOn(cs[0]);
    const kept = terms(here, cs[0], sibling);
    assert.equal(kept.prefixSharersHere, 8);
    assert.ok(Math.abs(kept.prefixAtRiskTokens - 60_000 / 9) < 1e-6, `at risk ${kept.prefixAtRiskTokens}`);
    assert.ok(kept.prefixAtRiskSeconds < unkept.prefixAtRiskSeconds, 'kept, the prefix costs less at risk');
    // once they have ended, nothing keeps it
    for (let ticket = 1; ticket <= 8; ticket++) here.onReleased(ticket);
    here.choose(cs, sibling);
    assert.equal(terms(here, cs[0], sibling).prefixSharersHere, 0);
    assert.ok(Math.abs(terms(here, cs[0], sibling).prefixAtRiskTokens - 34_000) < 1e-6);
  });

  test('prefix at risk: a turn sent before its previous turn ended waits for no KV that turn holds, and risks what it still lacks', () => {
    const p = new CostPolicy();
    const tps = DEFAULT_COST_WEIGHTS.prefillTokensPerSecond;
    // w0: 300,000 tokens of KV, 90% held (30,000 free); nothing of the session cached yet
    const cs = fleet([{ cached: 0, load: 0.9, capacity: 300_000, entries: 4_000 }, { capacity: 300_000 }]);
    const blocks = (n: number): RouteFeatures['blocks'] => ({
      hi: Array.from({ length: n }, (_, i) => i),
      lo: Array.from({ length: n }, (_, i) => 7 * i + 1),
      length: n,
    });
    const previous: RouteFeatures = { ...request(64_000), blocks: blocks(4_000) };
    p.choose([cs[0]], previous);
    p.onRouted(cs[0].worker, previous, 1, 0);
    // the next turn, 4,000 tokens longer, is sent before the previous one has ended
    const next: RouteFeatures = { ...request(68_000), blocks: blocks(4_250) };
    p.choose(cs, next);
    const t = terms(p, cs[0], next);
    // the pending table keeps every 64th block at that depth: 3,968 of the 4,000
    assert.equal(t.pendingTokens, 63_488, 'the previous turn brings its prefix');
    // still in prefill, the previous turn computes its prefix when admitted: that takes free KV
    // once, counted with this turn (68,000 against 30,000 free), and it holds the prefix then:
    // none of it is at risk
    assert.ok(Math.abs(t.kvWaitSeconds * tps - 38_000) < 1e-6, `KV wait ${t.kvWaitSeconds * tps}`);
    assert.equal(t.prefixAtRiskTokens, 0);
    // answering, the previous turn holds its prefix in the KV usage: the turn waits for none of it,
    // and when that turn ends its prefix is free KV, which covers the 38,000: nothing is at risk
    p.onPrefillDone(1);
    p.choose(cs, next);
    const answering = terms(p, cs[0], next);
    assert.equal(answering.kvWaitSeconds, 0);
    assert.equal(answering.prefixAtRiskTokens, 0);
    // with 3,000 free, 65,000 short: the prefix covers 63,488 of it, and the rest may come out of it
    const [full] = fleet([{ cached: 0, load: 0.99, capacity: 300_000, entries: 4_000 }]);
    p.choose([full, cs[1]], next);
    const lacking = terms(p, full, next);
    const short = 68_000 - 3_000 - 63_488;
    assert.ok(Math.abs(lacking.kvWaitSeconds * tps - short) < 1e-6, `KV wait ${lacking.kvWaitSeconds * tps}`);
    assert.ok(Math.abs(lacking.prefixAtRiskTokens - short) < 1e-6, `at risk ${lacking.prefixAtRiskTokens}`);
    assert.ok(lacking.prefixAtRiskSeconds > 0, 'the risk is charged');
    // with the previous turn ended and its prefix indexed, the same shortfall is a KV wait too
    p.onReleased(1);
    const after = fleet([{ cached: 64_000, load: 0.9, capacity: 300_000, entries: 4_000 }, { capacity: 300_000 }]);
    p.choose(after, next);
    const u = terms(p, after[0], next);
    assert.equal(u.pendingTokens, 0);
    assert.ok(Math.abs(u.kvWaitSeconds * tps - 38_000) < 1e-6, `KV wait ${u.kvWaitSeconds * tps}`);
    assert.ok(Math.abs(u.prefixAtRiskTokens - 38_000) < 1e-6, `at risk ${u.prefixAtRiskTokens}`);
  });

  test('KV wait: a prefix held on several workers is not counted again for each sibling queued there', () => {
    const p = new CostPolicy();
    // three workers of 40,000 tokens of KV, each holding a hot 10,240-token prefix and a little
    // else (800 blocks of 16 tokens), a quarter of their KV held by running requests
    const hot = { cached: 10_240, load: 0.25, capacity: 40_000, entries: 800 };
    const cs = fleet([hot, hot, hot, { capacity: 40_000 }]);
    // 650 blocks: the first 640 (10,240 tokens) the shared prefix, the rest each request's own
    const sibling = (n: number): RouteFeatures => ({
      ...request(10_400),
      blocks: {
        hi: Array.from({ length: 650 }, (_, i) => (i < 640 ? i : n * 1_000_000 + i)),
        lo: Array.from({ length: 650 }, (_, i) => (i < 640 ? 5 * i + 2 : n * 1_000_000 + 5 * i)),
        length: 650,
      },
    });
    // twelve siblings queued, sent in turn to the three holders: the pending table knows the
    // prefix on the last holder only, so each finds it pinned by no request of its own holder
    for (let n = 1; n <= 12; n++) {
      const r = sibling(n);
      const holder = cs[(n - 1) % 3];
      p.choose([holder], r);
      p.onRouted(holder.worker, r, n, 0);
    }
    const next = sibling(13);
    p.choose(cs, next);
    for (const holder of cs.slice(0, 3)) {
      const queued = terms(p, holder, next).queuedCachedTokens;
      // four siblings each would count 40,960 (the whole KV); the prefixes they pin are the
      // worker's own blocks: at most the 12,800 tokens the index holds for it
      assert.ok(queued <= 800 * 16, `at most what the worker holds, got ${queued}`);
      assert.ok(queued >= 10_240, `the prefix they pin, got ${queued}`);
    }
    assert.notEqual(p.choose(cs, next).index, 3, 'the next sibling joins a holder, not an empty worker');
  });

  test('a worker running late: a turn leaves a holder whose oldest queued request is past its estimate', () => {
    const p = new CostPolicy();
    const cs = fleet([{ cached: 40_000 }, {}]);
    const w0 = cs[0].worker;
    // a 45,000-token turn of another session routed to idle w0 at 0 s, estimated to start in 4 s
    const empty = { ...cs[0], cachedTokens: 0, overlapBlocks: 0 };
    const other: RouteFeatures = { ...request(45_000), now: 0 };
    p.choose([empty], other);
    const due = terms(p, empty, other).estimatedTtftSeconds;
    p.onRouted(w0, other, 1, 0);
    // a 50,000-token turn with 40,000 held on w0: at 2 s nothing is late and it stays
    const turn = (now: number): RouteFeatures => ({ ...request(50_000), now });
    assert.equal(p.choose(cs, turn(2000)).index, 0);
    assert.equal(terms(p, cs[0], turn(2000)).latenessSeconds, 0);
    // 60 s on, the queued turn has had no first token: w0 runs 56 s behind the estimate (less
    // the step every engine may add), and the turn is recomputed on idle w1 rather than wait there
    assert.equal(p.choose(cs, turn(60_000)).index, 1);
    const late = terms(p, cs[0], turn(60_000)).latenessSeconds;
    assert.ok(Math.abs(late - (60 - due - GRACE)) < 1e-6, `${late} vs ${60 - due - GRACE}`);
    assert.equal(terms(p, cs[1], turn(60_000)).latenessSeconds, 0);
    // once it has its first token, w0 is on time again
    p.onPrefillDone(1);
    assert.equal(p.choose(cs, turn(61_000)).index, 0);
    assert.equal(terms(p, cs[0], turn(61_000)).latenessSeconds, 0);
  });

  test('a worker running late: a first token one engine step past the estimate is not late', () => {
    const p = new CostPolicy();
    // a short prompt: the model estimates its first token within milliseconds, and an engine
    // adds its step in progress, its own step and the HTTP around them to every first token
    const cs = fleet([{ cached: 160 }, {}]);
    const first: RouteFeatures = { ...request(176), now: 0 };
    p.choose([{ ...cs[0], cachedTokens: 0, overlapBlocks: 0 }], first);
    const due = terms(p, { ...cs[0], cachedTokens: 0, overlapBlocks: 0 }, first).estimatedTtftSeconds;
    p.onRouted(cs[0].worker, first, 1, 0);
    const again = (now: number): RouteFeatures => ({ ...request(176), now });
    // 0.4 s on, no first token yet: within a step of the estimate, w0 keeps the prefix it holds
    assert.equal(p.choose(cs, again(400)).index, 0);
    assert.equal(terms(p, cs[0], again(400)).latenessSeconds, 0);
    // 3 s on it is late by what the step does not explain, and the next request goes to idle w1
    assert.equal(p.choose(cs, again(3000)).index, 1);
    const late = terms(p, cs[0], again(3000)).latenessSeconds;
    assert.ok(Math.abs(late - (3 - due - GRACE)) < 1e-6, `${late} vs ${3 - due - GRACE}`);
  });

  test('a worker running late: not one request held back by itself while the queue moves on', () => {
    const p = new CostPolicy();
    const cs = fleet([{ cached: 40_000 }, {}]);
    const empty = { ...cs[0], cachedTokens: 0, overlapBlocks: 0 };
    // two requests of other sessions queued on w0: the first one's grammar (or adapter, or
    // image) keeps it from its first token; the second, routed after it, has had its own
    const held: RouteFeatures = { ...request(2000), now: 0 };
    p.choose([empty], held);
    p.onRouted(cs[0].worker, held, 1, 0);
    const next: RouteFeatures = { ...request(2000), now: 100 };
    p.choose([empty], next);
    p.onRouted(cs[0].worker, next, 2, 100);
    const turn = (now: number): RouteFeatures => ({ ...request(50_000), now });
    assert.equal(p.choose(cs, turn(10_000)).index, 1, 'both queued and 10 s past due: w0 runs late');
    p.onPrefillDone(2);
    // the queue went past the held request: w0 is on time, and the turn stays with its history
    assert.equal(p.choose(cs, turn(10_000)).index, 0);
    assert.equal(terms(p, cs[0], turn(10_000)).latenessSeconds, 0);
    // a request routed after the one that had its first token is timed again
    const later: RouteFeatures = { ...request(2000), now: 10_000 };
    p.choose([empty], later);
    p.onRouted(cs[0].worker, later, 3, 10_000);
    assert.equal(p.choose(cs, turn(30_000)).index, 1, 'the next one 20 s past due: late again');
    assert.ok(terms(p, cs[0], turn(30_000)).latenessSeconds > 15);
  });

  test('a worker running late: a clock set back hides no lateness and makes none', () => {
    const p = new CostPolicy();
    const cs = fleet([{ cached: 40_000 }, {}]);
    const empty = { ...cs[0], cachedTokens: 0, overlapBlocks: 0 };
    const other: RouteFeatures = { ...request(45_000), now: 0 };
    p.choose([empty], other);
    const due = terms(p, empty, other).estimatedTtftSeconds;
    p.onRouted(cs[0].worker, other, 1, 0);
    // a minute on, a request to w1; then the clock is set back by 59 s for the next one
    const at60: RouteFeatures = { ...request(1000), now: 60_000 };
    p.choose([cs[1]], at60);
    p.onRouted(cs[1].worker, at60, 2, 60_000);
    const back: RouteFeatures = { ...request(1000), now: 1000 };
    p.choose([cs[1]], back);
    p.onRouted(cs[1].worker, back, 3, 1000);
    // w0's queued turn is still a minute old, and w1's requests, routed at or after the clock's
    // highest reading, are not late
    const turn: RouteFeatures = { ...request(50_000), now: 1500 };
    p.choose(cs, turn);
    const late = terms(p, cs[0], turn).latenessSeconds;
    assert.ok(Math.abs(late - (60 - due - GRACE)) < 1e-6, `${late} vs ${60 - due - GRACE}`);
    assert.equal(terms(p, cs[1], turn).latenessSeconds, 0);
  });

  test('a worker running late: a request whose answer is not streamed is not timed', () => {
    const p = new CostPolicy();
    const cs = fleet([{ cached: 40_000 }, {}]);
    // its first token comes with its last: a minute in the queue says nothing of w0's
    const whole: RouteFeatures = { ...request(45_000), now: 0, firstTokenReported: false };
    p.choose([{ ...cs[0], cachedTokens: 0, overlapBlocks: 0 }], whole);
    p.onRouted(cs[0].worker, whole, 1, 0);
    const turn: RouteFeatures = { ...request(50_000), now: 60_000 };
    assert.equal(p.choose(cs, turn).index, 0);
    assert.equal(terms(p, cs[0], turn).latenessSeconds, 0);
  });

  test('a worker running late: not charged to a prefix the requests in flight share', () => {
    const key = 0xbeef;
    const p = warmed(64, key, 8);
    const cs = fleet([{ cached: 4096, inFlight: 8 }, {}]);
    const w0 = cs[0].worker;
    const sibling = (now: number): RouteFeatures => ({ ...request(4608, key), now });
    p.choose(cs, sibling(0));
    p.onRouted(w0, sibling(0), 1, 0);
    assert.ok((terms(p, cs[0], sibling(60_000)).hotness as number) >= 1);
    // w0's queued sibling is a minute late; the prefix stays where its siblings are
    assert.equal(terms(p, cs[0], sibling(60_000)).latenessSeconds, 0);
    assert.equal(p.choose(cs, sibling(60_000)).index, 0);
  });

  test('queue by work: a turn leaves a holder whose queued long context costs more than its tokens say', () => {
    const p = new CostPolicy();
    const cs = fleet([{ cached: 15_000 }, {}]);
    const w0 = cs[0].worker;
    // a 20,000-token context routed to w0 by this policy, queued there: W = 33,000, 13,000 of it attention
    const long = request(20_000);
    p.choose([{ ...cs[0], cachedTokens: 0, overlapBlocks: 0 }], long);
    p.onRouted(w0, long, 1, 0);
    w0.queuedPrefillTokens = 20_000;
    assert.ok(Math.abs((terms(p, cs[0], long).queuedAttentionTokens as number) - 13_000) < 1e-6);
    // a 20,000-token turn with 15,000 cached on w0: its last 5,000 cost 10,688 there. In tokens
    // w0's wait is 30,688 against 33,000 for recomputing it on idle w1; in work it is 43,688
    const turn = request(20_000);
    assert.equal(p.choose(cs, turn).index, 1);
    p.onPrefillDone(1);
    assert.equal(
      p.choose(cs, turn).index,
      0,
      'once the long context has its first token, its tokens are all that queue',
    );
  });
});
