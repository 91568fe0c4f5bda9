import {
  Composer,
  CST,
  isMap,
  isScalar,
  Lexer,
  LineCounter,
  parseAllDocuments,
  Parser,
  visit,
  type Document,
  type DocumentOptions,
  type ParseOptions,
  type SchemaOptions,
} from 'yaml';
import { quotedText } from '../core/shown-text.js';

type Options = ParseOptions & DocumentOptions & SchemaOptions;

/**
 * The lexical tokens that each begin a value of the document (a scalar, a collection, an item, an
 * alias). A plain scalar follows a 'scalar' marker; a quoted one (every string of JSON) has none.
 */
const VALUE_TOKENS = new Set<string>([
  'scalar',
  'single-quoted-scalar',
  'double-quoted-scalar',
  'block-scalar-header',
  'flow-seq-start',
  'flow-map-start',
  'seq-item-ind',
  'alias',
]);

/** A text refused for its size or its nesting, past a bound of this module, not for its syntax. */
export class YamlBoundError extends RangeError {}

/**
 * Refuses, as a YamlBoundError (`holds more than N values`), a YAML or JSON text of more than
 * `maxValues` values, before it is parsed. The parser keeps several objects for every value
 * (about a kilobyte each): a file within its byte bound of a few million empty lists (`[[],[],…]`)
 * took gigabytes, or the whole heap, before anything could say what was wrong with it. The
 * text is only lexed here (little memory), and the count stops at the bound.
 */
export function checkYamlValueCount(text: string, maxValues: number): void {
  let values = 0;
  for (const token of new Lexer().lex(text)) {
    if (VALUE_TOKENS.has(CST.tokenType(token) ?? '') && ++values > maxValues)
      throw new YamlBoundError(`holds more than ${maxValues} values`);
  }
}

/**
 * The value of a YAML (or JSON) text of one document, at most `maxValues` values and `maxDepth`
 * levels of lists and mappings (a YamlBoundError past either), as plain JavaScript; an error the
 * parser reports (a duplicate key, an unknown tag) is thrown, not left as a warning. No document
 * is null; several are refused.
 *
 * Duplicate keys are found here, in one pass: the parser's own check compares each key of a
 * mapping with every key before it, and a keys file of 100,000 keys took minutes to read.
 * Keys are compared as the JavaScript object would hold them (`1` and `'1'` are one key there).
 */
export function parseBoundedYaml(text: string, maxValues: number, maxDepth = MAX_YAML_DEPTH): unknown {
  checkYamlValueCount(text, maxValues);
  const lines = new LineCounter();
  const options: Options = { logLevel: 'silent', uniqueKeys: false, lineCounter: lines };
  let docs: Document.Parsed[];
  try {
    docs = composeDepthBounded(text, maxDepth, options);
  } catch (err) {
    throw tooDeep(err) ?? err;
  }
  if (docs.length === 0) return null;
  if (docs.length > 1) throw new RangeError(`holds ${docs.length} YAML documents (separated by ---), not one`);
  let doc = docs[0];
  if (doc.errors.length > 0 || doc.warnings.length > 0) {
    // parsed again as parseAllDocuments parses, which adds the line, column and text of each
    // problem to its message (its helper for that is not exported); only a text at fault pays for it
    try {
      doc = parseAllDocuments(text, { ...options, lineCounter: new LineCounter() })[0] as Document.Parsed;
    } catch (err) {
      throw tooDeep(err) ?? err;
    }
  }
  const problem = doc.errors[0] ?? doc.warnings[0];
  if (problem) {
    if (/call stack/i.test(problem.message))
      throw new YamlBoundError(`nested too deeply (line ${problem.linePos?.[0].line ?? '?'})`);
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
            `Map keys must be unique${at ? ` at line ${at.line}, column ${at.col}` : ''}: ${quotedText(key, 64)} appears twice`,
          );
        }
      },
    });
    return doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    throw tooDeep(err) ?? err;
  }
}

/**
 * Deepest nesting of lists and mappings a YAML or JSON text may have. The settings, workers and
 * API keys nest four levels at most; the parser follows each level by recursion, so a few
 * thousand brackets (`[[[[…`, in a flag's few bytes) would overflow its stack.
 */
export const MAX_YAML_DEPTH = 64;

/** The lexical tokens that take no place in the text (markers the lexer adds for the parser). */
const MARKER_TOKENS = new Set<string>(['doc-mode', 'flow-error-end', 'scalar']);
const COLLECTIONS = new Set<string>(['block-map', 'block-seq', 'flow-collection']);

/**
 * The documents of `text`, as parseAllDocuments makes them (without its positions in the
 * messages of problems), refused as a YamlBoundError naming the line and column as soon as a list or
 * mapping opens more than `maxDepth` deep: the parser's stack of open nodes is read after each
 * lexical token, before anything recursive (composing the documents) has run.
 */
function composeDepthBounded(text: string, maxDepth: number, options: Options): Document.Parsed[] {
  const lines = options.lineCounter!;
  const parser = new Parser(lines.addNewLine);
  function* tokens(): Generator<CST.Token> {
    lines.addNewLine(0);
    let offset = 0;
    for (const lexeme of new Lexer().lex(text)) {
      yield* parser.next(lexeme);
      // the stack holds the document and a scalar or two besides the collections open
      if (parser.stack.length > maxDepth && parser.stack.filter((t) => COLLECTIONS.has(t.type)).length > maxDepth) {
        const at = lines.linePos(offset);
        throw new YamlBoundError(`nested more than ${maxDepth} levels deep (line ${at.line}, column ${at.col})`);
      }
      if (!MARKER_TOKENS.has(CST.tokenType(lexeme) ?? '')) offset += lexeme.length;
    }
    yield* parser.end();
  }
  return [...new Composer(options).compose(tokens())] as Document.Parsed[];
}

/** A stack overflow while following the text's nesting, as the error that says so. */
function tooDeep(err: unknown): YamlBoundError | undefined {
  return err instanceof RangeError && /call stack/i.test(err.message)
    ? new YamlBoundError('nested too deeply', { cause: err })
    : undefined;
}
