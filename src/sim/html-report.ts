import { writeFile } from 'node:fs/promises';
import { ENGINE_DEFAULTS } from '../engine-model/config.js';
import { comparisonWarnings, type ComparisonReport } from './compare.js';
import type { WorkerEvent } from './scenarios.js';
import { LLMD_SCRAPE_INTERVAL_MS } from '../core/policies/llmd.js';
import {
  DEFAULT_EVENT_DELAY_MS,
  DEFAULT_SCRAPE_INTERVAL_MS,
  type PolicyResult,
  type SimulationOptions,
} from './simulator.js';
import type { SweepReport, SweepTrace } from './sweep.js';

/** What produced a comparison, for the settings line of its report. */
export interface ReportSettings {
  /** The options every policy ran with. */
  simulation: Omit<SimulationOptions, 'policy' | 'label' | 'onScrape' | 'onRoute' | 'onProgress' | 'explainRoutes'>;
  /** Tokens per KV block (the trace's). */
  blockSize?: number;
}

/** Writes the self-contained HTML report of one comparison (inline SVG, no scripts, no external files). */
export async function writeHtmlReport(
  path: string,
  report: ComparisonReport,
  results: readonly PolicyResult[],
  settings?: ReportSettings,
): Promise<void> {
  await writeFile(path, renderHtmlReport(report, results, settings));
}

/**
 * Okabe & Ito's colour-blind-safe palette, each colour with its own dash pattern, so lines
 * stay distinguishable in grey print too. Each policy has its own colour and dash, the same
 * in every chart and report whichever policies are shown and in whatever order.
 */
const POLICY_STYLES: Readonly<Record<string, { color: string; dash: string }>> = {
  cost: { color: '#0072B2', dash: '' },
  seed: { color: '#D55E00', dash: '6 3' },
  dynamo: { color: '#009E73', dash: '2 3' },
  sglang: { color: '#CC79A7', dash: '8 3 2 3' },
  llmd: { color: '#E69F00', dash: '4 4' },
  'round-robin': { color: '#56B4E9', dash: '1 3' },
  'llmd-affinity': { color: '#000000', dash: '12 3 2 3' },
  smg: { color: '#8C6D31', dash: '6 2 2 2' },
};
/** Colours and dashes for other names, picked by a hash of the name (not its position). */
const OTHER_COLORS = ['#000000', '#8C6D31', '#999999', '#F0E442'];
const OTHER_DASHES = ['10 4', '3 3 8 3', '5 2', '2 2'];
const PREFIX_ONLY = '-prefix-only';

/** The colour and dash of a policy's lines: a `-prefix-only` variant keeps its policy's colour, long dashes. */
function policyStyle(name: string): { color: string; dash: string } {
  const own = POLICY_STYLES[name];
  if (own) return own;
  if (name.endsWith(PREFIX_ONLY)) {
    const base = POLICY_STYLES[name.slice(0, -PREFIX_ONLY.length)];
    if (base) return { color: base.color, dash: '10 4' };
  }
  let h = 0;
  for (const ch of name) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return { color: OTHER_COLORS[h % OTHER_COLORS.length], dash: OTHER_DASHES[(h >>> 4) % OTHER_DASHES.length] };
}
/** Workers get their own palette (Tableau 10), distinct from the policies' colours. */
const WORKER_COLORS = [
  '#4e79a7',
  '#f28e2b',
  '#e15759',
  '#76b7b2',
  '#59a14f',
  '#edc948',
  '#b07aa1',
  '#ff9da7',
  '#9c755f',
  '#bab0ac',
];

