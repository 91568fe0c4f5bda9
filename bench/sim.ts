/**
 * bench:sim — the standard comparison on the real traces (bench/traces, gzip copies):
 * 8 workers, every policy on the same requests, at light load and at the arrival scale
 * where round-robin's p99 TTFT reaches 5× its light-load value (found by bisection), plus a
 * sweep of arrival rates for the report's rate charts. Writes tables, JSON and HTML reports
 * under bench/results/ and prints a JSON summary with --json.
 *
 *   npm run bench:sim [-- --json] [--workers 8]
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { renderTable } from '../src/cli/commands/simulate.js';
import { pooledLruHitRate } from '../src/sim/bounds.js';
import { comparePolicies, type ComparisonReport } from '../src/sim/compare.js';
import { ENGINE_DEFAULTS } from '../src/engine-model/engine-model.js';
import { renderHtmlReport, type SweepPoint } from '../src/sim/html-report.js';
import { loadTrace } from '../src/sim/load-trace.js';
import { simulate } from '../src/sim/simulator.js';
import type { TraceRequest } from '../src/sim/trace.js';
import { intFlag, parseFlags, round } from './stats.js';

const flags = parseFlags(process.argv.slice(2));
const WORKERS = intFlag(flags, 'workers', 8);
const OUT = 'bench/results';
mkdirSync(OUT, { recursive: true });

interface Study {
  name: string;
  path: string;
  lightSpeed: number;
  maxSpeed: number;
  policies: string[];
}
const studies: Study[] = [
  {
    name: 'mooncake-conversation',
    path: 'bench/traces/conversation_trace.jsonl.gz',
    lightSpeed: 0.25,
    maxSpeed: 4,
    policies: ['cost', 'seed', 'dynamo', 'sglang', 'llmd', 'round-robin'],
  },
  {
    // one week at 0.012 req/s is idle for 8 engines: light load is 50× the recorded rate
    name: 'ragpulse',
    path: 'bench/traces/ragpulse',
    lightSpeed: 50,
    maxSpeed: 2000,
    policies: ['cost', 'cost-prefix-only', 'seed', 'dynamo', 'sglang', 'llmd', 'round-robin'],
  },
];

function p99(trace: readonly TraceRequest[], speed: number): number {
  return simulate(trace, { workers: WORKERS, policy: 'round-robin', speed }).ttft.p99;
}

/** The arrival scale at which round-robin's p99 TTFT reaches 5× its light-load value. */
function stressSpeed(trace: readonly TraceRequest[], light: number, max: number): number {
  const target = 5 * p99(trace, light);
  let lo = light;
  let hi = max;
  if (p99(trace, hi) < target) return hi;
  for (let i = 0; i < 10; i++) {
    const mid = Math.sqrt(lo * hi);
    if (p99(trace, mid) >= target) hi = mid;
    else lo = mid;
  }
  return round(hi, 3);
}

const summary: Record<string, unknown> = {};
for (const study of studies) {
  const { name, requests } = await loadTrace(study.path);
  const started = performance.now();
  const stress = stressSpeed(requests, study.lightSpeed, study.maxSpeed);
  const runs: Record<string, ComparisonReport> = {};
  const results: Record<string, ReturnType<typeof comparePolicies>['results']> = {};
  for (const [label, speed] of [['light', study.lightSpeed], ['stress', stress]] as const) {
    const c = comparePolicies(name, requests, study.policies, { workers: WORKERS, speed });
    runs[label] = c.report;
    results[label] = c.results;
    writeFileSync(`${OUT}/${study.name}-${label}.json`, JSON.stringify(c.report, null, 1) + '\n');
    writeFileSync(`${OUT}/${study.name}-${label}.txt`, renderTable(c.report));
  }
  // hit rate and TTFT against arrival rate
  const sweep: SweepPoint[] = [];
  for (const f of [1, 2, 4, 8]) {
    const speed = round(study.lightSpeed + ((stress - study.lightSpeed) * (f - 1)) / 7, 3);
    const c = comparePolicies(name, requests, study.policies, { workers: WORKERS, speed });
    sweep.push({ speed, policies: c.report.policies.map((p) => ({ policy: p.policy, hitRate: p.hitRate, ttftMean: p.ttft.mean })) });
  }
  writeFileSync(`${OUT}/${study.name}-report.html`, renderHtmlReport(runs.stress, results.stress, sweep));
  const pooled = round(pooledLruHitRate(requests, WORKERS * ENGINE_DEFAULTS.kvTokens), 4);
  summary[study.name] = { lightSpeed: study.lightSpeed, stressSpeed: stress, pooledLruHitRate: pooled, seconds: round((performance.now() - started) / 1000, 1), light: runs.light, stress: runs.stress };
  if (!flags.has('json')) process.stdout.write(`\n${study.name}: one LRU cache of the fleet's whole KV (${WORKERS} × ${ENGINE_DEFAULTS.kvTokens} tokens) would hit ${(pooled * 100).toFixed(1)}%\n`);
  if (!flags.has('json')) process.stdout.write(`\n== ${study.name}: light (×${study.lightSpeed})\n${renderTable(runs.light)}\n== ${study.name}: stress (×${stress})\n${renderTable(runs.stress)}`);
}
if (flags.has('json')) process.stdout.write(`${JSON.stringify(summary)}\n`);
else process.stdout.write(`\nwritten under ${OUT}/\n`);
