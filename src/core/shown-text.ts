/**
 * A value as a message repeats it. Whatever a user gives (a flag, a variable, a config value, a
 * spec) may be long, and a URL in it may carry a password: a message shows the start of the
 * value with its total length, and never the password, so that a mistyped megabyte is not
 * printed back whole and a credential does not reach a terminal, a log or a CI transcript. It
 * may also hold control characters (a downloaded trace, a file name): a message shows them
 * escaped, so that the value stays on the message's line and a terminal acts on none of them.
 */

/** Characters of a value a message shows before cutting it. */
export const SHOWN_CHARS = 80;

/**
 * The user-info part of a URL (`scheme://user:password@`) wherever it occurs in a text, up to
 * the last `@` before the host (as URL parsers read it: a password may hold an `@`), the
 * scheme and the user-info each bounded so that the search stays linear on a long text.
 */
const USERINFO = /\b([A-Za-z][A-Za-z0-9+.-]{0,31}:\/\/)[^\s/?#'"]{1,1024}@/g;

/** The text with the user name and password of every URL in it replaced by `***`. */
export function redactUserinfo(text: string): string {
  return text.replace(USERINFO, '$1***@');
}

/**
 * What a terminal would act on rather than show: C0 controls (line breaks and tabs too), DEL,
 * C1 controls, the Unicode line separators and the bidirectional overrides; and U+FFFD, what
 * binary bytes decode to, so that an excerpt of a binary file reads as such.
 */
// eslint-disable-next-line no-control-regex -- the characters escaped
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufffd]/g;

/**
 * The text with every character UNPRINTABLE matches written as an escape (`\x1b`, `\u2028`):
 * what a message repeats from outside then cannot move the cursor, set the terminal's title,
 * or end its line and forge another (`\r\nerror: …`).
 */
export function escapeUnprintable(text: string): string {
  return text.replace(UNPRINTABLE, (c) => {
    const n = c.charCodeAt(0);
    return n <= 0xff ? `\\x${n.toString(16).padStart(2, '0')}` : `\\u${n.toString(16).padStart(4, '0')}`;
  });
}

/**
 * A message's lines as a terminal should get them: every character UNPRINTABLE matches escaped
 * but the line feeds between them (the message's own). The last guard of what the CLI prints on
 * failing: a value a message repeats is escaped where it is quoted, line feeds too.
 */
export function escapeUnprintableLines(text: string): string {
  return text.split('\n').map(escapeUnprintable).join('\n');
}

/**
 * The start of the text a message shows (credentials masked, control characters escaped), and
 * whether the rest is cut off. The cut counts the text's own characters, before escaping.
 */
function head(text: string, max: number): { shown: string; cut: boolean } {
  // only what can reach the kept part is searched for credentials: the search stays short
  const redacted = redactUserinfo(text.length > max + 1100 ? text.slice(0, max + 1100) : text);
  if (text.length <= max) return { shown: escapeUnprintable(redacted), cut: false };
  let end = Math.min(max, redacted.length);
  // a surrogate pair is kept whole
  const code = redacted.charCodeAt(end - 1);
  if (code >= 0xd800 && code <= 0xdbff) end--;
  return { shown: escapeUnprintable(redacted.slice(0, end)), cut: true };
}

/**
 * The text as a message shows it: credentials in URLs masked, control characters escaped, and a long one cut after `max`
 * characters, with an ellipsis and the total length (`xxxx… (1048576 characters)`).
 */
export function shownText(text: string, max = SHOWN_CHARS): string {
  const { shown, cut } = head(text, max);
  return cut ? `${shown}… (${text.length} characters)` : shown;
}

/**
 * A file system error's first line, the file it names (`open '…'`) shown as shownText shows it
 * (a line break in the name does not cut the line), anything else unprintable escaped.
 */
export function fileErrorMessage(err: unknown, file: string): string {
  return escapeUnprintable(
    String((err as Error).message)
      .replaceAll(file, shownText(file))
      .split('\n')[0],
  );
}

/** `'value'`, or `'start of the value…' (N characters)` for a long one; credentials masked, control characters escaped. */
export function quotedText(text: string, max = SHOWN_CHARS): string {
  const { shown, cut } = head(text, max);
  return cut ? `'${shown}…' (${text.length} characters)` : `'${shown}'`;
}

/**
 * A text from outside (a parser's message quoting a file) on one line, as a message repeats
 * it: every character UNPRINTABLE matches escaped (`\x07`, `\u2028`), and cut after `max`
 * characters with the total length.
 */
export function escapedText(text: string, max = 2 * SHOWN_CHARS): string {
  let end = Math.min(max, text.length);
  // a surrogate pair is kept whole
  const code = text.charCodeAt(end - 1);
  if (end < text.length && code >= 0xd800 && code <= 0xdbff) end--;
  const shown = escapeUnprintable(text.slice(0, end));
  return end < text.length ? `${shown}… (${text.length} characters)` : shown;
}

/** An error's message (or the thrown value, when not an Error) on one line, as escapedText shows text from outside. */
export function errorText(err: unknown): string {
  return escapedText(String((err as Error)?.message ?? err));
}
