/**
 * The percentile every report of the project uses (simulator, live demo, benchmarks): the
 * nearest-rank definition, the smallest value with at least p% of the values at or below
 * it. It is always one of the samples (no interpolation), so a p99 is a latency that was
 * actually observed.
 */

/** The p-th percentile (0 < p <= 100) of values sorted ascending; NaN when there are none. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (!(p > 0 && p <= 100)) throw new RangeError(`p must be in (0, 100], got ${p}`);
  const n = sorted.length;
  if (n === 0) return NaN;
  return sorted[Math.min(n - 1, Math.max(0, Math.ceil((p / 100) * n) - 1))];
}
