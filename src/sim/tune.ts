import { createRng } from '../core/rng.js';
import { escapeUnprintable } from '../core/shown-text.js';
import { DEFAULT_COST_WEIGHTS, type CostWeights } from '../core/policies/cost.js';
import { simulate, type SimulationOptions } from './simulator.js';
import { checkReplayable, ReplayError, type TraceRequest } from './trace.js';

/**
 * Searches the cost policy's weights on the first part of a trace and checks them on the
 * held-out rest, so users need not tune by hand. The objective is the mean TTFT plus a
 * weighted p99 (tail latency matters to users as much as the mean). The search: a random
 * exploration around the defaults (log-uniform ×¼…×4 per weight), then coordinate refinement
 * of the best point. Everything is seeded and deterministic.
 */
export interface TuneOptions extends Omit<SimulationOptions, 'policy' | 'router'> {
  /** Fraction of requests (by arrival) used for the search (default 0.6). */
  trainFraction?: number;
  /** Simulations the search may run (default 30). */
  trials?: number;
  seed?: number;
  /** Weight of the p99 TTFT in the objective (default 0.1). */
  p99Weight?: number;
  onTrial?: (trial: number, total: number, score: number) => void;
}

export interface TuneResult {
  /** What to use: the tuned weights if they also win on the held-out part (by MIN_HELD_OUT_GAIN at least), else the defaults. */
  weights: CostWeights;
  recommended: 'tuned' | 'default';
  tunedWeights: CostWeights;
  train: { default: Score; tuned: Score };
  validation: { default: Score; tuned: Score };
  trials: number;
  trainRequests: number;
  validationRequests: number;
}

export interface Score {
  objective: number;
  ttftMean: number;
  ttftP99: number;
  hitRate: number;
}

/**
 * The weights a search moves: the multiplier of the derived saturation term and the KV
 * guards. The physical constants (prefill rate, attention, decode, KV capacity), the knee and
 * the ceiling describe the hardware and stay as given; the CLA and workflow bonuses only act
 * on seed-API requests, which a trace replay does not make.
 */
const TUNABLE: ReadonlyArray<keyof CostWeights> = ['recompute', 'load', 'pressure'];

