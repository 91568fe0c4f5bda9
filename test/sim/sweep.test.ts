import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import { renderHtmlReport, renderSweepReport } from '../../src/sim/html-report.js';
import { comparePolicies } from '../../src/sim/compare.js';
import { simulate, type PolicyResult } from '../../src/sim/simulator.js';
import {
  chooseLoadPoints,
  compareWithBestPeer,
  loadPoints,
  meanCi95,
  perturbTrace,
  splitTrace,
  summarise,
  sweepTrace,
  tQuantile95,
  windows,
  type SweepReport,
} from '../../src/sim/sweep.js';
import { loadMooncakeTrace, type TraceRequest } from '../../src/sim/trace.js';
import { renderSweepTables, sweepTables, withPeers } from '../../bench/sim-readme.js';

const head = await loadMooncakeTrace(
  fileURLToPath(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url)),
);

describe('sweep statistics', () => {
  test("Student's t intervals: textbook quantiles and a hand-computed interval", () => {
    assert.equal(tQuantile95(4), 2.776);
    assert.equal(tQuantile95(1), 12.706);
    assert.equal(tQuantile95(100), 1.96);
    assert.throws(() => tQuantile95(0), /degrees of freedom/);
    // 1, 2, 3, 4, 5: mean 3, s = √2.5, half-width 2.776 · √2.5 / √5
    const ci = meanCi95([1, 2, 3, 4, 5]);
    assert.equal(ci.mean, 3);
    assert.ok(Math.abs(ci.half - 2.776 * Math.sqrt(2.5 / 5)) < 1e-12);
    assert.deepEqual(meanCi95([7]), { mean: 7, half: 0 });
    assert.throws(() => meanCi95([]), /no samples/);
  });

  test('the split is the first half for training, the second for evaluation; windows cover it without overlap', () => {
    const { train, evaluation } = splitTrace(head);
    assert.equal(train.length, 150);
    assert.equal(evaluation.length, 150);
    assert.ok(train[train.length - 1].timestamp <= evaluation[0].timestamp);
    const w = windows(evaluation, 4);
    assert.deepEqual(
      w.map((x) => x.length),
      [37, 38, 37, 38],
    );
    assert.deepEqual(w.flat(), evaluation);
    assert.throws(() => windows(evaluation.slice(0, 2), 3), /cannot make 3 windows/);
  });

  test('load points run from light load to the last point on a log scale', () => {
    assert.deepEqual(loadPoints(1, 16, 5), [1, 2, 4, 8, 16]);
    assert.throws(() => loadPoints(2, 1, 5), /light < last/);
  });

  test('summarise reports mean and 95% half-width per metric, and sums rejections', () => {
    const fake = (hitRate: number, mean: number, p99: number, rejected: number) =>
      ({ hitRate, ttft: { mean, p50: 0, p90: 0, p99 }, rejected }) as unknown as PolicyResult;
    const p = summarise('cost', [fake(0.1, 1, 10, 1), fake(0.2, 2, 20, 0), fake(0.3, 3, 30, 2)]);
    assert.deepEqual(Object.keys(p), ['policy', 'hitRate', 'ttftMean', 'ttftP99', 'ci95', 'rejected']);
    assert.deepEqual(Object.keys(p.ci95), ['hitRate', 'ttftMean', 'ttftP99']);
    assert.equal(p.hitRate, 0.2);
    assert.equal(p.ttftMean, 2);
    assert.equal(p.ttftP99, 20);
    assert.equal(p.ci95.ttftMean, Math.round(4.303 * (1 / Math.sqrt(3)) * 1e4) / 1e4);
    assert.equal(p.rejected, 3);
  });

  test('a sweep on real samples: points from light load past the knee, every policy at every point', () => {
    const { train, evaluation } = splitTrace(head);
    const o = {
      policies: ['cost', 'round-robin'],
      points: 3,
      simulation: { workers: 2 },
      workerPrefillTokensPerSecond: 12_500,
    };
    const speeds = chooseLoadPoints(windows(train, 2), o);
    assert.equal(speeds.length, 3);
    assert.ok(speeds[0] < speeds[1] && speeds[1] < speeds[2]);
    const t = sweepTrace('head', windows(evaluation, 2), speeds, o);
    assert.deepEqual(
      t.points.map((p) => p.speed),
      speeds,
    );
    for (const point of t.points)
      assert.deepEqual(
        point.policies.map((p) => p.policy),
        ['cost', 'round-robin'],
      );
    // past the knee round-robin's p99 is far above its light-load value
    const rr = t.points.map((p) => p.policies[1].ttftP99);
    assert.ok(rr[2] > 2 * rr[0], `round-robin p99 ${rr}`);
  });

  test('the comparison with the best peer applies the bar: mean within the intervals, p99 within 5%, hit within 5%', () => {
    const q = (policy: string, ttftMean: number, ttftP99: number, hitRate: number, ci = 0.1) => ({
      policy,
      hitRate,
      ttftMean,
      ttftP99,
      ci95: { hitRate: 0, ttftMean: ci, ttftP99: 0 },
      rejected: 0,
    });
    const point = {
      speed: 1,
      policies: [q('cost', 1.15, 10.4, 0.5), q('dynamo', 1.0, 10, 0.5), q('llmd', 2, 12, 0.52)],
    };
    const c = compareWithBestPeer(point, 'cost', ['dynamo', 'llmd'])!;
    assert.equal(c.best.policy, 'dynamo');
    assert.deepEqual([c.meanOk, c.p99Ok, c.hitOk], [true, true, true]);
    const worse = { speed: 1, policies: [q('cost', 1.5, 11, 0.4), q('dynamo', 1.0, 10, 0.5)] };
    const d = compareWithBestPeer(worse, 'cost', ['dynamo'])!;
    assert.deepEqual([d.meanOk, d.p99Ok, d.hitOk], [false, false, false]);
    const table = renderSweepTables({ traces: [{ trace: 'x', points: [point, worse] }] });
    assert.match(table, /\| ×1 \| 1\.15 ± 0\.10 \| dynamo \| 1\.00 ± 0\.10 \|.*\| yes \|/);
    assert.match(table, /no \(mean, p99, hit rate\) \|/);
    // a candidate's run of cost alone, compared with the peers' run of the same points
    const both = [point, { ...worse, speed: 2 }];
    const costOnly = { traces: [{ trace: 'x', points: both.map((p) => ({ ...p, policies: [p.policies[0]] })) }] };
    const peersOnly = { traces: [{ trace: 'x', points: both.map((p) => ({ ...p, policies: p.policies.slice(1) })) }] };
    const merged = sweepTables(withPeers(costOnly, peersOnly));
    assert.deepEqual([merged.met, merged.points], [1, 2]);
    assert.equal(merged.text, renderSweepTables({ traces: [{ trace: 'x', points: both }] }));
    assert.throws(() => withPeers(costOnly, { traces: [] }), /--peers: no trace 'x'/);
  });
});

