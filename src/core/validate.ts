/**
 * Argument checks shared by the public API. Validation lives at the edges so the
 * route path itself can trust its inputs; every message names the argument.
 */
import { unknownKeyMessage } from './schema-issues.js';
import { escapeUnprintable } from './shown-text.js';

/**
 * Whether requireId() takes `value`: a non-empty string. The rule for the ids the router takes
 * as they come (workflows, anchors, content anchors), for ids read from elsewhere (another
 * replica), which are skipped rather than thrown on.
 */
export function isId(value: unknown): value is string {
  return typeof value === 'string' && value.length > 0;
}

/** A 64-bit hash as hashHex() spells it: 16 lowercase hex digits. */
export function isHashHex(value: unknown): value is string {
  return typeof value === 'string' && /^[0-9a-f]{16}$/.test(value);
}

/** A 64-bit hash as hashHex() spells it, or the field left out. */
export function optionalHashHex(value: unknown, name: string): string | undefined {
  if (value === undefined || isHashHex(value)) return value;
  if (typeof value !== 'string') throw new TypeError(`${name} must be a string, got ${typeName(value)}`);
  throw new RangeError(`${name} must be 16 lowercase hex digits, got ${value.length} characters`);
}

export function requireId(value: unknown, name: string): string {
  if (isId(value)) return value;
  if (typeof value !== 'string') throw new TypeError(`${name} must be a string, got ${typeName(value)}`);
  throw new RangeError(`${name} must be a non-empty string`);
}

/**
 * Longest worker id the router takes, in UTF-16 code units. The gateway's ids are at most 64
 * characters (WORKER_ID in src/server/worker-input.ts), and it registers a data-parallel rank
 * as `id#rank`, so the router must take longer ones; a library caller may name workers after
 * what it has, such as a Kubernetes pod's name (at most 253 characters). An id is kept in every
 * table that names the worker and repeated in stats and messages, so it stays short.
 */
export const MAX_WORKER_ID_LENGTH = 256;

/** A UTF-16 surrogate without its other half: such a string has no UTF-8 form (a metric label, a log line, JSON). */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Whether workerId() takes `value`: for ids read from elsewhere (another replica), skipped rather than thrown on. */
export function isWorkerId(value: unknown): value is string {
  return (
    typeof value === 'string' && value.length > 0 && value.length <= MAX_WORKER_ID_LENGTH && !LONE_SURROGATE.test(value)
  );
}

/** A worker id: a non-empty string of at most MAX_WORKER_ID_LENGTH code units, well-formed UTF-16. */
export function workerId(value: unknown, name: string): string {
  requireId(value, name);
  const id = value as string;
  if (id.length > MAX_WORKER_ID_LENGTH)
    throw new RangeError(`${name} must be at most ${MAX_WORKER_ID_LENGTH} characters, got ${id.length}`);
  if (LONE_SURROGATE.test(id)) throw new RangeError(`${name} must be well-formed UTF-16 (it has a lone surrogate)`);
  return id;
}

/** The keys of an options type, as knownKeys() takes them: naming every key of T, and no other, is checked when compiled. */
export function keySet<T>(keys: { readonly [K in keyof Required<T>]: true }): ReadonlySet<string> {
  return new Set(Object.keys(keys));
}

/**
 * Refuses a key of an options object that is not one of `known` (a misspelt `dryrun` would
 * otherwise be ignored, and the call do what was not asked). A key given as undefined counts
 * as not given, as with the constructor's options. Allocates nothing unless it throws: route()
 * checks its options with it on every call.
 */
export function knownKeys(value: object, known: ReadonlySet<string>, name: string): void {
  for (const key in value) {
    if (!known.has(key) && (value as Record<string, unknown>)[key] !== undefined)
      throw new TypeError(unknownKeyMessage(`${name}.${escapeUnprintable(key.slice(0, 64))}`, key, known));
  }
}

/**
 * A CLA group, a workflow step: null/undefined means "not given". An integer from 0 to 2^53 - 1
 * (Number.MAX_SAFE_INTEGER): past it neighbouring integers are one double (2^53 + 1 reads as
 * 2^53), so two groups or steps could not be told apart, and 1e308 would be taken as one.
 */
