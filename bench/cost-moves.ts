/**
 * bench:cost-moves — where the hit rate goes on the Mooncake conversation trace: at every
 * decision, what the engines held of the prompt (the simulator's own engines, not the
 * router's index), what the chosen worker held, and what the engine found cached when it
 * admitted the request; for the moves off the worker holding the most, the router's estimated
 * TTFT there and on the worker chosen (the cost policy's explanation).
 *
 *   npm run bench:cost-moves [-- --split train|evaluation] [--speeds 1.09,1.55,2.2]
 *                            [--policies cost,sglang,dynamo] [--samples 5] [--workers 8] [--json]
 *
 * Shares are of the prompt tokens, summed over the windows (`--samples` consecutive windows of
 * the split, as bench:sim cuts them). "Given up" is what the worker holding the most of a
 * prompt held beyond what the chosen one held; "lost waiting" is what the chosen worker held
 * at the decision beyond what its engine found cached at admission (a waiting request pins
 * nothing: the requests admitted before it, and the answers growing meanwhile, evict it).
 * The training split is the default: it is the one choices are made on.
 */
import { loadTrace } from '../src/sim/load-trace.js';
import { simulate, type RouteTrace } from '../src/sim/simulator.js';
import { splitTrace, windows } from '../src/sim/sweep.js';
import { benchFlags, intFlag, round, usageError } from './stats.js';

const flags = benchFlags(process.argv.slice(2), {
  split: 'value',
  speeds: 'value',
  policies: 'value',
  samples: 'value',
  workers: 'value',
  json: 'switch',
});
const split = String(flags.get('split') ?? 'train');
if (split !== 'train' && split !== 'evaluation') usageError(`--split must be train or evaluation, got '${split}'`);
const list = (name: string, fallback: string) => String(flags.get(name) ?? fallback).split(',');
const speeds = list('speeds', '1.09,1.55,2.2').map(Number);
if (speeds.some((s) => !(s > 0))) usageError(`--speeds must be positive numbers, got '${String(flags.get('speeds'))}'`);
const policies = list('policies', 'cost,sglang,dynamo');
const samples = intFlag(flags, 'samples', 5);
const workers = intFlag(flags, 'workers', 8);
if (!Number.isInteger(samples) || samples < 1 || samples > 10) usageError(`--samples must be an integer from 1 to 10`);
if (!Number.isInteger(workers) || workers < 1 || workers > 1024)
  usageError(`--workers must be an integer from 1 to 1024`);
/** A move gives up at least this many blocks to count as a large one (their TTFTs are reported). */
const LARGE_MOVE_BLOCKS = 8;

const trace = (await loadTrace('bench/traces/conversation_trace.jsonl.gz')).requests;
const blockTokens = trace[0].blockSize;
const parts = splitTrace(trace);
const sampleWindows = windows(split === 'train' ? parts.train : parts.evaluation, samples);

interface Row {
  speed: number;
  policy: string;
  decisions: number;
  hitRate: number;
  heldByChosen: number;
  heldMost: number;
  givenUp: number;
  lostWaiting: number;
  moves: number;
  largeMoves: number;
  largeMovesShareOfGivenUp: number;
  /** Median (p25) of the router's estimated TTFT on the worker holding the most, and on the one chosen, over the large moves (s); cost only. */
  holderTtftMedian?: number;
  holderTtftP25?: number;
  chosenTtftMedian?: number;
}

const quantile = (values: number[], q: number) => {
  const v = [...values].sort((a, b) => a - b);
  return v.length === 0 ? NaN : v[Math.min(v.length - 1, Math.floor(v.length * q))];
};

