import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { comparePolicies } from '../../src/sim/compare.js';
import { renderHtmlReport, renderSweepReport } from '../../src/sim/html-report.js';
import type { SweepReport } from '../../src/sim/sweep.js';
import type { TraceRequest } from '../../src/sim/trace.js';

/**
 * Every even request is a long prompt (1,500 tokens) that only the big worker holds: round-robin
 * sends each of them to the small worker, which refuses it, so it answers exactly half.
 */
const trace: TraceRequest[] = Array.from({ length: 24 }, (_, i) => ({
  index: i,
  timestamp: i * 200,
  inputLength: i % 2 === 0 ? 1500 : 300,
  outputLength: 10,
  hashIds: Array.from({ length: i % 2 === 0 ? 23 : 4 }, (_, k) => (i % 2 === 0 ? k + 1 : 1000 * i + k)),
  blockSize: 64,
}));
const options = { workers: 2, scenario: { workerKvTokens: [1000, 2_000_000] } };

/** The points of the polyline titled `policy` in the TTFT CDF. */
function cdfPoints(html: string, policy: string): Array<[number, number]> {
  const cdf = html.slice(html.indexOf('TTFT distribution'), html.indexOf('KV usage per worker'));
  const m = new RegExp(`points="([^"]*)"><title>${policy}</title>`).exec(cdf);
  assert.ok(m, `no CDF line for ${policy}`);
  return m[1].split(' ').map((p) => p.split(',').map(Number) as [number, number]);
}

/** The y coordinate of a tick label (e.g. "50%") on the CDF's y axis. */
function cdfTickY(html: string, label: string): number {
  const cdf = html.slice(html.indexOf('TTFT distribution'), html.indexOf('KV usage per worker'));
  const m = new RegExp(`<text x="[\\d.]+" y="([\\d.]+)" text-anchor="end">${label}</text>`).exec(cdf);
  assert.ok(m, `no tick ${label}`);
  return Number(m[1]) - 4;
}

/** The stroke colour and dash of the line titled `policy` (the first one in `html`). */
function lineStyle(html: string, policy: string): string {
  const m = new RegExp(
    `<polyline fill="none" stroke="(#\\w+)"[^>]*?stroke-dasharray="([^"]*)"[^>]*><title>${policy}</title>`,
  ).exec(html);
  assert.ok(m, `no line for ${policy}`);
  return `${m[1]} ${m[2]}`;
}

/** A policy's figures at one point of a sweep, the same for every policy, `rejected` of its requests refused. */
const figures = (policy: string, rejected = 0) => ({
  policy,
  hitRate: 0.5,
  ttftMean: 1,
  ttftP99: 2,
  ci95: { hitRate: 0.01, ttftMean: 0.1, ttftP99: 0.2 },
  rejected,
});