export function optionalNonNegativeInt(value: unknown, name: string): number | null {
  if (value === null || value === undefined) return null;
  if (typeof value !== 'number') {
    throw new TypeError(`${name} must be an integer or null, got ${typeName(value)}`);
  }
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${name} must be a non-negative integer (at most 2^53 - 1), got ${value}`);
  }
  return value;
}

/** A non-negative integer that must be given (a CLA group a worker serves): null is refused too. */
export function requiredNonNegativeInt(value: unknown, name: string): number {
  const n = optionalNonNegativeInt(value, name);
  if (n === null) throw new TypeError(`${name} must be a non-negative integer, got ${typeName(value)}`);
  return n;
}

/**
 * A count or length (promptTokens, blockTokens, a content anchor's tokens): any non-negative
 * integer, however large, so that the bound it is then held to (maxPromptTokens) is the one named.
 */
export function nonNegativeInt(value: unknown, name: string, fallback: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number') throw new TypeError(`${name} must be a non-negative integer, got ${typeName(value)}`);
  if (!Number.isInteger(value) || value < 0)
    throw new RangeError(`${name} must be a non-negative integer, got ${value}`);
  return value;
}

export function positiveInt(value: unknown, name: string, fallback: number): number {
  const n = nonNegativeInt(value, name, fallback);
  if (n === 0) throw new RangeError(`${name} must be at least 1, got 0`);
  return n;
}

/** A worker load: a fraction of capacity. Above 1 is clamped (as the seed does); NaN or negative is an error. */
export function load(value: unknown, name = 'load'): number {
  if (typeof value !== 'number') throw new TypeError(`${name} must be a number, got ${typeName(value)}`);
  if (Number.isNaN(value)) throw new RangeError(`${name} must not be NaN`);
  if (value < 0) throw new RangeError(`${name} must be >= 0, got ${value}`);
  return value > 1 ? 1 : value;
}

export function optionalId(value: unknown, name: string): string | undefined {
  if (value === undefined || value === null) return undefined;
  return requireId(value, name);
}

/**
 * Most UTF-8 bytes of an id a client chose (a workflow id, an agent role, an anchor, a content
 * anchor's id, a cache salt, a LoRA name) the router takes by default (its `maxIdBytes`): 1 KiB.
 * An id is kept in the router's tables (a workflow's, an anchor's, a content anchor's, up to
 * their capacity), so an unbounded one lets each request keep megabytes; at this bound the
 * tables hold at most about 1 KiB an entry. It is 4 × the gateway's default --max-id-bytes (256):
 * the gateway hands the router a LoRA adapter's name (a `model`, 4 × as long) and a tenant's ids
 * with `tenant/<name>/` before the client's, and a router built for a gateway at its default
 * limits must take them (`serve` passes the exact bound for its own limits: routerIdBytes()).
 */
export const DEFAULT_MAX_ID_BYTES = 1024;

/** Most UTF-8 bytes the router's `maxIdBytes` may be set to (1 GiB: a bound on the setting, not a size to use). */
export const MAX_ID_BYTES = 2 ** 30;

/**
 * Whether `s` is longer than `maxBytes` UTF-8 bytes. A UTF-16 code unit is 1 to 3 bytes (a
 * surrogate pair 4), so only a string of more than a third of the bound in code units is
 * counted, by a loop that allocates nothing.
 */
export function longerThanUtf8Bytes(s: string, maxBytes: number): boolean {
  const n = s.length;
  if (n > maxBytes) return true;
  if (n * 3 <= maxBytes) return false;
  let bytes = 0;
  for (let i = 0; i < n; i++) {
    const c = s.charCodeAt(i);
    // a surrogate (paired: 4 bytes for 2 units; alone: 3, as its replacement character)
    bytes += c < 0x80 ? 1 : c < 0x800 ? 2 : 3;
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < n) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        bytes += 1;
        i++;
      }
    }
    if (bytes > maxBytes) return true;
  }
  return false;
}

/** An id a client chose, given or not: a non-empty string of at most `maxBytes` UTF-8 bytes. */
export function optionalBoundedId(value: unknown, name: string, maxBytes: number): string | undefined {
  if (value === undefined || value === null) return undefined;
  return boundedId(value, name, maxBytes);
}

/** An id a client chose: a non-empty string of at most `maxBytes` UTF-8 bytes (the router's maxIdBytes). */
export function boundedId(value: unknown, name: string, maxBytes: number): string {
  const id = requireId(value, name);
  if (longerThanUtf8Bytes(id, maxBytes))
    throw new RangeError(
      `${name} must be at most ${maxBytes} bytes of UTF-8 (the router's maxIdBytes), got ${id.length} characters`,
    );
  return id;
}

