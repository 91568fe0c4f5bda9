/**
 * The Host header's value: RFC 9112 §3.2 has a server answer 400 to a request whose Host is
 * not a valid `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2): a reg-name, an IPv4
 * address or a bracketed IP literal, then digits after a colon. Such a request is refused on its
 * headers, 400 naming host, its body unread, as one with two Host lines is; every valid form,
 * and the empty value a request without an authority sends, is served.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

let setup: GatewayOnEngine;

before(async () => {
  setup = await gatewayOnEngine();
});
after(() => setup.close());

const body = '{"model":"m","prompt":"x","max_tokens":1}';

/** Sends a completion with `host` as its Host line's value (latin1 bytes); resolves to the status and the error's param. */
async function postWithHost(host: string): Promise<{ status: number; param: unknown; received: string }> {
  const client = await rawClient(setup.port);
  try {
    client.socket.write(
      Buffer.from(
        `POST /v1/completions HTTP/1.1\r\nHost: ${host}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
        'latin1',
      ),
    );
    const whole = () => {
      const r = client.received();
      const end = r.indexOf('\r\n\r\n');
      const length = end === -1 ? null : /^content-length: *(\d+)/im.exec(r.slice(0, end));
      return length !== null && r.length >= end + 4 + Number(length[1]);
    };
    await until(whole, `a whole answer to Host ${JSON.stringify(host)}`);
    const received = client.received();
    const status = Number(/^HTTP\/1\.1 (\d{3}) /.exec(received)?.[1]);
    const text = received.slice(received.indexOf('\r\n\r\n') + 4);
    const param = status >= 400 ? (JSON.parse(text) as { error: { param: unknown } }).error.param : undefined;
    return { status, param, received };
  } finally {
    client.socket.destroy();
  }
}

test('an invalid Host value is refused 400 naming host, its body unread', async () => {
  const completions = setup.completions();
  for (const host of [
    'a b',
    '<script>',
    'host:99999x',
    'a\tb',
    'a/b',
    'user@host',
    'a:b:c',
    ':8080',
    '[::1',
    '::1',
    '[::1]x',
    '[zz::1]',
    '[127.0.0.1]',
    '[fe80::1%]',
    '[fe80::1%eth 0]',
    '[fe80::1%eth0%]',
    'host:80:80',
    'ex%zzample',
    'bücher.example',
    'a\\b',
    'a?b',
    'a#b',
    '"quoted"',
  ]) {
    const r = await postWithHost(host);
    assert.equal(r.status, 400, `Host ${JSON.stringify(host)}: ${r.received.slice(0, 200)}`);
    assert.equal(r.param, 'host', `Host ${JSON.stringify(host)}`);
    assert.match(r.received, /\r\nconnection: close\r\n/i, `Host ${JSON.stringify(host)}: the connection closes`);
  }
  assert.equal(setup.completions(), completions, 'no request reached the engine');
});

test('every valid Host form is served: reg-name, IPv4, IP literal, with or without a port, and the empty value', async () => {
  for (const host of [
    'example.com',
    'EXAMPLE.com:8080',
    'localhost',
    'a-b.c_d~e',
    'xn--bcher-kva.example',
    'ex%41mple',
    "sub!$&'()*+,;=delims",
    '127.0.0.1',
    '127.0.0.1:80',
    '[::1]',
    '[::1]:8080',
    '[2001:db8::ff00:42:8329]',
    '[::ffff:192.0.2.128]:443',
    '[fe80::1%25eth0]',
    // what Node's own http client sends for host 'fe80::1%eth0' (the zone unescaped, RFC 6874 §2's
    // "accept a bare %": it is harmless), with a port too
    '[fe80::1%eth0]',
    '[fe80::1%eth0]:8000',
    '[v1.fe80::a+en1]',
    'example.com:',
    '',
  ]) {
    const r = await postWithHost(host);
    assert.equal(r.status, 200, `Host ${JSON.stringify(host)}: ${r.received.slice(0, 300)}`);
  }
});