const STYLE = `body{font:14px system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}table{border-collapse:collapse}td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}svg{background:#fff;border:1px solid #e4e4e4;margin:0.5em 0.5em 0.5em 0}svg text{font:12px system-ui,sans-serif;fill:#333}.charts{display:flex;flex-wrap:wrap}.legend{display:flex;flex-wrap:wrap;gap:1.2em;margin:0.5em 0}.legend span{display:inline-flex;align-items:center;gap:0.4em}h2{margin-top:2em}.warning{background:#fff4e5;border-left:4px solid #D55E00;padding:0.5em 1em}h1{overflow-wrap:anywhere}code{white-space:nowrap}code.long{white-space:normal;overflow-wrap:anywhere}svg.chart{max-width:100%;height:auto}svg.wide{min-width:600px}.scroll{overflow-x:auto}@media (max-width:700px){body{margin:0.8em}}`;

/** Scenario counts that get a column of the table when some policy has one. */
const SCENARIO_COUNTS = ['cancelled', 'failed', 'retried', 'eventBatchesLost'] as const;
const SCENARIO_HEADERS: Record<(typeof SCENARIO_COUNTS)[number], string> = {
  cancelled: 'cancelled',
  failed: 'failed',
  retried: 'retried',
  eventBatchesLost: 'event batches lost',
};

