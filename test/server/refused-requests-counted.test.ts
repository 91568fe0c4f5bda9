/**
 * Requests Node's HTTP parser refuses never reach a route, but the gateway answers them (an
 * OpenAI error body, the connection closed): they count in contextforge_requests_total with
 * the status they were answered with, under `path="unknown"`, the value every request no route
 * matches counts under, so they add no label values of their own. So does a CONNECT, answered
 * outside the routes too. Real sockets; every wait has a deadline.
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

/** Every contextforge_requests_total sample, as `path status`: count. */
async function requestCounts(): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for (const line of (await setup.gateway.metrics.metrics()).split('\n')) {
    const m = /^contextforge_requests_total\{path="([^"]*)",status="(\d+)"\} (\d+)$/.exec(line);
    if (m) counts[`${m[1]} ${m[2]}`] = Number(m[3]);
  }
  return counts;
}

/** The counts that grew from `before` to `after`, by how much. */
function grown(before: Record<string, number>, after: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(after)) if (v !== (before[k] ?? 0)) out[k] = v - (before[k] ?? 0);
  return out;
}

const exchange = (raw: string) => exchangeUntilClosed(setup.port, raw);

const body = '{"model":"m","prompt":"x","max_tokens":1}';
const completion = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;

test('a request the HTTP parser refuses counts once, with its status, under path "unknown"', async () => {
  for (const [name, raw, status] of [
    ['an unknown method', 'FOO /v1/models HTTP/1.1\r\nHost: x\r\n\r\n', 400],
    ['a control character in the target', 'GET /v1/mo\x01dels HTTP/1.1\r\nHost: x\r\n\r\n', 400],
    ['a control character in a header', 'GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n', 400],
    ['HTTP/3.0', 'GET /v1/models HTTP/3.0\r\nHost: x\r\n\r\n', 505],
    ["HTTP/2's preface", 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 505],
    ['headers over the limit', `GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(64 * 1024)}\r\n\r\n`, 431],
    ['a CONNECT', 'CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n', 405],
  ] as const) {
    const before = await requestCounts();
    const received = await exchange(raw);
    assert.match(received, new RegExp(`^HTTP/1\\.1 ${status} `), `${name}: ${received.slice(0, 200)}`);
    assert.deepEqual(grown(before, await requestCounts()), { [`unknown ${status}`]: 1 }, name);
  }
});

test('a refusal written after the answer in flight counts once, as that answer does', async () => {
  const before = await requestCounts();
  // a whole request, then bytes that are no request behind it
  const received = await exchange(`${completion}FOO / HTTP/1.1\r\nHost: x\r\n\r\n`);
  assert.match(received, /^HTTP\/1\.1 200 [^]*HTTP\/1\.1 400 /, received.slice(0, 400));
  assert.deepEqual(grown(before, await requestCounts()), { '/v1/completions 200': 1, 'unknown 400': 1 });
});
