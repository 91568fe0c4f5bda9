/**
 * bench:cost-eval — checks the `cost` policy against the peers on a split of the workloads
 * that keeps what the defaults were chosen on (`--split train`) apart from what they are
 * reported on (`--split eval`, the default):
 *
 * - public traces (Mooncake conversation, RAGPulse with and without its content anchors):
 *   train = the first half of the requests by arrival, eval = the second half; each half is
 *   cut into `--windows` consecutive windows, the independent samples of the intervals;
 * - generated workloads (`workflows:N:SEED`, `agentic:N:SEED` when the loader knows it): train
 *   seeds 1–3, eval seeds 101–103.
 *
 * For every trace and arrival scale it prints each policy's mean over the samples with a 95%
 * interval (t distribution) for mean TTFT, p99 TTFT and hit rate, and checks the bar: cost's
 * mean TTFT ≤ the best peer's + its interval, p99 ≤ 1.05 × the best peer's, hit rate ≥
 * 0.95 × the best peer's. Small on purpose (a shared 2-core machine): the full sweep is
 * `npm run bench:sim`.
 *
 *   node --import tsx bench/cost-eval.ts [--split train|eval] [--traces mooncake,ragpulse,ragpulse-no-anchors,workflows,agentic]
 *                                        [--windows 3] [--workers 8] [--speeds 0.5,1] [--json]
 *                                        [--cost-weights '{"pressure":2}']
 */
import { loadTrace } from '../src/sim/load-trace.js';
import { simulate, type SimulationOptions } from '../src/sim/simulator.js';
import type { TraceRequest } from '../src/sim/trace.js';
import { TABLE_PEERS, TABLE_POLICIES } from './policies.js';
import { benchFlags, costWeightsFlag, intFlag, round, usageError } from './stats.js';

const flags = benchFlags(process.argv.slice(2), {
  split: 'value',
  traces: 'value',
  windows: 'value',
  workers: 'value',
  speeds: 'value',
  'cost-weights': 'value',
  json: 'switch',
});
const split = (flags.get('split') ?? 'eval') as string;
if (split !== 'train' && split !== 'eval') usageError(`--split must be train or eval, got '${split}'`);
const WORKERS = intFlag(flags, 'workers', 8);
const WINDOWS = intFlag(flags, 'windows', 3);
const wanted = new Set(
  String(flags.get('traces') ?? 'mooncake,ragpulse,ragpulse-no-anchors,workflows,agentic').split(','),
);
const onlySpeeds = flags.has('speeds') ? new Set(String(flags.get('speeds')).split(',').map(Number)) : undefined;
// a variant of the weights to try (on the training split: that is what it is for)
const costWeights = costWeightsFlag(flags);

interface Study {
  name: string;
  speeds: number[];
  samples: () => Promise<TraceRequest[][]>;
}

/** Consecutive windows of one half of a public trace. */
async function halves(
  path: string,
  transform: (r: TraceRequest) => TraceRequest = (r) => r,
): Promise<TraceRequest[][]> {
  const requests = (await loadTrace(path)).requests.map(transform);
  const mid = Math.floor(requests.length / 2);
  const part = split === 'train' ? requests.slice(0, mid) : requests.slice(mid);
  const size = Math.floor(part.length / WINDOWS);
  return Array.from({ length: WINDOWS }, (_, i) => part.slice(i * size, (i + 1) * size));
}

async function generated(kind: string, n: number): Promise<TraceRequest[][]> {
  const seeds = split === 'train' ? [1, 2, 3] : [101, 102, 103];
  const out: TraceRequest[][] = [];
  for (const seed of seeds.slice(0, WINDOWS)) out.push((await loadTrace(`${kind}:${n}:${seed}`)).requests);
  return out;
}

const studies: Study[] = [
  {
    name: 'mooncake',
    speeds: [0.25, 0.5, 1, 1.5, 2],
    samples: () => halves('bench/traces/conversation_trace.jsonl.gz'),
  },
  { name: 'ragpulse', speeds: [50, 200, 800, 1600], samples: () => halves('bench/traces/ragpulse') },
  // the same requests without content anchors: no position-independent reuse to credit
  {
    name: 'ragpulse-no-anchors',
    speeds: [50, 200, 800, 1600],
    samples: () => halves('bench/traces/ragpulse', ({ anchors: _anchors, ...r }) => r),
  },
  { name: 'workflows', speeds: [1, 2, 4, 8], samples: () => generated('workflows', 150) },
  { name: 'agentic', speeds: [0.5, 1, 2], samples: () => generated('agentic', 12) },
];

