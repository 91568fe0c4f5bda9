/**
 * Renders a chat template (@huggingface/jinja) over data that holds JsonNumbers (from
 * parseLosslessJson) so numbers print as Python prints them: `tojson` writes json.dumps' text
 * (`0.0`, `1e-07`, every digit of a big int) and `{{ x }}` writes str(). @huggingface/jinja
 * turns JS numbers into its IntegerValue/FloatValue (1.0 becomes an integer) and writes them with
 * JSON.stringify. Here a JsonNumber becomes a subclass of the library's FloatValue or
 * IntegerValue: templates compare and compute with it as a number, and its text is Python's.
 * What a template prints is Python's str() too (pythonStr): `{{ x }}`, `~` and the string
 * filter write None, True and False by name and a dict or list as repr() writes it, where the
 * library writes nothing, `true` and JSON; `length` counts a string's code points.
 */
import { randomUUID } from 'node:crypto';
import { Environment, Interpreter, Template } from '@huggingface/jinja';
import { JsonNumber, jsonEntries } from '../core/lossless-json.js';

type RuntimeValue = ReturnType<Environment['set']>;
type Program = Template['parsed'];
interface NumberValue {
  type: string;
  value: number;
  toString(): string;
}
type ValueClass<V> = new (value: V) => RuntimeValue;

// The library exports no value classes; each is the class of a value it makes from JS data.
const probe = new Environment();
let probes = 0;
const classOf = <V>(data: unknown): ValueClass<V> => probe.set(`probe${probes++}`, data).constructor as ValueClass<V>;
const IntegerValue = classOf<number>(1) as unknown as new (value: number) => NumberValue;
const FloatValue = classOf<number>(0.5) as unknown as new (value: number) => NumberValue;
const StringValue = classOf<string>('');
const BooleanValue = classOf<boolean>(true);
const NullValue = classOf<null>(null);
const UndefinedValue = classOf<undefined>(undefined);
const ArrayValue = classOf<RuntimeValue[]>([]);
const ObjectValue = classOf<Map<string, RuntimeValue>>({});
const FunctionValue = classOf<unknown>(() => null);
const TupleValue = (() => {
  // the library makes a tuple of a template's `(a, b)` only
  const env = new Environment();
  new Interpreter(env).run(new Template('{% set t = (1, 2) %}').parsed);
  return env.lookupVariable('t').constructor as ValueClass<RuntimeValue[]>;
})();

/** A Python float from JSON: str() and json.dumps as Python writes them. */
class PythonFloatValue extends FloatValue {
  constructor(readonly number: JsonNumber) {
    super(number.value);
  }
  override toString(): string {
    return this.number.strText;
  }
}

/** A Python int from JSON: every digit of it, though the value used in arithmetic is rounded. */
class PythonIntValue extends IntegerValue {
  constructor(readonly number: JsonNumber) {
    super(number.value);
  }
  override toString(): string {
    return this.number.strText;
  }
}

/**
 * The characters Python's str.strip() takes as whitespace (str.isspace()). JavaScript's trim()
 * takes another set: it also strips U+FEFF and keeps U+001C-U+001F and U+0085.
 */
const PYTHON_WHITESPACE: ReadonlySet<string> = new Set(
  '\t\n\v\f\r\u001c\u001d\u001e\u001f \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000',
);

/**
 * Python's str.strip / lstrip / rstrip: with no argument (or None) its whitespace, with a
 * string the code points of that string.
 */
export function pythonStrip(s: string, chars: string | undefined, left: boolean, right: boolean): string {
  const set = chars === undefined ? PYTHON_WHITESPACE : new Set(Array.from(chars));
  let start = 0;
  let end = s.length;
  if (left)
    while (start < end) {
      const ch = String.fromCodePoint(s.codePointAt(start)!);
      if (!set.has(ch)) break;
      start += ch.length;
    }
  if (right)
    while (end > start) {
      const low = s.charCodeAt(end - 1);
      const pair = low >= 0xdc00 && low <= 0xdfff && end - 2 >= start && /[\ud800-\udbff]/.test(s[end - 2]);
      const ch = pair ? s.slice(end - 2, end) : s[end - 1];
      if (!set.has(ch)) break;
      end -= ch.length;
    }
  return s.slice(start, end);
}

