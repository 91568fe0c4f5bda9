/**
 * Slow request bodies: a body with a Content-Length takes its whole length from the body budget
 * when its headers arrive, so a few clients declaring large bodies and sending a byte now and
 * then would hold the whole budget until the request timeout, and every other client would be
 * refused 503 meanwhile. A body that arrives slower than --min-body-rate once
 * --min-body-rate-grace-ms have passed is cut: 408 naming the body, the connection closed, its
 * bytes given back at once, nothing sent to an engine. Raw sockets stand for the slow clients;
 * every wait has a deadline.
 */
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { test } from 'node:test';
import { createGateway } from '../../src/server/gateway.js';
import { KVAwareRouter } from '../../src/index.js';
import { gatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { fakeEngine } from './harness.js';
import { rawClient, type RawClient } from '../helpers/raw-client.js';
import { resolveServe } from '../helpers/serve-config.js';
import { settled, until } from '../helpers/wait.js';

const BODY_LIMIT = 64 * 1024;
/** Bytes a second a body must average once the grace period is over. */
const RATE = 1000;
const GRACE_MS = 300;

const head = (framing: string) =>
  `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n${framing}\r\n\r\n`;

/** The status, headers and JSON body of a complete answer read off a socket. */
function parseAnswer(raw: string) {
  const [headText, body] = raw.split('\r\n\r\n');
  const [statusLine, ...lines] = headText.split('\r\n');
  const headers = Object.fromEntries(
    lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]),
  );
  return { status: Number(statusLine.split(' ')[1]), headers, body: JSON.parse(body) as unknown };
}

const post = (port: number, body: string) =>
  fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
  });

test(
  'clients trickling large declared bodies are cut after the grace period and cannot lock out the others',
  { timeout: 60_000 },
  async () => {
    const setup = await gatewayOnEngine({
      bodyLimit: BODY_LIMIT,
      // room for two bodies at the limit (and the few bytes of a chunked one): two slow clients fill it
      bufferedBodyLimit: 2 * BODY_LIMIT + 1024,
      minBodyRate: RATE,
      minBodyRateGraceMs: GRACE_MS,
    });
    const { gateway, port } = setup;
    /** The slow clients, each with what it sends every 100 ms. */
    const slow: { client: RawClient; piece: string }[] = [];
    // never idle, never done, far below the rate
    const trickle = setInterval(() => {
      for (const { client, piece } of slow) if (!client.closed()) client.socket.write(piece);
    }, 100);
    try {
      // a chunked body holds only what it sent, but a trickle of one is cut the same way
      const chunked = await rawClient(port);
      chunked.socket.write(head('transfer-encoding: chunked') + '1\r\n{\r\n');
      slow.push({ client: chunked, piece: '1\r\n \r\n' });
      for (let i = 0; i < 2; i++) {
        const client = await rawClient(port);
        client.socket.write(head(`content-length: ${BODY_LIMIT}`) + '{"prompt":');
        slow.push({ client, piece: ' ' });
      }
      await until(() => gateway.bodyBudget.used >= 2 * BODY_LIMIT, 'the declared bodies taken from the budget');

      // a well-behaved client, retrying as Retry-After asks, is served long before the request
      // timeout (60 s) would free the budget: once the slow bodies are cut
      // (larger than the room the chunked body leaves)
      const body = JSON.stringify({ prompt: 'a well-behaved request '.repeat(1000), max_tokens: 1 });
      let refusals = 0;
      const status = await settled(
        async () => {
          const res = await post(port, body);
          await res.text();
          if (res.status === 503) refusals++;
          return res.status;
        },
        (s) => s === 200,
        { timeoutMs: 10_000, intervalMs: 50 },
      );
      assert.equal(status, 200, `the well-behaved client was still refused after ${refusals} tries`);

      for (const { client: c } of slow) {
        await until(() => c.received().includes('}}'), 'the slow client to be answered', { timeoutMs: 5000 });
        const answer = parseAnswer(c.received());
        assert.equal(answer.status, 408, c.received());
        assert.equal(answer.headers.connection, 'close');
        assert.match(answer.headers['content-type'], /^application\/json/);
        assert.deepEqual(answer.body, {
          error: {
            message: `the request body arrived slower than ${RATE} bytes per second`,
            type: 'invalid_request_error',
            param: 'body',
            code: null,
          },
        });
        // the gateway closes the connection though the client goes on sending
        await until(() => c.closed(), 'the slow connection to be closed', { timeoutMs: 5000 });
      }
      await until(() => gateway.bodyBudget.used === 0, 'every byte back in the budget');
      assert.equal(setup.completions(), 1, 'only the well-behaved request reached the engine');
      const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      assert.match(metrics, /^contextforge_requests_total\{path="\/v1\/completions",status="408"\} 3$/m);
      assert.match(metrics, /^contextforge_request_body_too_slow_total 3$/m);
    } finally {
      clearInterval(trickle);
      for (const { client } of slow) client.socket.destroy();
      await setup.close();
    }
  },
);

