/**
 * The gateway's budget of request-body bytes held at once over all requests: many clients each
 * sending a large body slowly must not make it hold (clients × body limit) bytes. A request
 * whose body does not fit is refused at once with 503, Retry-After and an OpenAI error; the
 * bytes come back when the answer is committed to the client (its first byte: no retry needs
 * the body after that), and when a request ends, fails or its client goes away; the body itself
 * is let go of then too, not kept for the rest of a stream. Raw sockets stand for the slow
 * clients; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import { createServer, request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { test } from 'node:test';
import { getHeapSnapshot, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { MAX_BODY_LIMIT } from '../../src/server/body-budget.js';
import { rawClient } from '../helpers/raw-client.js';
import { resolveServe } from '../helpers/serve-config.js';
import { until } from '../helpers/wait.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

const BODY_LIMIT = 64 * 1024;
const BUDGET = 100_000;

/** A client that sends `head` (request line and headers) and then as much of its body as told, when told. */
/** A gateway in front of the engine at `url` with BODY_LIMIT and BUDGET, listening on a free port. */
async function budgetGateway(url: string) {
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url }],
    bodyLimit: BODY_LIMIT,
    bufferedBodyLimit: BUDGET,
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return { gateway, port: (gateway.app.server.address() as { port: number }).port };
}

async function slowClient(port: number, head: string): Promise<{ socket: Socket; answer: () => string }> {
  const { socket, received } = await rawClient(port);
  socket.write(head);
  return { socket, answer: received };
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
    const { gateway, port } = await budgetGateway(`http://127.0.0.1:${engine.port}`);
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
    const text = await res.text();
    assert.equal(res.status, 413, text);
    // the answer names what is too large, as every refusal of a client's request does
    assert.equal((JSON.parse(text) as { error: { param: string | null } }).error.param, 'body', text);
    // a chunked body (no Content-Length to refuse it on) that grows past the limit too
    const chunked = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: new Blob([JSON.stringify({ prompt: 'x'.repeat(BODY_LIMIT) })]).stream(),
      duplex: 'half',
    } as RequestInit);
    const chunkedText = await chunked.text();
    assert.equal(chunked.status, 413, chunkedText);
    assert.equal((JSON.parse(chunkedText) as { error: { param: string | null } }).error.param, 'body', chunkedText);
    await until(() => gateway.bodyBudget.used === 0, 'nothing held');
  } finally {
    await gateway.close(0);
  }
  await assert.rejects(
    createGateway({ router: new KVAwareRouter(), bodyLimit: BODY_LIMIT, bufferedBodyLimit: BODY_LIMIT - 1 }),
    (err: Error) =>
      err instanceof RangeError && /bufferedBodyLimit \(65535\) must be at least bodyLimit/.test(err.message),
  );
  // a body is parsed as one string: a limit past the longest string V8 makes could not be honoured
  await assert.rejects(
    createGateway({ router: new KVAwareRouter(), bodyLimit: MAX_BODY_LIMIT + 1 }),
    (err: Error) => err instanceof RangeError && /^bodyLimit must be an integer from 1 to \d+/.test(err.message),
  );
});

test('--buffered-body-limit: 256 MiB by default, at least --body-limit, raised with it when not set', () => {
  assert.equal(resolveServe([]).config.bufferedBodyLimit, 256 * 1024 * 1024);
  assert.equal(resolveServe(['--buffered-body-limit', '33554432']).config.bufferedBodyLimit, 32 * 1024 * 1024);
  // a body limit past the default budget raises the budget it did not set
  const raised = resolveServe(['--body-limit', String(384 * 1024 * 1024)]);
  assert.equal(raised.config.bufferedBodyLimit, 384 * 1024 * 1024);
  assert.throws(
    () => resolveServe(['--body-limit', '2048', '--buffered-body-limit', '1024']),
    /^RangeError: --buffered-body-limit \(1024\) must be at least --body-limit \(2048\): a body at the limit could never be read$/,
  );
  assert.throws(
    () => resolveServe([], { CONTEXTFORGE_BUFFERED_BODY_LIMIT: '10' }),
    /--buffered-body-limit must be >= 1024 \(got 10\)/,
  );
});

/**
 * An engine that reads each request's body (and keeps none of it), answers it with the first
 * event of a stream and holds the stream open until `finish()`.
 */
