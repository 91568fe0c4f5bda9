/**
 * bench:held-out — every policy on the generated shapes no default was chosen on, the runs the
 * README and docs/routing.md §7 quote outside the sweep: hot shared prefixes on workers with
 * little KV (bench/traces/hot-prefixes/), long agent sessions among short chats
 * (bench/traces/long-sessions/), many tenants' system prompts under short sessions on workers
 * with little KV (bench/traces/tenants/), coding-agent loops that outgrow their worker
 * (bench/traces/agent-loops/) and SGLang's generated-shared-prefix benchmark from a cold start
 * (bench/traces/shared-prefix/). Each run is what `contextforge-router simulate --trace FILE
 * --speed S --kv-tokens K --max-model-len M --format json` prints for it, one run each (the
 * simulator is deterministic), written to bench/results/held-out.json with the run's settings.
 *
 *   npm run bench:held-out [-- --out bench/results/held-out.json]
 *                          [--only hot-prefixes,long-sessions,tenants,agent-loops,shared-prefix,shared-prefix-8x128]
 *                          [--policies cost,llmd-affinity,... --out FILE]
 *
 * --policies other than the defaults, and --only, need --out, so the README's file keeps its policies and runs.
 */
import { writeOutputFile } from '../src/cli/output-file.js';
import { comparePolicies, type ComparisonReport } from '../src/sim/compare.js';
import { loadTrace } from '../src/sim/load-trace.js';
import { KNOWN_POLICIES, TABLE_POLICIES } from './policies.js';
import { benchFlags, benchOutputFile, usageError } from './stats.js';

interface HeldOutRun {
  shape: string;
  trace: string;
  speed: number;
  kvTokens: number;
  maxModelLen?: number;
}

const RUNS: HeldOutRun[] = [
  ...[
    [1, 2, 40_000],
    [2, 2, 40_000],
    [1, 2, 60_000],
    [1, 3, 100_000],
    [2, 2, 60_000],
    [2, 3, 100_000],
    [1, 1, 300_000],
    [1, 3, 300_000],
  ].map(([n, speed, kvTokens]) => ({
    shape: 'hot-prefixes',
    trace: `bench/traces/hot-prefixes/hot-prefixes.${n}.jsonl.gz`,
    speed,
    kvTokens,
  })),
  ...[1, 2, 3, 4, 5, 6].map((n) => ({
    shape: 'long-sessions',
    trace: `bench/traces/long-sessions/long-sessions.${n}.jsonl.gz`,
    speed: 1,
    kvTokens: 450_000,
    maxModelLen: 450_000,
  })),
  // seeds 3-6 and the agent loops' 4-9 were added after the lateness was chosen on 1-2 and 1-3
  ...[1, 2, 3, 4, 5, 6]
    .flatMap((n) => [1, 2, 3].map((speed) => [n, speed]))
    .map(([n, speed]) => ({
      shape: 'tenants',
      trace: `bench/traces/tenants/tenants.${n}.jsonl.gz`,
      speed,
      kvTokens: 60_000,
    })),
  // SGLang's generated-shared-prefix benchmark from a cold start, at 100, 200 and 300 requests a
  // second (added 2026-12-06, after the policy: no default was chosen on it)
  ...['shared-prefix', 'shared-prefix-8x128']
    .flatMap((name) => [1, 2, 3].flatMap((n) => [1, 2, 3].map((speed) => ({ name, n, speed }))))
    .map(({ name, n, speed }) => ({
      shape: name,
      trace: `bench/traces/shared-prefix/${name}.${n}.jsonl.gz`,
      speed,
      kvTokens: 300_000,
    })),
  ...[1, 2, 3, 4, 5, 6, 7, 8, 9].map((n) => ({
    shape: 'agent-loops',
    trace: `bench/traces/agent-loops/agent-loops.${n}.jsonl.gz`,
    speed: 1,
    kvTokens: 300_000,
    maxModelLen: 150_000,
  })),
];

const flags = benchFlags(process.argv.slice(2), { out: 'value', only: 'value', policies: 'value' });
const POLICIES = flags.has('policies') ? String(flags.get('policies')).split(',') : TABLE_POLICIES;
if (POLICIES.some((p) => !KNOWN_POLICIES.includes(p)) || new Set(POLICIES).size !== POLICIES.length)
  usageError(`--policies must name some of ${KNOWN_POLICIES.join(', ')}, each once`);
// bench/results/held-out.json holds the README's tables: another set of policies goes elsewhere
if (POLICIES.join(',') !== TABLE_POLICIES.join(',') && !flags.has('out'))
  usageError(
    `--policies other than the defaults (${TABLE_POLICIES.join(',')}) needs --out: ` +
      'bench/results/held-out.json holds the README tables',
  );
// and so do some of its runs alone
if (flags.has('only') && !flags.has('out'))
  usageError('--only needs --out: bench/results/held-out.json holds the README tables, every run');
const out = String(flags.get('out') ?? 'bench/results/held-out.json');
// checked before the runs, written whole after them (an earlier file stays if they fail)
const outFile = benchOutputFile('--out', out);
const only = flags.has('only') ? new Set(String(flags.get('only')).split(',')) : undefined;
if (only) {
  const shapes = new Set(RUNS.map((r) => r.shape));
  for (const s of only) if (!shapes.has(s)) usageError(`--only: no shape '${s}' (${[...shapes].join(', ')})`);
}

const runs: Array<HeldOutRun & { report: ComparisonReport }> = [];
for (const run of RUNS) {
  if (only && !only.has(run.shape)) continue;
  const { name, requests } = await loadTrace(run.trace);
  const { report } = comparePolicies(name, requests, POLICIES, {
    workers: 8,
    speed: run.speed,
    engine: { kvTokens: run.kvTokens, ...(run.maxModelLen !== undefined ? { maxModelLen: run.maxModelLen } : {}) },
  });
  runs.push({ ...run, report });
  const cell = (p: ComparisonReport['policies'][number]) => `${p.policy} ${p.ttft.mean} · ${p.ttft.p99}`;
  console.log(`${run.trace} ×${run.speed} ${run.kvTokens}: ${report.policies.map(cell).join(' | ')}`);
}
writeOutputFile(
  outFile,
  JSON.stringify(
    {
      command: `npm run bench:held-out${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`,
      policies: POLICIES,
      runs,
    },
    null,
    2,
  ) + '\n',
);
console.log(`wrote ${out}`);
