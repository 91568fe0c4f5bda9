/**
 * `Expect: 100-continue` (curl sends it with every body over 1 MB): the client waits for a 100
 * before it sends the body, so that a request refused on its headers alone is refused before
 * the body is sent (RFC 9110 §10.1.1). The gateway says 100 only to a request it will read: one
 * over the body limit, over the body budget, without a Host or with a transfer coding it does
 * not decode gets its refusal at once, and no 100; so does one a route's checks on its headers
 * refuse (no route, a method the path is not served with, a compressed body, no valid API key):
 * the 100 is said once the body is read. Real sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { ApiKeys } from '../../src/server/api-keys.js';
import { createGateway } from '../../src/server/gateway.js';
import { fakeEngine } from '../faults/harness.js';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

const BODY_LIMIT = 4096;
let setup: GatewayOnEngine;

before(async () => {
  setup = await gatewayOnEngine({ bodyLimit: BODY_LIMIT, bufferedBodyLimit: BODY_LIMIT });
});
after(() => setup.close());

const head = (length: number, headers = 'Host: x\r\n') =>
  `POST /v1/completions HTTP/1.1\r\n${headers}Content-Type: application/json\r\nContent-Length: ${length}\r\nExpect: 100-continue\r\n\r\n`;

/** Sends `raw` (headers only) and returns what came back once a final answer's status line has. */
async function headersOnly(raw: string): Promise<string> {
  const client = await rawClient(setup.port);
  try {
    client.socket.write(raw);
    await until(
      () => /HTTP\/1\.1 [2-5]\d\d /.test(client.received()) || client.closed(),
      'a final answer to the headers alone',
    );
    return client.received();
  } finally {
    client.socket.destroy();
  }
}

test('a request refused on its headers alone gets its refusal and no 100 Continue', async () => {
  for (const [what, raw, status] of [
    ['a body over the body limit', head(BODY_LIMIT + 1), 413],
    ['no Host', head(10, ''), 400],
    [
      'a transfer coding it does not decode',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\nExpect: 100-continue\r\n\r\n',
      400,
    ],
  ] as const) {
    const received = await headersOnly(raw);
    assert.match(received, new RegExp(`^HTTP/1\\.1 ${status} `), `${what}: ${received}`);
    assert.doesNotMatch(received, /100 Continue/, what);
  }
});

test('a body the budget cannot take is refused 503 before it is sent, with no 100 Continue', async () => {
  // a request whose body holds the whole budget while it trickles in
  const holder = await rawClient(setup.port);
  try {
    holder.socket.write(head(BODY_LIMIT).replace('Expect: 100-continue\r\n', ''));
    await until(() => setup.gateway.bodyBudget.used === BODY_LIMIT, 'the budget held by the first request');
    const received = await headersOnly(head(100));
    assert.match(received, /^HTTP\/1\.1 503 /, received);
    assert.doesNotMatch(received, /100 Continue/);
    assert.match(received, /"code":"body_budget_exceeded"/);
  } finally {
    holder.socket.destroy();
  }
});

test('a request the gateway will read gets its 100 Continue, then its answer', async () => {
  const body = '{"model":"m","prompt":"x","max_tokens":1}';
  const client = await rawClient(setup.port);
  try {
    client.socket.write(head(body.length));
    await until(() => client.received().startsWith('HTTP/1.1 100 Continue\r\n\r\n'), 'the 100 Continue');
    client.socket.write(body);
    await until(() => /HTTP\/1\.1 200 /.test(client.received()), 'the answer');
    assert.match(client.received(), /"text":"ok"/);
  } finally {
    client.socket.destroy();
  }
});

test('a request refused on its headers by a route check gets the refusal as its first line, not a 100', async () => {
  // RFC 9110 §10.1.1: a server that will refuse the request on its headers answers that at
  // once; Node says 100 whenever asked, so the gateway says it only when the body is read
  for (const [what, raw, status] of [
    ['a compressed body', head(10, 'Host: x\r\nContent-Encoding: gzip\r\n'), 415],
    ['no route', head(10).replace('/v1/completions', '/v1/nowhere'), 404],
    ['a method the path is not served with', head(10).replace('POST /v1/completions', 'PUT /v1/completions'), 405],
  ] as const) {
    const received = await headersOnly(raw);
    assert.match(received, new RegExp(`^HTTP/1\\.1 ${status} `), `${what}: ${received}`);
  }
});

