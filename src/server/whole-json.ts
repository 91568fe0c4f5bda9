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

/** The length of the UTF-8 byte order mark `bytes` start with: 3, or 0 when they start without one. */
export function utf8BomLength(bytes: Uint8Array): number {
  return bytes.length >= 3 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf ? 3 : 0;
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
  const n = bytes.length;
  // a UTF-8 byte order mark at the start, which RFC 8259 §8.1 lets a parser ignore (the error-object check does)
  let i = utf8BomLength(bytes);
  while (i < n && isJsonSpace(bytes[i])) i++;
  if (i === n || (bytes[i] !== OPEN_BRACE && bytes[i] !== OPEN_BRACKET)) return false;
  /** The closing bracket each open one needs, innermost last. */
  const closers: number[] = [];
  for (; i < n; i++) {
    const b = bytes[i];
    if (b === QUOTE) {
      // the string ends at the next quote not escaped: one after an even run of backslashes
      let end = i;
      for (;;) {
        end = bytes.indexOf(QUOTE, end + 1);
        if (end < 0) return false;
        let backslashes = 0;
        while (bytes[end - 1 - backslashes] === BACKSLASH) backslashes++;
        if (backslashes % 2 === 0) break;
      }
      i = end;
    } else if (b === OPEN_BRACE) closers.push(CLOSE_BRACE);
    else if (b === OPEN_BRACKET) closers.push(CLOSE_BRACKET);
    else if (b === CLOSE_BRACE || b === CLOSE_BRACKET) {
      if (closers.pop() !== b) return false;
      if (closers.length === 0) {
        i++;
        break;
      }
    }
  }
  if (closers.length > 0) return false;
  while (i < n && isJsonSpace(bytes[i])) i++;
  return i === n;
}

/** A media type that says JSON: application/json, or a structured-syntax +json type. */
const JSON_MEDIA_TYPE = /^\s*application\/(?:[^\s;,]*\+)?json\s*(?:[;,]|$)/i;

/** Whether a Content-Type declares JSON. */
export function declaresJson(contentType: string): boolean {
  return JSON_MEDIA_TYPE.test(contentType);
}
