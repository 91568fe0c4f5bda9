/**
 * bench:sim — every policy on every trace at ≥ 5 arrival rates from light load to past the
 * knee, each rate over ≥ 5 independent samples, reported as mean and 95% confidence interval
 * of the hit rate, mean TTFT and p99 TTFT (src/sim/sweep.ts has the JSON shape).
 *
 *   npm run bench:sim [-- --json] [--split evaluation|train|fresh] [--samples 5] [--points 5]
 *                     [--workers 8] [--traces mooncake-conversation,ragpulse,...] [--out bench/results]
 *                     [--policies cost,sglang,...] [--prompt-scale 0.88] [--rate-scale 1.13] [--render-only]
 *                     [--closed-loop] [--cost-weights '{"pressure":2}' --out DIR]
 *                     [--engine '{"kvTokens":190000,...}' --out DIR]
 *
 * `--cost-weights` runs `cost` with some of its weights changed (JSON, as the router's
 * costWeights option), a variant measured beside the defaults; it needs `--out`.
 * `--engine` runs every policy on engines of other hardware (JSON, some of ENGINE_DEFAULTS'
 * settings, src/engine-model/config.ts): the weights of `cost` are derived for the default
 * engine, and this measures them on one they were not derived for; it needs `--out`. The load
 * points are chosen on that engine, as for the default one.
 * `--closed-loop` replays sessions closed-loop (a session's next request once its previous one
 * has ended; ScenarioOptions.closedLoop): only traces with sessions change (`agentic:N`).
 *
 * Data split (docs/simulator.md, "Training and evaluation data"): a recorded trace's first
 * half is training data, its second half evaluation data; a generated workload uses the first
 * `--samples` of seeds 1–10 for training and of 101–110 for evaluation (1–5 and 101–105 at
 * the default 5). The load points are chosen on the training
 * split; the reported figures come from the evaluation split (the default `--split`).
 * `--split train` runs the same sweep on the training split, for choosing defaults.
 * `--split fresh` runs a generated workload on seeds 201–210, which neither split uses: a
 * candidate change chosen on the training split is checked there before the evaluation split
 * is read again. A recorded trace has no fresh data (both halves are taken): it is skipped.
 * The load points are chosen on the training split whichever split is run, so every split
 * of a workload is swept at the same rates.
 *
 * Samples: a recorded trace's evaluation half is cut into `--samples` consecutive windows of
 * equal request counts; each window is replayed from an empty cluster. A generated workload
 * is generated once per seed. This keeps the whole sweep to minutes on one core.
 *
 * Perturbed samples: `--prompt-scale F` cuts each prompt of a recorded trace to F of its
 * length (its last blocks), `--rate-scale R` makes its arrivals R times as dense (perturbTrace
 * in src/sim/sweep.ts); generated workloads are left as they are, and the load points are still
 * chosen on the unperturbed training split, so a perturbed sweep runs at the same rates. They
 * check a candidate on the training split reshaped like data it has not seen (docs/simulator.md).
 *
 * Writes bench/results/sim-sweep.json and bench/results/sim-sweep.html (the charts).
 *
 * `--render-only` runs no simulation: it reads the sim-sweep JSON in `--out` and writes its
 * HTML page again, with the page's renderer of today. The page also states the run's
 * `--workers`, `--samples`, `--split` and `--closed-loop`, which the JSON does not hold: give
 * the ones the sweep was run with. It loads each trace's samples to count their requests (what the
 * page's rejected counts are out of), as the run did.
 */
import { mkdirSync, readFileSync } from 'node:fs';
import { writeOutputFile } from '../src/cli/output-file.js';
import { ENGINE_DEFAULTS } from '../src/engine-model/index.js';
import { renderSweepReport } from '../src/sim/html-report.js';
import { loadTrace } from '../src/sim/load-trace.js';
import {
  chooseLoadPoints,
  perturbTrace,
  splitTrace,
  sweepTrace,
  windows,
  type SweepOptions,
  type SweepReport,
} from '../src/sim/sweep.js';
import { KNOWN_POLICIES, TABLE_POLICIES } from './policies.js';
import type { TraceRequest } from '../src/sim/trace.js';
import { renderSweepTables } from './sim-readme.js';
import { benchFlags, benchOutputFile, costWeightsFlag, engineFlag, intFlag, usageError } from './stats.js';

