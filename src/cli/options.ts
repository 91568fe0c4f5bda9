import { InvalidArgumentError } from 'commander';
import { POLICY_NAMES } from '../core/policies/index.js';
import { quotedText } from '../core/shown-text.js';
import { MAX_KV_BLOCKS } from '../engine-model/limits.js';

import { DECIMAL } from '../core/validate.js';

export { DECIMAL };

/**
 * A commander parser for an integer flag from `min` to `max` (decimal digits only); bad values
 * exit with a message naming the flag, the bound and the value. `max` is the bound the value
 * meets where it is used (a port's 65535, a timer's 2^31 - 1 ms), so it has no default.
 */
export function intOption(flag: string, min: number, max: number): (value: string) => number {
  return (value: string) => {
    const n = Number(value);
    if (!/^-?\d+$/.test(value.trim())) {
      throw new InvalidArgumentError(`${flag} must be an integer, got ${quotedText(value)}`);
    }
    // past 2^53 the digits are shown as given (the number would be rounded): the bound is what is wrong
    const got = Number.isSafeInteger(n) ? String(n) : quotedText(value.trim());
    if (n < min) throw new InvalidArgumentError(`${flag} must be >= ${min}, got ${got}`);
    if (n > max) throw new InvalidArgumentError(`${flag} must be <= ${max}, got ${got}`);
    return n;
  };
}

/**
 * A commander parser for a file or directory flag: an empty path is refused, naming the flag,
 * as serve's path settings refuse one (it would name no file, or the current directory).
 */
export function pathOption(flag: string): (value: string) => string {
  return (value: string) => {
    if (value === '') throw new InvalidArgumentError(`${flag} must not be empty`);
    return value;
  };
}

/** A commander parser for a positive number flag, at least `min` and at most `max` when given. */
export function positiveNumberOption(
  flag: string,
  { min, max = Number.MAX_VALUE }: { min?: number; max?: number } = {},
): (value: string) => number {
  return (value: string) => {
    const n = Number(value);
    if (!DECIMAL.test(value) || !Number.isFinite(n) || n <= 0)
      throw new InvalidArgumentError(`${flag} must be a positive number, got ${quotedText(value)}`);
    if ((min !== undefined && n < min) || n > max)
      throw new InvalidArgumentError(`${flag} must be from ${min ?? 0} to ${max}, got ${n}`);
    return n;
  };
}

/** A commander parser for a number flag in [0, 1]. */
export function fractionOption(flag: string): (value: string) => number {
  return (value: string) => {
    const n = Number(value);
    if (!DECIMAL.test(value) || !Number.isFinite(n) || n < 0 || n > 1)
      throw new InvalidArgumentError(`${flag} must be a number from 0 to 1, got ${quotedText(value)}`);
    return n;
  };
}

/**
 * The policies of --policies (comma-separated, trimmed): none at all, an empty name (`a,,b`,
 * `a,`) or a name given twice is refused with a message naming the flag, not run as listed.
 */
export function policyList(value: string): string[] {
  const names = value.split(',').map((p) => p.trim());
  if (names.every((n) => n === '')) throw new RangeError('--policies lists no policy');
  if (names.includes('')) throw new RangeError('--policies has an empty name');
  const twice = names.find((n, i) => names.indexOf(n) !== i);
  if (twice !== undefined) throw new RangeError(`--policies names ${quotedText(twice)} twice`);
  return names;
}

/**
 * Refuses a name of `names` that is no policy, before any policy runs (`policyOf`: the policy a
 * name stands for, e.g. a variant's base policy).
 */
export function checkPolicyNames(names: readonly string[], policyOf: (name: string) => string = (n) => n): void {
  for (const name of names)
    if (!POLICY_NAMES.includes(policyOf(name)))
      throw new RangeError(`--policies: unknown policy ${quotedText(name)} (known: ${POLICY_NAMES.join(', ')})`);
}

/**
 * The fields of a `key=value,key=value` spec (the value of --worker or --discover): a part
 * without `=`, an unknown key or a key given twice is refused with a message naming the flag
 * (or `where` the spec came from) and the key.
 */
export function specFields(
  flag: string,
  spec: string,
  keys: readonly string[],
  // the spec as messages show it: cut short, any password in its URLs masked
  where = `${flag} ${quotedText(spec)}`,
): Record<string, string> {
  const fields: Record<string, string> = {};
  for (const part of spec.split(',')) {
    const eq = part.indexOf('=');
    if (eq <= 0) throw new RangeError(`${where}: ${quotedText(part)} is not key=value`);
    const key = part.slice(0, eq).trim();
    if (!keys.includes(key))
      throw new RangeError(`${where}: unknown key ${quotedText(key)} (known: ${keys.join(', ')})`);
    if (Object.hasOwn(fields, key)) throw new RangeError(`${where}: '${key}' is given twice`);
    fields[key] = part.slice(eq + 1).trim();
  }
  return fields;
}

/**
 * Bounds of the simulated cluster (simulate, tune): every engine's KV blocks are held in
 * memory and every policy runs over every worker, so the cluster's size bounds the run's
 * memory and time. Arrivals stretched by a tiny --speed would make the run endless.
 */
