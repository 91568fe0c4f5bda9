/**
 * Connections that pipeline every kind of request the gateway answers differently, in seeded
 * random orders: served ones, bodies that are not JSON, refusals on the headers (no Host, an
 * Expect other than 100-continue, a compressed body, a method the path does not take, HTTP/2.0),
 * requests over the client's limit, a request that asks to close the connection, broken
 * chunking. Whatever the order, the answers go back in order, nothing after an answer that
 * closes the connection is answered, the process stays up (an answer finished out of order is
 * an uncaught assertion in Node's server), and every in-flight count returns to zero. Real
 * sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

const good = '{"model":"m","prompt":"hi"}';
const post = (extra = '', version = '1.1', body = good, host = 'Host: x\r\n') =>
  `POST /v1/completions HTTP/${version}\r\n${host}${extra}Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;

/** Each kind of request by its letter; `c` asks to close the connection. */
const KINDS: Record<string, () => string> = {
  g: () => post(),
  b: () => post('', '1.1', '{x}'),
  e: () => post('Expect: 100-continue\r\n'),
  x: () => post('Expect: something\r\n'),
  h: () => post('', '1.1', good, ''),
  z: () => post('Content-Encoding: gzip\r\n'),
  v: () => 'GET /health HTTP/2.0\r\nHost: x\r\n\r\n',
  m: () => 'DELETE /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n',
  o: () => post('Connection: keep-alive\r\n', '1.0'),
  s: () =>
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"mod\r\nZZ\r\n',
  c: () => post('Connection: close\r\n'),
};

/** A seeded generator of patterns: 2 to 5 requests, then one that asks to close. */
function patterns(count: number, seed: number): string[] {
  let state = seed;
  const next = () => (state = (state * 1103515245 + 12345) % 2147483648) / 2147483648;
  const letters = Object.keys(KINDS);
  const out: string[] = [];
  for (let i = 0; i < count; i++) {
    let p = '';
    const n = 2 + Math.floor(next() * 4);
    for (let k = 0; k < n; k++) p += letters[Math.floor(next() * letters.length)];
    out.push(`${p}c`);
  }
  return out;
}

test('pipelined mixes of served, refused and malformed requests: answers in order, nothing after a closing answer, counts back to zero', async () => {
  const setup = await gatewayOnEngine({ maxRequestsPerClient: 2 });
  try {
    const all = patterns(60, 7);
    for (let i = 0; i < all.length; i += 10) {
      await Promise.all(
        all.slice(i, i + 10).map(async (pattern) => {
          const client = await rawClient(setup.port);
          try {
            client.socket.write([...pattern].map((k) => KINDS[k]()).join(''));
            await until(client.closed, `the connection of ${pattern} closed`);
            // (a 100 Continue is no answer)
            const answers = client
              .received()
              .split(/(?=HTTP\/1\.[01] \d{3} )/)
              .filter((a) => !a.startsWith('HTTP/1.1 100 '));
            const statuses = answers.map((a) => Number(a.slice(9, 12)));
            assert.ok(statuses.length >= 1 && statuses.length <= pattern.length, `${pattern}: ${statuses.join(',')}`);
            assert.ok(!statuses.some((s) => s >= 500 && s !== 503 && s !== 505), `${pattern}: ${statuses.join(',')}`);
            // an answer that closes the connection is the last one on it
            const closing = answers.findIndex((a) =>
              /\r\nconnection: close\r\n/i.test(a.slice(0, a.indexOf('\r\n\r\n'))),
            );
            assert.ok(
              closing === -1 || closing === answers.length - 1,
              `${pattern}: an answer after the closing one: ${JSON.stringify(client.received())}`,
            );
          } finally {
            client.socket.destroy();
          }
        }),
      );
    }
    const page = async () => (await setup.gateway.app.inject({ method: 'GET', url: '/metrics' })).body;
    await until(
      async () => /^contextforge_client_requests_in_flight 0$/m.test(await page()),
      'no request counted in flight',
    );
    assert.match(await page(), /^contextforge_worker_in_flight\{worker="e0"\} 0$/m);
    const health = await setup.gateway.app.inject({ method: 'GET', url: '/health' });
    assert.equal(health.statusCode, 200);
  } finally {
    await setup.close();
  }
});
