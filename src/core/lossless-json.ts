/**
 * JSON read as Python's json module reads it, for the text a chat template renders: a number
 * keeps what Python makes of its literal (`1.0` stays a float, `12345678901234567890` keeps
 * every digit), where JSON.parse makes both a rounded JS number. vLLM renders tool schemas and
 * tool-call arguments with Python's json.dumps, so the router needs the same text to get the
 * engine's token ids.
 */

/** A JSON number with the text Python prints for it: repr() of its float, or its int's digits. */
export class JsonNumber {
  /** As a JS number (rounded), for comparisons and arithmetic. */
  readonly value: number;
  /** Python's json.dumps text: repr() of the float ('Infinity' for an overflow), the int's digits. */
  readonly jsonText: string;
  /** Python's str(): as jsonText, but 'inf' / '-inf' for an overflowed float. */
  readonly strText: string;

  constructor(
    /** The literal as written in the JSON text. */
    readonly literal: string,
    /** A float literal (with a fraction or an exponent): Python's float, else Python's int. */
    readonly isFloat: boolean,
  ) {
    this.value = Number(literal);
    if (isFloat) {
      this.jsonText = pythonFloatJson(this.value);
      this.strText = Number.isFinite(this.value) ? this.jsonText : this.value > 0 ? 'inf' : '-inf';
    } else {
      this.jsonText = BigInt(literal).toString(); // "-0" is Python's int 0
      this.strText = this.jsonText;
    }
  }

  /** In a JSON.stringify (a cache key): the literal, so 1.0 and 1 stay apart. */
  toJSON(): string {
    return this.literal;
  }
}

/** Python's json.dumps of a float: repr() (shortest round-trip digits), Infinity/-Infinity/NaN. */
export function pythonFloatJson(x: number): string {
  if (Number.isNaN(x)) return 'NaN';
  if (!Number.isFinite(x)) return x > 0 ? 'Infinity' : '-Infinity';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const sign = x < 0 ? '-' : '';
  // shortest digits that read back as x, as repr() picks them; then repr's layout
  const [mantissa, exponentText] = Math.abs(x).toExponential().split('e');
  const digits = mantissa.replace('.', '');
  const exp = Number(exponentText);
  if (exp < -4 || exp >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    return `${sign}${m}e${exp < 0 ? '-' : '+'}${String(Math.abs(exp)).padStart(2, '0')}`;
  }
  if (exp < 0) return `${sign}0.${'0'.repeat(-exp - 1)}${digits}`;
  if (digits.length <= exp + 1) return `${sign}${digits}${'0'.repeat(exp + 1 - digits.length)}.0`;
  return `${sign}${digits.slice(0, exp + 1)}.${digits.slice(exp + 1)}`;
}

/**
 * The order of an object's keys as the JSON text gave them, kept on objects that have a key
 * JavaScript enumerates first whatever its place (an array index: "0", "10"). Python's dict keeps
 * the text's order, and json.dumps (a template's tojson) writes it: `{"b": 1, "2": 0}` stays so.
 */
const KEY_ORDER: unique symbol = Symbol('jsonKeyOrder');
/** A key JavaScript enumerates before every other, in numeric order: a canonical array index. */
const ARRAY_INDEX = /^(?:0|[1-9]\d{0,9})$/;
const isArrayIndex = (key: string): boolean => ARRAY_INDEX.test(key) && Number(key) < 2 ** 32 - 1;

/**
 * An object's entries in the order its JSON text (or orderedObject) gave them; a key deleted
 * since is left out, and one added since comes after them (as a Python dict would have it).
 */
export function jsonEntries(object: object): Array<[string, unknown]> {
  const order = (object as { [KEY_ORDER]?: readonly string[] })[KEY_ORDER];
  const record = object as Record<string, unknown>;
  if (order === undefined) return Object.entries(record);
  const entries: Array<[string, unknown]> = [];
  for (const key of order) if (Object.prototype.hasOwnProperty.call(record, key)) entries.push([key, record[key]]);
  const keys = Object.keys(record);
  if (entries.length !== keys.length)
    for (const key of keys) if (!order.includes(key)) entries.push([key, record[key]]);
  return entries;
}

/**
 * A plain object of `entries` that jsonEntries gives back in this order (a repeated key keeps
 * its first place and its last value, as in a Python dict). Keys are defined, not assigned: a
 * "__proto__" key is a member, never the prototype.
 */