/** The `chars` argument of a strip method or the trim filter: undefined for none or None. */
function stripChars(args: RuntimeValue[], what: string): string | undefined {
  const arg = args[0] as { value?: unknown } | undefined;
  if (arg === undefined || arg instanceof NullValue || arg instanceof UndefinedValue) return undefined;
  if (arg instanceof StringValue) return arg.value as string;
  throw new TypeError(`${what} arg must be None or str`);
}

// The library's string methods strip(), lstrip() and rstrip() ignore their argument and use
// JavaScript's trim(): replaced on every string value, with Python's semantics.
const stringBuiltins = Object.getOwnPropertyDescriptor(StringValue.prototype, 'builtins');
if (stringBuiltins?.get) {
  const libraryBuiltins = stringBuiltins.get;
  const patched = new WeakSet<object>();
  Object.defineProperty(StringValue.prototype, 'builtins', {
    configurable: true,
    get(this: { value: string }) {
      const map = libraryBuiltins.call(this) as Map<string, RuntimeValue>;
      if (!patched.has(map)) {
        patched.add(map);
        const methods: Array<[string, boolean, boolean]> = [
          ['strip', true, true],
          ['lstrip', true, false],
          ['rstrip', false, true],
        ];
        for (const [name, left, right] of methods)
          map.set(
            name,
            new FunctionValue((args: RuntimeValue[]) =>
              toRuntime(pythonStrip(this.value, stripChars(args, name), left, right)),
            ) as RuntimeValue,
          );
      }
      return map;
    },
  });
}

/**
 * Python's str.isprintable() is false for these: control, format, surrogate, private-use and
 * unassigned code points, and separators other than the space. repr() escapes them.
 */
const NOT_PRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u;

/** Python's repr() of a str: single quotes unless it holds one and no double quote; escapes as Python writes them. */
export function pythonStringRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const code = ch.codePointAt(0)!;
    if (ch === quote || ch === '\\') out += '\\' + ch;
    else if (ch === '\t') out += '\\t';
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (code < 0x20 || code === 0x7f) out += '\\x' + code.toString(16).padStart(2, '0');
    else if (code < 0x7f || !NOT_PRINTABLE.test(ch)) out += ch;
    else if (code <= 0xff) out += '\\x' + code.toString(16).padStart(2, '0');
    else if (code <= 0xffff) out += '\\u' + code.toString(16).padStart(4, '0');
    else out += '\\U' + code.toString(16).padStart(8, '0');
  }
  return out + quote;
}

/**
 * What Jinja2 prints for a value (`{{ x }}`, `~`, the string filter): Python's str(), so None,
 * True and False by their Python names, and a dict, list or tuple as Python's repr() writes it
 * (`{'a': None, 'b': [1, 'x']}`), where the library writes JSON (`{"a": null, ...}`) or nothing
 * (None); an undefined value as ''. Other values (namespaces, functions) as the library writes them.
 */
export function pythonStr(value: RuntimeValue): string {
  if (value instanceof StringValue) return value.value as string;
  // Jinja2's Undefined: str() is '' (its repr, inside a container, `Undefined`)
  if (value instanceof UndefinedValue) return '';
  if (value instanceof NullValue) return 'None';
  if (value instanceof BooleanValue) return value.value ? 'True' : 'False';
  if (value instanceof ArrayValue || (value instanceof ObjectValue && value.type === 'ObjectValue'))
    return pythonRepr(value);
  return value.toString();
}

/** Python's repr() of a value inside a container: a str quoted, the rest as pythonStr. */
function pythonRepr(value: RuntimeValue): string {
  if (value instanceof StringValue) return pythonStringRepr(value.value as string);
  if (value instanceof UndefinedValue) return 'Undefined';
  if (value instanceof TupleValue) {
    const items = (value.value as RuntimeValue[]).map(pythonRepr);
    return items.length === 1 ? `(${items[0]},)` : `(${items.join(', ')})`;
  }
  if (value instanceof ArrayValue) return `[${(value.value as RuntimeValue[]).map(pythonRepr).join(', ')}]`;
  if (value instanceof ObjectValue && value.type === 'ObjectValue') {
    const entries = [...(value.value as Map<string, RuntimeValue>)];
    return `{${entries.map(([k, v]) => `${pythonStringRepr(k)}: ${pythonRepr(v)}`).join(', ')}}`;
  }
  return pythonStr(value);
}