export function renderHtmlReport(
  report: ComparisonReport,
  results: readonly PolicyResult[],
  settings?: ReportSettings,
): string {
  const counts = SCENARIO_COUNTS.filter((k) => report.policies.some((p) => (p[k] ?? 0) > 0));
  const rows = report.policies.map((p) => {
    // a policy that answered nothing has figures of 0 that measure nothing: shown as such
    const measured = (text: string) => (p.answered > 0 ? text : '—');
    const cells = [
      measured(`${(p.hitRate * 100).toFixed(1)}%`),
      measured(p.ttft.mean.toFixed(3)),
      measured(p.ttft.p50.toFixed(3)),
      measured(p.ttft.p90.toFixed(3)),
      measured(p.ttft.p99.toFixed(3)),
      measured(p.e2e.mean.toFixed(2)),
      measured(p.e2e.p99.toFixed(2)),
      String(p.throughputTokPerS),
      measured(p.loadImbalance.toFixed(3)),
      String(p.rejected ?? 0),
      ...counts.map((k) => String(p[k] ?? 0)),
    ];
    return `<tr><td>${esc(p.policy)}</td>${cells.map((c) => `<td>${c}</td>`).join('')}</tr>`;
  });
  const headers = [
    'policy',
    'hit rate',
    'TTFT mean s',
    'TTFT p50 s',
    'TTFT p90 s',
    'TTFT p99 s',
    'e2e mean s',
    'e2e p99 s',
    'tok/s',
    'imbalance',
    'rejected',
    ...counts.map((k) => SCENARIO_HEADERS[k]),
  ];
  const names = results.map((r) => r.policy);
  const own = report.policies
    .filter((p) => p.bounds)
    .map(
      (p) =>
        `<p>${esc(p.policy)}: bounds over the ${p.answered} requests it answered: hit rate ${(p.bounds!.infiniteCacheHitRate * 100).toFixed(1)}%, ideal mean TTFT ${p.bounds!.idealTtftMean.toFixed(3)} s.</p>`,
    );
  const warnings = comparisonWarnings(report).map(
    (w) =>
      `<p class="warning"><strong>Warning:</strong> ${esc(w.replace('(policies[].bounds)', '(the per-policy bounds above)'))}</p>`,
  );
  // one time axis for every KV chart, so that they compare at a glance
  let runEnd = 0;
  for (const r of results) runEnd = Math.max(runEnd, r.loadTimeline[r.loadTimeline.length - 1]?.t ?? 0);
  const sc = settings?.simulation.scenario;
  const workerEvents = [
    ...(sc?.fail ?? []).map((e) => ({ ...e, what: 'fails' })),
    ...(sc?.drain ?? []).map((e) => ({ ...e, what: 'drained' })),
  ].sort((a, b) => a.atMs - b.atMs);
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>contextforge-router simulation: ${esc(report.trace)}</title>
<style>${STYLE}</style>
</head><body>
<h1>Simulation of ${esc(report.trace)}</h1>
<p>${count(report.requests, 'request')} on ${count(report.workers, 'simulated worker')}, arrival speed ×${report.speed}. Bounds no policy can pass: infinite-cache hit rate ${(report.bounds.infiniteCacheHitRate * 100).toFixed(1)}%, ideal mean TTFT ${report.bounds.idealTtftMean.toFixed(3)} s.</p>
${settings ? settingsLine(settings) : ''}
${rejectedLine(report)}${[...own, ...warnings].join('\n')}
<div class="scroll"><table><thead><tr>${headers.map((h) => `<th>${h}</th>`).join('')}</tr></thead><tbody>
${rows.join('\n')}
</tbody></table></div>
<p>Hit rate and TTFT cover the requests each policy answered. imbalance: the busiest worker's busy time over the mean busy time of the workers (1 = even). A policy that answered no request shows —.${counts.length > 0 ? ' The scenario columns count requests cancelled by their client, failed with their worker, retried on another worker, and KV-event batches the router never received.' : ''}</p>
<h2>TTFT distribution (CDF, log scale)</h2>
${legend(names)}
${ttftCdf(results, report.requests)}
<p>Each curve is over ${allRequests(report.requests)} of the run: it levels off at the share its policy answered.</p>
<h2>KV usage per worker over time</h2>
<p>Each chart spans the longest run of all the policies, so that they read alike; a policy's lines end where its run ended.${workerEvents.length > 0 ? ' Dashed lines mark the workers failed or drained.' : ''}</p>
${results.map((r) => `<h3>${esc(r.policy)}</h3>${loadChart(r, runEnd, workerEvents)}`).join('\n')}
</body></html>
`;
}

/**
 * The requests every policy rejected alike, said in words (the table's column alone is easy to
 * miss, and the CDF levels off below 100% for them); unequal counts have their own warning.
 */
function rejectedLine(report: ComparisonReport): string {
  const counts = report.policies.map((p) => p.rejected ?? 0);
  const n = counts[0] ?? 0;
  if (n === 0 || counts.some((c) => c !== n)) return '';
  return `<p>${n} of the ${count(report.requests, 'request')} (${pctOf(n, report.requests)}) ${n === 1 ? 'was' : 'were'} rejected by ${report.policies.length === 1 ? 'the policy' : 'every policy'}: longer than an engine serves (<code>--max-model-len</code>, capped at its KV tokens), or no worker could take ${n === 1 ? 'it' : 'them'}. Hit rate and TTFT cover the requests answered.</p>\n`;
}

/** `w3@600s`, as the flags take it. */
function workerEvent(e: WorkerEvent): string {
  return `w${e.worker}@${e.atMs % 1000 === 0 ? `${e.atMs / 1000}s` : `${e.atMs}ms`}`;
}

/** The simulation settings as the `simulate` flags that give them, defaults resolved and marked. */
function settingsLine({ simulation: o, blockSize }: ReportSettings): string {
  const flag = (name: string, value: string | number, isDefault = false) =>
    `<code>${esc(`${name} ${value}`)}</code>${isDefault ? ' (default)' : ''}`;
  const sc = o.scenario ?? {};
  const kv = sc.workerKvTokens
    ? flag('--worker-kv-tokens', sc.workerKvTokens.join(','))
    : flag('--kv-tokens', o.engine?.kvTokens ?? ENGINE_DEFAULTS.kvTokens, o.engine?.kvTokens === undefined);
  // an engine serves no request longer than its KV capacity, whatever --max-model-len says
  const maxModelLen = o.engine?.maxModelLen ?? ENGINE_DEFAULTS.maxModelLen;
  const smallestKv = sc.workerKvTokens
    ? Math.min(...sc.workerKvTokens)
    : (o.engine?.kvTokens ?? ENGINE_DEFAULTS.kvTokens);
  const items = [
    flag('--workers', o.workers),
    flag('--speed', o.speed ?? 1, o.speed === undefined),
    kv,
    flag('--max-model-len', maxModelLen, o.engine?.maxModelLen === undefined) +
      (maxModelLen > smallestKv ? ` (capped at each worker's KV tokens, ${smallestKv} on the smallest)` : ''),
    flag(
      '--blend-recompute',
      o.engine?.blendRecompute ?? ENGINE_DEFAULTS.blendRecompute,
      o.engine?.blendRecompute === undefined,
    ),
    flag('--event-delay-ms', o.eventDelayMs ?? DEFAULT_EVENT_DELAY_MS, o.eventDelayMs === undefined),
    o.scrapeIntervalMs === undefined
      ? `<code>--scrape-interval-ms</code> ${DEFAULT_SCRAPE_INTERVAL_MS}, llmd ${o.router?.policyOptions?.llmd?.scrapeIntervalMs ?? LLMD_SCRAPE_INTERVAL_MS}, llmd-affinity ${o.router?.policyOptions?.['llmd-affinity']?.scrapeIntervalMs ?? LLMD_SCRAPE_INTERVAL_MS} (default)`
      : flag('--scrape-interval-ms', o.scrapeIntervalMs),
  ];
  const scenario = [
    ...(sc.fail?.length ? [flag('--fail', sc.fail.map(workerEvent).join(','))] : []),
    ...(sc.drain?.length ? [flag('--drain', sc.drain.map(workerEvent).join(','))] : []),
    ...(sc.closedLoop === true ? [`<code>--closed-loop</code>`] : []),
    ...(
      [
        ['--event-jitter-ms', sc.eventJitterMs],
        ['--event-loss', sc.eventLoss],
        ['--replicas', sc.replicas],
        ['--state-lag-ms', sc.stateLagMs],
        ['--cancel-rate', sc.cancelRate],
        ['--cancel-within-ms', sc.cancelWithinMs],
        ['--non-streaming-share', sc.nonStreamingShare],
        ['--scenario-seed', sc.seed],
      ] as const
    )
      .filter(([, v]) => v !== undefined)
      .map(([name, v]) => flag(name, v!)),
  ];
  const policyOptions = o.router?.policyOptions
    ? [`<code class="long">${esc(`--policy-options ${JSON.stringify(o.router.policyOptions)}`)}</code>`]
    : [];
  return `<p>Settings: ${[...items, ...policyOptions].join(', ')}; ${
    scenario.length > 0
      ? `scenario: ${scenario.join(', ')}`
      : 'no scenario (no failures, drains, cancellations, event loss or jitter; one router)'
  }${blockSize !== undefined ? `; KV block size ${blockSize} tokens (the trace's)` : ''}.</p>`;
}

/** What a sweep page needs besides the JSON: how it was run, and the requests of each trace's samples. */
export interface SweepMeta {
  workers: number;
  samples: number;
  split: string;
  /** Requests over all samples of each trace, by trace name (the figure `rejected` is out of). */
  requests?: Readonly<Record<string, number>>;
  /** Sessions were replayed closed-loop (ScenarioOptions.closedLoop). */
  closedLoop?: boolean;
}

/** The sweep of `bench:sim`: per trace, hit rate and TTFT (mean, p99) against arrival rate, with 95% bands. */
export function renderSweepReport(report: SweepReport, meta: SweepMeta): string {
  const sections = report.traces.map((t) => {
    const names = t.points[0]?.policies.map((p) => p.policy) ?? [];
    return `<h2>${esc(t.trace)}</h2>
${sweepRejections(t, meta)}
${legend(names)}
<div class="charts">${sweepChart(t, 'hitRate', 'hit rate (axis zoomed)')}${sweepChart(t, 'ttftMean', 'mean TTFT (s, log scale)')}${sweepChart(t, 'ttftP99', 'p99 TTFT (s, log scale)')}</div>`;
  });
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>contextforge-router: policies against arrival rate</title>
<style>${STYLE}</style>
</head><body>
<h1>Policies against arrival rate</h1>
<p>${meta.workers} simulated workers; each point is the mean over ${meta.samples} independent samples of the ${esc(meta.split)} split, the shaded band its 95% confidence interval. The x axis is the arrival-rate multiplier (×1 = the trace's recorded rate), log scale. Hit rate and TTFT cover the requests a policy answered, not those rejected. ${meta.closedLoop === true ? " Sessions were replayed closed-loop: a session's request is sent once its previous one has ended." : ''} Made by <code>npm run bench:sim${meta.closedLoop === true ? ' -- --closed-loop' : ''}</code>.</p>
${sections.join('\n')}
</body></html>
`;
}

/**
 * How many of a trace's requests were rejected (summed over the samples, as in the JSON), and a
 * warning at each rate where the policies rejected different numbers: their figures there
 * cover different requests.
 */
function sweepRejections(t: SweepTrace, meta: SweepMeta): string {
  const all = t.points.flatMap((p) => p.policies.map((q) => q.rejected));
  const [lo, hi] = extent(all);
  const total = meta.requests?.[t.trace];
  const warnings = t.points
    .filter((p) => p.policies.some((q) => q.rejected !== p.policies[0].rejected))
    .map(
      (p) =>
        `<p class="warning"><strong>Warning:</strong> at ×${p.speed} the policies rejected different numbers of requests (${esc(p.policies.map((q) => `${q.policy} ${q.rejected}`).join(', '))}): their hit rates and TTFTs there cover different requests.</p>`,
    );
  if (all.length === 0 || hi === 0) return `<p>No request rejected${total !== undefined ? ` (of ${total})` : ''}.</p>`;
  const count = lo === hi ? `${lo}` : `${lo}–${hi}`;
  const share = total ? ` (${lo === hi ? pctOf(lo, total) : `${pctOf(lo, total)}–${pctOf(hi, total)}`})` : '';
  const where = lo === hi ? ' at every rate, by every policy' : '';
  const line =
    total !== undefined
      ? `<p>${count} of ${total} requests${share} rejected (over the context limit)${where}, summed over the ${meta.samples} samples.</p>`
      : `<p>${count} requests rejected (over the context limit), summed over the ${meta.samples} samples${where}.</p>`;
  return [line, ...warnings].join('\n');
}

/** `1 request`, `2 requests`. */
const count = (n: number, noun: string) => `${n} ${noun}${n === 1 ? '' : 's'}`;
/** `all 24 requests`, `the 1 request`. */
const allRequests = (n: number) => (n === 1 ? 'the 1 request' : `all ${n} requests`);

const pctOf = (n: number, of: number) => `${((n / of) * 100).toFixed(1)}%`;

function legend(names: readonly string[]): string {
  const items = names.map((name) => {
    const { color: c, dash } = policyStyle(name);
    return `<span><svg width="36" height="14" style="border:0;margin:0"><line x1="2" x2="34" y1="7" y2="7" stroke="${c}" stroke-width="${name === 'cost' ? 3.5 : 2.5}" stroke-dasharray="${dash}"/><circle cx="18" cy="7" r="3.5" fill="${c}"/></svg>${esc(name)}</span>`;
  });
  return `<div class="legend">${items.join('')}</div>`;
}

/** Smallest and largest of a list without spreading it into arguments (lists can hold millions). */
function extent(values: Iterable<number>): [number, number] {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

/** Tick values on a log axis: powers of ten, with 2 and 5 between them when the range is short. */
function logTicks(lo: number, hi: number): number[] {
  const ticks: number[] = [];
  const span = Math.log10(hi / lo);
  const steps = span > 3 ? [1] : span > 1.2 ? [1, 3] : [1, 2, 5];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    for (const m of steps) {
      const v = m * 10 ** e;
      if (v >= lo * 0.999 && v <= hi * 1.001) ticks.push(v);
    }
  }
  return ticks;
}

/** About five round tick values covering [lo, hi] on a linear axis (the first at or below lo). */
function linearTicks(lo: number, hi: number): number[] {
  const raw = (hi - lo) / 5 || Math.abs(hi) / 5 || 1;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw)!;
  const ticks: number[] = [];
  for (let v = Math.floor(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(Number(v.toPrecision(6)));
  return ticks;
}

function fmtSeconds(v: number): string {
  return v >= 1 ? `${Number(v.toPrecision(3))} s` : `${Number((v * 1000).toPrecision(3))} ms`;
}

/** The CDF of each policy's TTFTs over all `requests` of the run: a policy that answered fewer levels off lower. */
function ttftCdf(results: readonly PolicyResult[], requests: number): string {
  const W = 900,
    H = 340,
    L = 64,
    R = 20,
    T = 20,
    B = 48;
  const [minT, maxT] = extent(
    results.flatMap((r) => r.outcomes.filter(Boolean).map((o) => o.ttft)).filter((x) => x > 0),
  );
  if (!Number.isFinite(minT)) return '<p>(no requests answered)</p>';
  // a range under ×5 (one request, or all alike) is widened about its middle: a log axis over it
  // would have no tick, and the curves would be squeezed against its ends
  let lo = Math.max(1e-3, minT) / 1.05;
  let hi = Math.max(lo, maxT) * 1.05;
  if (hi / lo < 5) {
    const mid = Math.sqrt(lo * hi);
    [lo, hi] = [mid / Math.sqrt(5), mid * Math.sqrt(5)];
  }
  const x = (v: number) =>
    L + ((Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo) || 1)) * (W - L - R);
  const y = (f: number) => H - B - f * (H - B - T);
  const total = Math.max(1, requests);
  const lines = results.map((r) => {
    const s = r.outcomes
      .filter(Boolean)
      .map((o) => o.ttft)
      .sort((a, b) => a - b);
    if (s.length === 0) return '';
    // a step up at each TTFT, from 0 (a few hundred steps at most: each spans `step` requests)
    const step = Math.max(1, Math.floor(s.length / 300));
    const pts: string[] = [];
    let level = y(0).toFixed(1);
    for (let k = Math.min(step, s.length) - 1; ; k = Math.min(k + step, s.length - 1)) {
      const at = x(s[k]).toFixed(1);
      pts.push(`${at},${level}`);
      level = y((k + 1) / total).toFixed(1);
      pts.push(`${at},${level}`);
      if (k === s.length - 1) break;
    }
    const { color, dash } = policyStyle(r.policy);
    return `<polyline fill="none" stroke="${color}" stroke-dasharray="${dash}" stroke-width="${r.policy === 'cost' ? 3 : 2}" points="${pts.join(' ')}"><title>${esc(r.policy)}</title></polyline>`;
  });
  const xt = logTicks(lo, hi).map(
    (v) =>
      `<line x1="${x(v)}" x2="${x(v)}" y1="${H - B}" y2="${T}" stroke="#eee"/><text x="${x(v)}" y="${H - B + 16}" text-anchor="middle">${fmtSeconds(v)}</text>`,
  );
  const yt = [0, 0.25, 0.5, 0.75, 1].map(
    (f) =>
      `<line x1="${L}" x2="${W - R}" y1="${y(f)}" y2="${y(f)}" stroke="#eee"/><text x="${L - 6}" y="${y(f) + 4}" text-anchor="end">${f * 100}%</text>`,
  );
  return `<div class="scroll"><svg width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" class="chart wide" xmlns="http://www.w3.org/2000/svg">${xt.join('')}${yt.join('')}<line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#333"/><line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#333"/><text x="${(L + W - R) / 2}" y="${H - 8}" text-anchor="middle">time to first token (log scale)</text><text transform="translate(14 ${(T + H - B) / 2}) rotate(-90)" text-anchor="middle">share of ${allRequests(requests)}</text>${lines.join('')}</svg></div>`;
}

function sweepChart(t: SweepTrace, key: 'hitRate' | 'ttftMean' | 'ttftP99', title: string): string {
  const W = 420,
    H = 320,
    L = 64,
    R = 16,
    T = 30,
    B = 50;
  const log = key !== 'hitRate';
  const speeds = t.points.map((p) => p.speed);
  if (speeds.length < 2) return '';
  const [sMin, sMax] = extent(speeds);
  // on a log axis a band reaching down to (or below) zero would stretch the axis over decades
  // the lines never visit: the axis follows the means (and the bands' tops), bands are clipped
  const values = t.points.flatMap((p) =>
    p.policies.flatMap((q) => (log ? [q[key], q[key] + q.ci95[key]] : [q[key] - q.ci95[key], q[key] + q.ci95[key]])),
  );
  const [vMin, vMax] = extent(values.filter((v) => !log || v > 0));
  // hit rates: a zoomed axis between round ticks (differences of a point matter); TTFT: log
  const pad = (vMax - vMin) * 0.08 || 0.01;
  const linear = log ? [] : linearTicks(Math.max(0, vMin - pad), Math.min(1, vMax + pad));
  const yLo = log ? Math.max(1e-3, vMin) / 1.6 : linear[0];
  const yHi = log ? Math.max(vMax, yLo * 10) * 1.15 : Math.max(linear[linear.length - 1], vMax);
  const fy = (v: number) => (log ? Math.log10(Math.max(v, yLo)) : v);
  const x = (s: number) =>
    L + ((Math.log10(s) - Math.log10(sMin)) / (Math.log10(sMax) - Math.log10(sMin) || 1)) * (W - L - R - 8) + 4;
  const y = (v: number) => H - B - ((fy(v) - fy(yLo)) / (fy(yHi) - fy(yLo) || 1)) * (H - B - T);
  const names = t.points[0].policies.map((p) => p.policy);
  const bands: string[] = [];
  const lines: string[] = [];
  names.forEach((name) => {
    const { color: c, dash } = policyStyle(name);
    const pts = t.points.map((p) => ({ s: p.speed, q: p.policies.find((q) => q.policy === name)! })).filter((p) => p.q);
    const upper = pts.map((p) => `${x(p.s).toFixed(1)},${y(p.q[key] + p.q.ci95[key]).toFixed(1)}`);
    const lower = pts
      .map((p) => `${x(p.s).toFixed(1)},${y(Math.max(p.q[key] - p.q.ci95[key], log ? yLo : 0)).toFixed(1)}`)
      .reverse();
    bands.push(`<polygon points="${[...upper, ...lower].join(' ')}" fill="${c}" fill-opacity="0.13" stroke="none"/>`);
    const line = pts.map((p) => `${x(p.s).toFixed(1)},${y(p.q[key]).toFixed(1)}`).join(' ');
    const marks = pts
      .map(
        (p) =>
          `<circle cx="${x(p.s).toFixed(1)}" cy="${y(p.q[key]).toFixed(1)}" r="3.5" fill="${c}"><title>${esc(name)} at ×${p.s}: ${key === 'hitRate' ? `${(p.q[key] * 100).toFixed(1)}% ± ${(p.q.ci95[key] * 100).toFixed(1)}` : `${fmtSeconds(p.q[key])} ± ${fmtSeconds(p.q.ci95[key])}`}</title></circle>`,
      )
      .join('');
    lines.push(
      `<polyline fill="none" stroke="${c}" stroke-width="${name === 'cost' ? 3 : 2}" stroke-dasharray="${dash}" points="${line}"><title>${esc(name)}</title></polyline>${marks}`,
    );
  });
  const yTicks = log ? logTicks(yLo, yHi) : linear;
  const yt = yTicks.map(
    (v) =>
      `<line x1="${L}" x2="${W - R}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" stroke="#eee"/><text x="${L - 6}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end">${log ? fmtSeconds(v) : `${Number((v * 100).toPrecision(3))}%`}</text>`,
  );
  const xt = speeds.map(
    (s) =>
      `<line x1="${x(s).toFixed(1)}" x2="${x(s).toFixed(1)}" y1="${H - B}" y2="${H - B + 4}" stroke="#333"/><text x="${x(s).toFixed(1)}" y="${H - B + 17}" text-anchor="middle">×${s}</text>`,
  );
  return `<svg width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" class="chart" xmlns="http://www.w3.org/2000/svg"><text x="${L}" y="18" style="font-weight:600;font-size:14px">${esc(title)}</text>${yt.join('')}${bands.join('')}${lines.join('')}<line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#333"/><line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#333"/>${xt.join('')}<text x="${(L + W - R) / 2}" y="${H - 10}" text-anchor="middle">arrival rate (× recorded, log scale)</text></svg>`;
}

/** KV usage per worker of one policy, on a time axis to `runEnd` s, failures and drains marked. */
function loadChart(r: PolicyResult, runEnd: number, events: ReadonlyArray<WorkerEvent & { what: string }>): string {
  const W = 900,
    H = 220,
    L = 56,
    R = 90,
    T = 12,
    B = 40;
  const tl = r.loadTimeline;
  if (tl.length < 2) return '<p>(no chart: the run ended before a second sample of KV usage was taken)</p>';
  // runEnd is the longest run's end, this one's included
  const tMax = runEnd || 1;
  const x = (t: number) => L + (t / tMax) * (W - L - R);
  const y = (u: number) => H - B - u * (H - B - T);
  const workers = tl[0].kvUsage.length;
  const lines: string[] = [];
  const names: string[] = [];
  for (let w = 0; w < workers; w++) {
    const c = WORKER_COLORS[w % WORKER_COLORS.length];
    const pts = tl.map((s) => `${x(s.t).toFixed(1)},${y(s.kvUsage[w]).toFixed(1)}`).join(' ');
    lines.push(
      `<polyline fill="none" stroke="${c}" stroke-width="1.3" points="${pts}"><title>w${w}</title></polyline>`,
    );
    if (w < 12)
      names.push(
        `<line x1="${W - R + 12}" x2="${W - R + 32}" y1="${T + 8 + w * 15}" y2="${T + 8 + w * 15}" stroke="${c}" stroke-width="2"/><text x="${W - R + 38}" y="${T + 12 + w * 15}">w${w}</text>`,
      );
  }
  const yt = [0, 0.25, 0.5, 0.75, 1].map(
    (u) =>
      `<line x1="${L}" x2="${W - R}" y1="${y(u)}" y2="${y(u)}" stroke="#eee"/><text x="${L - 6}" y="${y(u) + 4}" text-anchor="end">${u * 100}%</text>`,
  );
  const marks = events
    .filter((e) => e.atMs / 1000 <= tMax)
    .map((e, i) => {
      const at = x(e.atMs / 1000).toFixed(1);
      return `<line x1="${at}" x2="${at}" y1="${T}" y2="${H - B}" stroke="#555" stroke-dasharray="3 3"/><text x="${at}" y="${T + 10 + (i % 4) * 13}" dx="3" style="font-size:11px">w${e.worker} ${e.what}</text>`;
    });
  if (workers > 12) names.push(`<text x="${W - R + 12}" y="${T + 12 + 12 * 15}">+${workers - 12} more</text>`);
  const step = linearTicks(0, tMax);
  const xt = step
    .filter((t) => t <= tMax)
    .map((t) => `<text x="${x(t).toFixed(1)}" y="${H - B + 16}" text-anchor="middle">${t} s</text>`);
  return `<div class="scroll"><svg width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" class="chart wide" xmlns="http://www.w3.org/2000/svg">${yt.join('')}<line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#333"/><line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#333"/>${xt.join('')}<text x="${(L + W - R) / 2}" y="${H - 6}" text-anchor="middle">simulated time</text><text transform="translate(14 ${(T + H - B) / 2}) rotate(-90)" text-anchor="middle">KV usage</text>${lines.join('')}${marks.join('')}${names.join('')}</svg></div>`;
}

function esc(s: string): string {
  return s.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]!);
}
