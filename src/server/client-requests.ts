/**
 * The cap on requests one client holds in flight at once (--max-requests-per-client), nginx's
 * limit_conn keyed per client. The cap on client connections bounds the process, not a client:
 * without this, one client opening connections up to that cap (and pipelining on each) would hold
 * every engine's queue and leave every other client waiting behind it.
 *
 * A client is its API key when the request carries a valid one (with --api-keys-file): many
 * users behind one NAT or ingress, each with a key of their own, are not lumped together. Else
 * it is the connection's remote address: an IPv4 address as it is, an IPv6 address by its /64
 * prefix, the smallest block a host is routinely given (SLAAC, RFC 4291 §2.5.1), within which it
 * can take a new address for every connection (privacy addresses, RFC 8981). No header names the
 * client: X-Forwarded-For and Forwarded are the client's to write, and trusting them would let
 * any client pass as any number of clients. Behind a proxy, every client shares the proxy's
 * address (API keys tell them apart).
 *
 * The table holds an entry only while its client has a request in flight: its size is at most the
 * requests in flight, whatever the number of clients seen.
 */
import { isIPv4 } from 'node:net';

/** The largest limit taken: 2^20, as --max-client-connections (a client holds at most that many connections). */
export const MAX_REQUESTS_PER_CLIENT = 1_048_576;

/** Seconds a client refused for having too many requests in flight is told to wait (Retry-After). */
export const CLIENT_REQUEST_LIMIT_RETRY_AFTER_S = 1;

/** The `code` of the 429 answered to a request over the limit. */
export const CLIENT_REQUEST_LIMIT_CODE = 'client_request_limit_exceeded';

/** `limit` when it is an integer from 0 (no limit) to MAX_REQUESTS_PER_CLIENT; a RangeError or TypeError naming it otherwise. */
export function checkMaxRequestsPerClient(limit: number): number {
  if (typeof limit !== 'number' || !Number.isInteger(limit))
    throw new TypeError(`maxRequestsPerClient must be an integer (got ${String(limit)})`);
  if (limit < 0 || limit > MAX_REQUESTS_PER_CLIENT)
    throw new RangeError(`maxRequestsPerClient must be from 0 (no limit) to ${MAX_REQUESTS_PER_CLIENT} (got ${limit})`);
  return limit;
}

/** How a client was told apart: by its API key, or by its address. */
export type ClientKeyKind = 'api_key' | 'address';
export const CLIENT_KEY_KINDS: readonly ClientKeyKind[] = ['api_key', 'address'];

/**
 * The client an address stands for: an IPv4 address itself (an IPv4-mapped IPv6 address, as a
 * dual-stack listener sees an IPv4 client, as that IPv4 address), an IPv6 address its /64 prefix
 * (`2001:db8:0:1::/64`), the zone of a link-local one dropped. Undefined (a connection already
 * closed) is one client of its own.
 */
export function clientAddressKey(address: string | undefined): string {
  if (address === undefined || address === '') return 'unknown';
  if (isIPv4(address)) return address;
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped !== null && isIPv4(mapped[1])) return mapped[1];
  const groups = ipv6Groups(address);
  if (groups === undefined) return address;
  return `${groups.slice(0, 4).join(':')}::/64`;
}

/** The eight 16-bit groups of an IPv6 address, in lower-case hex without leading zeros; undefined when it is not one. */
function ipv6Groups(address: string): string[] | undefined {
  const zone = address.indexOf('%');
  const text = (zone < 0 ? address : address.slice(0, zone)).toLowerCase();
  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const parse = (part: string): string[] | undefined => {
    if (part === '') return [];
    const out: string[] = [];
    const pieces = part.split(':');
    for (let i = 0; i < pieces.length; i++) {
      const p = pieces[i];
      // an IPv4 address in the last 32 bits (::ffff:1.2.3.4, 64:ff9b::1.2.3.4)
      if (i === pieces.length - 1 && isIPv4(p)) {
        const [a, b, c, d] = p.split('.').map(Number);
        out.push(((a << 8) | b).toString(16), ((c << 8) | d).toString(16));
      } else if (/^[0-9a-f]{1,4}$/.test(p)) out.push(parseInt(p, 16).toString(16));
      else return undefined;
    }
    return out;
  };
  const head = parse(halves[0]);
  const tail = halves.length === 2 ? parse(halves[1]) : [];
  if (head === undefined || tail === undefined) return undefined;
  const missing = 8 - head.length - tail.length;
  if (halves.length === 1 ? missing !== 0 : missing < 1) return undefined;
  return [...head, ...Array<string>(missing).fill('0'), ...tail];
}

/** The requests each client has in flight, against a limit. */
export class ClientRequests {
  /** Requests in flight per client; a client with none has no entry. */
  private readonly inFlight = new Map<string, number>();
  private total = 0;

  /** `limit`: most requests in flight per client (0: none, nothing is counted). */
  constructor(readonly limit: number) {
    checkMaxRequestsPerClient(limit);
  }

  /** Clients with requests in flight now (the table's entries). */
  get clients(): number {
    return this.inFlight.size;
  }

  /** Requests counted in flight now, over all clients. */
  get requests(): number {
    return this.total;
  }

  /**
   * Counts a request of `client` in flight; returns its release, to be called once when the
   * request ends however it ends (further calls do nothing), or undefined when the client has
   * `limit` requests in flight already (nothing is counted).
   */
  admit(client: string): (() => void) | undefined {
    const held = this.inFlight.get(client) ?? 0;
    if (held >= this.limit) return undefined;
    this.inFlight.set(client, held + 1);
    this.total++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.total--;
      const left = this.inFlight.get(client)! - 1;
      if (left === 0) this.inFlight.delete(client);
      else this.inFlight.set(client, left);
    };
  }
}