type PythonNumberValue = PythonFloatValue | PythonIntValue;
const isPythonNumber = (v: unknown): v is PythonNumberValue =>
  v instanceof PythonFloatValue || v instanceof PythonIntValue;

/** JS data as template values, as the library converts it, with JsonNumbers as Python numbers. */
function toRuntime(data: unknown): RuntimeValue {
  if (data instanceof JsonNumber)
    return (data.isFloat ? new PythonFloatValue(data) : new PythonIntValue(data)) as unknown as RuntimeValue;
  switch (typeof data) {
    case 'number':
      return (Number.isInteger(data) ? new IntegerValue(data) : new FloatValue(data)) as unknown as RuntimeValue;
    case 'string':
      return new StringValue(data);
    case 'boolean':
      return new BooleanValue(data);
    case 'undefined':
      return new UndefinedValue(undefined);
    case 'object':
      if (data === null) return new NullValue(null);
      if (Array.isArray(data)) return new ArrayValue(data.map(toRuntime));
      // in the JSON text's order (an array-index key is not moved first): a Python dict's
      return new ObjectValue(new Map(jsonEntries(data).map(([k, v]) => [k, toRuntime(v)])));
    default:
      return new Environment().set('value', data);
  }
}

// The globals Template.render gives a template (its setupGlobals is not exported): range and
// strftime_now are taken from a rendering, the rest are plain values.
const captured: unknown[] = [];
new Template('{{ keep(range, strftime_now) }}').render({ keep: (...fns: unknown[]) => void captured.push(...fns) });
/**
 * What a template's raise_exception(message) throws: the template refuses the request, as
 * transformers' raise_exception raises a TemplateError, which vLLM answers with a 400 that
 * carries the message. A RangeError, so the gateway shows the message to the client, in
 * process as from a tokenizer thread.
 */
export class ChatTemplateError extends RangeError {
  constructor(message: string) {
    super(message);
    this.name = 'ChatTemplateError';
  }
}
// made once: it holds no state, and building it for each rendering allocates an Environment
const RAISE_EXCEPTION = toRuntime((message: unknown) => {
  throw new ChatTemplateError(String(message));
});
/**
 * Most items a template's range() may make. The library builds the whole list first, and a list
 * of some hundred million items is no exception a rendering can catch: V8 stops the process
 * ("invalid size error"), every request in flight with it. A chat template loops over the
 * messages and tools; a hundred thousand is far past any real one.
 */
export const MAX_TEMPLATE_RANGE = 100_000;

/** A rendering refused by a bound of this renderer's (MAX_TEMPLATE_RANGE): answered 400, naming it. */
export class TemplateBoundError extends RangeError {
  constructor(message: string) {
    super(message);
    this.name = 'TemplateBoundError';
  }
}
type TemplateFunction = (args: RuntimeValue[], scope: unknown) => RuntimeValue;
const libraryRange = captured[0] as TemplateFunction;
/** The library's range(), refused (RangeError) past MAX_TEMPLATE_RANGE items. */
const boundedRange: TemplateFunction = (args, scope) => {
  const n = args.map((a) => (a as { value?: unknown }).value);
  if (n.every((v) => typeof v === 'number')) {
    const [start, stop, step = 1] = n.length === 1 ? [0, n[0] as number] : (n as number[]);
    const items = step > 0 ? (stop - start) / step : step < 0 ? (start - stop) / -step : 0;
    if (items > MAX_TEMPLATE_RANGE)
      throw new TemplateBoundError(
        `the chat template's range() would make ${Math.ceil(items)} items, more than ${MAX_TEMPLATE_RANGE}`,
      );
  }
  return libraryRange(args, scope);
};
const GLOBALS: ReadonlyArray<[string, () => RuntimeValue]> = [
  ['false', () => new BooleanValue(false)],
  ['true', () => new BooleanValue(true)],
  ['none', () => new NullValue(null)],
  ['raise_exception', () => RAISE_EXCEPTION],
  ['range', () => new FunctionValue(boundedRange)],
  ['strftime_now', () => new FunctionValue(captured[1])],
  ['True', () => new BooleanValue(true)],
  ['False', () => new BooleanValue(false)],
  ['None', () => new NullValue(null)],
];

