import { simulate, type PolicyResult, type SimulationOptions } from './simulator.js';
import type { TraceRequest } from './trace.js';

/**
 * The statistics of `bench:sim`: each policy at each arrival rate over several independent
 * samples (time windows of a trace, or generator seeds), reported as the mean over the
 * samples with a 95% confidence interval (Student's t, samples − 1 degrees of freedom).
 * The JSON shape (`npm run bench:sim -- --json`, bench/results/sim-sweep.json):
 *
 *   { traces: [ { trace, points: [ { speed, policies: [ { policy, hitRate, ttftMean,
 *     ttftP99, ci95: { hitRate, ttftMean, ttftP99 }, rejected } ] } ] } ] }
 *
 * `ci95` holds half-widths: the interval is value ± ci95. `rejected` is the requests no
 * worker (or the engine) would take, summed over the samples.
 */
export interface SweepPolicyPoint {
  policy: string;
  hitRate: number;
  ttftMean: number;
  ttftP99: number;
  ci95: { hitRate: number; ttftMean: number; ttftP99: number };
  rejected: number;
}

export interface SweepPoint {
  /** Arrival-rate multiplier (timestamps divided by it). */
  speed: number;
  policies: SweepPolicyPoint[];
}

export interface SweepTrace {
  trace: string;
  points: SweepPoint[];
}

export interface SweepReport {
  traces: SweepTrace[];
}

/** Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom. */
const T975 = [
  12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.16, 2.145, 2.131, 2.12, 2.11,
  2.101, 2.093, 2.086, 2.08, 2.074, 2.069, 2.064, 2.06, 2.056, 2.052, 2.048, 2.045, 2.042,
];

/** The t quantile for a 95% two-sided interval with `df` degrees of freedom (normal beyond 30). */
export function tQuantile95(df: number): number {
  if (!Number.isInteger(df) || df < 1) throw new RangeError(`degrees of freedom must be a positive integer, got ${df}`);
  return df <= T975.length ? T975[df - 1] : 1.96;
}

/** Mean and 95% confidence half-width of independent samples (half-width 0 for one sample). */
export function meanCi95(values: readonly number[]): { mean: number; half: number } {
  const n = values.length;
  if (n === 0) throw new RangeError('no samples');
  let mean = 0;
  for (const v of values) mean += v;
  mean /= n;
  if (n === 1) return { mean, half: 0 };
  let ss = 0;
  for (const v of values) ss += (v - mean) ** 2;
  return { mean, half: tQuantile95(n - 1) * Math.sqrt(ss / (n - 1) / n) };
}

const r4 = (x: number) => Math.round(x * 1e4) / 1e4;

/** One policy's samples at one load point, summarised. */
export function summarise(policy: string, samples: readonly PolicyResult[]): SweepPolicyPoint {
  const hit = meanCi95(samples.map((s) => s.hitRate));
  const mean = meanCi95(samples.map((s) => s.ttft.mean));
  const p99 = meanCi95(samples.map((s) => s.ttft.p99));
  return {
    policy,
    hitRate: r4(hit.mean),
    ttftMean: r4(mean.mean),
    ttftP99: r4(p99.mean),
    ci95: { hitRate: r4(hit.half), ttftMean: r4(mean.half), ttftP99: r4(p99.half) },
    rejected: samples.reduce((a, s) => a + s.rejected, 0),
  };
}

/**
 * The fixed split of a recorded trace: the first half of its requests (by arrival) is for
 * choosing anything (defaults, weights, load points); the second half is for reporting.
 */
export function splitTrace(requests: readonly TraceRequest[]): { train: TraceRequest[]; evaluation: TraceRequest[] } {
  const half = Math.floor(requests.length / 2);
  return { train: requests.slice(0, half), evaluation: requests.slice(half) };
}

/** How a recorded sample is reshaped: prompts shorter by `promptScale`, arrivals denser by `rateScale`. */
export interface Perturbation {
  /** Each prompt's length × this, in (0, 1]: its last blocks are cut, the prefixes it shares kept. */
  promptScale: number;
  /** Arrivals this many times as dense (timestamps ÷ it), from 0.1 to 10. */
  rateScale: number;
}

/**
 * `requests` reshaped by `p`: the same sessions and prefixes, as more and shorter requests
 * arrive. At promptScale 0.88 and rateScale 1.13 the Mooncake conversation trace's first half
 * takes the shape of its second (13% more requests a second, 12% shorter prompts, the same
 * tokens a second), so a policy can be checked on that shape without reading the second half.
 * A prompt with content anchors cannot be cut without moving them: RangeError.
 */
export function perturbTrace(requests: readonly TraceRequest[], p: Perturbation): TraceRequest[] {
  const { promptScale, rateScale } = p;
  if (!(promptScale > 0 && promptScale <= 1)) throw new RangeError(`promptScale must be in (0, 1], got ${promptScale}`);
  if (!(rateScale >= 0.1 && rateScale <= 10))
    throw new RangeError(`rateScale must be from 0.1 to 10, got ${rateScale}`);
  return requests.map((r) => {
    if (promptScale === 1) return { ...r, timestamp: r.timestamp / rateScale };
    if (r.anchors !== undefined && r.anchors.length > 0)
      throw new RangeError(`request ${r.index} has content anchors: its prompt cannot be cut (promptScale)`);
    const inputLength = Math.max(1, Math.round(r.inputLength * promptScale));
    const hashIds = r.hashIds.slice(0, Math.ceil(inputLength / r.blockSize));
    return { ...r, timestamp: r.timestamp / rateScale, inputLength, hashIds };
  });
}