const flags = benchFlags(process.argv.slice(2), {
  json: 'switch',
  split: 'value',
  samples: 'value',
  points: 'value',
  workers: 'value',
  traces: 'value',
  out: 'value',
  policies: 'value',
  'prompt-scale': 'value',
  'rate-scale': 'value',
  'render-only': 'switch',
  'closed-loop': 'switch',
  'cost-weights': 'value',
  engine: 'value',
});
const WORKERS = intFlag(flags, 'workers', 8);
const SAMPLES = intFlag(flags, 'samples', 5);
const POINTS = intFlag(flags, 'points', 5);
/** Sessions replayed closed-loop (ScenarioOptions.closedLoop): each turn once the previous one has ended. */
const CLOSED_LOOP = flags.has('closed-loop');
for (const [name, value, min, max] of [
  ['samples', SAMPLES, 2, 10],
  ['points', POINTS, 2, 50],
  ['workers', WORKERS, 1, 1024],
] as const) {
  if (!Number.isInteger(value) || value < min || value > max) {
    process.stderr.write(`error: --${name} must be an integer from ${min} to ${max}, got ${value}\n`);
    process.exit(2);
  }
}
const split = String(flags.get('split') ?? 'evaluation');
if (split !== 'evaluation' && split !== 'train' && split !== 'fresh') {
  process.stderr.write(`error: --split must be evaluation, train or fresh, got '${split}'\n`);
  process.exit(2);
}
const OUT = String(flags.get('out') ?? 'bench/results');
/** Other weights for `cost` (a variant measured beside the defaults): never into the README's files. */
const COST_WEIGHTS = costWeightsFlag(flags);
if (COST_WEIGHTS && !flags.has('out'))
  usageError('--cost-weights needs --out: bench/results holds the sweep of the default weights');
/** Engines of other hardware (a sweep measured beside the default engine's): never into the README's files. */
const ENGINE = engineFlag(flags);
if (ENGINE && !flags.has('out'))
  usageError('--engine needs --out: bench/results holds the sweep of the default engine');
const onlyPolicies = flags.get('policies');
const POLICIES = typeof onlyPolicies === 'string' ? onlyPolicies.split(',') : TABLE_POLICIES;
if (
  POLICIES.length === 0 ||
  POLICIES.some((p) => !KNOWN_POLICIES.includes(p)) ||
  new Set(POLICIES).size !== POLICIES.length
) {
  process.stderr.write(`error: --policies must name some of ${KNOWN_POLICIES.join(', ')}, each once\n`);
  process.exit(2);
}
/** A positive number flag, or `fallback`; a bad one ends the run naming it. */
function scaleFlag(name: string, fallback: number): number {
  const v = flags.get(name);
  if (v === undefined) return fallback;
  const n = typeof v === 'string' ? Number(v) : NaN;
  if (!Number.isFinite(n)) {
    process.stderr.write(`error: --${name} must be a number, got '${String(v)}'\n`);
    process.exit(2);
  }
  return n;
}
const perturbation = { promptScale: scaleFlag('prompt-scale', 1), rateScale: scaleFlag('rate-scale', 1) };
const perturbed = perturbation.promptScale !== 1 || perturbation.rateScale !== 1;
try {
  perturbTrace([], perturbation);
} catch (err) {
  process.stderr.write(
    `error: --${(err as Error).message.startsWith('promptScale') ? 'prompt-scale' : 'rate-scale'}: ${(err as Error).message}\n`,
  );
  process.exit(2);
}

/** Seeds of generated workloads: training and evaluation never share one. */
const TRAIN_SEEDS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
const EVALUATION_SEEDS = [101, 102, 103, 104, 105, 106, 107, 108, 109, 110];
/** Seeds for checking a candidate change on data neither split has shown. */
const FRESH_SEEDS = [201, 202, 203, 204, 205, 206, 207, 208, 209, 210];

interface TraceSpec {
  name: string;
  /** `count` independent samples of the split; none for a split the workload does not have (fresh, of a recorded trace). */
  samples(part: 'train' | 'evaluation' | 'fresh', count: number): Promise<TraceRequest[][]>;
  /** A recorded trace, which --prompt-scale and --rate-scale reshape. */
  perturbable?: boolean;
}

/** A recorded trace: halves by arrival, each cut into windows. */
function recorded(name: string, path: string, transform: (r: TraceRequest) => TraceRequest = (r) => r): TraceSpec {
  let cache: { train: TraceRequest[]; evaluation: TraceRequest[] } | undefined;
  return {
    name,
    async samples(part, count) {
      if (part === 'fresh') return [];
      cache ??= splitTrace((await loadTrace(path)).requests.map(transform));
      return windows(cache[part], count);
    },
    perturbable: true,
  };
}

/** A generated workload (`workflows:N`, `agentic:N`): one sample per seed. */
function generated(name: string, spec: (seed: number) => string): TraceSpec {
  return {
    name,
    async samples(part, count) {
      const seeds = (part === 'train' ? TRAIN_SEEDS : part === 'fresh' ? FRESH_SEEDS : EVALUATION_SEEDS).slice(
        0,
        count,
      );
      if (seeds.length < count) throw new RangeError(`at most ${TRAIN_SEEDS.length} samples of a generated workload`);
      return Promise.all(seeds.map(async (seed) => (await loadTrace(spec(seed))).requests));
    },
  };
}

