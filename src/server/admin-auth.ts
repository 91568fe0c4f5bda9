/**
 * Who may use the admin API (and, unless it is public, /v1/route): the holder of one bearer
 * token. The token comes from a file or the environment, never needs the command line (where
 * any local user reads it in the process list); without one, a random token is generated at
 * start and written to a file only its owner can read. Being on loopback grants nothing: any
 * local process, or a browser page making a request to 127.0.0.1, is a loopback client.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { closeSync, linkSync, mkdirSync, openSync, rmSync, writeSync } from 'node:fs';
import type { IncomingMessage } from 'node:http';
import { dirname } from 'node:path';
import { fileErrorMessage, shownText } from '../core/shown-text.js';
import { readRegularFile } from '../engines/bounded-file.js';

/** The shortest admin token: anything shorter is guessed too easily. */
export const MIN_ADMIN_TOKEN_LENGTH = 8;

/** The longest admin token an `Authorization: Bearer …` header of at most 4096 characters holds. */
export const MAX_ADMIN_TOKEN_LENGTH = 4096 - 'Bearer '.length;

/**
 * Largest admin token file read: the longest token and its line end fit; a larger file (a stray
 * dump, a huge sparse file) is refused before it is read into memory.
 */
export const MAX_ADMIN_TOKEN_FILE_BYTES = 4096;

/**
 * What an admin token may hold: visible ASCII (RFC 9110 VCHAR, which RFC 6750's b64token is a
 * part of). A header line cannot carry a line break or other control character, and a non-ASCII
 * character reaches the server as other bytes: such a token could never be sent.
 */
export const ADMIN_TOKEN_PATTERN = /^[\x21-\x7e]*$/;
export const ADMIN_TOKEN_RULE =
  'must hold visible ASCII characters only (letters, digits, punctuation; no spaces, line breaks or other control characters), as an Authorization header carries it';

/**
 * SHA-256 of the token: comparing digests takes the same time whatever the guess. `replace`
 * swaps it for another (SIGHUP re-reads the token file): from then on only the new one matches.
 */
export class AdminToken {
  private digest: Buffer;

  constructor(token: string) {
    this.digest = AdminToken.digestOf(token);
  }

  /** Accepts `token` instead of the current one; a token refused (RangeError) leaves the current one. */
  replace(token: string): void {
    this.digest = AdminToken.digestOf(token);
  }

  private static digestOf(token: string): Buffer {
    if (typeof token !== 'string' || token.length < MIN_ADMIN_TOKEN_LENGTH)
      throw new RangeError(`the admin token must be a string of at least ${MIN_ADMIN_TOKEN_LENGTH} characters`);
    // what `matches` can ever accept: `Bearer TOKEN` within its 4096 characters, the token trimmed
    if (token.length > MAX_ADMIN_TOKEN_LENGTH)
      throw new RangeError(`the admin token must be at most ${MAX_ADMIN_TOKEN_LENGTH} characters`);
    if (token.trim() !== token) throw new RangeError('the admin token must not begin or end with whitespace');
    if (!ADMIN_TOKEN_PATTERN.test(token)) throw new RangeError(`the admin token ${ADMIN_TOKEN_RULE}`);
    return createHash('sha256').update(token).digest();
  }

  /** True when `authorization` is `Bearer <the token>`; constant time in the token. */
  matches(authorization: string | string[] | undefined): boolean {
    if (typeof authorization !== 'string' || authorization.length > 4096) return false;
    const m = /^Bearer +(.+)$/i.exec(authorization);
    const given = createHash('sha256')
      .update(m ? m[1].trim() : '')
      .digest();
    // always compare, so a missing prefix takes as long as a wrong token
    return timingSafeEqual(given, this.digest) && m !== null;
  }
}

/** 32 random bytes, base64url: what is generated when no token is configured. */
export function generateToken(): string {
  return randomBytes(32).toString('base64url');
}

