/**
 * Transfer codings: Node's parser takes `Transfer-Encoding: gzip, chunked` (chunked last) and
 * hands over the body dechunked but still gzip-coded, as if it were the body itself. The gateway
 * decodes no transfer coding but chunked, so such a request is refused before its body is read:
 * a 400 naming transfer-encoding, the connection closed, nothing sent to an engine.
 */
import assert from 'node:assert/strict';
import { gzipSync } from 'node:zlib';
import { after, before, test } from 'node:test';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

let setup: GatewayOnEngine;

before(async () => {
  setup = await gatewayOnEngine();
});
after(() => setup.close());

/** A chunked request whose Transfer-Encoding is `coding`, its body `body` in one chunk. */
function chunked(path: string, coding: string, body: Buffer, headers = ''): Buffer {
  return Buffer.concat([
    Buffer.from(
      `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${headers}Transfer-Encoding: ${coding}\r\n\r\n${body.length.toString(16)}\r\n`,
    ),
    body,
    Buffer.from('\r\n0\r\n\r\n'),
  ]);
}

/** Sends `raw` on a new connection; the text received once the gateway closes it. */
async function closedExchange(raw: Buffer): Promise<string> {
  const client = await rawClient(setup.port);
  client.socket.write(raw);
  await until(client.closed, 'the gateway closing the connection');
  return client.received();
}

test('a transfer coding other than chunked is a 400 naming transfer-encoding; the body reaches no engine', async () => {
  const json = Buffer.from('{"model":"m","prompt":"x","max_tokens":1}');
  const admin = `Authorization: Bearer ${setup.gateway.adminToken}\r\n`;
  for (const [path, coding, body, headers] of [
    ['/v1/completions', 'gzip, chunked', gzipSync(json), ''],
    ['/v1/completions', 'deflate, chunked', json, ''],
    ['/v1/chat/completions', 'identity, chunked', json, ''],
    ['/admin/workers', 'gzip, chunked', gzipSync(Buffer.from('{"id":"w9","url":"http://127.0.0.1:9"}')), admin],
  ] as const) {
    const received = await closedExchange(chunked(path, coding, body, headers));
    const what = `${path} with Transfer-Encoding: ${coding}`;
    assert.match(received, /^HTTP\/1\.1 400 /, `${what}: ${received}`);
    assert.match(received, /\r\nconnection: close\r\n/i, what);
    const error = (
      JSON.parse(received.slice(received.indexOf('\r\n\r\n') + 4)) as {
        error: { message: string; type: string; param: string };
      }
    ).error;
    assert.equal(error.param, 'transfer-encoding', what);
    assert.equal(error.type, 'invalid_request_error', what);
    assert.match(error.message, /chunked/, what);
  }
  assert.equal(setup.completions(), 0, 'no request reached the engine');
  assert.equal(setup.gateway.connections.has('w9'), false, 'no worker was added');
});

test('chunked alone (in any case) is still read, and answered on the same connection', async () => {
  const json = Buffer.from('{"model":"m","prompt":"x","max_tokens":1}');
  const client = await rawClient(setup.port);
  try {
    client.socket.write(
      Buffer.concat([chunked('/v1/completions', 'chunked', json), chunked('/v1/completions', 'Chunked', json)]),
    );
    await until(() => (client.received().match(/HTTP\/1\.1 200 /g) ?? []).length === 2, 'both answered 200');
    assert.equal(client.closed(), false);
  } finally {
    client.socket.destroy();
  }
});

test('an HTTP/1.0 request with a Transfer-Encoding is a 400 naming transfer-encoding (its framing is faulty, RFC 9112 §6.1)', async () => {
  const before = setup.completions();
  const json = Buffer.from('{"model":"m","prompt":"x","max_tokens":1}');
  const raw = chunked('/v1/completions', 'chunked', json, 'Connection: keep-alive\r\n');
  const received = await closedExchange(
    Buffer.from(raw.toString('latin1').replace(' HTTP/1.1\r\n', ' HTTP/1.0\r\n'), 'latin1'),
  );
  assert.match(received, /^HTTP\/1\.1 400 /, received);
  assert.equal(
    (JSON.parse(received.slice(received.indexOf('\r\n\r\n') + 4)) as { error: { param: string } }).error.param,
    'transfer-encoding',
  );
  assert.equal(setup.completions(), before, 'nothing reached the engine');
});

test('a request refused on its transfer coding gets one answer, even when its body then fails to parse', async () => {
  // "xchunked" is no chunked: Node's parser fails on the body after the headers were refused
  const raw = Buffer.from(
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: xchunked\r\n\r\n{"model":"m","prompt":"x"}',
  );
  const received = await closedExchange(raw);
  assert.equal(received.match(/HTTP\/1\.1 \d{3} /g)?.length, 1, received);
  assert.match(received, /^HTTP\/1\.1 400 .*"param":"transfer-encoding"/s);
});