export const SIM_LIMITS = Object.freeze({
  workers: 1024,
  /** KV tokens of one engine (16 Mi: past any GPU's today). */
  kvTokens: 2 ** 24,
  /** KV tokens of the whole cluster (workers × KV tokens of each). */
  clusterKvTokens: 2 ** 29,
  /**
   * KV blocks of the whole cluster (each engine's KV tokens / the trace's block size, summed):
   * an engine holds some 25 bytes per block whatever its size, so a trace of small blocks
   * needs far more memory for the same tokens (16 Mi, mock-engine's bound on its blocks).
   */
  clusterKvBlocks: MAX_KV_BLOCKS,
  /**
   * Router replicas × the trace's distinct blocks (hash ids and content-anchor blocks): each
   * replica keeps an index and its policy's state over the blocks it routes. One replica is the
   * replay itself, held by the trace's own bound (MAX_TRACE_BLOCKS).
   */
  replicaBlocks: 2 ** 25,
  speed: { min: 1e-3, max: 1e6 },
  /** Simulated delays and intervals (ms): a day. */
  delayMs: 86_400_000,
});

/** The simulated cluster's KV, refused past SIM_LIMITS.clusterKvTokens with the flags that set it. */
export function checkClusterKv(workers: number, kvTokens: readonly number[], flags: string): void {
  const total = kvTokens.length === 1 ? workers * kvTokens[0] : kvTokens.reduce((a, b) => a + b, 0);
  if (total > SIM_LIMITS.clusterKvTokens)
    throw new RangeError(
      `${flags}: the simulated cluster would hold ${total} KV tokens, more than ${SIM_LIMITS.clusterKvTokens} (each engine's blocks are held in memory)`,
    );
}

/**
 * The simulated cluster's KV in blocks of the trace (`blockSize` tokens), refused past
 * SIM_LIMITS.clusterKvBlocks with the flags that set it: each engine holds floor(KV tokens /
 * block size) blocks (at least one), so a trace of 1-token blocks holds as many blocks as tokens.
 */
export function checkClusterKvBlocks(
  workers: number,
  kvTokens: readonly number[],
  blockSize: number,
  flags: string,
): void {
  const blocks = (t: number) => Math.max(1, Math.floor(t / blockSize));
  const total = kvTokens.length === 1 ? workers * blocks(kvTokens[0]) : kvTokens.reduce((a, t) => a + blocks(t), 0);
  if (total > SIM_LIMITS.clusterKvBlocks)
    throw new RangeError(
      `${flags}: the simulated cluster would hold ${total} KV blocks of the trace's block size (${blockSize} ${blockSize === 1 ? 'token' : 'tokens'}), more than ${SIM_LIMITS.clusterKvBlocks} (each engine's blocks are held in memory)`,
    );
}

/**
 * Router replicas of a run over a trace of `traceBlocks` distinct blocks (distinctTraceBlocks,
 * counted up to half the bound: past it the trace takes one replica), refused past
 * SIM_LIMITS.replicaBlocks naming --replicas, with the most this trace may have.
 */
export function checkReplicaBlocks(replicas: number, traceBlocks: number): void {
  if (replicas < 2 || replicas * traceBlocks <= SIM_LIMITS.replicaBlocks) return;
  const counted = Math.floor(SIM_LIMITS.replicaBlocks / 2);
  const blocks = traceBlocks > counted ? `more than ${counted}` : `${traceBlocks}`;
  const most = Math.floor(SIM_LIMITS.replicaBlocks / traceBlocks);
  throw new RangeError(
    `--replicas ${replicas}: ${replicas} router replicas × the trace's ${blocks} distinct blocks (hash ids and content-anchor blocks) is more than ${SIM_LIMITS.replicaBlocks} (each replica holds its own index of the blocks in memory); ${most < 2 ? 'this trace takes one replica' : `this trace takes at most ${most}`}`,
  );
}

/**
 * Commander's own messages repeat the value they refuse whole (`argument '…' is invalid`,
 * `value '…' from env`, `unknown option '…'`): each is cut as quotedText cuts a value, with
 * any password in a URL masked, so that a megabyte typed by mistake is not printed back.
 */
const COMMANDER_ECHOES: readonly RegExp[] = [
  /^(error: option '[^'\n]*' argument )'([\s\S]*)'( is invalid\.)/,
  /^(error: option '[^'\n]*' value )'([\s\S]*)'( from env '[^'\n]*' is invalid\.)/,
  /^(error: command-argument value )'([\s\S]*)'( is invalid for argument)/,
  /^(error: unknown (?:option|command) )'([\s\S]*)'((?:\n\(Did you mean [^\n]*\?\))?\n?)$/,
];

/** A commander error message with the value it repeats cut short (outputError of the program). */
/**
 * commander's "too many arguments" with what the extra argument most likely is: the value of a
 * switch (`--public-route-api false`), which takes none; its environment variable and config
 * key take true or false, so the habit carries over. Other messages are returned as they are.
 */
export function excessArgumentHint(message: string, argv: readonly string[]): string {
  if (!/too many arguments/.test(message)) return message;
  for (let i = 1; i < argv.length; i++) {
    if (/^--[a-z]/.test(argv[i - 1]) && !argv[i - 1].includes('=') && /^(true|false|yes|no|on|off)$/i.test(argv[i])) {
      const name = argv[i - 1];
      return `${message.trimEnd()}\n${quotedText(argv[i])} follows ${name}, a switch that takes no value: give ${name} alone${name.startsWith('--no-') ? '' : ' to turn it on, leave it out to keep it off'}\n`;
    }
  }
  return message;
}

export function shortenCommanderMessage(message: string): string {
  for (const echo of COMMANDER_ECHOES) {
    const m = echo.exec(message);
    if (m) return `${m[1]}${quotedText(m[2])}${m[3]}${message.slice(m[0].length)}`;
  }
  return message;
}
