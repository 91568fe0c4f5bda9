import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import { comparePolicies } from '../../src/sim/compare.js';
import { simulate } from '../../src/sim/simulator.js';
import { loadMooncakeTrace, type TraceRequest } from '../../src/sim/trace.js';

const head = await loadMooncakeTrace(
  fileURLToPath(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url)),
);

describe('simulator', () => {
  test('the same trace gives the same results, request for request', () => {
    const a = comparePolicies('head', head, ['cost', 'random', 'power-of-two'], { workers: 4 });
    const b = comparePolicies('head', head, ['cost', 'random', 'power-of-two'], { workers: 4 });
    assert.deepEqual(a.report, b.report);
    assert.deepEqual(
      a.results.map((r) => r.outcomes),
      b.results.map((r) => r.outcomes),
    );
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
    const { report } = comparePolicies('head', head, ['cost', 'round-robin'], {
      workers: 4,
      engine: { kvTokens: 2_000_000 },
    });
    const [cost, rr] = report.policies;
    assert.ok(cost.hitRate > rr.hitRate, `hit ${cost.hitRate} vs ${rr.hitRate}`);
    assert.ok(cost.ttft.mean < rr.ttft.mean, `ttft ${cost.ttft.mean} vs ${rr.ttft.mean}`);
  });

  test('speed scales the arrival rate', () => {
    const slow = simulate(head, { workers: 2, policy: 'round-robin', speed: 0.25 });
    const fast = simulate(head, { workers: 2, policy: 'round-robin', speed: 8 });
    assert.ok(fast.ttft.mean > slow.ttft.mean);
  });
});

test('prompts past the router default maxPromptTokens run where the engines take them', () => {
  // 1.2M-token prompts on engines configured for 2M: the engines decide what is too long, not the router
  const trace = [0, 1].map((i) => ({
    index: i,
    timestamp: i * 1000,
    inputLength: 1_200_000,
    outputLength: 4,
    hashIds: Array.from({ length: 2344 }, (_, k) => k),
    blockSize: 512,
  }));
  const r = simulate(trace, { workers: 2, policy: 'cost', engine: { maxModelLen: 2_000_000, kvTokens: 4_000_000 } });
  assert.equal(r.rejected, 0);
  assert.equal(r.outcomes.length, 2);
  assert.ok(r.hitRate > 0.4, 'the second request reuses the first one’s KV');
});

test('an idle fleet is not scraped through a gap between requests, and decides as if it were', () => {
  // two requests a day apart: scraping every 200 ms through the gap reads the same idle engines
  // 432,000 times; the scrape kept is the last one before the second request
  const day = 24 * 3_600_000;
  const trace = [0, day].map((timestamp, i) => ({
    index: i,
    timestamp,
    inputLength: 2048,
    outputLength: 8,
    hashIds: [1, 2, 3, 4],
    blockSize: 512,
  }));
  const scrapes: number[] = [];
  const r = simulate(trace, { workers: 2, policy: 'cost', onScrape: (at, w) => w === 0 && scrapes.push(at) });
  assert.ok(scrapes.length < 50, `${scrapes.length} scrapes of worker 0`);
  // the scrape before the second request is on the same 200 ms grid, at most one interval before it
  const before = scrapes.filter((t) => t <= day);
  assert.equal(before.at(-1)! % 200, 0);
  assert.ok(day - before.at(-1)! <= 200);
  assert.equal(r.outcomes.length, 2);
  assert.equal(r.outcomes[1].cachedTokens, 3 * 512, 'the second request found the first one’s prefix');
});

test('the router is given the full blocks of a prompt, never its partial last block', () => {
  // a trace names the prompt's last, partial block too; an engine caches full blocks only, and a
  // router hashing the prompt's tokens keys only those (Dynamo's, llm-d's and this one's alike)
  const trace = [600, 1024, 1100, 100].map((inputLength, i) => ({
    index: i,
    timestamp: i * 60_000,
    inputLength,
    outputLength: 4,
    hashIds: [1, 2, 3].slice(0, Math.ceil(inputLength / 512)),
    blockSize: 512,
  }));
  const blocks: number[] = [];
  for (const policy of ['cost', 'dynamo', 'sglang', 'llmd', 'seed']) {
    blocks.length = 0;
    simulate(trace, { workers: 2, policy, onRoute: (d) => blocks.push(d.routedBlocks) });
    assert.deepEqual(blocks, [1, 2, 2, 0], policy);
  }
});