test('a body sent steadily above the minimum rate is served however long it takes past the grace period', async () => {
  const setup = await gatewayOnEngine({ bodyLimit: BODY_LIMIT, minBodyRate: RATE, minBodyRateGraceMs: GRACE_MS });
  const client = await rawClient(setup.port);
  // 2 KiB every 25 ms (about 80 KB/s, 80 times the rate): it takes a second, past the grace period
  const body = Buffer.from(JSON.stringify({ prompt: 'x'.repeat(40_000), max_tokens: 1 }));
  client.socket.write(head(`content-length: ${body.length}`));
  let sent = 0;
  const sending = setInterval(() => {
    client.socket.write(body.subarray(sent, sent + 2048));
    sent += 2048;
    if (sent >= body.length) clearInterval(sending);
  }, 25);
  try {
    await until(() => client.received().includes('\r\n\r\n{'), 'the answer', { timeoutMs: 10_000 });
    assert.ok(sent >= body.length, 'answered only once the whole body was sent');
    assert.match(client.received(), /^HTTP\/1.1 200 /);
    assert.equal(setup.completions(), 1);
    await until(() => setup.gateway.bodyBudget.used === 0, 'the bytes back in the budget');
  } finally {
    clearInterval(sending);
    client.socket.destroy();
    await setup.close();
  }
});

/**
 * A gateway on one engine that holds each streamed request open after its first event (in
 * `open`, for the test to end) and answers the others at once; `completions` counts the requests
 * that reached the engine.
 */
async function streamHoldingGateway() {
  const open: ServerResponse[] = [];
  let completions = 0;
  const engine = await fakeEngine((req, res) => {
    // the gateway asks for the models on its own
    if (req.method !== 'POST') return void res.writeHead(404).end();
    completions++;
    let text = '';
    req.on('data', (c: Buffer) => (text += c.toString()));
    req.on('end', () => {
      if ((JSON.parse(text) as { stream?: boolean }).stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(`data: ${JSON.stringify({ choices: [{ index: 0, text: 'first', finish_reason: null }] })}\n\n`);
        open.push(res);
      } else {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ choices: [{ index: 0, text: 'second', finish_reason: 'stop' }] }));
      }
    });
  });
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e0', url: engine.url }],
    bodyLimit: BODY_LIMIT,
    minBodyRate: RATE,
    minBodyRateGraceMs: GRACE_MS,
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const port = (gateway.app.server.address() as { port: number }).port;
  return {
    open,
    completions: () => completions,
    gateway,
    port,
    close: async () => {
      for (const res of open) res.end();
      await gateway.close(0);
      await engine.close();
    },
  };
}

test('a slow body pipelined behind a stream still being answered: its bytes given back at once, refused after the stream', async () => {
  const { open, completions, gateway, port, close } = await streamHoldingGateway();
  const client = await rawClient(port);
  const trickle = setInterval(() => client.closed() || client.socket.write(' '), 100);
  try {
    const first = JSON.stringify({ prompt: 'first', max_tokens: 100, stream: true });
    client.socket.write(head(`content-length: ${first.length}`) + first);
    await until(() => client.received().includes('"first"'), 'the first stream to start');
    // its answer waits behind the open stream; the rest of its body is dropped meanwhile
    client.socket.write(head(`content-length: ${BODY_LIMIT}`) + '{"prompt":');
    await until(() => gateway.bodyBudget.used === BODY_LIMIT, 'the pipelined body taken from the budget');
    await until(() => gateway.bodyBudget.used === 0, 'the slow body cut, its bytes back', { timeoutMs: 5000 });
    assert.equal(client.closed(), false, 'the stream goes on');
    for (const res of open.splice(0)) res.end('data: [DONE]\n\n');
    await until(() => client.closed(), 'the connection closed after the stream', { timeoutMs: 5000 });
    const received = client.received();
    const done = received.indexOf('data: [DONE]\n\n\r\n0\r\n\r\n');
    assert.ok(done > 0, `the stream ended whole: ${received}`);
    assert.match(received.slice(done), /\r\n0\r\n\r\nHTTP\/1\.1 408 [^]*"param":"body"/);
    assert.equal(completions(), 1, 'the slow request never reached the engine');
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    assert.match(metrics, /^contextforge_request_body_too_slow_total 1$/m);
  } finally {
    clearInterval(trickle);
    client.socket.destroy();
    await close();
  }
});

