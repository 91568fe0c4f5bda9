/**
 * Messages for the option schemas (zod): one phrase per kind of problem, naming the key path
 * and the value given, so the router's constructor, `serve`'s flags, its environment and its
 * config file all report a bad value the same way.
 */
import type { z } from 'zod';
import { escapeUnprintable, quotedText } from './shown-text.js';

type RawIssue = z.core.$ZodRawIssue;

/** `a.b[0].c` for a zod path; a key from outside (a config file's) shows its control characters escaped. */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const p of path) {
    const key = escapeUnprintable(String(p));
    out += typeof p === 'number' ? `[${p}]` : out === '' ? key : `.${key}`;
  }
  return out;
}

function shown(value: unknown): string {
  if (typeof value === 'string') return quotedText(value);
  if (value === null || typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (Array.isArray(value)) return 'a list';
  return typeof value === 'object' ? 'a mapping' : typeof value;
}

/** ` (got VALUE)`, or nothing when there is no value. */
export function gotPhrase(input: unknown): string {
  return input === undefined ? '' : ` (got ${shown(input)})`;
}

const TYPE_NAMES: Readonly<Record<string, string>> = {
  int: 'an integer',
  number: 'a finite number',
  boolean: 'true or false',
  string: 'a string',
  object: 'a mapping',
  array: 'a list',
};

/**
 * The error map handed to `safeParse`: the phrase after the key path ("must be >= 1 (got 0)").
 * Schemas give their own message where a generic one would be vague.
 */
export function describeIssue(issue: RawIssue): string {
  const got = gotPhrase(issue.input);
  switch (issue.code) {
    case 'invalid_type': {
      if (issue.input === undefined && !('received' in issue)) return 'is required';
      const received = 'received' in issue ? ` (got ${String(issue.received)})` : got;
      // a string given for an integer is reported against the integer, not any number
      const format = (issue as { schema?: { def?: { format?: string } } }).schema?.def?.format;
      const expected = format?.includes('int') ? 'int' : issue.expected;
      return `must be ${TYPE_NAMES[expected] ?? expected}${received}`;
    }
    case 'too_small':
      if (issue.origin === 'string' && issue.minimum === 1) return 'must not be empty';
      if (issue.origin === 'array' || issue.origin === 'string')
        return `must have at least ${String(issue.minimum)} ${issue.origin === 'array' ? 'entries' : 'characters'}`;
      return `must be ${issue.inclusive ? '>=' : '>'} ${String(issue.minimum)}${got}`;
    case 'too_big':
      if (issue.origin === 'array' || issue.origin === 'string')
        return `must have at most ${String(issue.maximum)} ${issue.origin === 'array' ? 'entries' : 'characters'}`;
      return `must be ${issue.inclusive ? '<=' : '<'} ${String(issue.maximum)}${got}`;
    case 'not_multiple_of':
      return `must be a multiple of ${String(issue.divisor)}${got}`;
    case 'invalid_value': {
      const values = issue.values.map(String);
      return values.length === 2
        ? `must be '${values[0]}' or '${values[1]}'${got}`
        : `must be one of ${values.join(', ')}${got}`;
    }
    case 'unrecognized_keys':
      return 'is not a known key';
    case 'invalid_format':
      return `must be a valid ${issue.format}${got}`;
    default:
      return `is not valid${got}`;
  }
}

/**
 * describeIssue without the value given: for a secret setting (a token, a URL with a
 * password), whose value no message may repeat.
 */
export function describeIssueHidingValue(issue: RawIssue): string {
  const phrase = describeIssue(issue);
  const got = gotPhrase(issue.input);
  return got !== '' && phrase.endsWith(got) ? phrase.slice(0, -got.length) : phrase;
}

/** The known key closest to a misspelt one (at most two edits, or a prefix), for a did-you-mean. */
export function closestKey(key: string, known: Iterable<string>): string | undefined {
  let best: string | undefined;
  let bestDistance = 3;
  const k = key.toLowerCase();
  for (const candidate of known) {
    const c = candidate.toLowerCase();
    const d = c.startsWith(k) || k.startsWith(c) ? 1 : editDistance(k, c);
    if (d < bestDistance) {
      best = candidate;
      bestDistance = d;
    }
  }
  return best;
}

function editDistance(a: string, b: string): number {
  if (Math.abs(a.length - b.length) > 2) return 3;
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++)
      row[j] = Math.min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = row;
  }
  return prev[b.length];
}