interface FilterNode {
  type: string;
  value?: unknown;
  callee?: { type: string; value?: unknown };
}
type ApplyFilter = (this: Interpreter, operand: RuntimeValue, filter: FilterNode, env: Environment) => RuntimeValue;

/**
 * The library's filters, but `tojson` writes Python numbers with json.dumps' text: the
 * library's own tojson runs over the value with each Python number swapped for a marker string,
 * and each quoted marker is then replaced by the number's text (so indent, separators, sort_keys
 * and ensure_ascii stay the library's). Set on each interpreter (its applyFilter is private).
 */
const libraryApplyFilter = (Interpreter.prototype as unknown as { applyFilter: ApplyFilter }).applyFilter;
const isFilter = (filter: FilterNode, name: string): boolean =>
  (filter.type === 'Identifier' && filter.value === name) ||
  (filter.type === 'CallExpression' && filter.callee?.type === 'Identifier' && filter.callee.value === name);
const applyFilterWithPythonNumbers: ApplyFilter = function (operand, filter, env) {
  const isTojson = isFilter(filter, 'tojson');
  if (!isTojson) {
    // Jinja2's string filter is str(); length and count of a str count its code points
    if (filter.type === 'Identifier' && filter.value === 'string') return new StringValue(pythonStr(operand));
    if (filter.type === 'Identifier' && (filter.value === 'length' || filter.value === 'count')) {
      if (operand instanceof StringValue)
        return new IntegerValue([...(operand.value as string)].length) as unknown as RuntimeValue;
      // count is length's other name in Jinja2; the library knows only length on a list or dict
      if (filter.value === 'count' && operand instanceof ArrayValue)
        return new IntegerValue((operand.value as RuntimeValue[]).length) as unknown as RuntimeValue;
      if (filter.value === 'count' && operand instanceof ObjectValue && operand.type === 'ObjectValue')
        return new IntegerValue((operand.value as Map<string, RuntimeValue>).size) as unknown as RuntimeValue;
    }
    // Jinja2's join writes each item's str() (None, True, a dict as Python writes them), where the
    // library writes its own text
    if (isFilter(filter, 'join') && operand instanceof ArrayValue) {
      const args = filter.type === 'CallExpression' ? ((filter as { args?: Array<{ type: string }> }).args ?? []) : [];
      // join by an attribute (a keyword argument, or the second positional one): the library
      // writes each item's own text, never the attribute's; failing the rendering routes the
      // request on its text rather than on wrong ids
      if (args.length > 1 || args.some((a) => a.type === 'KeywordArgumentExpression'))
        throw new Error('join by an attribute, or with keyword arguments, is not rendered here');
      // the separator is str() of whatever it is (join(None) joins with "None"), as Jinja2's
      const separator = args.length === 1 ? pythonStr(this.evaluate(args[0] as never, env) as RuntimeValue) : '';
      return new StringValue((operand.value as RuntimeValue[]).map(pythonStr).join(separator));
    }
    // Jinja's trim filter is Python's str.strip(chars), not JavaScript's trim()
    if (isFilter(filter, 'trim') && operand instanceof StringValue) {
      const args =
        filter.type === 'CallExpression'
          ? ((filter as { args?: unknown[] }).args ?? []).map((a) => this.evaluate(a as never, env) as RuntimeValue)
          : [];
      return new StringValue(pythonStrip(operand.value as string, stripChars(args, 'trim'), true, true));
    }
    return libraryApplyFilter.call(this, operand, filter, env);
  }
  const numbers: PythonNumberValue[] = [];
  const marked = markNumbers(operand, numbers);
  const result = libraryApplyFilter.call(this, marked, filter, env);
  if (numbers.length === 0) return result;
  const text = (result.value as string).replace(MARKER, (_, i: string) => numbers[Number(i)].number.jsonText);
  return new StringValue(text);
};

