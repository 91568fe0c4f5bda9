/**
 * Requests the HTTP layer refuses before any route runs: a request line or framing Node's
 * parser rejects, headers over the size limit, a URL that does not decode, a path parameter
 * over Fastify's length limit. Each is a 4xx with the OpenAI error body, like every other error.
 */
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { gzipSync } from 'node:zlib';
import { after, before, test } from 'node:test';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { until } from '../helpers/wait.js';

let setup: GatewayOnEngine;

before(async () => {
  setup = await gatewayOnEngine({ adminToken: 'admin-token-for-tests' });
});
after(() => setup.close());

/** Writes `raw` on a new connection and returns the first response's status and body. */
function exchange(raw: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const socket = connect(setup.port, '127.0.0.1');
    let text = '';
    const done = () => {
      const head = text.slice(0, text.indexOf('\r\n\r\n'));
      const length = /^content-length: *(\d+)/im.exec(head);
      const body = text.slice(head.length + 4);
      resolve({
        status: Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0),
        body: length ? body.slice(0, Number(length[1])) : body,
      });
    };
    socket.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      const end = text.indexOf('\r\n\r\n');
      const length = end === -1 ? null : /^content-length: *(\d+)/im.exec(text.slice(0, end));
      if (length && text.length >= end + 4 + Number(length[1])) {
        socket.destroy();
        done();
      }
    });
    socket.on('close', done);
    socket.on('error', reject);
    socket.write(raw);
  });
}

const openAiError = (body: string) => {
  const parsed = JSON.parse(body) as { error: { message: unknown; type: unknown; param: unknown; code: unknown } };
  assert.equal(typeof parsed.error, 'object', `an OpenAI error body: ${body}`);
  assert.equal(typeof parsed.error.message, 'string');
  assert.equal(parsed.error.type, 'invalid_request_error');
  assert.ok('param' in parsed.error && 'code' in parsed.error, body);
  return parsed.error;
};

test('what the HTTP parser refuses is answered with an OpenAI error body', async () => {
  const body = '{"prompt":"x"}';
  for (const [what, raw, status] of [
    ['a request line that is not HTTP', 'GARBAGE\r\n\r\n', 400],
    ['an unknown method', 'FOO / HTTP/1.1\r\nHost: x\r\n\r\n', 400],
    [
      'Content-Length with Transfer-Encoding',
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`,
      400,
    ],
    [
      'two Content-Lengths',
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nContent-Length: 3\r\n\r\n${body}`,
      400,
    ],
    ['headers over the size limit', `GET /healthz HTTP/1.1\r\nHost: x\r\nx-big: ${'a'.repeat(20_000)}\r\n\r\n`, 431],
  ] as const) {
    const res = await exchange(raw);
    assert.equal(res.status, status, what);
    openAiError(res.body);
  }
});

test('a URL that does not decode, or a path parameter over the length limit, is an OpenAI error naming the URL', async () => {
  const auth = 'Authorization: Bearer admin-token-for-tests\r\n';
  for (const [raw, status] of [
    [`DELETE /admin/workers/%E0%A4%A HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, 400],
    [`GET /%ff%fe HTTP/1.1\r\nHost: x\r\n\r\n`, 400],
    [`DELETE /admin/workers/${'a'.repeat(200)} HTTP/1.1\r\nHost: x\r\n${auth}\r\n`, 414],
  ] as const) {
    const res = await exchange(raw);
    assert.equal(res.status, status, raw);
    assert.equal(openAiError(res.body).param, 'url');
  }
  assert.equal((await fetch(`http://127.0.0.1:${setup.port}/healthz`)).status, 200);
});

test('a request Node would answer without a body (no Host, an unknown Expect) gets an OpenAI error naming the header', async () => {
  const body = '{"prompt":"x","max_tokens":1}';
  const post = (headers: string) =>
    `POST /v1/completions HTTP/1.1\r\n${headers}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
  for (const [what, raw, status, param] of [
    ['an HTTP/1.1 request without Host', post(''), 400, 'host'],
    ['an Expect other than 100-continue', post('Host: x\r\nExpect: 200-ok\r\n'), 417, 'expect'],
  ] as const) {
    const res = await exchange(raw);
    assert.equal(res.status, status, what);
    assert.equal(openAiError(res.body).param, param, what);
  }
  // refused before any route saw them, and counted all the same
  const counted = async (status: number) =>
    new RegExp(`^contextforge_requests_total\\{path="/v1/completions",status="${status}"\\} [1-9]`, 'm').test(
      await (await fetch(`http://127.0.0.1:${setup.port}/metrics`)).text(),
    );
  await until(async () => (await counted(400)) && (await counted(417)), 'the 400 and the 417 counted');
  // HTTP/1.0 needs no Host
  const old = await exchange(
    `POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
  );
  assert.equal(old.status, 200, old.body);
});

test('a compressed body is refused with 415 naming content-encoding, on every route that takes a body', async () => {
  const body = gzipSync('{"prompt":"x","max_tokens":1}');
  const base = `http://127.0.0.1:${setup.port}`;
  for (const [path, headers] of [
    ['/v1/completions', { 'content-type': 'application/json' }],
    ['/v1/chat/completions', { 'content-type': 'application/json; charset=utf-8' }],
    ['/admin/workers', { 'content-type': 'application/json', authorization: 'Bearer admin-token-for-tests' }],
  ] as const) {
    const res = await fetch(`${base}${path}`, {
      method: 'POST',
      headers: { ...headers, 'content-encoding': 'gzip' },
      body,
    });
    assert.equal(res.status, 415, path);
    const error = openAiError(await res.text());
    assert.equal(error.param, 'content-encoding', path);
  }
  // identity is no encoding at all
  const plain = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'content-encoding': 'identity' },
    body: '{"prompt":"x","max_tokens":1}',
  });
  assert.equal(plain.status, 200);
});

/** A one-token completion sent under Content-Type `type`. */
const completionAs = (type: string) =>
  fetch(`http://127.0.0.1:${setup.port}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': type },
    body: '{"prompt":"x","max_tokens":1}',
  });

test('a Content-Type that is not a media type is a 415 naming content-type', async () => {
  for (const type of ['json', ';', 'application/json, text/plain']) {
    const res = await completionAs(type);
    assert.equal(res.status, 415, type);
    const error = openAiError(await res.text());
    assert.equal(error.param, 'content-type', type);
    assert.match(String(error.message), /Content-Type/);
  }
});

test('JSON sent under another content type is read as JSON, text/plain included', async () => {
  for (const type of ['application/x-www-form-urlencoded', 'text/plain', 'text/plain; charset=utf-8']) {
    const res = await completionAs(type);
    assert.equal(res.status, 200, `${type}: ${await res.clone().text()}`);
    await res.text();
  }
});