test('a request waiting for its 100 Continue behind a stream is not cut for the body it was told to hold back', async () => {
  const { open, port, close } = await streamHoldingGateway();
  const tooSlow = async () =>
    Number(
      /^contextforge_request_body_too_slow_total (\d+)$/m.exec(
        await (await fetch(`http://127.0.0.1:${port}/metrics`)).text(),
      )?.[1],
    );
  const client = await rawClient(port);
  const control = await rawClient(port);
  try {
    const first = JSON.stringify({ prompt: 'first', max_tokens: 100, stream: true });
    client.socket.write(head(`content-length: ${first.length}`) + first);
    await until(() => client.received().includes('"first"'), 'the first stream to start');
    // pipelined behind the open stream: its 100 Continue waits for the stream to end, and the
    // client sends nothing until it comes (RFC 9110 §10.1.1)
    const second = JSON.stringify({ prompt: 'second', max_tokens: 5 });
    client.socket.write(head(`expect: 100-continue\r\ncontent-length: ${second.length}`));
    // a body that does trickle too slowly, its headers sent after the waiting request's: once it
    // is cut, the waiting request has been watched at least as long
    control.socket.write(head(`content-length: ${BODY_LIMIT}`) + '{');
    await until(async () => (await tooSlow()) >= 1, 'the trickling body cut', { timeoutMs: 5000 });
    assert.equal(await tooSlow(), 1, 'the trickling body alone was cut');
    assert.equal(client.closed(), false, 'the request waiting for its 100 Continue is not cut');
    assert.doesNotMatch(client.received(), /HTTP\/1\.1 408/);
    for (const res of open.splice(0)) res.end('data: [DONE]\n\n');
    await until(() => client.received().includes('HTTP/1.1 100 Continue'), 'the 100 Continue after the stream');
    client.socket.write(second);
    await until(() => client.received().includes('"second"'), 'the second answer');
    assert.match(client.received().slice(client.received().indexOf('100 Continue')), /HTTP\/1\.1 200 /);
    assert.equal(await tooSlow(), 1, 'only the trickling body was cut');
  } finally {
    client.socket.destroy();
    control.socket.destroy();
    await close();
  }
});

test('--min-body-rate and --min-body-rate-grace-ms: defaults as Kestrel, flags, environment, 0 turns the rate off', async () => {
  const defaults = resolveServe([]).config;
  assert.equal(defaults.minBodyRate, 240);
  assert.equal(defaults.minBodyRateGraceMs, 5000);
  const set = resolveServe(['--min-body-rate', '0'], { CONTEXTFORGE_MIN_BODY_RATE_GRACE_MS: '2000' }).config;
  assert.equal(set.minBodyRate, 0);
  assert.equal(set.minBodyRateGraceMs, 2000);
  assert.throws(() => resolveServe(['--min-body-rate', '-1']), /--min-body-rate must be >= 0/);
  assert.throws(() => resolveServe(['--min-body-rate-grace-ms', '0']), /--min-body-rate-grace-ms must be >= 1/);
  await assert.rejects(
    createGateway({ router: new KVAwareRouter(), minBodyRate: 2.5 }),
    (err: Error) => err instanceof RangeError && /^minBodyRate must be an integer/.test(err.message),
  );
  await assert.rejects(
    createGateway({ router: new KVAwareRouter(), minBodyRateGraceMs: 0 }),
    (err: Error) => err instanceof RangeError && /^minBodyRateGraceMs must be an integer/.test(err.message),
  );
});