/**
 * A list of ids a client chose (broadcastNewBlocks()' block ids): an array whose every element
 * is an id as boundedId() takes it, a non-empty string of at most `maxBytes` UTF-8 bytes, each
 * named by its index. Every element is checked before the list is used, so a refused list
 * records none of it.
 */
export function boundedIdList(value: unknown, name: string, maxBytes: number): string[] {
  if (!Array.isArray(value)) throw new TypeError(`${name} must be an array of strings, got ${typeName(value)}`);
  for (let i = 0; i < value.length; i++) boundedId(value[i], `${name}[${i}]`, maxBytes);
  return value as string[];
}

export function fraction(value: unknown, name: string): number {
  if (typeof value !== 'number') throw new TypeError(`${name} must be a number, got ${typeName(value)}`);
  if (!(value >= 0 && value <= 1)) throw new RangeError(`${name} must be within [0, 1], got ${value}`);
  return value;
}

export function finiteNonNegative(value: unknown, name: string): number {
  if (typeof value !== 'number') throw new TypeError(`${name} must be a number, got ${typeName(value)}`);
  if (!Number.isFinite(value) || value < 0) throw new RangeError(`${name} must be a finite number >= 0, got ${value}`);
  return value;
}

/** A number from 0 to `max` (a fraction too); NaN, an infinity or a negative one is an error. */
export function numberUpTo(value: unknown, name: string, max: number): number {
  if (typeof value !== 'number')
    throw new TypeError(`${name} must be a number from 0 to ${max}, got ${typeName(value)}`);
  if (!(value >= 0 && value <= max)) throw new RangeError(`${name} must be a number from 0 to ${max}, got ${value}`);
  return value;
}

/**
 * A time in ms (a `now`, a clock's reading): a finite number >= 0. NaN or an infinity would stay
 * in the policy's and the index's bookkeeping for good; a negative time has no generation in
 * the index's expiry (it counts generations of the prediction lifetime from 0).
 */
export function time(value: unknown, name: string): number {
  if (typeof value !== 'number')
    throw new TypeError(`${name} must be a finite number of ms >= 0, got ${typeName(value)}`);
  if (!(value >= 0 && value <= Number.MAX_VALUE))
    throw new RangeError(`${name} must be a finite number of ms >= 0, got ${value}`);
  return value;
}

/**
 * A ticket route() returned: a non-negative integer. An unknown one (ended, untracked: 0) is
 * not an error, since release() and the rest are idempotent; a value that cannot be a ticket is.
 */
export function ticket(value: unknown, name = 'ticket'): number {
  if (typeof value !== 'number')
    throw new TypeError(`${name} must be a ticket route() returned, got ${typeName(value)}`);
  if (!Number.isSafeInteger(value) || value < 0)
    throw new RangeError(`${name} must be a ticket route() returned (an integer >= 0), got ${value}`);
  return value;
}

/** An argument that must be an object (not null, not an array). */
export function object(value: unknown, name: string): void {
  if (value === null || typeof value !== 'object' || Array.isArray(value))
    throw new TypeError(`${name} must be an object, got ${typeName(value)}`);
}

/** A flag that may be left out: a boolean or undefined (a string 'false' would read as true). */
export function optionalBoolean(value: unknown, name: string): void {
  if (value !== undefined && typeof value !== 'boolean')
    throw new TypeError(`${name} must be a boolean, got ${typeName(value)}`);
}

/** A set of ids given as a ReadonlySet; undefined means "none". */
export function optionalSet(value: unknown, name: string): void {
  if (value !== undefined && !(value instanceof Set))
    throw new TypeError(`${name} must be a Set of worker ids, got ${typeName(value)}`);
}

/** Tokens per block: an integer from 1 to 65536 (what the router and the engines support). */
export const MAX_BLOCK_SIZE = 1 << 16;

export function blockSize(value: unknown, name: string): number {
  if (typeof value !== 'number') throw new TypeError(`${name} must be an integer, got ${typeName(value)}`);
  if (!Number.isInteger(value) || value < 1 || value > MAX_BLOCK_SIZE)
    throw new RangeError(`${name} must be an integer from 1 to ${MAX_BLOCK_SIZE}, got ${value}`);
  return value;
}

/** What kind of value `value` is, for a refusal: 'null', 'an array', or its typeof. */
export function typeName(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}

/** A number written in decimal: a sign, a fraction and an exponent allowed, blanks around (not `0x10`, `Infinity`). */
export const DECIMAL = /^\s*[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?\s*$/i;