describe('HTML reports', () => {
  test('the sweep report: one chart per metric and trace, bands, tick values, a legend naming every policy', () => {
    const q = (policy: string, m: number) => ({
      policy,
      hitRate: 0.3 * m,
      ttftMean: m,
      ttftP99: 5 * m,
      ci95: { hitRate: 0.01, ttftMean: 0.1 * m, ttftP99: 0.5 * m },
      rejected: 0,
    });
    const report: SweepReport = {
      traces: [
        {
          trace: 'tr<1>',
          points: [1, 2, 4].map((speed) => ({ speed, policies: [q('cost', speed), q('dynamo', speed * 1.2)] })),
        },
      ],
    };
    const html = renderSweepReport(report, { workers: 8, samples: 5, split: 'evaluation' });
    assert.equal((html.match(/<svg width="420"/g) ?? []).length, 3);
    assert.equal((html.match(/<polygon /g) ?? []).length, 6, 'a confidence band per policy and chart');
    assert.match(html, />×1<\/text>.*>×2<\/text>.*>×4<\/text>/s);
    assert.match(html, /class="legend".*cost.*dynamo/s);
    assert.match(html, /tr&lt;1&gt;/);
    assert.doesNotMatch(html, /<script|src="http|NaN|Infinity/);
  });

  test('the run report handles hundreds of thousands of requests (no argument-spread of big arrays)', () => {
    const r = simulate(head.slice(0, 20), { workers: 2, policy: 'cost' });
    const many = Array.from({ length: 400_000 }, (_, i) => ({
      ...r.outcomes[i % r.outcomes.length],
      ttft: 0.001 + (i % 1000) / 100,
    }));
    const { report } = comparePolicies('big', head.slice(0, 20), ['cost'], { workers: 2 });
    const html = renderHtmlReport(report, [{ ...r, outcomes: many }]);
    assert.match(html, /<polyline/);
    assert.doesNotMatch(html, /NaN|Infinity/);
  });
});

test('perturbTrace: shorter prompts keep their leading blocks, arrivals come denser; bad scales and anchored prompts are refused', () => {
  const req = (index: number, timestamp: number, inputLength: number, hashIds: number[]): TraceRequest => ({
    index,
    timestamp,
    inputLength,
    outputLength: 10,
    hashIds,
    blockSize: 512,
  });
  const trace = [req(0, 0, 2048, [1, 2, 3, 4]), req(1, 1250, 1500, [1, 2, 5]), req(2, 2500, 100, [9])];
  const out = perturbTrace(trace, { promptScale: 0.5, rateScale: 1.25 });
  assert.deepEqual(
    out.map((r) => [r.timestamp, r.inputLength, r.hashIds]),
    [
      [0, 1024, [1, 2]],
      [1000, 750, [1, 2]],
      [2000, 50, [9]],
    ],
  );
  // the input is left as it was
  assert.deepEqual(trace[0].hashIds, [1, 2, 3, 4]);
  // arrivals alone: prompts untouched
  assert.deepEqual(
    perturbTrace(trace, { promptScale: 1, rateScale: 2 }).map((r) => [r.timestamp, r.inputLength, r.hashIds.length]),
    [
      [0, 2048, 4],
      [625, 1500, 3],
      [1250, 100, 1],
    ],
  );
  for (const [p, name] of [
    [{ promptScale: 0, rateScale: 1 }, /promptScale/],
    [{ promptScale: 1.5, rateScale: 1 }, /promptScale/],
    [{ promptScale: NaN, rateScale: 1 }, /promptScale/],
    [{ promptScale: 1, rateScale: 0.05 }, /rateScale/],
    [{ promptScale: 1, rateScale: Infinity }, /rateScale/],
  ] as const)
    assert.throws(
      () => perturbTrace(trace, p),
      (e: unknown) => e instanceof RangeError && name.test(e.message),
    );
  const anchored = { ...trace[0], anchors: [{ id: 'doc', tokens: 512 }] };
  assert.throws(() => perturbTrace([anchored], { promptScale: 0.9, rateScale: 1 }), /content anchors/);
  assert.equal(perturbTrace([anchored], { promptScale: 1, rateScale: 2 })[0].anchors?.length, 1);
});
