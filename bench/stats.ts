/** Small helpers shared by the benchmark programs (not part of the package). */

export { percentile } from '../src/sim/percentile.js';

export function round(x: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** Parses `--flag value` pairs and boolean `--flag`s. */
export function parseFlags(argv: string[]): Map<string, string | true> {
  const flags = new Map<string, string | true>();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) throw new Error(`unexpected argument '${a}'`);
    const next = argv[i + 1];
    if (next !== undefined && !next.startsWith('--')) {
      flags.set(a.slice(2), next);
      i++;
    } else flags.set(a.slice(2), true);
  }
  return flags;
}

export function intFlag(flags: Map<string, string | true>, name: string, fallback: number): number {
  const v = flags.get(name);
  if (v === undefined) return fallback;
  const n = Number(v);
  if (v === true || !Number.isFinite(n) || n < 0) {
    process.stderr.write(`error: --${name} must be a non-negative number\n`);
    process.exit(2);
  }
  return n;
}

/** Heap plus ArrayBuffer memory after a full GC (needs --expose-gc). */
export function memoryAfterGc(): number {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) throw new Error('run with node --expose-gc');
  gc();
  gc();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

/** Median, min and max of repeated measurements, with the values in run order. */
export function spread(values: number[]): { median: number; min: number; max: number; values: number[] } {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  const median = sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  return { median: round(median, 3), min: sorted[0], max: sorted[sorted.length - 1], values };
}
