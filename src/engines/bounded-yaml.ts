import { CST, isMap, isScalar, Lexer, LineCounter, parseAllDocuments, visit, type Document } from 'yaml';

/** The lexical tokens that each begin a value of the document (a scalar, a collection, an item, an alias). */
const VALUE_TOKENS = new Set<string>([
  'scalar',
  'block-scalar-header',
  'flow-seq-start',
  'flow-map-start',
  'seq-item-ind',
  'alias',
]);

/**
 * Refuses, as a RangeError (`holds more than N values`), a YAML or JSON text of more than
 * `maxValues` values, before it is parsed. The parser keeps several objects for every value
 * (about a kilobyte each): a file within its byte bound of a few million empty lists (`[[],[],…]`)
 * took gigabytes, or the whole heap, before anything could say what was wrong with it. The
 * text is only lexed here (little memory), and the count stops at the bound.
 */
export function checkYamlValueCount(text: string, maxValues: number): void {
  let values = 0;
  for (const token of new Lexer().lex(text)) {
    if (VALUE_TOKENS.has(CST.tokenType(token) ?? '') && ++values > maxValues)
      throw new RangeError(`holds more than ${maxValues} values`);
  }
}

/**
 * The value of a YAML (or JSON) text of one document, at most `maxValues` values, as plain
 * JavaScript; an error the parser reports (a duplicate key, an unknown tag, a nesting it cannot
 * follow) is thrown, not left as a warning. No document is null; several are refused.
 *
 * Duplicate keys are found here, in one pass: the parser's own check compares each key of a
 * mapping with every key before it, and a keys file of 100,000 keys took minutes to read.
 * Keys are compared as the JavaScript object would hold them (`1` and `'1'` are one key there).
 */
export function parseBoundedYaml(text: string, maxValues: number): unknown {
  checkYamlValueCount(text, maxValues);
  const lines = new LineCounter();
  let docs: Document.Parsed[];
  try {
    docs = parseAllDocuments(text, { logLevel: 'silent', uniqueKeys: false, lineCounter: lines }) as Document.Parsed[];
  } catch (err) {
    throw tooDeep(err) ?? err;
  }
  if (docs.length === 0) return null;
  if (docs.length > 1) throw new RangeError(`holds ${docs.length} YAML documents (separated by ---), not one`);
  const doc = docs[0];
  const problem = doc.errors[0] ?? doc.warnings[0];
  if (problem) {
    if (/call stack/i.test(problem.message))
      throw new RangeError(`nested too deeply (line ${problem.linePos?.[0].line ?? '?'})`);
    throw problem;
  }
  try {
    visit(doc, {
      Map(_, map) {
        if (!isMap(map) || map.items.length < 2) return;
        const seen = new Set<string>();
        for (const pair of map.items) {
          if (!isScalar(pair.key)) continue;
          const key = String(pair.key.value);
          if (!seen.has(key)) {
            seen.add(key);
            continue;
          }
          const at = pair.key.range ? lines.linePos(pair.key.range[0]) : undefined;
          throw new RangeError(
            `Map keys must be unique${at ? ` at line ${at.line}, column ${at.col}` : ''}: '${key.slice(0, 64)}' appears twice`,
          );
        }
      },
    });
    return doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    throw tooDeep(err) ?? err;
  }
}

/** A stack overflow while following the text's nesting, as the error that says so. */
function tooDeep(err: unknown): RangeError | undefined {
  return err instanceof RangeError && /call stack/i.test(err.message)
    ? new RangeError('nested too deeply', { cause: err })
    : undefined;
}
