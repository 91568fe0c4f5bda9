/** Small helpers shared by the benchmark programs (not part of the package). */

import { readFileSync } from 'node:fs';
import { checkOutputFile, type OutputFile } from '../src/cli/output-file.js';
import { SIM_LIMITS } from '../src/cli/options.js';
import { resolveCostWeights, type CostWeights } from '../src/core/policies/index.js';
import { ENGINE_DEFAULTS, engineConfig, type EngineConfig } from '../src/engine-model/index.js';

export { percentile } from '../src/sim/percentile.js';

export function round(x: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** One flag as given: its name without the dashes, its value (true when none), and whether it came as `--name=value`. */
interface GivenFlag {
  readonly name: string;
  readonly value: string | true;
  readonly inline: boolean;
}

/**
 * The flags of `argv` in order: `--name=value` (split at the first `=`), `--name value` (the next
 * argument, when it does not start with `--`), or `--name` alone. Throws naming an argument that is
 * neither a flag nor a flag's value.
 */
function givenFlags(argv: readonly string[]): GivenFlag[] {
  const given: GivenFlag[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) throw new RangeError(`unexpected argument '${a}'`);
    const eq = a.indexOf('=');
    if (eq >= 0) {
      given.push({ name: a.slice(2, eq), value: a.slice(eq + 1), inline: true });
      continue;
    }
    const next = argv[i + 1];
    if (next !== undefined && !next.startsWith('--')) {
      given.push({ name: a.slice(2), value: next, inline: false });
      i++;
    } else given.push({ name: a.slice(2), value: true, inline: false });
  }
  return given;
}

/**
 * How each flag a program takes is given, by name without the dashes: `value` takes a value (the
 * next argument, or after `=` as in `--out=FILE`), `switch` stands alone, `optional` may take one.
 */
export type FlagSpec = Readonly<Record<string, 'value' | 'switch' | 'optional'>>;

/**
 * The flags of `argv` (`--name value`, `--name=value` or `--name` alone), checked against `spec`:
 * throws a RangeError naming a stray argument (one after a `switch` included), a flag not in `spec`,
 * a flag given twice, a `value` flag without its value (`--out=` included), a `switch` given one
 * (`--json=x`), or an `optional` flag given `=` and nothing after it.
 */