export interface AdminTokenSource {
  /** The token itself (from --admin-token, or CONTEXTFORGE_ADMIN_TOKEN). */
  token?: string;
  /** A file holding the token; created with a random token (mode 0600) when it does not exist. */
  tokenFile?: string;
  /** Whether the token file's missing directories are created (mode 0700) (default true). */
  createDirectory?: boolean;
}

export interface ResolvedAdminToken {
  token: string;
  /** Where it came from: 'configured', 'file' (read), 'generated' (written to `file`). */
  origin: 'configured' | 'file' | 'generated';
  file?: string;
}

/**
 * The admin token: the configured one; else the file's content; else a new random token
 * written to the file (created exclusively, mode 0600, in a directory created 0700). A token
 * file readable by group or others is refused: anyone who can read it is an administrator.
 */
export function resolveAdminToken(source: AdminTokenSource): ResolvedAdminToken {
  if (source.token !== undefined && source.token !== '') {
    new AdminToken(source.token); // checks it
    return { token: source.token, origin: 'configured' };
  }
  const file = source.tokenFile;
  if (!file) throw new RangeError('no admin token: give a token or a token file');
  const named = `--admin-token-file ${shownText(file)}`;
  const existing = readAdminTokenFile(file);
  if (existing !== undefined) return { token: existing, origin: 'file', file };
  const token = generateToken();
  try {
    if (source.createDirectory !== false) mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
  } catch (err) {
    throw new RangeError(`${named}: ${fileErrorMessage(err, file)}`, { cause: err });
  }
  // written whole to a private temporary file, then linked into place: another process starting
  // at the same moment either wins (and this one reads its token) or loses, never half-writes
  const tmp = `${file}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
  let fd: number;
  try {
    fd = openSync(tmp, 'wx', 0o600);
  } catch (err) {
    throw new RangeError(`${named}: cannot write: ${writeErrorReason(err)}`, { cause: err });
  }
  try {
    writeSync(fd, `${token}\n`);
  } finally {
    closeSync(fd);
  }
  try {
    linkSync(tmp, file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST')
      return resolveAdminToken({ tokenFile: file, createDirectory: false });
    throw new RangeError(`${named}: cannot write: ${writeErrorReason(err)}`, { cause: err });
  } finally {
    rmSync(tmp, { force: true });
  }
  return { token, origin: 'generated', file };
}

/**
 * The token in `file` again, as SIGHUP reads it: the file must still be there and hold a token
 * `resolveAdminToken` would take. Nothing is generated: a file removed by mistake would lock out
 * whoever holds the token, unseen. A RangeError names the file and why it is refused, never the
 * token.
 */
export function rereadAdminTokenFile(file: string): string {
  const token = readAdminTokenFile(file);
  if (token === undefined) throw new RangeError(`--admin-token-file ${shownText(file)} does not exist`);
  return token;
}

/**
 * The token a token file holds, or undefined when there is no such file; a file that cannot be
 * read, or holds no acceptable token, is a RangeError naming `--admin-token-file` and the file.
 */
function readAdminTokenFile(file: string): string | undefined {
  // the file as messages name it
  const named = `--admin-token-file ${shownText(file)}`;
  let existing: string;
  try {
    // a regular file of bounded size, checked through the opened file (nothing swapped in between):
    // a device or a pipe could block or never end, a huge file would fill memory
    existing = readRegularFile(file, MAX_ADMIN_TOKEN_FILE_BYTES, (st) => {
      if ((st.mode & 0o077) !== 0)
        throw new RangeError(`is readable by others (mode ${(st.mode & 0o777).toString(8)}); chmod 600 it`);
      if (typeof process.getuid === 'function' && st.uid !== process.getuid())
        throw new RangeError('belongs to another user');
    }).trim();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new RangeError(`${named}: ${fileErrorMessage(err, file)}`, { cause: err });
  }
  // a file emptied by mistake is not replaced: whoever holds the old token would be locked out unseen
  if (existing === '')
    throw new RangeError(`${named} is empty: write a token in it, or remove it to have one generated`);
  try {
    new AdminToken(existing);
  } catch (err) {
    throw new RangeError(`${named}: ${(err as Error).message}`, { cause: err });
  }
  return existing;
}

/**
 * Why the token file could not be written, without the paths Node's message names: those are
 * the temporary file's (`FILE.PID.HEX.tmp`), a name the user never gave. `ENOSPC: no space
 * left on device`, or the message's first line when it has no code.
 */
function writeErrorReason(err: unknown): string {
  const message = String((err as Error).message).split('\n')[0];
  const code = (err as NodeJS.ErrnoException).code;
  if (typeof code !== 'string' || !message.startsWith(`${code}: `)) return shownText(message);
  // `CODE: description, syscall 'path'…`: the description ends before the system call
  const syscall = (err as NodeJS.ErrnoException).syscall;
  const end = syscall === undefined ? -1 : message.indexOf(`, ${syscall} `);
  return end === -1 ? code : message.slice(0, end);
}

type Headers = Readonly<Record<string, string | string[] | undefined>>;

/**
 * Why a request's credentials (an API key, the admin token) are not read, or undefined: it has
 * more than one Authorization line. Node keeps the first and drops the others, and a proxy in
 * front may have read another one (checked it, logged it, passed it on as the caller's): the
 * gateway would then act for a caller the proxy never saw. Authorization is not a list
 * (RFC 9110 §11.6.2), so a request with several is malformed (400), as one with several Host
 * lines is, whether the lines agree or not. `param` names the header to fix.
 */
export function authorizationProblem(
  req: Partial<Pick<IncomingMessage, 'headersDistinct' | 'rawHeaders'>>,
): { status: number; message: string; param: string } | undefined {
  // a request made in process (Fastify's inject) has no headersDistinct: its raw lines are counted
  const lines = req.headersDistinct
    ? (req.headersDistinct.authorization?.length ?? 0)
    : authorizationLines(req.rawHeaders);
  if (lines < 2) return undefined;
  return { status: 400, message: 'the request has more than one Authorization header', param: 'authorization' };
}

/** Authorization lines among raw header lines (name, value, name, value…), any case. */
function authorizationLines(raw: readonly string[] | undefined): number {
  let n = 0;
  if (raw) for (let i = 0; i < raw.length; i += 2) if (raw[i].toLowerCase() === 'authorization') n++;
  return n;
}

/**
 * Why a request to an admin endpoint is refused before its token is even looked at, or
 * undefined: a cross-site browser request (Sec-Fetch-Site, or an Origin other than the Host),
 * or a body that is not declared `application/json` (HTML forms can send only form encodings
 * and text/plain without a preflight). `param` names the header to fix.
 */
export function adminRequestProblem(
  method: string,
  headers: Headers,
): { status: number; message: string; param: string } | undefined {
  const site = headers['sec-fetch-site'];
  if (typeof site === 'string' && site !== 'same-origin' && site !== 'none')
    return {
      status: 403,
      message: `admin endpoints refuse cross-site requests (Sec-Fetch-Site: ${site.slice(0, 40)})`,
      param: 'sec-fetch-site',
    };
  const origin = headers.origin;
  if (typeof origin === 'string' && origin !== '') {
    let host: string | undefined;
    try {
      host = new URL(origin).host;
    } catch {
      host = undefined;
    }
    if (host === undefined || host !== headers.host)
      return { status: 403, message: 'admin endpoints refuse requests from another origin', param: 'origin' };
  }
  if (method !== 'GET' && method !== 'HEAD') {
    const length = headers['content-length'];
    const hasBody = (typeof length === 'string' && length !== '0') || headers['transfer-encoding'] !== undefined;
    const type = headers['content-type'];
    const json = typeof type === 'string' && /^application\/json\s*(;|$)/i.test(type);
    if ((hasBody || type !== undefined) && !json)
      return { status: 415, message: 'admin endpoints take application/json bodies only', param: 'content-type' };
  }
  return undefined;
}