/**
 * `WHERE is not a known key (did you mean GUESS?)`, or with the known keys listed when none is
 * close: what the constructor's options, the router's option objects and the settings all say.
 */
export function unknownKeyMessage(
  where: string,
  key: string,
  known: Iterable<string>,
  phrase = 'is not a known key',
): string {
  const guess = closestKey(key.slice(0, 64), known);
  const names = [...known];
  return `${where} ${phrase}${guess ? ` (did you mean ${guess}?)` : names.length > 0 ? ` (known: ${names.join(', ')})` : ''}`;
}

/** Known keys of the object schema an unknown key was found in (for the message). */
function knownKeys(issue: z.core.$ZodIssue, root: z.ZodType): string[] {
  let schema: unknown = root;
  for (const p of issue.path) {
    schema = unwrap(schema);
    const shape = (schema as { shape?: Record<string, unknown> }).shape;
    schema = shape?.[String(p)];
  }
  const shape = (unwrap(schema) as { shape?: Record<string, unknown> } | undefined)?.shape;
  return shape ? Object.keys(shape) : [];
}

function unwrap(schema: unknown): unknown {
  let s = schema as { unwrap?: () => unknown; def?: { innerType?: unknown } } | undefined;
  while (s?.def?.innerType !== undefined) s = s.def.innerType as typeof s;
  return s;
}

/**
 * One sentence for a failed parse: the first issue, its key path (under `prefix`) and the
 * phrase. Unknown keys name the known ones and the closest.
 */
export function issueMessage(issue: z.core.$ZodIssue, root: z.ZodType, prefix = ''): string {
  const join = (path: readonly PropertyKey[]) => {
    const p = formatPath(path);
    return prefix === '' ? p : p === '' ? prefix : p.startsWith('[') ? `${prefix}${p}` : `${prefix}.${p}`;
  };
  if (issue.code === 'unrecognized_keys') {
    const key = issue.keys[0].slice(0, 64);
    return unknownKeyMessage(join([...issue.path, key]), key, knownKeys(issue, root), issue.message);
  }
  const where = join(issue.path);
  return where === '' ? issue.message : `${where} ${issue.message}`;
}

/**
 * The issue a message reports: the first, except zod's own bound of every integer (the safe
 * integers, within ±(2^53 - 1)), which a value past it meets before the schema's bound: then the
 * schema's bound of the same value, which is the one that holds (a port's 65535, a delay's
 * 2147483647), is reported instead, when there is one.
 */
export function firstIssue(issues: readonly z.core.$ZodIssue[]): z.core.$ZodIssue {
  const first = issues[0];
  if ((first.code !== 'too_big' && first.code !== 'too_small') || first.origin !== 'int') return first;
  const bound = first.code === 'too_big' ? first.maximum : first.minimum;
  if (Math.abs(Number(bound)) !== Number.MAX_SAFE_INTEGER) return first;
  const path = formatPath(first.path);
  return issues.find((i, k) => k > 0 && i.code === first.code && formatPath(i.path) === path) ?? first;
}

/** The error to throw for a failed parse: TypeError for a wrong type, RangeError otherwise. */
export function issueError(issue: z.core.$ZodIssue, root: z.ZodType, prefix = ''): TypeError | RangeError {
  const message = issueMessage(issue, root, prefix);
  return issue.code === 'invalid_type' ? new TypeError(message) : new RangeError(message);
}