/** `k` consecutive windows of (nearly) equal request counts: independent time samples. */
export function windows(requests: readonly TraceRequest[], k: number): TraceRequest[][] {
  if (!Number.isInteger(k) || k < 1) throw new RangeError(`windows must be a positive integer, got ${k}`);
  if (requests.length < k) throw new RangeError(`${requests.length} requests cannot make ${k} windows`);
  const out: TraceRequest[][] = [];
  for (let i = 0; i < k; i++)
    out.push(requests.slice(Math.floor((i * requests.length) / k), Math.floor(((i + 1) * requests.length) / k)));
  return out;
}

/** `n` load points from `light` to `last`, evenly spaced on a log scale, 3 significant digits. */
export function loadPoints(light: number, last: number, n: number): number[] {
  if (!(light > 0 && last > light) || !Number.isInteger(n) || n < 2)
    throw new RangeError('load points need 0 < light < last and n >= 2');
  return Array.from({ length: n }, (_, i) => Number((light * (last / light) ** (i / (n - 1))).toPrecision(3)));
}

/**
 * Who wins at a point: the best peer (not `subject`) by mean TTFT, and how `subject` compares.
 * Rejected requests are left out of hit rate and TTFT, so a policy that rejected more than a
 * peer was measured on fewer requests: it does not meet the bar (`rejectedOk` false) whatever
 * its figures.
 */
export function compareWithBestPeer(point: SweepPoint, subject: string, peers: readonly string[]) {
  const own = point.policies.find((p) => p.policy === subject);
  const candidates = point.policies.filter((p) => p.policy !== subject && peers.includes(p.policy));
  if (!own || candidates.length === 0) return undefined;
  const best = candidates.reduce((a, b) => (b.ttftMean < a.ttftMean ? b : a));
  const bestP99 = Math.min(...candidates.map((p) => p.ttftP99));
  const bestHit = Math.max(...candidates.map((p) => p.hitRate));
  const fewestPeerRejected = Math.min(...candidates.map((p) => p.rejected));
  return {
    own,
    best,
    // the bar of "cost leads on every workload": mean within the intervals, p99 within 5%, hit within 5%
    meanOk: own.ttftMean - own.ci95.ttftMean <= best.ttftMean + best.ci95.ttftMean,
    p99Ok: own.ttftP99 <= 1.05 * bestP99,
    hitOk: own.hitRate >= 0.95 * bestHit,
    rejectedOk: own.rejected <= fewestPeerRejected,
    bestP99,
    bestHit,
    fewestPeerRejected,
  };
}

export interface SweepOptions {
  policies: readonly string[];
  /** Load points (default 5). */
  points?: number;
  /** Simulation settings shared by every run (workers, engine...). */
  simulation: Omit<SimulationOptions, 'policy' | 'speed'>;
  /** Prefill tokens per second one worker computes (sets light load). */
  workerPrefillTokensPerSecond: number;
}

function runAll(
  samples: readonly (readonly TraceRequest[])[],
  policy: string,
  speed: number,
  o: SweepOptions,
): PolicyResult[] {
  return samples.map((trace) => simulate(trace, { ...o.simulation, policy, speed }));
}

/** Round-robin's p99 TTFT at a speed: the median over the samples. */
function roundRobinP99(samples: readonly (readonly TraceRequest[])[], speed: number, o: SweepOptions): number {
  const p = runAll(samples, 'round-robin', speed, o)
    .map((r) => r.ttft.p99)
    .sort((a, b) => a - b);
  return p[Math.floor(p.length / 2)];
}

/**
 * Load points from calibration (training) samples: light load is the arrival rate at which
 * the prompts alone (no cache hits) would keep 15% of the fleet's prefill capacity busy; the
 * knee is where round-robin's p99 TTFT reaches 5× its light-load value (bisection on a log
 * scale); the points run evenly on a log scale from light load to 1.5× the knee.
 */
export function chooseLoadPoints(calibration: readonly (readonly TraceRequest[])[], o: SweepOptions): number[] {
  let tokens = 0;
  let seconds = 0;
  for (const s of calibration) {
    for (const r of s) tokens += r.inputLength;
    seconds += Math.max(1e-3, (s[s.length - 1].timestamp - s[0].timestamp) / 1000);
  }
  const capacity = o.simulation.workers * o.workerPrefillTokensPerSecond;
  const light = Number(((0.15 * capacity) / Math.max(1e-9, tokens / seconds)).toPrecision(3));
  const points = o.points ?? 5;
  const target = 5 * roundRobinP99(calibration, light, o);
  let lo = light;
  let hi = light * 64;
  if (roundRobinP99(calibration, hi, o) < target) return loadPoints(light, hi, points);
  for (let i = 0; i < 8; i++) {
    const mid = Math.sqrt(lo * hi);
    if (roundRobinP99(calibration, mid, o) >= target) hi = mid;
    else lo = mid;
  }
  return loadPoints(light, 1.5 * hi, points);
}

/** Every policy at every speed over the samples. */
export function sweepTrace(
  trace: string,
  samples: readonly (readonly TraceRequest[])[],
  speeds: readonly number[],
  o: SweepOptions,
): SweepTrace {
  return {
    trace,
    points: speeds.map((speed) => ({
      speed,
      policies: o.policies.map((policy) => summarise(policy, runAll(samples, policy, speed, o))),
    })),
  };
}
