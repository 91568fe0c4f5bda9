import { writeFile } from 'node:fs/promises';
import type { ComparisonReport } from './compare.js';
import type { PolicyResult } from './simulator.js';

/** Results of every policy at one arrival scale, for the rate charts. */
export interface SweepPoint {
  speed: number;
  policies: Array<{ policy: string; hitRate: number; ttftMean: number }>;
}

/** Writes the self-contained HTML report (inline SVG, no scripts, no external files). */
export async function writeHtmlReport(path: string, report: ComparisonReport, results: readonly PolicyResult[], sweep?: readonly SweepPoint[]): Promise<void> {
  await writeFile(path, renderHtmlReport(report, results, sweep));
}

const COLORS = ['#1b6ac9', '#d1495b', '#2a9d55', '#e09f3e', '#7b4fb8', '#4a4a4a', '#0097a7', '#8d6e63', '#c2185b', '#689f38'];

export function renderHtmlReport(report: ComparisonReport, results: readonly PolicyResult[], sweep?: readonly SweepPoint[]): string {
  const rows = report.policies
    .map((p) => `<tr><td>${esc(p.policy)}</td><td>${(p.hitRate * 100).toFixed(1)}%</td><td>${p.ttft.mean.toFixed(3)}</td><td>${p.ttft.p50.toFixed(3)}</td><td>${p.ttft.p90.toFixed(3)}</td><td>${p.ttft.p99.toFixed(3)}</td><td>${p.e2e.mean.toFixed(2)}</td><td>${p.e2e.p99.toFixed(2)}</td><td>${p.throughputTokPerS}</td><td>${p.loadImbalance.toFixed(3)}</td></tr>`)
    .join('\n');
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>contextforge-router simulation: ${esc(report.trace)}</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}svg{background:#fafafa;margin:1em 0}h2{margin-top:2em}</style>
</head><body>
<h1>Simulation of ${esc(report.trace)}</h1>
<p>${report.requests} requests on ${report.workers} simulated workers, arrival speed ×${report.speed}. Bounds no policy can pass: infinite-cache hit rate ${(report.bounds.infiniteCacheHitRate * 100).toFixed(1)}%, ideal mean TTFT ${report.bounds.idealTtftMean.toFixed(3)} s.</p>
<table><thead><tr><th>policy</th><th>hit rate</th><th>TTFT mean s</th><th>p50</th><th>p90</th><th>p99</th><th>e2e mean s</th><th>e2e p99</th><th>tok/s</th><th>imbalance</th></tr></thead><tbody>
${rows}
</tbody></table>
<h2>TTFT distribution (CDF, log scale)</h2>
${ttftCdf(results)}
${sweep && sweep.length > 1 ? `<h2>Hit rate and mean TTFT against arrival rate</h2>${sweepChart(sweep, 'hitRate', 'hit rate')}${sweepChart(sweep, 'ttftMean', 'mean TTFT (s, log)')}` : ''}
<h2>KV usage per worker over time</h2>
${results.map((r) => `<h3>${esc(r.policy)}</h3>${loadChart(r)}`).join('\n')}
</body></html>
`;
}

function ttftCdf(results: readonly PolicyResult[]): string {
  const W = 900, H = 320, L = 60, B = 40;
  const all = results.flatMap((r) => r.outcomes.map((o) => o.ttft)).filter((x) => x > 0);
  const lo = Math.log10(Math.max(1e-3, Math.min(...all)));
  const hi = Math.log10(Math.max(...all) * 1.01);
  const x = (v: number) => L + ((Math.log10(Math.max(v, 1e-3)) - lo) / (hi - lo || 1)) * (W - L - 20);
  const y = (f: number) => H - B - f * (H - B - 20);
  const lines = results.map((r, i) => {
    const s = r.outcomes.map((o) => o.ttft).sort((a, b) => a - b);
    const step = Math.max(1, Math.floor(s.length / 300));
    const pts: string[] = [];
    for (let k = 0; k < s.length; k += step) pts.push(`${x(s[k]).toFixed(1)},${y((k + 1) / s.length).toFixed(1)}`);
    pts.push(`${x(s[s.length - 1]).toFixed(1)},${y(1).toFixed(1)}`);
    return `<polyline fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="2" points="${pts.join(' ')}"/><text x="${W - 150}" y="${30 + i * 16}" fill="${COLORS[i % COLORS.length]}">${esc(r.policy)}</text>`;
  });
  const ticks: string[] = [];
  for (let e = Math.ceil(lo); e <= Math.floor(hi); e++) ticks.push(`<line x1="${x(10 ** e)}" x2="${x(10 ** e)}" y1="${H - B}" y2="20" stroke="#ddd"/><text x="${x(10 ** e)}" y="${H - B + 16}" text-anchor="middle">${10 ** e} s</text>`);
  return `<svg width="${W}" height="${H}" xmlns="http://www.w3.org/2000/svg">${ticks.join('')}<line x1="${L}" x2="${W - 20}" y1="${H - B}" y2="${H - B}" stroke="#333"/><line x1="${L}" x2="${L}" y1="20" y2="${H - B}" stroke="#333"/><text x="10" y="${y(1) + 4}">100%</text><text x="10" y="${y(0.5) + 4}">50%</text>${lines.join('')}</svg>`;
}

function sweepChart(sweep: readonly SweepPoint[], key: 'hitRate' | 'ttftMean', label: string): string {
  const W = 900, H = 260, L = 60, B = 40;
  const log = key === 'ttftMean';
  const f = (v: number) => (log ? Math.log10(Math.max(v, 1e-3)) : v);
  const values = sweep.flatMap((p) => p.policies.map((q) => f(q[key])));
  const lo = log ? Math.min(...values) : 0;
  const hi = Math.max(...values) * (log ? 1 : 1.05) + (log ? 0.1 : 0);
  const sMin = sweep[0].speed, sMax = sweep[sweep.length - 1].speed;
  const x = (s: number) => L + ((s - sMin) / (sMax - sMin || 1)) * (W - L - 160);
  const y = (v: number) => H - B - ((f(v) - lo) / (hi - lo || 1)) * (H - B - 20);
  const names = sweep[0].policies.map((p) => p.policy);
  const lines = names.map((name, i) => {
    const pts = sweep.map((p) => `${x(p.speed).toFixed(1)},${y(p.policies.find((q) => q.policy === name)![key]).toFixed(1)}`).join(' ');
    return `<polyline fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="2" points="${pts}"/><text x="${W - 140}" y="${30 + i * 16}" fill="${COLORS[i % COLORS.length]}">${esc(name)}</text>`;
  });
  const ticks = sweep.map((p) => `<text x="${x(p.speed)}" y="${H - B + 16}" text-anchor="middle">×${p.speed}</text>`);
  return `<svg width="${W}" height="${H}" xmlns="http://www.w3.org/2000/svg"><text x="10" y="14">${esc(label)}</text><line x1="${L}" x2="${W - 160}" y1="${H - B}" y2="${H - B}" stroke="#333"/><line x1="${L}" x2="${L}" y1="20" y2="${H - B}" stroke="#333"/>${ticks.join('')}${lines.join('')}</svg>`;
}

function loadChart(r: PolicyResult): string {
  const W = 900, H = 200, L = 40, B = 30;
  const tl = r.loadTimeline;
  if (tl.length < 2) return '<p>(too short to chart)</p>';
  const tMax = tl[tl.length - 1].t || 1;
  const x = (t: number) => L + (t / tMax) * (W - L - 20);
  const y = (u: number) => H - B - u * (H - B - 10);
  const workers = tl[0].kvUsage.length;
  const lines: string[] = [];
  for (let w = 0; w < workers; w++) {
    const pts = tl.map((s) => `${x(s.t).toFixed(1)},${y(s.kvUsage[w]).toFixed(1)}`).join(' ');
    lines.push(`<polyline fill="none" stroke="${COLORS[w % COLORS.length]}" stroke-width="1" points="${pts}"/>`);
  }
  return `<svg width="${W}" height="${H}" xmlns="http://www.w3.org/2000/svg"><line x1="${L}" x2="${W - 20}" y1="${H - B}" y2="${H - B}" stroke="#333"/><text x="5" y="${y(1) + 4}">1.0</text><text x="5" y="${y(0) + 4}">0</text><text x="${W - 80}" y="${H - 8}">${tMax.toFixed(0)} s</text>${lines.join('')}</svg>`;
}

function esc(s: string): string {
  return s.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]!);
}