const rows: Row[] = [];
for (const speed of speeds) {
  for (const policy of policies) {
    let prompt = 0;
    let cachedAtAdmission = 0;
    let heldByChosen = 0;
    let heldMost = 0;
    let givenUp = 0;
    let givenUpLarge = 0;
    let decisions = 0;
    let moves = 0;
    let largeMoves = 0;
    const holderTtft: number[] = [];
    const chosenTtft: number[] = [];
    for (const window of sampleWindows) {
      // the last decision per request (a retried request is routed again): counted once answered
      const seen = new Map<number, { mine: number; most: number; holderTtft?: number; chosenTtft?: number }>();
      const result = simulate(window, {
        workers,
        policy,
        speed,
        explainRoutes: policy === 'cost',
        onRoute: (d: RouteTrace) => {
          let most = 0;
          let holder = d.worker;
          d.heldTokens.forEach((t, w) => {
            if (t > most) {
              most = t;
              holder = w;
            }
          });
          const mine = d.heldTokens[d.worker];
          const ttft = (w: number) => d.explain?.find((c) => c.worker === `w${w}`)?.terms.estimatedTtftSeconds;
          const there = ttft(holder);
          const here = ttft(d.worker);
          seen.set(d.request, {
            mine,
            most,
            ...(typeof there === 'number' && typeof here === 'number' ? { holderTtft: there, chosenTtft: here } : {}),
          });
        },
      });
      // a request refused or cancelled before its first token has no outcome and stays out
      for (const o of result.outcomes) {
        prompt += o.promptTokens;
        cachedAtAdmission += o.cachedTokens;
        const d = seen.get(o.request);
        if (!d) continue;
        decisions++;
        heldByChosen += d.mine;
        heldMost += d.most;
        if (d.most <= d.mine) continue;
        moves++;
        givenUp += d.most - d.mine;
        if (d.most - d.mine < LARGE_MOVE_BLOCKS * blockTokens) continue;
        largeMoves++;
        givenUpLarge += d.most - d.mine;
        if (d.holderTtft !== undefined && d.chosenTtft !== undefined) {
          holderTtft.push(d.holderTtft);
          chosenTtft.push(d.chosenTtft);
        }
      }
    }
    const share = (x: number) => round(x / prompt, 4);
    const row: Row = {
      speed,
      policy,
      decisions,
      hitRate: share(cachedAtAdmission),
      heldByChosen: share(heldByChosen),
      heldMost: share(heldMost),
      givenUp: share(givenUp),
      lostWaiting: share(heldByChosen - cachedAtAdmission),
      moves,
      largeMoves,
      largeMovesShareOfGivenUp: givenUp > 0 ? round(givenUpLarge / givenUp, 3) : 0,
    };
    if (holderTtft.length > 0) {
      row.holderTtftMedian = round(quantile(holderTtft, 0.5), 2);
      row.holderTtftP25 = round(quantile(holderTtft, 0.25), 2);
      row.chosenTtftMedian = round(quantile(chosenTtft, 0.5), 2);
    }
    rows.push(row);
    process.stderr.write(`x${speed} ${policy}: done\n`);
  }
}

if (flags.has('json')) {
  process.stdout.write(
    `${JSON.stringify({ trace: 'mooncake-conversation', split, samples, workers, rows }, null, 1)}\n`,
  );
} else {
  const pct = (x: number) => `${(x * 100).toFixed(2)}%`;
  process.stdout.write(
    `| speed | policy | hit rate | held by the chosen worker | held most | given up | lost waiting | moves (large) | holder / chosen est. TTFT, large moves (s) |\n|---:|---|---:|---:|---:|---:|---:|---:|---|\n`,
  );
  for (const r of rows)
    process.stdout.write(
      `| ×${r.speed} | ${r.policy} | ${pct(r.hitRate)} | ${pct(r.heldByChosen)} | ${pct(r.heldMost)} | ${pct(r.givenUp)} | ${pct(r.lostWaiting)} | ${r.moves} (${r.largeMoves}) | ${r.holderTtftMedian === undefined ? '' : `${r.holderTtftMedian} (p25 ${r.holderTtftP25}) / ${r.chosenTtftMedian}`} |\n`,
    );
}
