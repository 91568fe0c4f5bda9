/**
 * A request pipelined behind a stream still being answered, whose body does not arrive: in
 * time (--request-timeout-ms) or at the minimum rate (--min-body-rate). Its refusal is the
 * pipelined request's, not the stream's: the stream is written whole, every event of it, then
 * the 408, then the connection closes. Written at once, the refusal would land in the middle of
 * the stream and the connection be cut under it. Real sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { fakeEngine, type FakeEngine } from '../faults/harness.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

/** Events a stream sends after it is told to finish, then [DONE]. */
const LAST_EVENTS = 5;
const BODY_LIMIT = 64 * 1024;

/**
 * An engine that streams an event every 50 ms to each completion until `finish` is called, then
 * LAST_EVENTS more and [DONE]: the stream is still being written whatever happens to the request
 * behind it, for as long as the test needs.
 */
async function streamingEngine() {
  let completions = 0;
  let finishing = false;
  const open = new Set<ServerResponse>();
  const engine: FakeEngine = await fakeEngine((req, res) => {
    if (req.method !== 'POST') return void res.writeHead(404).end();
    completions++;
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      open.add(res);
      let n = 0;
      let left = LAST_EVENTS;
      const timer = setInterval(() => {
        if (finishing && left-- === 0) {
          clearInterval(timer);
          open.delete(res);
          return void res.end('data: [DONE]\n\n');
        }
        const event = {
          id: 'c',
          object: 'text_completion',
          choices: [{ index: 0, text: `t${n++}`, finish_reason: null }],
        };
        res.write(`data: ${JSON.stringify(event)}\n\n`);
      }, 50);
      res.once('close', () => clearInterval(timer));
    });
  });
  return {
    engine,
    completions: () => completions,
    finish: () => void (finishing = true),
    close: async () => {
      for (const res of open) res.destroy();
      await engine.close();
    },
  };
}

async function gatewayOn(
  engine: FakeEngine,
  options: Partial<GatewayOptions>,
): Promise<{ gateway: Gateway; port: number }> {
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e0', url: engine.url }],
    bodyLimit: BODY_LIMIT,
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
    ...options,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return { gateway, port: (gateway.app.server.address() as { port: number }).port };
}

const head = (length: number) =>
  `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\n\r\n`;

/** The streamed request, and one pipelined right behind it whose body stops after a few bytes. */
function streamThenStalled(): string {
  const first = JSON.stringify({ model: 'm', prompt: 'streamed', max_tokens: 100, stream: true });
  return head(first.length) + first + head(BODY_LIMIT) + '{"prompt":';
}

/**
 * The first answer of what a client received, its chunked body decoded, and what came after it.
 * Framing that does not hold (bytes of another answer inside it, a cut) fails, showing the bytes.
 */
function firstAnswer(raw: string): { head: string; body: string; rest: string } {
  const end = raw.indexOf('\r\n\r\n');
  assert.ok(end > 0, `no answer head in ${JSON.stringify(raw)}`);
  const answerHead = raw.slice(0, end);
  assert.match(answerHead, /^HTTP\/1\.1 200 /, raw);
  assert.match(answerHead, /\r\ntransfer-encoding: chunked/i, raw);
  let at = end + 4;
  let body = '';
  for (;;) {
    const line = raw.indexOf('\r\n', at);
    assert.ok(
      line > at,
      `the chunked stream is cut or broken at byte ${at}: ${JSON.stringify(raw.slice(at - 200, at + 300))}`,
    );
    const sizeText = raw.slice(at, line);
    assert.match(
      sizeText,
      /^[0-9a-f]+$/i,
      `not a chunk size at byte ${at}: ${JSON.stringify(raw.slice(at - 200, at + 300))}`,
    );
    const size = parseInt(sizeText, 16);
    const data = line + 2;
    if (size === 0) {
      assert.equal(raw.slice(data, data + 2), '\r\n', `the last chunk is not closed: ${JSON.stringify(raw.slice(at))}`);
      return { head: answerHead, body, rest: raw.slice(data + 2) };
    }
    assert.equal(
      raw.slice(data + size, data + size + 2),
      '\r\n',
      `a chunk of ${size} bytes is cut at byte ${data}: ${JSON.stringify(raw.slice(at - 200, at + 300))}`,
    );
    body += raw.slice(data, data + size);
    at = data + size + 2;
  }
}