// ASCII letters and digits only: JSON.stringify and ensure_ascii leave a marker as it is. The
// random part keeps a marker from ever being text a request sent.
const MARKER_PREFIX = `pyjson${randomUUID().replaceAll('-', '')}n`;
const MARKER = new RegExp(`"${MARKER_PREFIX}(\\d+)"`, 'g');

/** The value with each Python number swapped for a marker string (numbers[i] for marker i). */
function markNumbers(value: RuntimeValue, numbers: PythonNumberValue[]): RuntimeValue {
  if (isPythonNumber(value)) {
    numbers.push(value);
    return new StringValue(`${MARKER_PREFIX}${numbers.length - 1}`);
  }
  if (value instanceof ArrayValue) {
    // an array or a tuple, rebuilt as what it is
    const items = value.value as RuntimeValue[];
    const marked = items.map((v) => markNumbers(v, numbers));
    return marked.every((v, i) => v === items[i]) ? value : new (value.constructor as typeof ArrayValue)(marked);
  }
  if (value instanceof ObjectValue && value.type === 'ObjectValue') {
    const entries = [...(value.value as Map<string, RuntimeValue>)];
    const marked = entries.map(([k, v]): [string, RuntimeValue] => [k, markNumbers(v, numbers)]);
    return marked.every(([, v], i) => v === entries[i][1]) ? value : new ObjectValue(new Map(marked));
  }
  return value;
}

interface StatementNode {
  type: string;
}
interface BinaryNode {
  type: string;
  operator: { value: string };
  left: unknown;
  right: unknown;
}
type Evaluate = (this: Interpreter, node: unknown, env: Environment) => RuntimeValue;
type EvaluateBlock = (this: Interpreter, statements: StatementNode[], env: Environment) => RuntimeValue;
type EvaluateBinary = (this: Interpreter, node: BinaryNode, env: Environment) => RuntimeValue;
const interpreterMethods = Interpreter.prototype as unknown as {
  evaluate: Evaluate;
  evaluateBinaryExpression: EvaluateBinary;
};
const libraryBinary = interpreterMethods.evaluateBinaryExpression;
/** The template's statements (tags): what they give is the text of their body, or nothing. */
const STATEMENTS = new Set([
  'Program',
  'If',
  'For',
  'Break',
  'Continue',
  'Set',
  'Macro',
  'Comment',
  'FilterStatement',
  'CallStatement',
]);

/**
 * The library's evaluateBlock, but an output expression (`{{ x }}`) writes what Jinja2 writes:
 * pythonStr (None as `None`, where the library writes nothing; True, dicts and lists as Python).
 */
const evaluateBlockAsPython: EvaluateBlock = function (statements, env) {
  let result = '';
  for (const statement of statements) {
    const value = interpreterMethods.evaluate.call(this, statement, env);
    if (!STATEMENTS.has(statement.type)) result += pythonStr(value);
    else if (!(value instanceof NullValue) && !(value instanceof UndefinedValue)) result += value.toString();
  }
  return new StringValue(result);
};

/** The library's binary operators, but `~` joins the two sides' str(), as Jinja2 (None is `None`, not an error). */
const evaluateBinaryAsPython: EvaluateBinary = function (node, env) {
  if (node.operator.value !== '~') return libraryBinary.call(this, node, env);
  const left = interpreterMethods.evaluate.call(this, node.left, env);
  const right = interpreterMethods.evaluate.call(this, node.right, env);
  return new StringValue(pythonStr(left) + pythonStr(right));
};

/** Renders a parsed template over `items` (as Template.render does), Python numbers as Python writes them. */
export function renderWithPythonNumbers(program: Program, items: Record<string, unknown>): string {
  const env = new Environment();
  for (const [name, make] of GLOBALS) env.setVariable(name, make());
  for (const [name, value] of Object.entries(items)) env.setVariable(name, toRuntime(value));
  const interpreter = new Interpreter(env);
  const patched = interpreter as unknown as {
    applyFilter: ApplyFilter;
    evaluateBlock: EvaluateBlock;
    evaluateBinaryExpression: EvaluateBinary;
  };
  patched.applyFilter = applyFilterWithPythonNumbers;
  patched.evaluateBlock = evaluateBlockAsPython;
  patched.evaluateBinaryExpression = evaluateBinaryAsPython;
  return interpreter.run(program).value as string;
}
