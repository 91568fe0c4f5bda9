/**
 * bench:trace-seeds — every policy on many seeds of three generated shapes, where one seed's
 * figures say little: coding-agent loops that outgrow their worker (bench/traces/agent-loops/,
 * seeds 10–39), many tenants' system prompts under short sessions on workers with little KV
 * (bench/traces/tenants/, seeds 7–26), and a few hot shared prefixes on workers with little KV
 * (bench/traces/hot-prefixes/, seeds 10–39). Each shape's seeds are split in two sets: the first
 * (agent loops 10–29, tenants 7–16, hot prefixes 10–29) is the one a change is chosen on, the
 * second (30–39, 17–26, 30–39) is kept apart until it is, and later versions are run on it too
 * (docs/routing.md §7, "The prefix at risk while a turn waits"; the hot prefixes since 2026-12-05,
 * "Hot prefixes over thirty seeds"). The agent loops run open-loop at their recorded rate, as bench:held-out runs
 * seeds 1–9, and closed-loop (each turn sent once the previous one has ended, as an agent does);
 * the tenants at ×2 and ×3; the hot prefixes at ×2 on 40,000 and 60,000 tokens of KV and at ×3 on
 * 100,000, as bench:held-out runs seeds 1 and 2. Per set and policy it reports the mean over the seeds of each run's
 * mean TTFT, the geometric means of the runs' mean and p99 TTFT, and the worst run's mean; and
 * every run's figures. The simulator is deterministic: one run per seed.
 *
 *   npm run bench:trace-seeds [-- --policies cost,dynamo,... --only agent-loops|tenants|hot-prefixes
 *                              --cost-weights '{"pressure":2}' --out FILE]
 *
 * It writes bench/results/trace-seeds.json; --policies other than the defaults, --only and
 * --cost-weights (`cost` with some of its weights changed) need --out, so that file keeps every
 * policy and set with the default weights.
 */
import { writeOutputFile } from '../src/cli/output-file.js';
import { comparePolicies } from '../src/sim/compare.js';
import { loadTrace } from '../src/sim/load-trace.js';
import { KNOWN_POLICIES, TABLE_POLICIES } from './policies.js';
import { benchFlags, benchOutputFile, costWeightsFlag, usageError } from './stats.js';

const SHAPES = ['agent-loops', 'tenants', 'hot-prefixes'] as const;
type Shape = (typeof SHAPES)[number];

interface SeedSet {
  name: string;
  shape: Shape;
  seeds: number[];
  speed: number;
  kvTokens: number;
  maxModelLen?: number;
  closedLoop: boolean;
}

const range = (first: number, last: number) => Array.from({ length: last - first + 1 }, (_, i) => first + i);
const agentLoops = (name: string, seeds: number[], closedLoop: boolean): SeedSet => ({
  name,
  shape: 'agent-loops',
  seeds,
  speed: 1,
  kvTokens: 300_000,
  maxModelLen: 150_000,
  closedLoop,
});
const tenants = (name: string, seeds: number[], speed: number): SeedSet => ({
  name,
  shape: 'tenants',
  seeds,
  speed,
  kvTokens: 60_000,
  closedLoop: false,
});

const hotPrefixes = (name: string, seeds: number[], speed: number, kvTokens: number): SeedSet => ({
  name,
  shape: 'hot-prefixes',
  seeds,
  speed,
  kvTokens,
  closedLoop: false,
});

const SETS: SeedSet[] = [
  agentLoops('agent-loops 10-29', range(10, 29), false),
  agentLoops('agent-loops 30-39', range(30, 39), false),
  agentLoops('agent-loops 10-29 closed-loop', range(10, 29), true),
  agentLoops('agent-loops 30-39 closed-loop', range(30, 39), true),
  tenants('tenants 7-16 ×2', range(7, 16), 2),
  tenants('tenants 7-16 ×3', range(7, 16), 3),
  tenants('tenants 17-26 ×2', range(17, 26), 2),
  tenants('tenants 17-26 ×3', range(17, 26), 3),
  hotPrefixes('hot-prefixes 10-29 ×2 40k', range(10, 29), 2, 40_000),
  hotPrefixes('hot-prefixes 10-29 ×2 60k', range(10, 29), 2, 60_000),
  hotPrefixes('hot-prefixes 10-29 ×3 100k', range(10, 29), 3, 100_000),
  hotPrefixes('hot-prefixes 30-39 ×2 40k', range(30, 39), 2, 40_000),
  hotPrefixes('hot-prefixes 30-39 ×2 60k', range(30, 39), 2, 60_000),
  hotPrefixes('hot-prefixes 30-39 ×3 100k', range(30, 39), 3, 100_000),
];