/** Every event of the stream intact and in order (t0, t1, …), then data: [DONE]. */
function assertWholeStream(body: string): void {
  const events = body.split('\n\n');
  assert.equal(events.pop(), '', `the stream ends in the middle of an event: ${JSON.stringify(body.slice(-300))}`);
  assert.equal(
    events.pop(),
    'data: [DONE]',
    `the stream does not end with data: [DONE]: ${JSON.stringify(body.slice(-300))}`,
  );
  assert.ok(events.length >= LAST_EVENTS, `only ${events.length} events`);
  events.forEach((e, i) => {
    assert.match(e, /^data: \{/, `event ${i}: ${JSON.stringify(e)}`);
    const parsed = JSON.parse(e.slice('data: '.length)) as { choices: { text: string }[] };
    assert.equal(parsed.choices[0].text, `t${i}`, `event ${i}: ${JSON.stringify(e)}`);
  });
  assert.doesNotMatch(body, /HTTP\/1\.1/);
}

/** What came after the stream: nothing (the connection closed), or a whole 408 with an OpenAI error body. */
function assertRefusalAfter(rest: string, param: string | null): void {
  if (rest === '') return;
  const [answerHead, body] = rest.split('\r\n\r\n');
  assert.match(answerHead, /^HTTP\/1\.1 408 /, rest);
  assert.match(answerHead, /\r\nconnection: close/i, rest);
  const length = Number(/\r\ncontent-length: (\d+)/i.exec(answerHead)?.[1]);
  assert.equal(Buffer.byteLength(body), length, rest);
  const error = (JSON.parse(body) as { error: { type: string; param: string | null } }).error;
  assert.equal(error.type, 'invalid_request_error');
  assert.equal(error.param, param);
}

/**
 * A gateway on `engine` whose request timeout (600 ms) is what refuses a request, the minimum
 * body rate off; `clientErrors` counts the refusals of Node's parser (a request timed out).
 */
async function timingOutGateway(engine: Parameters<typeof gatewayOn>[0]) {
  const g = await gatewayOn(engine, { minBodyRate: 0, timeouts: { headersTimeoutMs: 300, requestTimeoutMs: 600 } });
  let clientErrors = 0;
  g.gateway.app.server.on('clientError', () => clientErrors++);
  return { ...g, clientErrors: () => clientErrors };
}

test('a request whose body does not arrive in time behind a stream is refused after the stream, not inside it', async () => {
  const engine = await streamingEngine();
  const { gateway, port, clientErrors } = await timingOutGateway(engine.engine);
  const client = await rawClient(port);
  try {
    client.socket.write(streamThenStalled());
    await until(() => client.received().includes('"t0"'), 'the stream to start');
    await until(() => clientErrors() > 0, 'the request timeout of the request behind it');
    assert.equal(gateway.bodyBudget.used, 0, 'the unread body holds no budget');
    engine.finish();
    await until(client.closed, 'the connection closed after the stream');
    const { body, rest } = firstAnswer(client.received());
    assertWholeStream(body);
    assertRefusalAfter(rest, null);
    assert.notEqual(rest, '', 'the stalled request is answered');
    assert.equal(engine.completions(), 1, 'the stalled request reached no engine');
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    assert.match(metrics, /^contextforge_requests_total\{path="\/v1\/completions",status="408"\} 1$/m);
  } finally {
    client.socket.destroy();
    await gateway.close(0);
    await engine.close();
  }
});

test('a body too slow behind a stream gives its bytes back at once and is refused after the stream', async () => {
  const engine = await streamingEngine();
  const { gateway, port } = await gatewayOn(engine.engine, { minBodyRate: 1000, minBodyRateGraceMs: 300 });
  const client = await rawClient(port);
  // the pipelined body goes on trickling: it is read and dropped, not held
  const trickle = setInterval(() => client.closed() || client.socket.write(' '), 100);
  try {
    client.socket.write(streamThenStalled());
    await until(() => client.received().includes('"t0"'), 'the stream to start');
    await until(() => gateway.bodyBudget.used === BODY_LIMIT, 'the pipelined body taken from the budget');
    await until(() => gateway.bodyBudget.used === 0, 'the slow body cut, its bytes back');
    assert.equal(client.closed(), false, 'the stream is not cut');
    engine.finish();
    await until(client.closed, 'the connection closed after the stream');
    const { body, rest } = firstAnswer(client.received());
    assertWholeStream(body);
    assertRefusalAfter(rest, 'body');
    assert.notEqual(rest, '', 'the slow body is answered');
    assert.equal(engine.completions(), 1, 'the slow request reached no engine');
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    assert.match(metrics, /^contextforge_request_body_too_slow_total 1$/m);
  } finally {
    clearInterval(trickle);
    client.socket.destroy();
    await gateway.close(0);
    await engine.close();
  }
});

test('a request refused on its headers behind a stream, its body not arriving in time, closes the connection only after both answers', async () => {
  const engine = await streamingEngine();
  const { gateway, port, clientErrors } = await timingOutGateway(engine.engine);
  const client = await rawClient(port);
  try {
    const first = JSON.stringify({ model: 'm', prompt: 'streamed', max_tokens: 100, stream: true });
    // refused 400 on its headers (two Host lines), its answer waiting behind the stream
    const refused = head(100).replace('host: x\r\n', 'host: x\r\nhost: y\r\n') + '{"prompt":';
    client.socket.write(head(first.length) + first + refused);
    await until(() => client.received().includes('"t0"'), 'the stream to start');
    await until(() => clientErrors() > 0, 'the request timeout of the request behind it');
    // a client done sending: the connection closes once its answers are written, not before
    client.socket.end();
    await until(() => client.received().includes('"t10"'), 'the stream going on');
    engine.finish();
    await until(client.closed, 'the connection closed after both answers');
    const { body, rest } = firstAnswer(client.received());
    assertWholeStream(body);
    assert.match(rest, /^HTTP\/1\.1 400 [^]*\r\nconnection: close\r\n[^]*"param":"host"/i, rest);
    assert.equal(engine.completions(), 1);
  } finally {
    client.socket.destroy();
    await gateway.close(0);
    await engine.close();
  }
});