export function orderedObject(entries: Iterable<readonly [string, unknown]>): Record<string, unknown> {
  const object: Record<string, unknown> = {};
  const keys: string[] = [];
  let indexKey = false;
  for (const [key, value] of entries) {
    if (!Object.prototype.hasOwnProperty.call(object, key)) {
      keys.push(key);
      if (isArrayIndex(key)) indexKey = true;
    }
    Object.defineProperty(object, key, { value, enumerable: true, writable: true, configurable: true });
  }
  if (indexKey) Object.defineProperty(object, KEY_ORDER, { value: keys });
  return object;
}

const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;
// eslint-disable-next-line no-control-regex -- JSON strings exclude the control characters
const STRING = /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y;
const WHITESPACE = /[ \t\n\r]*/y;

/**
 * Parses JSON text as JSON.parse does, except that every number is a JsonNumber. Objects are
 * plain objects (the last of a repeated key wins, as in both parsers) whose keys jsonEntries
 * gives in the text's order, as Python's json keeps them. Nesting deeper than
 * maxDepth is refused. Throws a SyntaxError for text that is not JSON.
 */
export function parseLosslessJson(text: string, maxDepth: number): unknown {
  let pos = 0;
  const skipWhitespace = () => {
    WHITESPACE.lastIndex = pos;
    WHITESPACE.test(text);
    pos = WHITESPACE.lastIndex;
  };
  const fail = (): never => {
    throw new SyntaxError(`not JSON at position ${pos}`);
  };
  const readString = (): string => {
    STRING.lastIndex = pos;
    const m = STRING.exec(text) ?? fail();
    pos = STRING.lastIndex;
    return JSON.parse(m[0]) as string;
  };
  const readValue = (depth: number): unknown => {
    skipWhitespace();
    const c = text[pos];
    if (c === '"') return readString();
    if (c === '{' || c === '[') {
      if (depth >= maxDepth) throw new SyntaxError(`JSON nested deeper than ${maxDepth}`);
      pos++;
      skipWhitespace();
      const close = c === '{' ? '}' : ']';
      const array: unknown[] = [];
      const members: Array<[string, unknown]> = [];
      if (text[pos] === close) pos++;
      else
        for (;;) {
          if (c === '{') {
            skipWhitespace();
            if (text[pos] !== '"') fail();
            const key = readString();
            skipWhitespace();
            if (text[pos++] !== ':') fail();
            members.push([key, readValue(depth + 1)]);
          } else array.push(readValue(depth + 1));
          skipWhitespace();
          const sep = text[pos++];
          if (sep === close) break;
          if (sep !== ',') fail();
        }
      return c === '{' ? orderedObject(members) : array;
    }
    for (const [word, value] of [
      ['true', true],
      ['false', false],
      ['null', null],
    ] as const)
      if (text.startsWith(word, pos)) {
        pos += word.length;
        return value;
      }
    NUMBER.lastIndex = pos;
    const m = NUMBER.exec(text) ?? fail();
    pos = NUMBER.lastIndex;
    return new JsonNumber(m[0], m[1] !== undefined || m[2] !== undefined);
  };
  const value = readValue(0);
  skipWhitespace();
  if (pos !== text.length) fail();
  return value;
}

/**
 * The source text of a top-level member of a JSON object text (the last one of that name, as
 * JSON.parse keeps it), or undefined. The text must be JSON (checked by JSON.parse before).
 */
export function memberSourceText(text: string, key: string): string | undefined {
  let pos = 0;
  const skipWhitespace = () => {
    WHITESPACE.lastIndex = pos;
    WHITESPACE.test(text);
    pos = WHITESPACE.lastIndex;
  };
  const skipString = () => {
    STRING.lastIndex = pos;
    const m = STRING.exec(text);
    if (!m) throw new SyntaxError(`not JSON at position ${pos}`);
    pos = STRING.lastIndex;
    return m[0];
  };
  skipWhitespace();
  if (text[pos] !== '{') return undefined;
  pos++;
  let found: string | undefined;
  for (;;) {
    skipWhitespace();
    if (text[pos] !== '"') return found;
    const name = JSON.parse(skipString()) as string;
    skipWhitespace();
    pos++; // ':'
    skipWhitespace();
    const start = pos;
    let depth = 0;
    for (; pos < text.length;) {
      const c = text[pos];
      if (c === '"') {
        skipString();
        if (depth === 0) break;
        continue;
      }
      if (c === '{' || c === '[') depth++;
      else if (c === '}' || c === ']') {
        if (depth === 0) break;
        if (--depth === 0) {
          pos++;
          break;
        }
      } else if (c === ',' && depth === 0) break;
      pos++;
    }
    if (name === key) found = text.slice(start, pos).trimEnd();
    skipWhitespace();
    if (text[pos++] !== ',') return found;
  }
}
