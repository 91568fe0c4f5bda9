import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { computeBounds } from '../../src/sim/bounds.js';
import { comparePolicies, comparisonWarnings } from '../../src/sim/compare.js';
import { renderHtmlReport } from '../../src/sim/html-report.js';
import { simulate } from '../../src/sim/simulator.js';
import { compareWithBestPeer } from '../../src/sim/sweep.js';
import type { TraceRequest } from '../../src/sim/trace.js';
import { renderTable } from '../../src/cli/commands/simulate-run.js';
import { renderSweepTables } from '../../bench/sim-readme.js';

/**
 * Long prompts (1,500 tokens) between short ones, on a worker of 1,000 KV tokens and one of
 * 2,000,000: round-robin sends every other request to the small worker, which refuses the
 * long ones; a policy that reads capacity serves them all.
 */
const trace: TraceRequest[] = Array.from({ length: 24 }, (_, i) => ({
  index: i,
  timestamp: i * 200,
  inputLength: i % 4 === 0 ? 1500 : 300,
  outputLength: 10,
  hashIds: Array.from({ length: i % 4 === 0 ? 23 : 4 }, (_, k) => (i % 4 === 0 ? k + 1 : 1000 * i + k)),
  blockSize: 64,
}));
const options = { workers: 2, scenario: { workerKvTokens: [1000, 2_000_000] } };

describe('policies that rejected different requests', () => {
  const { report, results } = comparePolicies('hetero', trace, ['cost', 'round-robin'], options);
  const [cost, rr] = report.policies;

  test('each policy says how many requests it answered, and which the simulator refused', () => {
    assert.equal(rr.rejected, 6, 'round-robin sends the six long prompts to the small worker');
    assert.ok(cost.rejected < rr.rejected, `cost ${cost.rejected}`);
    for (const [p, r] of [
      [cost, results[0]],
      [rr, results[1]],
    ] as const) {
      assert.equal(p.answered, r.outcomes.length);
      assert.equal(p.answered + p.rejected, trace.length);
      assert.equal(r.refused.length, p.rejected);
    }
  });

  test('a policy that left out requests the bounds count gets bounds over the requests it did not refuse', () => {
    assert.equal(cost.bounds, undefined, 'cost refused nothing: the run bounds are its own');
    assert.ok(rr.bounds, 'round-robin refused requests some worker holds');
    const own = computeBounds(trace, undefined, options.scenario.workerKvTokens, new Set(results[1].refused));
    assert.deepEqual(rr.bounds, {
      infiniteCacheHitRate: Math.round(own.infiniteCacheHitRate * 1e4) / 1e4,
      idealTtftMean: Math.round(own.idealTtftMean * 1e4) / 1e4,
    });
    assert.ok(rr.hitRate <= rr.bounds.infiniteCacheHitRate + 1e-4);
    assert.ok(rr.ttft.mean >= rr.bounds.idealTtftMean - 1e-4);
    // over every request: round-robin passes the run's TTFT bound by dropping the long prompts
    assert.ok(rr.ttft.mean < report.bounds.idealTtftMean, 'the case this guards against');
  });

  test('the warnings name the policies and their rejections; the table and the HTML report carry them', () => {
    const warnings = comparisonWarnings(report);
    assert.equal(warnings.length, 1);
    assert.match(warnings[0], new RegExp(`cost ${cost.rejected}, round-robin 6`));
    assert.match(warnings[0], /different requests/);
    const table = renderTable(report);
    assert.ok(table.includes(`warning: ${warnings[0]}`), table);
    const html = renderHtmlReport(report, results);
    // the page names the bounds it shows above the table, not their JSON path
    const shown = warnings[0].replace('(policies[].bounds)', '(the per-policy bounds above)').replace(/&/g, '&amp;');
    assert.ok(html.includes(shown), 'the HTML report shows the warning');
  });

  test('equal rejections give no warning', () => {
    const same = comparePolicies('same', trace, ['round-robin', 'round-robin'], options);
    assert.deepEqual(comparisonWarnings(same.report), []);
    assert.doesNotMatch(renderTable(same.report), /warning/);
  });

  test('a policy that answered no request is named, its figures kept numeric', () => {
    const none = comparePolicies('none', trace.slice(0, 3), ['cost'], {
      workers: 1,
      scenario: { fail: [{ worker: 0, atMs: 0 }] },
    });
    const [p] = none.report.policies;
    assert.equal(p.answered, 0);
    assert.equal(p.ttft.mean, 0);
    assert.equal(typeof p.hitRate, 'number');
    assert.deepEqual(comparisonWarnings(none.report), [
      'cost answered no request: its hit rate and TTFT are 0 for want of any, not measured',
    ]);
    assert.doesNotMatch(JSON.stringify(none.report), /null|NaN/);
  });
});

test('no policy passes its own bounds on workers of different sizes (the bounds over what it answered)', () => {
  for (const policy of ['cost', 'seed', 'dynamo', 'sglang', 'llmd', 'round-robin']) {
    const r = simulate(trace, { ...options, policy });
    const b = computeBounds(trace, undefined, options.scenario.workerKvTokens, new Set(r.refused));
    assert.ok(r.hitRate <= b.infiniteCacheHitRate + 1e-9, `${policy} hit ${r.hitRate} > ${b.infiniteCacheHitRate}`);
    assert.ok(r.ttft.mean >= b.idealTtftMean - 1e-9, `${policy} ttft ${r.ttft.mean} < ${b.idealTtftMean}`);
  }
});

test('the sweep comparison does not let a policy meet the bar by rejecting more than a peer', () => {
  const q = (policy: string, ttftMean: number, rejected: number) => ({
    policy,
    hitRate: 0.5,
    ttftMean,
    ttftP99: 10 * ttftMean,
    ci95: { hitRate: 0, ttftMean: 0.05, ttftP99: 0 },
    rejected,
  });
  const point = { speed: 1, policies: [q('cost', 1, 30), q('dynamo', 1.2, 0), q('llmd', 1.5, 30)] };
  const c = compareWithBestPeer(point, 'cost', ['dynamo', 'llmd'])!;
  assert.equal(c.rejectedOk, false);
  assert.equal(c.fewestPeerRejected, 0);
  const fair = compareWithBestPeer({ ...point, policies: [q('cost', 1, 0), q('dynamo', 1.2, 0)] }, 'cost', ['dynamo'])!;
  assert.equal(fair.rejectedOk, true);
  const table = renderSweepTables({ traces: [{ trace: 'x', points: [point] }] });
  assert.match(table, /\| no \(rejected 30 vs 0\) \|/);
});