describe('the run report', () => {
  const { report, results } = comparePolicies('half', trace, ['cost', 'round-robin'], options);

  test('the TTFT CDF is over every request of the run: a policy that answered half levels off at 50%', () => {
    assert.equal(report.policies[1].answered, 12, 'round-robin answers the short half');
    assert.equal(report.policies[0].answered, 24);
    const html = renderHtmlReport(report, results);
    const rr = cdfPoints(html, 'round-robin');
    const cost = cdfPoints(html, 'cost');
    assert.equal(rr[rr.length - 1][1], cdfTickY(html, '50%'));
    assert.equal(cost[cost.length - 1][1], cdfTickY(html, '100%'));
    assert.match(html, /share of all 24 requests/);
  });

  test('a one-request run: counts read as one, the CDF has ticks and rises from 0% to 100%', () => {
    const one = comparePolicies('one', trace.slice(1, 2), ['cost', 'round-robin'], { workers: 1 });
    const html = renderHtmlReport(one.report, one.results);
    assert.match(html, /<p>1 request on 1 simulated worker,/);
    assert.match(html, /share of the 1 request</);
    assert.doesNotMatch(html, /\b1 (requests|workers)\b/);
    const cdf = html.slice(html.indexOf('TTFT distribution'), html.indexOf('KV usage per worker'));
    const ticks = [...cdf.matchAll(/text-anchor="middle">([\d.]+ m?s)<\/text>/g)].map((m) => m[1]);
    assert.ok(ticks.length >= 2, `time ticks: ${ticks.join(', ')}`);
    const pts = cdfPoints(html, 'cost');
    assert.equal(pts[0][1], cdfTickY(html, '0%'), 'the step starts at 0%');
    assert.equal(pts[pts.length - 1][1], cdfTickY(html, '100%'));
    assert.equal(pts[0][0], pts[pts.length - 1][0], 'one TTFT: one vertical step');
  });

  test('the CDF is a staircase: flat between TTFTs, rising at each', () => {
    const html = renderHtmlReport(report, results);
    const pts = cdfPoints(html, 'cost');
    assert.equal(pts[0][1], cdfTickY(html, '0%'));
    for (let k = 1; k < pts.length; k++)
      assert.ok(pts[k][0] === pts[k - 1][0] || pts[k][1] === pts[k - 1][1], `segment ${k} is not diagonal`);
  });

  test('the KV charts share one time axis, mark failures and drains, and say why one is missing', () => {
    const sample = (t: number) => ({ t, kvUsage: [0.5, 0.25] });
    const long = { ...results[0], loadTimeline: [0, 50, 100, 150].map(sample) };
    const short = { ...results[1], loadTimeline: [0, 20].map(sample) };
    const brief = { ...results[1], policy: 'brief', loadTimeline: [sample(0)] };
    const scenario = { fail: [{ worker: 1, atMs: 60_000 }], drain: [{ worker: 0, atMs: 30_000 }] };
    const html = renderHtmlReport(report, [long, short, brief], { simulation: { workers: 2, scenario } });
    const charts = html.split('<h3>').slice(1);
    const ticks = (chart: string) => [...chart.matchAll(/text-anchor="middle">(\d+ s)<\/text>/g)].map((m) => m[1]);
    assert.deepEqual(ticks(charts[1]), ticks(charts[0]), 'the shorter run is drawn on the same axis');
    assert.ok(ticks(charts[0]).includes('150 s'), ticks(charts[0]).join(', '));
    for (const chart of charts.slice(0, 2)) {
      assert.match(chart, />w1 fails<\/text>/);
      assert.match(chart, />w0 drained<\/text>/);
    }
    assert.match(charts[2], /the run ended before a second sample of KV usage/);
    assert.doesNotMatch(html, /too short to chart/);
  });

  test('requests every policy rejected are said in words, with their share', () => {
    // 1,500-token prompts over a 1,000-token context: all 12 refused, by both policies
    const small = { workers: 2, engine: { maxModelLen: 1000 } };
    const both = comparePolicies('small', trace, ['cost', 'round-robin'], small);
    assert.deepEqual(
      both.report.policies.map((p) => p.rejected),
      [12, 12],
    );
    const html = renderHtmlReport(both.report, both.results);
    assert.match(
      html,
      /<p>12 of the 24 requests \(50\.0%\) were rejected by every policy: longer than an engine serves/,
    );
    // unequal rejections have their warning instead; none, no line
    assert.doesNotMatch(renderHtmlReport(report, results), /rejected by every policy/);
    const none = comparePolicies('none', trace.slice(1, 4), ['cost'], { workers: 2 });
    assert.doesNotMatch(renderHtmlReport(none.report, none.results), /were rejected|was rejected/);
  });

  test('the report names the settings that produced it and the scenario counts', () => {
    const scenario = {
      workerKvTokens: [1000, 2_000_000],
      fail: [{ worker: 1, atMs: 1000 }],
      cancelRate: 0.3,
      cancelWithinMs: 5,
      eventLoss: 0.5,
    };
    const run = { workers: 2, speed: 2, engine: { maxModelLen: 4096 }, scenario };
    const c = comparePolicies('scenario', trace, ['cost', 'round-robin'], run);
    const html = renderHtmlReport(c.report, c.results, { simulation: run, blockSize: 64 });
    for (const flag of [
      '--workers 2',
      '--speed 2',
      '--worker-kv-tokens 1000,2000000',
      '--max-model-len 4096',
      '--fail w1@1s',
      '--cancel-within-ms 5',
      '--cancel-rate 0.3',
      '--event-loss 0.5',
      '--event-delay-ms 50',
    ])
      assert.ok(html.includes(`<code>${flag}</code>`), `settings name ${flag}`);
    assert.match(html, /KV block size 64 tokens/);
    const cost = c.report.policies[0];
    assert.ok(cost.cancelled > 0 && cost.failed > 0, 'the scenario cancels and fails requests');
    const row = /<tr><td>cost<\/td>(.*?)<\/tr>/.exec(html)![1];
    const cells = [...row.matchAll(/<td>([^<]*)<\/td>/g)].map((m) => m[1]);
    assert.match(html, /<th>rejected<\/th><th>cancelled<\/th><th>failed<\/th><th>event batches lost<\/th><\/tr>/);
    assert.deepEqual(cells.slice(-4), [cost.rejected, cost.cancelled, cost.failed, cost.eventBatchesLost].map(String));
    // a run with no scenario has no such columns, and says so
    const plain = renderHtmlReport(report, results, { simulation: options, blockSize: 64 });
    assert.doesNotMatch(plain, /<th>cancelled<\/th>|<th>failed<\/th>|<th>retried<\/th>/);
    assert.match(plain, /<code>--kv-tokens|<code>--worker-kv-tokens 1000,2000000<\/code>/);
    assert.match(plain, /no failures, drains, cancellations/);
  });

  test('headers say metric and unit, imbalance is defined, a policy that answered nothing shows dashes', () => {
    const none = comparePolicies('none', trace.slice(0, 3), ['cost'], {
      workers: 1,
      scenario: { fail: [{ worker: 0, atMs: 0 }] },
    });
    const html = renderHtmlReport(none.report, none.results);
    for (const h of ['TTFT mean s', 'TTFT p50 s', 'TTFT p90 s', 'TTFT p99 s', 'e2e mean s', 'e2e p99 s'])
      assert.ok(html.includes(`<th>${h}</th>`), h);
    assert.match(html, /imbalance: the busiest worker's busy time over the mean/);
    const row = /<tr><td>cost<\/td>(.*?)<\/tr>/.exec(html)![1];
    assert.equal((row.match(/<td>—<\/td>/g) ?? []).length, 8, `hit rate, TTFT ×4, e2e ×2, imbalance: ${row}`);
    const uneven = renderHtmlReport(report, results);
    assert.doesNotMatch(uneven, /policies\[\]\.bounds/);
    assert.match(uneven, /the per-policy bounds above/);
  });

  test("a policy's colour and dash are its own, whatever its position", () => {
    const swapped = comparePolicies('half', trace, ['round-robin', 'cost'], options);
    const a = renderHtmlReport(report, results);
    const b = renderHtmlReport(swapped.report, swapped.results);
    for (const p of ['cost', 'round-robin']) assert.equal(lineStyle(a, p), lineStyle(b, p), p);
    assert.notEqual(lineStyle(a, 'cost'), lineStyle(a, 'round-robin'));
    // and the same in the sweep charts
    const sweep = renderSweepReport(
      {
        traces: [
          {
            trace: 't',
            points: [1, 2].map((speed) => ({
              speed,
              policies: [figures('llmd'), figures('round-robin'), figures('cost')],
            })),
          },
        ],
      },
      { workers: 8, samples: 5, split: 'evaluation' },
    );
    for (const p of ['cost', 'round-robin']) assert.equal(lineStyle(sweep, p), lineStyle(a, p), p);
  });

  test('every peer has a fixed style of its own: no two policies share a colour and a dash', () => {
    const peers = ['cost', 'seed', 'dynamo', 'sglang', 'smg', 'llmd', 'llmd-affinity', 'round-robin'];
    const sweep = renderSweepReport(
      { traces: [{ trace: 't', points: [1, 2].map((speed) => ({ speed, policies: peers.map((p) => figures(p)) })) }] },
      { workers: 8, samples: 5, split: 'evaluation' },
    );
    const styles = peers.map((p) => lineStyle(sweep, p));
    assert.equal(new Set(styles.map((s) => s.split(' ')[0])).size, peers.length, styles.join(', '));
    assert.equal(new Set(styles.map((s) => s.slice(8))).size, peers.length, styles.join(', '));
    assert.equal(lineStyle(sweep, 'smg'), '#8C6D31 6 2 2 2');
  });
});

describe('the sweep report', () => {
  const meta = { workers: 8, samples: 5, split: 'evaluation', requests: { 'agentic:10': 3000, ok: 500 } };

  test('each trace says how many requests were rejected', () => {
    const report: SweepReport = {
      traces: [
        {
          trace: 'agentic:10',
          points: [1, 2].map((speed) => ({ speed, policies: [figures('cost', 997), figures('dynamo', 997)] })),
        },
        {
          trace: 'ok',
          points: [1, 2].map((speed) => ({ speed, policies: [figures('cost', 0), figures('dynamo', 0)] })),
        },
      ],
    };
    const html = renderSweepReport(report, meta);
    assert.match(html, /997 of 3000 requests \(33\.2%\) rejected \(over the context limit\)/);
    assert.match(html, /<h2>ok<\/h2>\s*<p>No request rejected/);
    assert.doesNotMatch(html, /class="warning"/);
  });

  test('rejection counts that change with the rate are given as a range, and unequal ones are warned of', () => {
    const report: SweepReport = {
      traces: [
        {
          trace: 'agentic:10',
          points: [
            { speed: 1, policies: [figures('cost', 990), figures('dynamo', 990)] },
            { speed: 2, policies: [figures('cost', 997), figures('dynamo', 1200)] },
          ],
        },
      ],
    };
    const html = renderSweepReport(report, meta);
    assert.match(html, /990–1200 of 3000 requests/);
    assert.match(
      html,
      /class="warning"><strong>Warning:<\/strong> at ×2 the policies rejected different numbers of requests \(cost 997, dynamo 1200\)/,
    );
  });

  test('without the request count the rejections are still named', () => {
    const report: SweepReport = {
      traces: [{ trace: 'x', points: [1, 2].map((speed) => ({ speed, policies: [figures('cost', 7)] })) }],
    };
    const html = renderSweepReport(report, { workers: 8, samples: 5, split: 'evaluation' });
    assert.match(html, /7 requests rejected \(over the context limit\), summed over the 5 samples/);
  });
});
