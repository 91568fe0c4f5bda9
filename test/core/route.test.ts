import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { MAX_ENGINE_REQUESTS } from '../../src/core/worker-registry.js';
import { KVAwareRouter } from '../../src/index.js';
import { BS, fleet, prompt } from '../helpers/prompts.js';

describe('route()', () => {
  test('panicCandidates: an unhealthy worker among them may be chosen, never a draining or excluded one', () => {
    const r = fleet(3);
    for (const id of ['w0', 'w1', 'w2']) r.setWorkerHealth(id, false);
    assert.ok(r.route({ tokens: prompt(2, 4) }, { dryRun: true }).noWorker, 'none in rotation');
    r.drainWorker('w2');
    const panicCandidates = new Set(['w0', 'w1', 'w2']);
    const chosen = new Set<string>();
    for (let i = 0; i < 8; i++)
      chosen.add(
        r.route({ tokens: prompt(10 + i, 4) }, { track: false, exclude: new Set(['w0']), panicCandidates }).workerId,
      );
    assert.deepEqual([...chosen], ['w1'], 'only the unhealthy worker neither draining nor excluded');
    r.setWorkerHealth('w1', true);
    assert.equal(r.route({ tokens: prompt(30, 4) }, { dryRun: true }).workerId, 'w1', 'without them, the healthy one');
  });

  test('servedBy: the worker serving the request is the only candidate, available or not', () => {
    const r = fleet(3);
    r.drainWorker('w1');
    r.setWorkerHealth('w2', false);
    for (const id of ['w0', 'w1', 'w2']) {
      const d = r.route({ tokens: prompt(40, 4) }, { servedBy: id, exclude: new Set([id]) });
      assert.equal(d.workerId, id);
      assert.equal(r.listWorkers().find((w) => w.id === id)!.inFlightRequests, 1, `${id} counts it`);
      r.release(d.ticket);
    }
    assert.ok(r.route({ tokens: prompt(41, 4) }, { servedBy: 'gone' }).noWorker, 'a worker not registered is none');
    assert.throws(
      () => r.route({ tokens: prompt(42, 4) }, { servedBy: 7 as never }),
      (e: unknown) => e instanceof TypeError && /servedBy/.test(e.message),
    );
  });

  test('replaces: a decision taken again for a request that found no worker counts once, as the decision taken', () => {
    const r = fleet(2);
    for (const id of ['w0', 'w1']) r.setWorkerHealth(id, false);
    const panicCandidates = new Set(['w0', 'w1']);
    const first = r.route({ tokens: prompt(2, 4) }, { track: false });
    assert.ok(first.noWorker);
    const again = r.route({ tokens: prompt(2, 4) }, { track: false, panicCandidates, replaces: first });
    assert.ok(!again.noWorker);
    const counts = r.getStats().decisionsByReason;
    assert.equal(counts[again.reason], 1, JSON.stringify(counts));
    assert.equal(counts.none ?? 0, 0, JSON.stringify(counts));
    // found no worker again: still one count, as no worker
    r.drainWorker('w0');
    r.drainWorker('w1');
    const none = r.route({ tokens: prompt(3, 4) }, { track: false });
    assert.ok(none.noWorker);
    const still = r.route({ tokens: prompt(3, 4) }, { track: false, panicCandidates, replaces: none });
    assert.ok(still.noWorker);
    assert.equal(r.getStats().decisionsByReason.none, 1);
    // a dry run counts nothing and withdraws nothing
    r.route({ tokens: prompt(4, 4) }, { dryRun: true, replaces: none });
    assert.equal(r.getStats().decisionsByReason.none, 1);
    // a decision never counted is not withdrawn below zero
    const fresh = fleet(1);
    fresh.route({ tokens: prompt(4, 4) }, { track: false, replaces: none });
    assert.equal(fresh.getStats().decisionsByReason.none ?? 0, 0);
    assert.throws(
      () => r.route({ tokens: prompt(5, 4) }, { replaces: again as never }),
      (e: unknown) => e instanceof TypeError && /replaces/.test(e.message),
    );
  });

  test('approximate mode: a request sharing a prefix follows the first one, with its cached tokens predicted', () => {
    const r = fleet(4);
    const first = r.route({ tokens: prompt(1, 10) });
    assert.equal(first.cachedTokens, 0);
    assert.equal(first.blocks, 10);
    const second = r.route({ tokens: prompt(1, 12) });
    assert.equal(second.workerId, first.workerId);
    assert.equal(second.cachedTokens, 10 * BS);
    assert.equal(second.promptTokens, 12 * BS);
    assert.equal(second.confidence, 10 / 12);
  });

  test('precise mode: the worker that stored the blocks gets the request', () => {
    const r = fleet(4, { indexMode: 'precise' });
    r.applyStored('w2', r.hashTokens(prompt(5, 8)));
    const d = r.route({ tokens: prompt(5, 8, [1, 2, 3]) });
    assert.equal(d.workerId, 'w2');
    assert.equal(d.cachedTokens, 8 * BS);
    r.applyRemoved('w2', r.hashTokens(prompt(5, 8)));
    r.applyCleared('w2');
    const e = r.route({ tokens: prompt(9, 8) }, { dryRun: true });
    assert.equal(e.cachedTokens, 0);
  });

  test('precise mode: siblings arriving before the first BlockStored land together, then the speculation expires', () => {
    let now = 0;
    const r = fleet(8, { indexMode: 'precise', predictionTtlMs: 2000, clock: () => now });
    const ids = new Set<string>();
    // untracked, so that no queue builds: what keeps the burst together is the speculation
    for (let i = 0; i < 6; i++) ids.add(r.route({ tokens: prompt(3, 20, [i]) }, { track: false }).workerId);
    assert.equal(ids.size, 1, 'the burst stays on one worker');
    now = 10_000;
    const later = r.route({ tokens: prompt(3, 20) }, { dryRun: true });
    assert.equal(later.cachedTokens, 0, 'speculative entries do not outlive their TTL');
  });

  test('approximate mode: records expire after the TTL (120 s default)', () => {
    let now = 0;
    const r = fleet(2, { clock: () => now });
    // answered at once: the record outlives the request
    r.release(r.route({ tokens: prompt(4, 5) }).ticket);
    now = 119_000;
    assert.equal(r.route({ tokens: prompt(4, 5) }, { dryRun: true }).cachedTokens, 5 * BS);
    now = 119_000 + 181_000; // 1.5 × TTL after the last use
    assert.equal(r.route({ tokens: prompt(4, 5) }, { dryRun: true }).cachedTokens, 0);
  });

  test('the default clock does not step with the wall clock: a prediction neither ages nor keeps at once', () => {
    const wall = Date.now;
    let step = 0;
    Date.now = () => wall() + step;
    try {
      const r = new KVAwareRouter({ blockSize: BS, predictionTtlMs: 60_000 });
      r.registerWorker('w0');
      r.registerWorker('w1');
      const first = r.route({ tokens: prompt(1, 8) });
      const before = r.now();
      // the wall clock set an hour forward (an NTP step): the router's time goes on as it went
      step = 3_600_000;
      assert.ok(r.now() - before < 60_000, `${r.now() - before} ms passed`);
      assert.equal(r.route({ tokens: prompt(1, 8) }, { dryRun: true }).workerId, first.workerId);
    } finally {
      Date.now = wall;
    }
  });

  test('hot prefix: when its holder is saturated with queued prefill, spreading to a second worker wins', () => {
    const r = fleet(2, { indexMode: 'precise' });
    r.applyStored('w0', r.hashTokens(prompt(7, 64)));
    // many requests on the hot prefix pile up prefill work on w0 while they run
    const placed: string[] = [];
    for (let i = 0; i < 40; i++) placed.push(r.route({ tokens: prompt(7, 64, prompt(100 + i, 32)) }).workerId);
    assert.equal(placed[0], 'w0');
    assert.ok(placed.includes('w1'), 'the prefix is spread once w0 is saturated');
    const onW0 = placed.filter((w) => w === 'w0').length;
    assert.ok(onW0 > 20, `the holder keeps most of the work (${onW0}/40)`);
  });

  test('hot prefix: a holder at KV pressure loses to an idle worker', () => {
    const r = fleet(2, { indexMode: 'precise' });
    r.applyStored('w0', r.hashTokens(prompt(7, 64)));
    r.updateWorkerMetrics('w0', { kvUsage: 0.93 });
    assert.equal(r.route({ tokens: prompt(7, 64, [1]) }).workerId, 'w1');
  });

  test('tickets: prefill moves to decode, release frees it, and release is idempotent', () => {
    const r = fleet(1);
    const d = r.route({ tokens: prompt(1, 4) });
    const w = r.listWorkers()[0];
    assert.equal(w.queuedPrefillTokens, 64);
    assert.equal(w.inFlightRequests, 1);
    r.markPrefillDone(d.ticket);
    assert.equal(w.queuedPrefillTokens, 0);
    assert.equal(w.activeDecodeTokens, 64);
    r.release(d.ticket);
    r.release(d.ticket);
    assert.equal(w.activeDecodeTokens, 0);
    assert.equal(w.inFlightRequests, 0);
    assert.equal(r.getStats().inFlightRequests, 0);
    const untracked = r.route({ tokens: prompt(2, 4) }, { track: false });
    assert.equal(untracked.ticket, 0);
    assert.equal(w.inFlightRequests, 0);
  });

  test('isolation ignores overlap and sets a private cache salt; judge roles are isolated', () => {
    const r = fleet(2, { judgeRoles: ['judge'] });
    const base = r.route({ tokens: prompt(1, 10) });
    const iso = r.route({ tokens: prompt(1, 10), isolate: true });
    assert.equal(iso.cachedTokens, 0);
    assert.match(iso.cacheSalt ?? '', /^cf-/);
    const judge = r.route({ tokens: prompt(1, 10), agentRole: 'judge' });
    assert.equal(judge.cachedTokens, 0);
    assert.notEqual(judge.cacheSalt, iso.cacheSalt);
    assert.equal(r.route({ tokens: prompt(1, 10), agentRole: 'retriever' }).workerId, base.workerId);
    assert.equal(base.cacheSalt, undefined);
  });

  test('a different LoRA or cache salt never matches', () => {
    const r = fleet(4);
    const a = r.route({ tokens: prompt(1, 10), lora: 'sql' });
    assert.equal(r.route({ tokens: prompt(1, 10), lora: 'sql' }, { dryRun: true }).cachedTokens, 160);
    assert.equal(r.route({ tokens: prompt(1, 10), lora: 'chat' }, { dryRun: true }).cachedTokens, 0);
    assert.equal(r.route({ tokens: prompt(1, 10), cacheSalt: 's' }, { dryRun: true }).cachedTokens, 0);
    assert.equal(r.route({ tokens: prompt(1, 10) }, { dryRun: true }).cachedTokens, 0);
    assert.ok(a.workerId);
  });

  test('content anchors are scored apart from the prefix', () => {
    const r = fleet(3);
    const passage = { id: 'passage-42', tokens: 900 };
    const first = r.route({ tokens: prompt(1, 4), contentAnchors: [passage], promptTokens: 0 });
    // a different prefix, the same passage: the anchor pulls it to the same worker
    const d = r.route({ tokens: prompt(2, 4), contentAnchors: [passage] }, { explain: true });
    assert.equal(d.workerId, first.workerId);
    const held = d.explain!.find((e) => e.worker === first.workerId)!;
    assert.equal(held.anchorTokens, 900);
    assert.equal(held.overlapBlocks, 0);
  });

  test('chat messages hash the whole conversation; later turns find the earlier ones', () => {
    const r = fleet(4);
    const sys = { role: 'system', content: 'You are a meticulous analyst. '.repeat(20) };
    const turn1 = [sys, { role: 'user', content: 'Summarise the quarterly report in detail, please.' }];
    // untracked: the first turn has finished when the second arrives (no queue ahead of it)
    const a = r.route({ messages: turn1 }, { track: false });
    const b = r.route({
      messages: [
        ...turn1,
        { role: 'assistant', content: 'Here is the summary.' },
        { role: 'user', content: 'And the risks?' },
      ],
    });
    assert.equal(b.workerId, a.workerId);
    assert.ok(b.cachedTokens > 0);
    const other = r.route(
      { messages: [sys, { role: 'user', content: 'A totally different question here.' }] },
      { dryRun: true, explain: true },
    );
    // shares the system prompt only: less cached than the continuation
    assert.ok(Math.max(...other.explain!.map((e) => e.cachedTokens)) < b.cachedTokens);
  });

  test('precomputed block hashes (traces) route like tokens', () => {
    const r = fleet(3);
    const a = r.route({ blockHashes: [0, 11, 12, 13], blockTokens: 512, promptTokens: 1900 }, { track: false });
    const b = r.route({ blockHashes: [0, 11, 12, 14, 15], blockTokens: 512, promptTokens: 2400 });
    assert.equal(b.workerId, a.workerId);
    assert.equal(b.cachedTokens, 3 * 512);
  });

  test('explain lists every candidate with its score terms; dryRun changes nothing', () => {
    const r = fleet(3);
    r.route({ tokens: prompt(1, 6) });
    const before = JSON.stringify(r.getStats());
    const d = r.route({ tokens: prompt(1, 6) }, { explain: true, dryRun: true });
    assert.equal(JSON.stringify(r.getStats()), before);
    assert.equal(d.explain!.length, 3);
    assert.equal(d.explain!.filter((e) => e.chosen).length, 1);
    for (const e of d.explain!) assert.equal(typeof e.terms.score, 'number');
    assert.equal(d.explain!.find((e) => e.chosen)!.worker, d.workerId);
  });

  test('unhealthy and draining workers are never chosen', () => {
    const r = fleet(3);
    r.setWorkerHealth('w0', false);
    r.drainWorker('w1');
    for (let i = 0; i < 10; i++) assert.equal(r.route({ tokens: prompt(i, 2) }).workerId, 'w2');
    r.setWorkerHealth('w2', false);
    assert.equal(r.route({ tokens: prompt(1, 2) }).workerId, '');
  });

  test('a removed worker takes its index entries with it', () => {
    const r = fleet(2, { indexMode: 'precise' });
    r.applyStored('w0', r.hashTokens(prompt(1, 10)));
    assert.equal(r.getStats().index.entries, 10);
    r.removeWorker('w0');
    assert.equal(r.getStats().index.entries, 0);
    assert.throws(() => r.applyStored('w0', r.hashTokens(prompt(1, 1))), /not registered/);
  });

  test("an engine's queue and batch past any engine's are held at MAX_ENGINE_REQUESTS: scores stay finite and ordered", () => {
    for (const policy of ['cost', 'llmd', 'seed', 'least-loaded', 'dynamo', 'sglang']) {
      const r = fleet(3, { policy });
      r.updateWorkerMetrics('w0', { waitingRequests: 1e308, runningRequests: 1e308, kvUsage: 0.1 });
      r.updateWorkerMetrics('w1', {
        waitingRequests: Number.MAX_VALUE,
        runningRequests: Number.MAX_VALUE,
        kvUsage: 0.1,
      });
      r.updateWorkerMetrics('w2', { waitingRequests: 3, runningRequests: 3, kvUsage: 0.1 });
      const workers = r.listWorkers();
      assert.deepEqual(
        workers.map((w) => [w.waitingRequests, w.runningRequests]),
        [
          [MAX_ENGINE_REQUESTS, MAX_ENGINE_REQUESTS],
          [MAX_ENGINE_REQUESTS, MAX_ENGINE_REQUESTS],
          [3, 3],
        ],
        policy,
      );
      // what the endpoint picker and dashboards add up over the workers stays a number
      assert.ok(Number.isFinite(workers.reduce((sum, w) => sum + w.waitingRequests + w.runningRequests, 0)), policy);
      const d = r.route({ tokens: prompt(1, 4) }, { dryRun: true, explain: true });
      for (const c of d.explain!)
        for (const [term, value] of Object.entries(c.terms))
          if (typeof value === 'number' && !(term === 'score' && c.terms.excluded === true))
            assert.ok(Number.isFinite(value), `${policy}: ${c.worker}.${term} = ${value}`);
      // the queue scorer orders a huge queue below a short one
      if (policy === 'llmd') assert.equal(d.workerId, 'w2');
    }
  });

  test('bad requests are rejected with errors naming the field', () => {
    const r = fleet(1);
    assert.throws(() => r.route({ tokens: [1, -2, ...prompt(1, 1)] }), /tokens\[1\]/);
    assert.throws(() => r.route({ tokens: 'abc' as never }), TypeError);
    assert.throws(() => r.route({ messages: [{ content: 'x' } as never] }), /messages\[0\]/);
    assert.throws(() => r.route({ contentAnchors: [{ id: '', tokens: 3 }] }), /contentAnchors\[0\].id/);
    assert.throws(() => r.route({ contentAnchors: [{ id: 'a', tokens: -3 }] }), /contentAnchors\[0\].tokens/);
    assert.throws(() => r.route({ blockHashes: [1.5] }), /blockHashes\[0\]/);
    assert.throws(() => r.route({ claGroup: -1 }), /claGroup/);
    assert.throws(() => r.route({ isolate: 'yes' as never }), /isolate/);
    assert.throws(() => r.route(null as never), TypeError);
    assert.throws(() => new KVAwareRouter({ indexMode: 'exact' as never }), /indexMode/);
    assert.equal(r.getStats().inFlightRequests, 0, 'nothing was recorded for rejected requests');
  });
});