test('with API keys, a request without a valid key gets its 401 as the first line, not a 100', async () => {
  const keyed = await gatewayOnEngine({
    bodyLimit: BODY_LIMIT,
    bufferedBodyLimit: BODY_LIMIT,
    apiKeys: new ApiKeys({ 'sk-valid-key-0123456789': 'tenant' }),
  });
  try {
    const client = await rawClient(keyed.port);
    try {
      client.socket.write(head(10, 'Host: x\r\nAuthorization: Bearer sk-wrong-key-0123456789\r\n'));
      await until(
        () => /HTTP\/1\.1 [1-5]\d\d /.test(client.received()) || client.closed(),
        'an answer to the headers alone',
      );
      assert.match(client.received(), /^HTTP\/1\.1 401 /, client.received());
    } finally {
      client.socket.destroy();
    }
    // a valid key: the 100, then the answer (Fastify reads the body)
    const body = '{"model":"m","prompt":"x","max_tokens":1}';
    const valid = await rawClient(keyed.port);
    try {
      valid.socket.write(head(body.length, 'Host: x\r\nAuthorization: Bearer sk-valid-key-0123456789\r\n'));
      await until(() => valid.received().startsWith('HTTP/1.1 100 Continue\r\n\r\n'), 'the 100 Continue');
      valid.socket.write(body);
      await until(() => /HTTP\/1\.1 200 /.test(valid.received()), 'the answer');
    } finally {
      valid.socket.destroy();
    }
  } finally {
    await keyed.close();
  }
});

test('behind an answer still being written, a pipelined request is answered whole, no 100 inside its body', async () => {
  // Node holds what is written to an answer queued behind another and, for a body given as a
  // Buffer, puts its head before what was held: a 100 said while the answer was queued came out
  // after the next head, inside the span its Content-Length gives. A pipelined body is already
  // on its way, so no 100 is said to an answer that is not yet the connection's own
  let holdFirst: (() => void) | undefined;
  const engine = await fakeEngine((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      const text = JSON.stringify({ choices: [{ text: body.includes('first') ? 'one' : 'two' }] });
      const answer = () =>
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': text.length }).end(text);
      if (body.includes('first')) holdFirst = answer;
      else answer();
    });
  });
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers: [{ id: 'e0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = gateway.app.server.address() as AddressInfo;
  const client = await rawClient(port);
  try {
    const first = '{"model":"m","prompt":"first","max_tokens":1}';
    const second = '{"model":"m","prompt":"second","max_tokens":1}';
    client.socket.write(
      head(first.length).replace('Expect: 100-continue\r\n', '') + first + head(second.length) + second,
    );
    // the second answered by the engine and released by the gateway while the first is held
    await until(() => holdFirst !== undefined && router.getStats().inFlightRequests === 1, 'the second answered');
    holdFirst!();
    await until(() => (client.received().match(/HTTP\/1\.1 200 /g) ?? []).length === 2, 'both answers');
    await until(() => client.received().includes('"two"'), 'the second body');
    // each answer's head is followed by exactly its Content-Length of JSON
    const got = Buffer.from(client.received(), 'latin1');
    let at = 0;
    const bodies: string[] = [];
    while (at < got.length) {
      const end = got.indexOf('\r\n\r\n', at);
      assert.ok(end > 0, `a whole head at ${at}: ${client.received()}`);
      const headText = got.subarray(at, end).toString('latin1');
      if (/^HTTP\/1\.1 100 /.test(headText)) {
        at = end + 4;
        continue;
      }
      const length = Number(/content-length: (\d+)/i.exec(headText)?.[1]);
      const body = got.subarray(end + 4, end + 4 + length).toString();
      assert.doesNotThrow(() => JSON.parse(body), `a JSON body after ${headText.split('\r\n')[0]}: ${body}`);
      bodies.push(body);
      at = end + 4 + length;
    }
    assert.equal(bodies.length, 2);
    assert.match(bodies[0], /"one"/);
    assert.match(bodies[1], /"two"/);
  } finally {
    client.socket.destroy();
    await gateway.close(0);
    await engine.close();
  }
});
