/**
 * The HTTP version of the request line: the gateway speaks HTTP/1.0 and HTTP/1.1. Node's
 * parser refuses most other versions itself (HTTP/3.0, HTTP/1.2) but hands over HTTP/2.0 and
 * HTTP/0.9, a request line without a version included, as if they were HTTP/1.x. RFC 9110
 * §15.6.6: a version the server does not support is answered 505 HTTP Version Not Supported;
 * the gateway does so, whichever refused it, with an OpenAI error body and closes the
 * connection, the body unread. A request line whose version is not an HTTP-version at all is 400.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { exchangeUntilClosed } from '../helpers/raw-client.js';

let setup: GatewayOnEngine;

before(async () => {
  setup = await gatewayOnEngine();
});
after(() => setup.close());

const body = '{"model":"m","prompt":"x","max_tokens":1}';
const completion = (version: string) =>
  `POST /v1/completions${version === '' ? '' : ` ${version}`}\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;

const exchange = (raw: string) => exchangeUntilClosed(setup.port, raw);

test('a request line with HTTP/2.0 or HTTP/0.9 (or no version) is answered 505 with an OpenAI error body, connection closed', async () => {
  const completions = setup.completions();
  for (const raw of [
    completion('HTTP/2.0'),
    completion('HTTP/0.9'),
    completion(''),
    'GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n',
    'GET /v1/models HTTP/0.9\r\nHost: x\r\n\r\n',
    completion('HTTP/2.0').replace('Host: x\r\n', 'Host: x\r\nExpect: 100-continue\r\n'),
    completion('HTTP/2.0').replace('Host: x\r\n', 'Host: x\r\nExpect: something-else\r\n'),
  ]) {
    const received = await exchange(raw);
    assert.match(received, /^HTTP\/1\.1 505 /, `${JSON.stringify(raw.slice(0, 40))}: ${received.slice(0, 200)}`);
    assert.match(received, /\r\nconnection: close\r\n/i);
    const error = (JSON.parse(received.slice(received.indexOf('\r\n\r\n') + 4)) as { error: Record<string, unknown> })
      .error;
    assert.equal(typeof error.message, 'string');
    assert.equal(error.code, 'http_version_not_supported');
  }
  assert.equal(setup.completions(), completions, 'no request reached the engine');
});

test('HTTP/1.0 and HTTP/1.1 are served; other well-formed versions Node refuses itself are 505, malformed ones 400', async () => {
  for (const version of ['HTTP/1.1', 'HTTP/1.0']) {
    const received = await exchange(completion(version).replace('Host: x\r\n', 'Host: x\r\nConnection: close\r\n'));
    assert.match(received, /^HTTP\/1\.1 200 /, `${version}: ${received.slice(0, 200)}`);
  }
  const completions = setup.completions();
  for (const version of ['HTTP/3.0', 'HTTP/1.2', 'HTTP/9.9']) {
    const received = await exchange(completion(version));
    assert.match(received, /^HTTP\/1\.1 505 /, `${version}: ${received.slice(0, 200)}`);
    const error = (JSON.parse(received.slice(received.indexOf('\r\n\r\n') + 4)) as { error: Record<string, unknown> })
      .error;
    assert.equal(error.code, 'http_version_not_supported');
    assert.match(String(error.message), new RegExp(`^${version.replace('.', '\\.')} is not supported`));
  }
  // not an HTTP-version at all (RFC 9112 §2.3: one digit, a dot, one digit)
  for (const version of ['HTTP/1.10', 'HTTP/10.0', 'HTTP/1']) {
    const received = await exchange(completion(version));
    assert.match(received, /^HTTP\/1\.1 400 /, `${version}: ${received.slice(0, 200)}`);
  }
  assert.equal(setup.completions(), completions, 'no request reached the engine');
});

test("HTTP/2's connection preface (a client speaking HTTP/2 with prior knowledge) is answered 505, not 400", async () => {
  const completions = setup.completions();
  const received = await exchange('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
  assert.match(received, /^HTTP\/1\.1 505 /, received.slice(0, 200));
  assert.match(received, /\r\nconnection: close\r\n/i);
  const error = (JSON.parse(received.slice(received.indexOf('\r\n\r\n') + 4)) as { error: Record<string, unknown> })
    .error;
  assert.equal(error.code, 'http_version_not_supported');
  assert.equal(setup.completions(), completions, 'no request reached the engine');
});