const ALL_TRACES: TraceSpec[] = [
  recorded('mooncake-conversation', 'bench/traces/conversation_trace.jsonl.gz'),
  recorded('ragpulse', 'bench/traces/ragpulse'),
  // the same requests on engines without position-independent reuse: passages are plain new tokens
  recorded('ragpulse-no-content-anchors', 'bench/traces/ragpulse', ({ anchors: _anchors, ...r }) => r),
  generated('workflows:150', (seed) => `workflows:150:${seed}`),
  generated('agentic:10', (seed) => `agentic:10:${seed}`),
];

const only = flags.get('traces');
const traces = typeof only === 'string' ? ALL_TRACES.filter((t) => only.split(',').includes(t.name)) : ALL_TRACES;
if (traces.length === 0) {
  process.stderr.write(`error: --traces names none of ${ALL_TRACES.map((t) => t.name).join(', ')}\n`);
  process.exit(2);
}

const log = (s: string) => process.stderr.write(`${s}\n`);
const suffix =
  (split === 'evaluation' ? '' : `-${split}`) +
  (perturbed ? `-prompt${perturbation.promptScale}-rate${perturbation.rateScale}` : '');

/** A trace's samples of the split, reshaped as --prompt-scale and --rate-scale ask (throws for one that cannot be). */
async function splitSamples(spec: TraceSpec): Promise<TraceRequest[][]> {
  const asRecorded = await spec.samples(split as 'train' | 'evaluation' | 'fresh', SAMPLES);
  return perturbed && spec.perturbable ? asRecorded.map((s) => perturbTrace(s, perturbation)) : asRecorded;
}
/** Requests over all samples of each trace: what its rejected counts are out of. */
const requests: Record<string, number> = {};
const meta = () => ({
  workers: WORKERS,
  samples: SAMPLES,
  split,
  requests,
  ...(CLOSED_LOOP ? { closedLoop: true } : {}),
});

if (flags.has('render-only')) {
  const path = `${OUT}/sim-sweep${suffix}.json`;
  const saved = JSON.parse(readFileSync(path, 'utf8')) as SweepReport;
  for (const t of saved.traces) {
    const spec = ALL_TRACES.find((s) => s.name === t.trace);
    if (spec) requests[t.trace] = (await splitSamples(spec)).reduce((a, s) => a + s.length, 0);
  }
  writeOutputFile(benchOutputFile('--out', `${OUT}/sim-sweep${suffix}.html`), renderSweepReport(saved, meta()));
  log(`${OUT}/sim-sweep${suffix}.html: rendered from ${path}, no simulation run`);
  process.exit(0);
}
const sweepOptions: SweepOptions = {
  policies: POLICIES,
  points: POINTS,
  simulation: {
    workers: WORKERS,
    ...(CLOSED_LOOP ? { scenario: { closedLoop: true } } : {}),
    ...(COST_WEIGHTS ? { router: { costWeights: COST_WEIGHTS } } : {}),
    ...(ENGINE ? { engine: ENGINE } : {}),
  },
  workerPrefillTokensPerSecond: 1000 / (ENGINE?.linearMsPerToken ?? ENGINE_DEFAULTS.linearMsPerToken),
};

mkdirSync(OUT, { recursive: true });
// checked before the sweep, written whole after it (an earlier sweep's files stay if it fails)
const jsonOut = benchOutputFile('--out', `${OUT}/sim-sweep${suffix}.json`);
const htmlOut = benchOutputFile('--out', `${OUT}/sim-sweep${suffix}.html`);
const report: SweepReport = { traces: [] };
const started = performance.now();
for (const spec of traces) {
  const t0 = performance.now();
  let samples: TraceRequest[][];
  try {
    samples = await splitSamples(spec);
  } catch (err) {
    // a trace whose prompts cannot be cut (content anchors) is not swept rather than swept as recorded
    log(`${spec.name}: skipped (${(err as Error).message})`);
    continue;
  }
  if (samples.length === 0) {
    log(`${spec.name}: skipped (a recorded trace has no ${split} split)`);
    continue;
  }
  const calibration = (await spec.samples('train', SAMPLES)).slice(0, 3);
  const speeds = chooseLoadPoints(calibration, sweepOptions);
  const out = sweepTrace(spec.name, samples, speeds, sweepOptions);
  requests[spec.name] = samples.reduce((a, s) => a + s.length, 0);
  report.traces.push(out);
  log(
    `${spec.name}: ${samples.length} samples of ${samples.map((s) => s.length).join('/')} requests (${split}), speeds ${speeds.join(', ')}, ${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );
}
log(`sweep: ${((performance.now() - started) / 1000).toFixed(1)} s`);

const json = JSON.stringify(report);
writeOutputFile(jsonOut, JSON.stringify(report, null, 1) + '\n');
writeOutputFile(htmlOut, renderSweepReport(report, meta()));
if (flags.has('json')) process.stdout.write(`${json}\n`);
else process.stdout.write(renderSweepTables(report));
