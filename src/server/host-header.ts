/**
 * The Host header's value (RFC 9110 §7.2): `uri-host [ ":" port ]`, where uri-host is an IP
 * literal in brackets, an IPv4 address or a reg-name (RFC 3986 §3.2.2) and port is digits. A
 * request with any other value is refused (RFC 9112 §3.2: 400): a value the gateway cannot read
 * as an authority may be read otherwise by a proxy in front of it or by what reads the logs.
 */
import { isIPv6 } from 'node:net';

/** reg-name: unreserved, pct-encoded and sub-delims (an IPv4 address is one too), at least one. */
const REG_NAME = /^(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+$/;
/** IPvFuture: "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" ). */
const IP_FUTURE = /^v[0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+$/;
/**
 * An IPv6 zone identifier as a URI writes it (RFC 6874): "%25" then unreserved or pct-encoded;
 * or after a bare "%", as Node's http client sends it for a host such as `fe80::1%eth0` (RFC 6874
 * §2 asks a URI parser to accept that form: it is harmless).
 */
const ZONE_ID = /%(?:25)?(?:[A-Za-z0-9\-._~]|%[0-9A-Fa-f]{2})+$/;
const PORT = /^[0-9]*$/;

/**
 * Whether `value` is a valid non-empty Host value. The empty value (a request whose target has no
 * authority sends one) is the caller's to allow. Any bytes outside these grammars (spaces,
 * `<`, `/`, `@`, characters past ASCII) make it invalid: an international name is sent in its
 * ASCII form (xn--).
 */
export function isValidHost(value: string): boolean {
  let host = value;
  let port = '';
  if (value.startsWith('[')) {
    const close = value.indexOf(']');
    if (close === -1) return false;
    const literal = value.slice(1, close);
    const rest = value.slice(close + 1);
    if (rest !== '') {
      if (rest[0] !== ':') return false;
      port = rest.slice(1);
    }
    if (!PORT.test(port)) return false;
    if (IP_FUTURE.test(literal)) return true;
    // the zone is taken off by its own grammar: Node's isIPv6 would take any text after a "%"
    const address = literal.replace(ZONE_ID, '');
    return !address.includes('%') && isIPv6(address);
  }
  const colon = value.indexOf(':');
  if (colon !== -1) {
    host = value.slice(0, colon);
    port = value.slice(colon + 1);
  }
  // an http URI with an empty host is invalid (RFC 9110 §4.2.1): ":8080" names no host
  return REG_NAME.test(host) && PORT.test(port);
}