export function tuneCostWeights(trace: readonly TraceRequest[], options: TuneOptions): TuneResult {
  const trainFraction = options.trainFraction ?? 0.6;
  if (!(trainFraction > 0 && trainFraction < 1))
    throw new RangeError(`trainFraction must be in (0, 1), got ${trainFraction}`);
  const trials = options.trials ?? 30;
  if (!Number.isInteger(trials) || trials < 1) throw new RangeError(`trials must be a positive integer, got ${trials}`);
  const split = Math.max(1, Math.min(trace.length - 1, Math.floor(trace.length * trainFraction)));
  const train = trace.slice(0, split);
  const validation = trace.slice(split);
  // each part is a replay of its own, held to a replay's span (the whole trace may be longer),
  // and named in what is said of it: checked before the search, not after its trials
  const parts = new Map<readonly TraceRequest[], string>([
    [train, `the part searched on (the first ${train.length} of ${trace.length} requests)`],
    [validation, `the held-out part (the last ${validation.length} of ${trace.length} requests)`],
  ]);
  const speed = options.speed ?? 1;
  if (speed > 0) for (const [part, what] of parts) checkReplayable(part, speed, what);
  const p99Weight = options.p99Weight ?? 0.1;
  const rng = createRng(options.seed ?? 7);
  const { onTrial, ...sim } = options;

  const evaluate = (part: readonly TraceRequest[], w: CostWeights): Score => {
    let r;
    try {
      r = simulate(part, { ...sim, policy: 'cost', router: { costWeights: w } });
    } catch (err) {
      if (err instanceof ReplayError) throw new ReplayError(`${parts.get(part)}: ${err.message}`, { cause: err });
      throw err;
    }
    return {
      objective: r.ttft.mean + p99Weight * r.ttft.p99,
      ttftMean: r.ttft.mean,
      ttftP99: r.ttft.p99,
      hitRate: r.hitRate,
    };
  };

  const base: CostWeights = { ...DEFAULT_COST_WEIGHTS };
  let best = base;
  let bestScore = evaluate(train, base);
  const baseTrain = bestScore;
  let used = 1;
  const consider = (w: CostWeights) => {
    const s = evaluate(train, w);
    used++;
    onTrial?.(used, trials, s.objective);
    if (s.objective < bestScore.objective) {
      best = w;
      bestScore = s;
    }
  };
  // exploration: half the budget
  const explore = Math.floor((trials - 1) / 2);
  for (let i = 0; i < explore; i++) {
    const w = { ...base };
    for (const k of TUNABLE) w[k] = round3(base[k] * 4 ** (2 * rng() - 1));
    consider(w);
  }
  // refinement: one weight at a time, ×2 and ×½ around the best so far
  for (let i = 0; used < trials; i++) {
    const k = TUNABLE[i % TUNABLE.length];
    const factor = Math.floor(i / TUNABLE.length) % 2 === 0 ? 2 : 0.5;
    consider({ ...best, [k]: round3(best[k] * factor) });
  }
  const validationDefault = evaluate(validation, base);
  const validationTuned = evaluate(validation, best);
  // a search that only fits the part it saw is not worth recommending, and neither is a held-out
  // win smaller than another replay of the same workload would move the objective: the defaults
  // were checked across workloads, the tuned weights on this one
  const recommended =
    validationTuned.objective < validationDefault.objective * (1 - MIN_HELD_OUT_GAIN) ? 'tuned' : 'default';
  return {
    weights: recommended === 'tuned' ? best : base,
    recommended,
    tunedWeights: best,
    train: { default: baseTrain, tuned: bestScore },
    validation: { default: validationDefault, tuned: validationTuned },
    trials: used,
    trainRequests: train.length,
    validationRequests: validation.length,
  };
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

/**
 * The tuned router options as JSON: `{ "policy": "cost", "costWeights": { … } }`. JSON is
 * also YAML, so the same text is a `serve --config` file and the argument of
 * `new KVAwareRouter(…)`.
 */
export function renderRouterOptions(r: TuneResult): string {
  return `${JSON.stringify({ policy: 'cost', costWeights: r.weights }, null, 2)}\n`;
}

/**
 * Least share of the defaults' held-out objective the tuned weights must save to be
 * recommended: a smaller difference is within what the order of a few hundred requests moves.
 */
export const MIN_HELD_OUT_GAIN = 0.01;

/** How much lower the tuned weights' held-out objective is than the defaults', in percent (negative: higher). */
function heldOutGain(r: TuneResult): string {
  const d = r.validation.default.objective;
  return `${d > 0 ? ((100 * (d - r.validation.tuned.objective)) / d).toFixed(2) : '0.00'}%`;
}

/**
 * A config block a user can paste (the router.yaml of `serve --config`; its keys are
 * KVAwareRouter's options). The trace's name comes from outside (a file name may hold a line
 * break): it is written with its control characters and line separators escaped, so that it
 * cannot end its comment and add a key to the block.
 */
export function renderWeightsConfig(traceName: string, r: TuneResult): string {
  const lines = [
    `# cost weights tuned by contextforge-router tune on ${escapeUnprintable(traceName)}`,
    `# search: first ${r.trainRequests} requests; held-out check: last ${r.validationRequests}`,
    `# held-out mean TTFT ${r.validation.default.ttftMean.toFixed(3)} s (defaults) vs ${r.validation.tuned.ttftMean.toFixed(3)} s (tuned), p99 ${r.validation.default.ttftP99.toFixed(3)} s vs ${r.validation.tuned.ttftP99.toFixed(3)} s`,
    r.recommended === 'tuned'
      ? `# the tuned weights win on the held-out requests too (objective ${heldOutGain(r)} lower):`
      : `# the tuned weights did not beat the defaults on the held-out requests by ${100 * MIN_HELD_OUT_GAIN}% or more (objective ${heldOutGain(r)} lower); keep the defaults:`,
    'policy: cost',
    'costWeights:',
    ...Object.entries(r.weights).map(([k, v]) => `  ${k}: ${v}`),
  ];
  return lines.join('\n') + '\n';
}
