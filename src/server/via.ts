/**
 * Routing-loop detection through the Via header (RFC 9110 §7.6.3): the gateway appends its own
 * pseudonym to the Via of each request it forwards, and a request whose Via already holds it
 * has come back to it (a worker URL that leads to this gateway, directly or through another
 * one). The pseudonym is random per gateway: unique without naming a host, a port or anything
 * an operator configured.
 */
import { randomBytes } from 'node:crypto';

/** Most entries of a request's Via the gateway accepts (a chain of intermediaries is short). */
export const MAX_VIA_ENTRIES = 16;
/** Longest Via the gateway accepts, in bytes. */
export const MAX_VIA_BYTES = 1024;

/** A comma, a space or a tab: what ends a list whose last element is empty. */
const LIST_SPACE = new Set([0x2c, 0x20, 0x09]);

/** A pseudonym for one gateway: `contextforge-` and 12 random hex digits. */
export function viaPseudonym(): string {
  return `contextforge-${randomBytes(6).toString('hex')}`;
}

/**
 * The Via of a request the gateway makes on its own (health checks, metrics scrapes, the
 * models read, /tokenize): its entry alone, over HTTP/1.1 as undici and fetch send it.
 */
export function ownVia(pseudonym: string): string {
  return `1.1 ${pseudonym}`;
}

/** Why a request's Via is refused: the HTTP status, the message and the error code. */
export interface ViaRejection {
  status: 400 | 508;
  message: string;
  code: string | null;
}

/**
 * The Via to forward a request with: the client's, with this gateway's entry appended
 * (`1.1 contextforge-…`), or a rejection: 508 when the client's already holds this gateway's
 * pseudonym (a routing loop), 400 when it is longer than MAX_VIA_BYTES or has more than
 * MAX_VIA_ENTRIES entries.
 */
export function forwardedVia(
  incoming: string | readonly string[] | undefined,
  pseudonym: string,
  httpVersion = '1.1',
): string | ViaRejection {
  const own = `${httpVersion} ${pseudonym}`;
  if (incoming === undefined) return own;
  const value = typeof incoming === 'string' ? incoming : incoming.join(', ');
  if (value.length > MAX_VIA_BYTES)
    return { status: 400, message: `the Via header is longer than ${MAX_VIA_BYTES} bytes`, code: null };
  let entries = 0;
  let looped = false;
  for (const member of value.split(',')) {
    // an entry: received-protocol RWS received-by [RWS comment]; empty list elements are allowed
    const entry = member.trim();
    if (entry === '') continue;
    entries++;
    const by = entry.split(/[ \t]+/, 2)[1];
    if (by === pseudonym || by?.startsWith(`${pseudonym}:`)) looped = true;
  }
  if (entries > MAX_VIA_ENTRIES)
    return { status: 400, message: `the Via header has more than ${MAX_VIA_ENTRIES} entries`, code: null };
  if (looped)
    return {
      status: 508,
      message:
        'the request came back to this gateway (its Via holds this gateway): a worker URL leads back to it, directly or through another gateway',
      code: 'loop_detected',
    };
  if (entries === 0) return own;
  // appended after the last entry (a trailing empty list element is dropped)
  let end = value.length;
  while (end > 0 && LIST_SPACE.has(value.charCodeAt(end - 1))) end--;
  return `${value.slice(0, end)}, ${own}`;
}