test('onRoute reports what every engine held of each prompt when it was routed', () => {
  // three requests sharing a 4-block prefix, far apart: the second and third find it where the first ran
  const trace = [0, 1, 2].map((i) => ({
    index: i,
    timestamp: i * 60_000,
    inputLength: 6 * 512,
    outputLength: 4,
    hashIds: [1, 2, 3, 4, 10 + i, 20 + i],
    blockSize: 512,
  }));
  const seen: Array<{ request: number; worker: number; heldTokens: number[]; explained: boolean }> = [];
  const r = simulate(trace, {
    workers: 3,
    policy: 'cost',
    explainRoutes: true,
    onRoute: (d) =>
      seen.push({ request: d.request, worker: d.worker, heldTokens: d.heldTokens, explained: d.explain !== undefined }),
  });
  assert.deepEqual(
    seen.map((d) => d.request),
    [0, 1, 2],
  );
  assert.deepEqual(seen[0].heldTokens, [0, 0, 0]);
  for (const d of seen) {
    assert.equal(d.heldTokens.length, 3);
    assert.equal(d.explained, true);
    assert.equal(d.worker, r.outcomes.find((o) => o.request === d.request)!.worker);
  }
  // the shared prefix (4 blocks; the rest of the first prompt is its own) is held where it ran, and only there
  const first = seen[0].worker;
  assert.deepEqual(
    seen[1].heldTokens,
    [0, 1, 2].map((w) => (w === first ? 4 * 512 : 0)),
  );
  // the second found its 4-block prefix where it went: the engine reports it at admission too
  assert.equal(seen[1].heldTokens[seen[1].worker], r.outcomes.find((o) => o.request === 1)!.cachedTokens);
});

test('a request reaching a worker between trace arrivals starts at its next step, not after its run of decode steps', () => {
  // worker 0 decodes a 4,000-token answer alone: with no arrival and no scrape (every 10 s) to
  // stop them, its decode steps run on in one go; requests reach it in between
  const req = (index: number, timestamp: number, inputLength: number, sessionId?: string): TraceRequest => ({
    index,
    timestamp,
    inputLength,
    outputLength: index === 0 ? 4000 : 8,
    hashIds: Array.from({ length: Math.ceil(inputLength / 16) }, (_, i) => index * 100_000 + i),
    blockSize: 16,
    ...(sessionId === undefined ? {} : { sessionId }),
  });
  const at = (r: ReturnType<typeof simulate>, i: number) => r.outcomes.find((o) => o.request === i)!;
  // closed loop: session a's first turn runs on worker 1 (round-robin), its second is sent when
  // it ends, to worker 0 in the middle of its run
  const closed = simulate([req(0, 0, 512), req(1, 1, 512, 'a'), req(2, 2, 512, 'a')], {
    workers: 2,
    policy: 'round-robin',
    scrapeIntervalMs: 10_000,
    scenario: { closedLoop: true },
  });
  assert.equal(at(closed, 2).worker, 0);
  assert.ok(Math.abs(at(closed, 2).arrival - (at(closed, 1).arrival + at(closed, 1).e2e)) < 1e-9);
  // its 512-token prefill and a decode step of worker 0 take tens of ms; the run went on for seconds
  assert.ok(at(closed, 2).ttft < 0.1, `ttft ${at(closed, 2).ttft} s`);
  // a retry: worker 1 fails before the first token of a long prompt, which goes to worker 0
  const retried = simulate([req(0, 0, 512), req(1, 1, 8000)], {
    workers: 2,
    policy: 'round-robin',
    scrapeIntervalMs: 10_000,
    scenario: { fail: [{ atMs: 100, worker: 1 }] },
  });
  assert.equal(retried.retried, 1);
  assert.equal(at(retried, 1).worker, 0);
  // arrived at 1 ms, sent again at 100 ms: its prefill of 8,000 tokens takes about half a second
  assert.ok(at(retried, 1).ttft < 1, `ttft ${at(retried, 1).ttft} s`);
  // the long answer is the same either way, give or take the steps it shared
  assert.ok(Math.abs(at(closed, 0).e2e - at(retried, 0).e2e) < 1);
});