/** Mean and 95% half-width (t distribution) of a few samples. */
function meanCi(xs: number[]): { mean: number; ci: number } {
  const n = xs.length;
  const mean = xs.reduce((a, b) => a + b, 0) / n;
  if (n < 2) return { mean, ci: 0 };
  const sd = Math.sqrt(xs.reduce((a, x) => a + (x - mean) ** 2, 0) / (n - 1));
  const t = [0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262][n - 1] ?? 1.96;
  return { mean, ci: (t * sd) / Math.sqrt(n) };
}

const report: unknown[] = [];
for (const study of studies) {
  if (!wanted.has(study.name)) continue;
  let samples: TraceRequest[][];
  try {
    samples = await study.samples();
  } catch (err) {
    process.stderr.write(`${study.name}: skipped (${(err as Error).message})\n`);
    continue;
  }
  for (const speed of study.speeds) {
    if (onlySpeeds && !onlySpeeds.has(speed)) continue;
    const rows: Record<string, { ttftMean: number[]; ttftP99: number[]; hitRate: number[] }> = {};
    for (const policy of TABLE_POLICIES) {
      rows[policy] = { ttftMean: [], ttftP99: [], hitRate: [] };
      for (const trace of samples) {
        const opts: SimulationOptions = {
          workers: WORKERS,
          policy,
          speed,
          router: policy === 'cost' && costWeights ? { costWeights } : undefined,
        };
        const r = simulate(trace, opts);
        rows[policy].ttftMean.push(r.ttft.mean);
        rows[policy].ttftP99.push(r.ttft.p99);
        rows[policy].hitRate.push(r.hitRate);
      }
    }
    const stat = (p: string) => ({
      ttftMean: meanCi(rows[p].ttftMean),
      ttftP99: meanCi(rows[p].ttftP99),
      hitRate: meanCi(rows[p].hitRate),
    });
    const cost = stat('cost');
    const peers = TABLE_PEERS.map((p) => ({ p, s: stat(p) }));
    const bestMean = peers.reduce((a, b) => (b.s.ttftMean.mean < a.s.ttftMean.mean ? b : a));
    const bestP99 = peers.reduce((a, b) => (b.s.ttftP99.mean < a.s.ttftP99.mean ? b : a));
    const bestHit = peers.reduce((a, b) => (b.s.hitRate.mean > a.s.hitRate.mean ? b : a));
    const verdict = {
      mean: cost.ttftMean.mean <= bestMean.s.ttftMean.mean + Math.max(cost.ttftMean.ci, bestMean.s.ttftMean.ci),
      p99: cost.ttftP99.mean <= 1.05 * bestP99.s.ttftP99.mean,
      hit: cost.hitRate.mean >= 0.95 * bestHit.s.hitRate.mean,
    };
    report.push({
      trace: study.name,
      split,
      speed,
      samples: samples.length,
      policies: TABLE_POLICIES.map((p) => ({ policy: p, ...stat(p) })),
      best: { ttftMean: bestMean.p, ttftP99: bestP99.p, hitRate: bestHit.p },
      verdict,
    });
    if (!flags.has('json')) {
      const fmt = (m: { mean: number; ci: number }, d: number) => `${round(m.mean, d)}±${round(m.ci, d)}`;
      process.stdout.write(
        `\n${study.name} ${split} speed ×${speed} (${samples.length} samples of ${samples[0].length} requests)\n`,
      );
      for (const p of TABLE_POLICIES) {
        const s = stat(p);
        process.stdout.write(
          `  ${p.padEnd(12)} mean ${fmt(s.ttftMean, 3).padEnd(16)} p99 ${fmt(s.ttftP99, 2).padEnd(16)} hit ${fmt(s.hitRate, 3)}\n`,
        );
      }
      const mark = (ok: boolean) => (ok ? 'ok' : 'LOSES');
      process.stdout.write(
        `  bar: mean ${mark(verdict.mean)} (best ${bestMean.p}), p99 ${mark(verdict.p99)} (best ${bestP99.p}), hit ${mark(verdict.hit)} (best ${bestHit.p})\n`,
      );
    }
  }
}
if (flags.has('json')) process.stdout.write(`${JSON.stringify(report)}\n`);
