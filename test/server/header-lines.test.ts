/**
 * Header lines: Node keeps at most the server's maxHeadersCount of them and drops the rest
 * without a word, so a request could hide its Content-Length (or its Host, or a metadata
 * header) behind a run of small ones: its body was then read with nothing taken from the body
 * budget, the bound on the bodies held at once. A request with more than MAX_HEADER_LINES is
 * refused on its headers, 431 naming headers, its body unread. Real sockets; every wait has a
 * deadline.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { MAX_HEADER_LINES } from '../../src/server/gateway.js';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

let setup: GatewayOnEngine;

before(async () => {
  setup = await gatewayOnEngine();
});
after(() => setup.close());

/** `n` header lines of filler, each a few bytes (a thousand of them fit the header size limit). */
const filler = (n: number) => Array.from({ length: n }, (_, i) => `f${i}:1\r\n`).join('');

test('a request whose Content-Length hides behind 2,000 header lines is refused 431 naming headers, its body unread', async () => {
  const client = await rawClient(setup.port);
  try {
    client.socket.write(
      `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${filler(1999)}Content-Length: 8000000\r\n\r\n{"prompt":"`,
    );
    client.socket.write('x'.repeat(1_000_000));
    await until(() => /^HTTP\/1\.1 \d{3} /.test(client.received()), 'an answer on the headers');
    const received = client.received();
    assert.match(received, /^HTTP\/1\.1 431 /, received.slice(0, 200));
    assert.match(received, /\r\nconnection: close\r\n/i);
    const error = (JSON.parse(received.slice(received.indexOf('\r\n\r\n') + 4)) as { error: { param: string } }).error;
    assert.equal(error.param, 'headers');
    assert.equal(setup.gateway.bodyBudget.used, 0, 'nothing of the body is held');
    await until(client.closed, 'the connection closed');
  } finally {
    client.socket.destroy();
  }
  assert.equal(setup.completions(), 0);
});

test(`${MAX_HEADER_LINES} header lines are served, one more is refused`, async () => {
  const body = '{"model":"m","prompt":"x","max_tokens":1}';
  const request = (lines: number) =>
    `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n${filler(lines - 3)}\r\n${body}`;
  for (const [lines, status] of [
    [MAX_HEADER_LINES, 200],
    [MAX_HEADER_LINES + 1, 431],
  ] as const) {
    const client = await rawClient(setup.port);
    try {
      client.socket.write(request(lines));
      await until(() => /^HTTP\/1\.1 \d{3} /.test(client.received()), `an answer to ${lines} header lines`);
      assert.match(client.received(), new RegExp(`^HTTP/1\\.1 ${status} `), `${lines} header lines`);
    } finally {
      client.socket.destroy();
    }
  }
});

test('a request with two Host header lines is refused 400 naming host (RFC 9112 §3.2), its body unread', async () => {
  const body = '{"model":"m","prompt":"x","max_tokens":1}';
  const completions = setup.completions();
  for (const hosts of ['Host: a\r\nHost: b\r\n', 'Host: a\r\nhOsT: a\r\n']) {
    const client = await rawClient(setup.port);
    try {
      client.socket.write(
        `POST /v1/completions HTTP/1.1\r\n${hosts}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
      );
      await until(() => /^HTTP\/1\.1 \d{3} /.test(client.received()), 'an answer on the headers');
      const received = client.received();
      assert.match(received, /^HTTP\/1\.1 400 /, received.slice(0, 200));
      await until(
        () => client.received().includes('\r\n\r\n') && client.received().endsWith('}'),
        'the whole error body',
      );
      const answer = client.received();
      const error = (JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as { error: { param: string } }).error;
      assert.equal(error.param, 'host');
    } finally {
      client.socket.destroy();
    }
  }
  assert.equal(setup.completions(), completions, 'no request reached the engine');
});
