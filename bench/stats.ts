/** Small helpers shared by the benchmark programs (not part of the package). */

import { checkOutputFile, type OutputFile } from '../src/cli/output-file.js';
import { resolveCostWeights, type CostWeights } from '../src/core/policies/index.js';

export { percentile } from '../src/sim/percentile.js';

export function round(x: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** Parses `--flag value` pairs and boolean `--flag`s. */
export function parseFlags(argv: readonly string[]): Map<string, string | true> {
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

/**
 * How each flag a program takes is given, by name without the dashes: `value` takes the next
 * argument, `switch` stands alone, `optional` may take one.
 */
export type FlagSpec = Readonly<Record<string, 'value' | 'switch' | 'optional'>>;

/**
 * parseFlags, checked against `spec`: throws naming a stray argument (one after a `switch`
 * included), a flag not in `spec`, or a `value` flag without its value.
 */
export function checkedFlags(argv: readonly string[], spec: FlagSpec): Map<string, string | true> {
  const flags = parseFlags(argv);
  for (const [name, value] of flags) {
    const kind = Object.hasOwn(spec, name) ? spec[name] : undefined;
    if (kind === undefined)
      throw new RangeError(
        `unknown flag --${name} (${Object.keys(spec)
          .map((f) => `--${f}`)
          .join(', ')})`,
      );
    if (kind === 'value' && value === true) throw new RangeError(`--${name} needs a value`);
    if (kind === 'switch' && value !== true)
      throw new RangeError(`unexpected argument '${value}' (--${name} takes no value)`);
  }
  return flags;
}

/** Ends the program as a refusal of its arguments: `error: message` on stderr, exit status 2. */
export function usageError(message: string): never {
  process.stderr.write(`error: ${message}\n`);
  process.exit(2);
}

/**
 * A benchmark program's flags (checkedFlags on `argv`, the arguments after the script's path):
 * a stray argument, an unknown flag or a flag without its value ends it through usageError, before
 * anything runs, where it would otherwise be ignored or end in a stack trace.
 */
export function benchFlags(argv: readonly string[], spec: FlagSpec): Map<string, string | true> {
  try {
    return checkedFlags(argv, spec);
  } catch (err) {
    usageError((err as Error).message);
  }
}

/**
 * checkOutputFile for a file a benchmark writes: one that cannot be written ends the program
 * through usageError (checked before the runs, it costs none of them).
 */
export function benchOutputFile(flag: string, path: string): OutputFile {
  try {
    return checkOutputFile(flag, path);
  } catch (err) {
    usageError((err as Error).message);
  }
}

/**
 * `--cost-weights JSON`: some of the `cost` policy's weights, e.g. '{"pressure":2}', checked as the
 * router checks them (undefined when the flag is not given); a bad one ends the program through
 * usageError, naming the weight.
 */
export function costWeightsFlag(flags: Map<string, string | true>): Partial<CostWeights> | undefined {
  const v = flags.get('cost-weights');
  if (v === undefined) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(String(v));
  } catch {
    usageError(`--cost-weights must be a JSON object of cost weights, e.g. '{"pressure":2}', got '${String(v)}'`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
    usageError(`--cost-weights must be a JSON object of cost weights, e.g. '{"pressure":2}', got '${String(v)}'`);
  try {
    resolveCostWeights(parsed as Partial<CostWeights>);
  } catch (err) {
    usageError(`--cost-weights: ${(err as Error).message}`);
  }
  return parsed as Partial<CostWeights>;
}

export function intFlag(flags: Map<string, string | true>, name: string, fallback: number): number {
  const v = flags.get(name);
  if (v === undefined) return fallback;
  const n = Number(v);
  if (v === true || !Number.isFinite(n) || n < 0) usageError(`--${name} must be a non-negative number`);
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
