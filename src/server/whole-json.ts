/**
 * Whether an engine's complete answer, declared JSON, is a whole JSON object or array (every
 * answer of the OpenAI API is an object; a bare string, number or null is none): the check the
 * proxy makes on an answer it gathered before passing it on, so that one cut short (a
 * Content-Length short of the body, an engine that stopped mid-write) or one that is not JSON
 * at all (an error page marked as JSON) is a failed attempt, not a 200 the client cannot parse.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;

/** JSON's whitespace: space, tab, LF, CR. */
function isJsonSpace(b: number | undefined): boolean {
  return b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
}

/** The length of the UTF-8 byte order mark `bytes[at, end)` start with: 3, or 0 when they start without one. */
export function utf8BomLength(bytes: Uint8Array, at = 0, end = bytes.length): number {
  return end - at >= 3 && bytes[at] === 0xef && bytes[at + 1] === 0xbb && bytes[at + 2] === 0xbf ? 3 : 0;
}

/**
 * True when `bytes` hold one JSON object or array, whitespace around it allowed, whose brackets
 * all close, the outermost one at its end, outside any string. It checks the structure, not
 * the spelling of each value: an engine's serializer does not write a bad token in the middle
 * of an answer; what breaks an answer on its way is where it ends, or that it is not JSON at
 * all. A proper prefix of an object or array never passes (its outermost bracket is still
 * open, or a string is), nor does anything after its end. One pass over the bytes with no copy:
 * strings, most of an answer, are skipped with indexOf; JSON.parse would decode the answer into
 * a string and build every object in it, for an answer that is passed on as its bytes.
 */
export function isWholeJson(bytes: Uint8Array): boolean {
  return isWholeJsonIn(bytes, 0, bytes.length);
}

/**
 * The closing brackets isWholeJsonIn waits for, innermost last: one stack for every call (the
 * check is synchronous and calls nothing that could re-enter it), so that the check of each
 * streamed event allocates nothing.
 */
let closers = new Uint8Array(64);
/** The largest stack kept for later calls; an input nested deeper gets a larger one for its own call. */
const MAX_KEPT_CLOSERS = 4096;

/**
 * isWholeJson of `bytes[start, end)`, read in place: a streamed event's data is judged where it
 * lies in its chunk, with no view of it made (a UTF-8 byte order mark is skipped at `start`).
 */
export function isWholeJsonIn(bytes: Uint8Array, start: number, end: number): boolean {
  const n = end;
  // a UTF-8 byte order mark at the start, which RFC 8259 §8.1 lets a parser ignore (the error-object check does)
  let i = start + utf8BomLength(bytes, start, n);
  while (i < n && isJsonSpace(bytes[i])) i++;
  if (i === n || (bytes[i] !== OPEN_BRACE && bytes[i] !== OPEN_BRACKET)) return false;
  let stack = closers;
  let depth = 0;
  for (; i < n; i++) {
    const b = bytes[i];
    if (b === QUOTE) {
      // the string ends at the next quote not escaped: one after an even run of backslashes
      let close = i;
      for (;;) {
        close = bytes.indexOf(QUOTE, close + 1);
        if (close < 0 || close >= n) return false;
        let backslashes = 0;
        // the run stops at the opening quote at the latest, so it never reads before `start`
        while (bytes[close - 1 - backslashes] === BACKSLASH) backslashes++;
        if (backslashes % 2 === 0) break;
      }
      i = close;
    } else if (b === OPEN_BRACE || b === OPEN_BRACKET) {
      if (depth === stack.length) {
        const grown = new Uint8Array(stack.length * 2);
        grown.set(stack);
        stack = grown;
        if (grown.length <= MAX_KEPT_CLOSERS) closers = grown;
      }
      stack[depth++] = b === OPEN_BRACE ? CLOSE_BRACE : CLOSE_BRACKET;
    } else if (b === CLOSE_BRACE || b === CLOSE_BRACKET) {
      if (depth === 0 || stack[--depth] !== b) return false;
      if (depth === 0) {
        i++;
        break;
      }
    }
  }
  if (depth > 0) return false;
  while (i < n && isJsonSpace(bytes[i])) i++;
  return i === n;
}

/** A media type that says JSON: application/json, or a structured-syntax +json type. */
const JSON_MEDIA_TYPE = /^\s*application\/(?:[^\s;,]*\+)?json\s*(?:[;,]|$)/i;

/** Whether a Content-Type declares JSON. */
export function declaresJson(contentType: string): boolean {
  return JSON_MEDIA_TYPE.test(contentType);
}