async function holdingEngine() {
  const open: ServerResponse[] = [];
  const server = createServer((req, res) => {
    // the gateway asks for the models on its own
    if (req.method !== 'POST') return void res.writeHead(404).end();
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: ${JSON.stringify({ choices: [{ index: 0, text: 'first', finish_reason: null }] })}\n\n`);
      open.push(res);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    /** Streams answered and not ended. */
    open: () => open.filter((res) => !res.writableEnded).length,
    finish: () => {
      for (const res of open) if (!res.writableEnded) res.end('data: [DONE]\n\n');
    },
    close: async () => {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
}

/**
 * A streamed completion sent with node:http (whole, or chunked); resolves once its first event
 * arrived. No closure holds `body`: what the client side keeps of it must not count as the gateway's.
 */
function openStream(
  port: number,
  body: Buffer,
  { chunked = false, headers = {} }: { chunked?: boolean; headers?: Record<string, string> } = {},
): Promise<{ status: number; first: string; res: IncomingMessage }> {
  const req = httpRequest({
    host: '127.0.0.1',
    port,
    method: 'POST',
    path: '/v1/completions',
    headers: {
      'content-type': 'application/json',
      ...(chunked ? { 'transfer-encoding': 'chunked' } : { 'content-length': String(body.length) }),
      ...headers,
    },
  });
  const answered = new Promise<{ status: number; first: string; res: IncomingMessage }>((resolve, reject) => {
    req.once('response', (res: IncomingMessage) => {
      res.once('data', (d: Buffer) => {
        res.pause();
        resolve({ status: res.statusCode ?? 0, first: d.toString(), res });
      });
      res.once('error', reject);
    });
    req.once('error', reject);
  });
  if (chunked) {
    // in pieces, as a client streaming its body sends it
    const piece = 256 * 1024;
    for (let at = 0; at < body.length; at += piece) req.write(body.subarray(at, at + piece));
    req.end();
  } else req.end(body);
  return answered;
}

/** The rest of a stream, read to its end. */
function readToEnd(res: IncomingMessage): Promise<string> {
  let text = '';
  res.on('data', (d: Buffer) => (text += d.toString()));
  res.resume();
  return new Promise((resolve) => res.once('end', () => resolve(text)));
}

test(
  'a streamed answer gives its body bytes back once its first byte reached the client, not when it ends',
  { timeout: 60_000 },
  async () => {
    const engine = await holdingEngine();
    const { gateway, port } = await budgetGateway(engine.url);
    // two of these do not fit in the budget together
    const body = () => Buffer.from(JSON.stringify({ prompt: 'x'.repeat(60_000), max_tokens: 100, stream: true }));
    try {
      const first = await openStream(port, body());
      assert.equal(first.status, 200);
      assert.match(first.first, /^data: .*"first"/);
      // the stream is still open: its body is needed no more, and neither are its bytes
      await until(() => gateway.bodyBudget.used === 0, 'the open stream gave its body bytes back', {
        timeoutMs: 5000,
      });
      assert.equal(engine.open(), 1, 'the first stream is still open');
      // a second request that did not fit beside it before gets through while it stays open
      const second = await openStream(port, body());
      assert.equal(second.status, 200, `the second request was answered ${second.status}: ${second.first}`);
      assert.match(second.first, /^data: .*"first"/);
      assert.equal(engine.open(), 2, 'both streams open at once');
      await until(() => gateway.bodyBudget.used === 0, 'the second stream gave its bytes back', { timeoutMs: 5000 });
      // the streams end as they would have: the rest passes through, and nothing is given back twice
      const rests = [readToEnd(first.res), readToEnd(second.res)];
      engine.finish();
      for (const rest of await Promise.all(rests)) assert.equal(rest, 'data: [DONE]\n\n');
      assert.equal(gateway.bodyBudget.used, 0);
      const again = await openStream(port, body());
      assert.equal(again.status, 200);
      await until(() => gateway.bodyBudget.used === 0, 'the third stream gave its bytes back', { timeoutMs: 5000 });
      engine.finish();
      await readToEnd(again.res);
    } finally {
      await gateway.close(0);
      await engine.close();
    }
  },
);

/** Whether the heap holds a string that contains `needle` (a heap snapshot shows the start of each string). */
async function heapHoldsString(needle: Buffer): Promise<boolean> {
  let tail = Buffer.alloc(0);
  for await (const chunk of getHeapSnapshot()) {
    const text = Buffer.concat([tail, chunk as Buffer]);
    if (text.includes(needle)) return true;
    tail = text.subarray(Math.max(0, text.length - needle.length));
  }
  return false;
}

const variants: { name: string; chunked: boolean; headers: Record<string, string>; waits?: boolean }[] = [
  { name: 'a whole body forwarded as received (the fast path)', chunked: false, headers: {} },
  {
    name: 'a whole body that waited for a free connection to the engine',
    chunked: false,
    headers: {},
    waits: true,
  },
  { name: 'a chunked body forwarded as received (Fastify)', chunked: true, headers: {} },
  {
    name: 'a chunked body forwarded with a cache salt (Fastify, the body re-serialised)',
    chunked: true,
    headers: { 'x-kv-isolate': '1' },
  },
];
for (const variant of variants) {
  test(`an open stream keeps nothing of its request body: ${variant.name}`, { timeout: 120_000 }, async () => {
    const engine = await holdingEngine();
    const gateway = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ id: 'e', url: engine.url }],
      healthCheckIntervalMs: 0,
      metricsIntervalMs: 0,
      // one connection to the engine: a request waits for it while another stream holds it
      engineConnections: variant.waits === true ? 1 : undefined,
    });
    await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const port = (gateway.app.server.address() as { port: number }).port;
    const before = variant.waits
      ? await openStream(port, Buffer.from(JSON.stringify({ prompt: 'before', max_tokens: 1, stream: true })))
      : undefined;
    // every Buffer that carried the body through the gateway: the chunks it read, the bytes it sent the engine
    let carried = 0;
    let collected = 0;
    const registry = new FinalizationRegistry(() => void collected++);
    const onRequest = (message: unknown) => {
      const { request, server } = message as { request: IncomingMessage; server: unknown };
      if (server !== gateway.app.server) return;
      request.on('data', (chunk: Buffer) => {
        carried++;
        registry.register(chunk, 0);
      });
    };
    const onBodySent = (message: unknown) => {
      const { request, chunk } = message as { request: { origin: string }; chunk: Buffer };
      if (request.origin !== engine.url) return;
      carried++;
      registry.register(chunk, 0);
    };
    subscribe('http.server.request.start', onRequest);
    subscribe('undici:request:bodyChunkSent', onBodySent);
    // the prompt starts with a mark of its own: a string the gateway keeps that holds the prompt shows it
    const mark = randomBytes(16);
    const PROMPT_BYTES = 2 * 1024 * 1024;
    try {
      const opening = openStream(
        port,
        Buffer.from(
          JSON.stringify({
            prompt: `${mark.toString('hex')}${'x'.repeat(PROMPT_BYTES)}`,
            max_tokens: 100,
            stream: true,
          }),
        ),
        variant,
      );
      if (before !== undefined) {
        const slots = gateway.connections.get('e')!.slots;
        await until(() => slots.queued === 1, 'the request to wait for the connection the first stream holds');
        engine.finish();
        await readToEnd(before.res);
      }
      const opened = await opening;
      assert.equal(opened.status, 200, opened.first);
      assert.ok(carried >= 2, `the body's buffers were seen (${carried})`);
      await until(
        () => {
          gc();
          return collected === carried;
        },
        'every buffer of the body to be collected while the stream is open',
        { timeoutMs: 5000 },
      );
      // the key is made of buffers: a string of it would be found in the heap itself
      const key = Buffer.concat([Buffer.from(mark.toString('hex')), Buffer.from('x'.repeat(8))]);
      assert.equal(await heapHoldsString(key), false, 'a string holding the prompt is still reachable');
      assert.equal(engine.open(), 1, 'the stream is still open');
      assert.equal(gateway.bodyBudget.used, 0);
      const rest = readToEnd(opened.res);
      engine.finish();
      assert.equal(await rest, 'data: [DONE]\n\n');
    } finally {
      unsubscribe('http.server.request.start', onRequest);
      unsubscribe('undici:request:bodyChunkSent', onBodySent);
      await gateway.close(0);
      await engine.close();
    }
  });
}

test('a pipelined request whose client closes while its answer waits behind another gives its bytes back', async () => {
  const engine = await holdingEngine();
  const { gateway, port } = await budgetGateway(engine.url);
  const { socket } = await rawClient(port);
  try {
    const first = JSON.stringify({ prompt: 'first', max_tokens: 100, stream: true });
    socket.write(
      `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(first)}\r\n\r\n${first}`,
    );
    // the second request's answer waits behind the first's stream: its body is taken at its headers
    socket.write(
      'POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 50000\r\n\r\n{',
    );
    await until(() => gateway.bodyBudget.used >= 50_000, 'the pipelined body to be taken from the budget');
    socket.destroy();
    await until(() => gateway.bodyBudget.used === 0, 'the budget back at 0 once the client is gone', {
      timeoutMs: 5_000,
    });
  } finally {
    socket.destroy();
    engine.finish();
    await gateway.close(0);
    await engine.close();
  }
});
