/**
 * The gateway's budget of request-body bytes held at once over all requests: many clients each
 * sending a large body slowly must not make it hold (clients × body limit) bytes. A request
 * whose body does not fit is refused at once with 503, Retry-After and an OpenAI error; the
 * bytes come back when a request ends, fails or its client goes away. Raw sockets stand for
 * the slow clients; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { resolveServe } from '../helpers/serve-config.js';
import { until } from '../helpers/wait.js';

const BODY_LIMIT = 64 * 1024;
const BUDGET = 100_000;

/** A client that sends `head` (request line and headers) and then as much of its body as told, when told. */
async function slowClient(port: number, head: string): Promise<{ socket: Socket; answer: () => string }> {
  const socket = connect(port, '127.0.0.1');
  let received = '';
  socket.on('data', (d: Buffer) => (received += d.toString('latin1')));
  socket.on('error', () => {});
  await new Promise<void>((r) => socket.once('connect', () => r()));
  socket.write(head);
  return { socket, answer: () => received };
}

const requestHead = (headers: string) =>
  `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n${headers}\r\n`;

/** The status, headers and JSON body of a complete answer read off a socket. */
function parseAnswer(raw: string) {
  const [head, body] = raw.split('\r\n\r\n');
  const [statusLine, ...lines] = head.split('\r\n');
  const headers = Object.fromEntries(
    lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]),
  );
  return { status: Number(statusLine.split(' ')[1]), headers, body: JSON.parse(body) as unknown };
}

const REFUSAL = {
  error: {
    message: 'the router is holding as many request bodies as it may at once; retry shortly',
    type: 'server_error',
    param: null,
    code: 'body_budget_exceeded',
  },
};

test(
  'slow bodies over the buffered-body budget: the one that does not fit gets 503 at once, aborted ones give their bytes back',
  { timeout: 60_000 },
  async () => {
    const engine = await new MockEngine().start();
    const gateway = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ id: 'e', url: `http://127.0.0.1:${engine.port}` }],
      bodyLimit: BODY_LIMIT,
      bufferedBodyLimit: BUDGET,
      healthCheckIntervalMs: 0,
      metricsIntervalMs: 0,
    });
    await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const port = (gateway.app.server.address() as { port: number }).port;
    const clients: Socket[] = [];
    try {
      // a declared body is taken whole as soon as its headers arrive, though only a byte of it came
      const a = await slowClient(port, requestHead('content-length: 60000\r\n') + '{');
      clients.push(a.socket);
      await until(() => gateway.bodyBudget.used === 60_000, "the first body's declared length taken");
      // a second one of that size does not fit: refused before its body is read
      const b = await slowClient(port, requestHead('content-length: 60000\r\n') + '{');
      clients.push(b.socket);
      await until(() => b.answer().includes('}}'), 'the refusal of the body that does not fit', { timeoutMs: 5000 });
      const refused = parseAnswer(b.answer());
      assert.equal(refused.status, 503);
      assert.equal(refused.headers['retry-after'], '1');
      assert.match(refused.headers['content-type'], /^application\/json/);
      assert.equal(refused.headers.connection, 'close');
      assert.deepEqual(refused.body, REFUSAL);
      assert.equal(gateway.bodyBudget.used, 60_000, 'the refused request holds nothing');

      // a chunked body (no declared length) is charged chunk by chunk, and refused when a chunk does not fit
      const c = await slowClient(port, requestHead('transfer-encoding: chunked\r\n'));
      clients.push(c.socket);
      const chunk = (n: number) => `${n.toString(16)}\r\n${' '.repeat(n)}\r\n`;
      c.socket.write(chunk(30_000));
      await until(() => gateway.bodyBudget.used === 90_000, 'the chunk read taken');
      c.socket.write(chunk(20_000));
      await until(() => c.answer().includes('}}'), 'the refusal of the chunk that does not fit', { timeoutMs: 5000 });
      const chunkRefused = parseAnswer(c.answer());
      assert.equal(chunkRefused.status, 503);
      assert.equal(chunkRefused.headers['retry-after'], '1');
      assert.deepEqual(chunkRefused.body, REFUSAL);
      await until(() => gateway.bodyBudget.used === 60_000, 'the refused chunked request gave its bytes back');

      // another chunked one is left mid-body, then both slow clients go away: every byte comes back
      const d = await slowClient(port, requestHead('transfer-encoding: chunked\r\n'));
      clients.push(d.socket);
      d.socket.write(chunk(10_000));
      await until(() => gateway.bodyBudget.used === 70_000, 'the chunk read taken');
      a.socket.destroy();
      d.socket.destroy();
      await until(() => gateway.bodyBudget.used === 0, 'the aborted clients gave their bytes back');

      // a body that fills most of the budget is served, and gives its bytes back once answered
      const prompt = 'x'.repeat(60_000);
      for (const stream of [false, true]) {
        const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ prompt, max_tokens: 2, stream }),
        });
        assert.equal(res.status, 200, await res.text());
      }
      await until(() => gateway.bodyBudget.used === 0, 'the answered requests gave their bytes back');
      const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      assert.match(metrics, /^contextforge_request_body_budget_refusals_total 2$/m);
      assert.match(metrics, /^contextforge_request_body_bytes_limit 100000$/m);
      assert.match(metrics, /^contextforge_request_body_bytes_held 0$/m);
    } finally {
      for (const s of clients) s.destroy();
      await gateway.close(0);
      await engine.close();
    }
  },
);

test('a body over the body limit is still a 413, not a budget refusal; the budget may not be below the body limit', async () => {
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    bodyLimit: BODY_LIMIT,
    bufferedBodyLimit: BODY_LIMIT,
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'x'.repeat(BODY_LIMIT) }),
    });
    assert.equal(res.status, 413, await res.text());
    await until(() => gateway.bodyBudget.used === 0, 'nothing held');
  } finally {
    await gateway.close(0);
  }
  await assert.rejects(
    createGateway({ router: new KVAwareRouter(), bodyLimit: BODY_LIMIT, bufferedBodyLimit: BODY_LIMIT - 1 }),
    (err: Error) =>
      err instanceof RangeError && /bufferedBodyLimit \(65535\) must be at least bodyLimit/.test(err.message),
  );
});

test('--buffered-body-limit: 256 MiB by default, at least --body-limit, raised with it when not set', () => {
  assert.equal(resolveServe([]).config.bufferedBodyLimit, 256 * 1024 * 1024);
  assert.equal(resolveServe(['--buffered-body-limit', '33554432']).config.bufferedBodyLimit, 32 * 1024 * 1024);
  // a body limit past the default budget raises the budget it did not set
  const raised = resolveServe(['--body-limit', String(512 * 1024 * 1024)]);
  assert.equal(raised.config.bufferedBodyLimit, 512 * 1024 * 1024);
  assert.throws(
    () => resolveServe(['--body-limit', '2048', '--buffered-body-limit', '1024']),
    /^RangeError: --buffered-body-limit \(1024\) must be at least --body-limit \(2048\): a body at the limit could never be read$/,
  );
  assert.throws(
    () => resolveServe([], { CONTEXTFORGE_BUFFERED_BODY_LIMIT: '10' }),
    /--buffered-body-limit must be >= 1024 \(got 10\)/,
  );
});