export function checkedFlags(argv: readonly string[], spec: FlagSpec): Map<string, string | true> {
  const flags = new Map<string, string | true>();
  for (const { name, value, inline } of givenFlags(argv)) {
    const kind = Object.hasOwn(spec, name) ? spec[name] : undefined;
    if (kind === undefined)
      throw new RangeError(
        `unknown flag --${name} (${Object.keys(spec)
          .map((f) => `--${f}`)
          .join(', ')})`,
      );
    if (flags.has(name)) throw new RangeError(`--${name} given twice`);
    if (kind === 'switch' && value !== true)
      throw new RangeError(
        inline ? `--${name} takes no value` : `unexpected argument '${value}' (--${name} takes no value)`,
      );
    if (kind === 'value' && (value === true || value === '')) throw new RangeError(`--${name} needs a value`);
    if (kind === 'optional' && value === '') throw new RangeError(`--${name}= needs a value (or give --${name} alone)`);
    flags.set(name, value);
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
 * a stray argument, an unknown flag, a flag given twice, a flag without its value or a switch given
 * one ends it through usageError, before anything runs, where it would otherwise be ignored, taken
 * as the last one given, or end in a stack trace.
 */
export function benchFlags(argv: readonly string[], spec: FlagSpec): Map<string, string | true> {
  if (argv.length === 1 && (argv[0] === '--help' || argv[0] === '-h')) {
    process.stdout.write(usageText(process.argv[1], spec));
    process.exit(0);
  }
  try {
    return checkedFlags(argv, spec);
  } catch (err) {
    usageError((err as Error).message);
  }
}

/**
 * What `--help` prints for the benchmark program at `path`: the comment that opens its file (what
 * it measures and its command line, kept there for readers of the source) and its flags.
 */
function usageText(path: string, spec: FlagSpec): string {
  const source = readFileSync(path, 'utf8');
  const opening = /^\/\*\*\n([\s\S]*?)\n \*\//.exec(source);
  const comment = opening ? opening[1].replace(/^ \* ?/gm, '') + '\n\n' : '';
  const flags = Object.entries(spec).map(([name, kind]) =>
    kind === 'switch' ? `--${name}` : kind === 'optional' ? `--${name}[=VALUE]` : `--${name} VALUE`,
  );
  return `${comment}flags: ${flags.length > 0 ? flags.join(', ') : 'none'}\n`;
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
 * The JSON object a flag gives, checked by `check` (which throws naming what is wrong), or
 * undefined when the flag is not given; one that is not a JSON object, or that `check` refuses,
 * ends the program through usageError naming the flag. `what` says what the object holds, with an
 * example, for the message.
 */
function jsonObjectFlag(
  flags: Map<string, string | true>,
  name: string,
  what: string,
  check: (value: Record<string, unknown>) => void,
): Record<string, unknown> | undefined {
  const v = flags.get(name);
  if (v === undefined) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(String(v));
  } catch {
    parsed = undefined;
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
    usageError(`--${name} must be a JSON object of ${what}, got '${String(v)}'`);
  try {
    check(parsed as Record<string, unknown>);
  } catch (err) {
    usageError(`--${name}: ${(err as Error).message}`);
  }
  return parsed as Record<string, unknown>;
}

/**
 * `--cost-weights JSON`: some of the `cost` policy's weights, e.g. '{"pressure":2}', checked as the
 * router checks them (undefined when the flag is not given); a bad one ends the program through
 * usageError, naming the weight.
 */
export function costWeightsFlag(flags: Map<string, string | true>): Partial<CostWeights> | undefined {
  return jsonObjectFlag(flags, 'cost-weights', `cost weights, e.g. '{"pressure":2}'`, (weights) =>
    resolveCostWeights(weights as Partial<CostWeights>),
  ) as Partial<CostWeights> | undefined;
}

/** The engine settings `--engine` may change: every one of ENGINE_DEFAULTS (the block size is the trace's). */
export type EngineSettings = Partial<Omit<EngineConfig, 'blockTokens'>>;

/**
 * `--engine JSON`: some of the simulated engine's settings, e.g. '{"kvTokens":190000}', checked as
 * the simulator checks them (undefined when the flag is not given); an unknown setting or a bad
 * value ends the program through usageError, naming it.
 */
export function engineFlag(flags: Map<string, string | true>): EngineSettings | undefined {
  return jsonObjectFlag(flags, 'engine', `engine settings, e.g. '{"kvTokens":190000}'`, (settings) => {
    for (const key of Object.keys(settings))
      if (!Object.hasOwn(ENGINE_DEFAULTS, key))
        throw new RangeError(`unknown setting '${key}' (known: ${Object.keys(ENGINE_DEFAULTS).join(', ')})`);
    engineConfig({ ...(settings as EngineSettings), blockTokens: 1 });
    // simulate's own bound on one engine's KV: its blocks are held in memory
    const kvTokens = settings.kvTokens;
    if (typeof kvTokens === 'number' && kvTokens > SIM_LIMITS.kvTokens)
      throw new RangeError(
        `kvTokens must be at most ${SIM_LIMITS.kvTokens}, as simulate's --kv-tokens (got ${kvTokens})`,
      );
    // the sweep's load points are counted in the engines' prefill rate, 1 / linearMsPerToken
    if (settings.linearMsPerToken === 0)
      throw new RangeError('linearMsPerToken must be > 0 (the load points are counted in the prefill rate it gives)');
  }) as EngineSettings | undefined;
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