const flags = benchFlags(process.argv.slice(2), {
  policies: 'value',
  only: 'value',
  out: 'value',
  'cost-weights': 'value',
});
const POLICIES = flags.has('policies') ? String(flags.get('policies')).split(',') : TABLE_POLICIES;
if (POLICIES.some((p) => !KNOWN_POLICIES.includes(p)) || new Set(POLICIES).size !== POLICIES.length)
  usageError(`--policies must name some of ${KNOWN_POLICIES.join(', ')}, each once`);
// bench/results/trace-seeds.json holds the docs' figures: a subset goes elsewhere
const costWeights = costWeightsFlag(flags);
if ((POLICIES.join(',') !== TABLE_POLICIES.join(',') || flags.has('only') || costWeights) && !flags.has('out'))
  usageError(
    `--policies other than the defaults (${TABLE_POLICIES.join(',')}), --only and --cost-weights need --out: ` +
      'bench/results/trace-seeds.json holds every policy and set with the default weights',
  );
const only = flags.has('only') ? new Set(String(flags.get('only')).split(',')) : undefined;
if (only)
  for (const s of only)
    if (!(SHAPES as readonly string[]).includes(s)) usageError(`--only: no shape '${s}' (${SHAPES.join(', ')})`);
const out = String(flags.get('out') ?? 'bench/results/trace-seeds.json');
const outFile = benchOutputFile('--out', out);

/** What a set's runs say of one policy. */
interface Summary {
  /** Mean over the runs of each run's mean TTFT (s). */
  meanOfMeans: number;
  /** Geometric means of the runs' mean and p99 TTFT (s). */
  geomeanMean: number;
  geomeanP99: number;
  /** The highest of the runs' mean TTFT (s), and its seed. */
  worstMean: number;
  worstSeed: number;
}

const round = (x: number, digits = 3) => Number(x.toFixed(digits));
const geomean = (xs: number[]) => Math.exp(xs.reduce((s, x) => s + Math.log(Math.max(x, 1e-3)), 0) / xs.length);

const results = [];
for (const set of SETS) {
  if (only && !only.has(set.shape)) continue;
  const runs: Array<{
    seed: number;
    policies: Array<{
      policy: string;
      ttftMean: number;
      ttftP99: number;
      hitRate: number;
      rejected: number;
    }>;
  }> = [];
  for (const seed of set.seeds) {
    const { name, requests } = await loadTrace(`bench/traces/${set.shape}/${set.shape}.${seed}.jsonl.gz`);
    const { report } = comparePolicies(name, requests, POLICIES, {
      workers: 8,
      speed: set.speed,
      engine: {
        kvTokens: set.kvTokens,
        ...(set.maxModelLen !== undefined ? { maxModelLen: set.maxModelLen } : {}),
      },
      ...(set.closedLoop ? { scenario: { closedLoop: true } } : {}),
      ...(costWeights ? { router: { costWeights } } : {}),
    });
    runs.push({
      seed,
      policies: report.policies.map((p) => ({
        policy: p.policy,
        ttftMean: p.ttft.mean,
        ttftP99: p.ttft.p99,
        hitRate: p.hitRate,
        rejected: p.rejected,
      })),
    });
  }
  const summary: Record<string, Summary> = {};
  for (const policy of POLICIES) {
    const rows = runs.map((r) => ({
      seed: r.seed,
      ...r.policies.find((p) => p.policy === policy)!,
    }));
    const worst = rows.reduce((a, b) => (b.ttftMean > a.ttftMean ? b : a));
    summary[policy] = {
      meanOfMeans: round(rows.reduce((s, r) => s + r.ttftMean, 0) / rows.length),
      geomeanMean: round(geomean(rows.map((r) => r.ttftMean))),
      geomeanP99: round(geomean(rows.map((r) => r.ttftP99))),
      worstMean: round(worst.ttftMean),
      worstSeed: worst.seed,
    };
  }
  const cell = (p: string) =>
    `${p} ${summary[p].meanOfMeans} / ${summary[p].geomeanMean} / p99 ${summary[p].geomeanP99} / worst ${summary[p].worstMean}`;
  console.log(`${set.name}: ${POLICIES.map(cell).join(' | ')}`);
  results.push({ ...set, summary, runs });
}
writeOutputFile(
  outFile,
  JSON.stringify(
    {
      command: `npm run bench:trace-seeds${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`,
      policies: POLICIES,
      sets: results,
    },
    null,
    2,
  ) + '\n',
);
console.log(`wrote ${out}`);
