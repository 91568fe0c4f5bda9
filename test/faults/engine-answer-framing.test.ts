/**
 * Engines whose HTTP framing lies: a Content-Length shorter than the body they send. The
 * gathered answer is then a JSON document cut short, and the bytes past the declared length
 * are left on the keep-alive connection. And engines (or proxies in front of them) whose answer
 * breaks HTTP/1.1 itself, which the gateway's HTTP client cannot read at all: the engine got the
 * request, so it is a malformed answer, not a connection lost before the request arrived. Raw
 * TCP stub engines, since Node's own HTTP server never sends such answers.
 */
import assert from 'node:assert/strict';
import { createServer, type AddressInfo, type Socket } from 'node:net';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { tiers } from '../helpers/prompts.js';
import { until } from '../helpers/wait.js';
import { post } from './harness.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0, adminToken: 'framing-suite-admin' };

interface RawEngine {
  url: string;
  /** Completion requests read, over all connections. */
  requests: number;
  /** The connection (numbered as accepted, from 0) each completion request came on. */
  requestConnections: number[];
  /** Connections accepted, and those of them closed (numbered as accepted, from 0). */
  connections: number;
  closed: Set<number>;
  close(): Promise<void>;
}

/**
 * An engine on a raw socket: each completion request read (headers and Content-Length body) is
 * answered with the bytes `answer(n)` returns for the n-th one (0-based): in one write, or in
 * one write per part, each after the last has been handed to the system.
 */
async function rawEngine(answer: (n: number) => string | string[]): Promise<RawEngine> {
  const sockets = new Set<Socket>();
  const engine: RawEngine = {
    url: '',
    requests: 0,
    requestConnections: [],
    connections: 0,
    closed: new Set(),
    close: async () => {},
  };
  const server = createServer((socket) => {
    const connection = engine.connections++;
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => {
      engine.closed.add(connection);
      sockets.delete(socket);
    });
    let pending = Buffer.alloc(0);
    socket.on('data', (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      for (;;) {
        const end = pending.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = pending.subarray(0, end).toString('latin1');
        const length = Number(/\r\ncontent-length:\s*(\d+)/i.exec(head)?.[1] ?? 0);
        if (pending.length < end + 4 + length) return;
        pending = pending.subarray(end + 4 + length);
        // the gateway's own requests (its model list) are answered 404
        if (!head.startsWith('POST /v1/completions '))
          socket.write('HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n');
        else {
          engine.requestConnections.push(connection);
          writeParts(socket, [answer(engine.requests++)].flat());
        }
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  engine.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  engine.close = () =>
    new Promise<void>((r) => {
      for (const s of sockets) s.destroy();
      server.close(() => r());
    });
  return engine;
}

function writeParts(socket: Socket, parts: string[]): void {
  const [first, ...rest] = parts;
  if (first !== undefined) socket.write(first, () => setImmediate(() => writeParts(socket, rest)));
}

/** A 200 JSON answer whose Content-Length says `declared` bytes, followed by `body` whatever its length. */
const framed = (body: string, declared = Buffer.byteLength(body)) =>
  `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${declared}\r\n\r\n${body}`;

const completion = (n: number) =>
  JSON.stringify({
    id: `cmpl-${n}`,
    object: 'text_completion',
    choices: [{ index: 0, text: `answer ${n}`, finish_reason: 'length' }],
    usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
  });

async function gatewayWith(badUrl: string, withGood: boolean) {
  const good = withGood ? await new MockEngine().start() : undefined;
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const workers = [{ id: 'bad', url: badUrl }];
  if (good) workers.push({ id: 'good', url: `http://127.0.0.1:${good.port}` });
  const gateway = await createGateway({ router, workers, ...quiet });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const metricLine = async (prefix: string) =>
    (await gateway.metrics.metrics()).split('\n').find((l) => l.startsWith(prefix));
  return {
    router,
    base,
    metricLine,
    close: async () => {
      await gateway.close();
      await good?.close();
    },
  };
}

test('a JSON answer whose Content-Length is short of its body is a failed attempt, retried on another worker', async () => {
  // the declared length stops one byte short: the client would get JSON without its last brace
  const bad = await rawEngine((n) => framed(completion(n), Buffer.byteLength(completion(n)) - 1));
  const g = await gatewayWith(bad.url, true);
  try {
    for (let i = 0; i < 2; i++) {
      const r = await post(g.base, '/v1/completions', { prompt: `short${i}`, max_tokens: 2 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'good', r.text);
      assert.doesNotThrow(() => JSON.parse(r.text), `a whole JSON answer: ${r.text}`);
    }
    assert.ok(bad.requests >= 1, 'the lying engine was tried');
    assert.equal(
      await g.metricLine('contextforge_upstream_failures_total{worker="bad"'),
      `contextforge_upstream_failures_total{worker="bad",reason="malformed"} ${bad.requests}`,
      'each cut answer counts as an engine failure',
    );
    // the connection that carried the cut answer has bytes of it left unread: it is not kept
    await until(
      () => bad.requestConnections.every((c) => bad.closed.has(c)),
      'the connections that carried the cut answers closed',
    );
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await bad.close();
  }
});

test('a JSON answer cut by its Content-Length, with no other worker, is a 502 naming the cause', async () => {
  const bad = await rawEngine((n) => framed(completion(n), 40));
  const g = await gatewayWith(bad.url, false);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'alone', max_tokens: 2 });
    assert.equal(r.status, 502, r.text);
    const body = JSON.parse(r.text) as { error: { type: string; code: string | null; message: string } };
    assert.equal(body.error.type, 'server_error');
    assert.equal(body.error.code, 'engine_answer_incomplete');
    assert.match(body.error.message, /not a whole JSON document/);
    assert.equal(
      await g.metricLine('contextforge_upstream_failures_total{worker="bad"'),
      'contextforge_upstream_failures_total{worker="bad",reason="malformed"} 1',
    );
  } finally {
    await g.close();
    await bad.close();
  }
});

test('bytes past a whole answer’s Content-Length never become the answer to the next request on that connection', async () => {
  // the first answer is whole within its declared length; what follows it is a whole second
  // response, which a connection reused as is would hand to the next request
  const smuggled = framed('{"smuggled":true}');
  for (const together of [true, false]) {
    const bad = await rawEngine((n) =>
      n > 0
        ? framed(completion(n))
        : together
          ? `${framed(completion(0))}${smuggled}`
          : [framed(completion(0)), smuggled],
    );
    const g = await gatewayWith(bad.url, false);
    try {
      const first = await post(g.base, '/v1/completions', { prompt: 'first', max_tokens: 2 });
      assert.equal(first.status, 200, first.text);
      assert.deepEqual(JSON.parse(first.text), JSON.parse(completion(0)));
      const second = await post(g.base, '/v1/completions', { prompt: 'second', max_tokens: 2 });
      assert.equal(second.status, 200, second.text);
      assert.deepEqual(JSON.parse(second.text), JSON.parse(completion(1)), 'the engine’s own answer to it');
      assert.equal(bad.requests, 2);
      const [onFirst, onSecond] = bad.requestConnections;
      assert.notEqual(onSecond, onFirst, 'the poisoned connection was dropped, the second request had another');
    } finally {
      await g.close();
      await bad.close();
    }
  }
});

/** Token prompts of whole blocks, distinct per family. */
const blocksOf = (router: KVAwareRouter, family: number, blocks: number) =>
  Array.from({ length: blocks * router.blockSize }, (_, i) => family * 1000 + i);

/**
 * Answers the gateway's HTTP client refuses as no HTTP/1.1 answer; each engine got the request
 * and may have computed it.
 */
const unreadable: ReadonlyArray<readonly [string, (n: number) => string]> = [
  // an interim 100 the request never asked for (no Expect: 100-continue), then a valid answer
  ['an unsolicited 100 Continue', (n) => `HTTP/1.1 100 Continue\r\n\r\n${framed(completion(n))}`],
  [
    'two different Content-Lengths',
    (n) =>
      framed(completion(n)).replace('\r\n\r\n', `\r\ncontent-length: ${Buffer.byteLength(completion(n)) + 5}\r\n\r\n`),
  ],
  [
    'Transfer-Encoding and Content-Length together',
    (n) => {
      const body = completion(n);
      const size = Buffer.byteLength(body);
      return `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\ncontent-length: ${size}\r\n\r\n${size.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
    },
  ],
  ['a reply that is not HTTP', () => '-ERR unknown command\r\n'],
  ['a body without a status line (HTTP/0.9)', (n) => completion(n)],
  ['a 100 KB header', (n) => framed(completion(n)).replace('\r\n\r\n', `\r\nx-big: ${'h'.repeat(100_000)}\r\n\r\n`)],
];

for (const [what, answer] of unreadable) {
  test(`${what}: a malformed answer, tried once on that engine, then on another worker; its predictions stay`, async () => {
    const bad = await rawEngine(answer);
    const g = await gatewayWith(bad.url, true); // round robin: the bad worker first
    try {
      const prompt = blocksOf(g.router, 1, 4);
      const r = await post(g.base, '/v1/completions', { prompt, max_tokens: 2 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'good', r.text);
      assert.equal(bad.requests, 1, 'the engine got the request once: no second try as on a stale connection');
      assert.equal(
        await g.metricLine('contextforge_upstream_failures_total{worker="bad"'),
        'contextforge_upstream_failures_total{worker="bad",reason="malformed"} 1',
      );
      // the engine got the request and may hold it: what was predicted of it is not withdrawn
      assert.deepEqual(tiers(g.router, 'bad', prompt), Array(4).fill('predicted'));
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
      await bad.close();
    }
  });

  test(`${what}, from the only engine: one attempt, then a 502 naming it malformed`, async () => {
    const bad = await rawEngine(answer);
    const g = await gatewayWith(bad.url, false);
    try {
      for (const stream of [false, true]) {
        const before = bad.requests;
        const r = await post(g.base, '/v1/completions', { prompt: 'alone', max_tokens: 2, stream });
        assert.equal(r.status, 502, r.text);
        const body = JSON.parse(r.text) as { error: { type: string; message: string } };
        assert.equal(body.error.type, 'server_error');
        assert.match(body.error.message, /\(last: bad, malformed\)$/);
        assert.equal(bad.requests - before, 1, `stream ${stream}: the engine got the request once, not once per retry`);
      }
      assert.equal(
        await g.metricLine('contextforge_upstream_failures_total{worker="bad"'),
        'contextforge_upstream_failures_total{worker="bad",reason="malformed"} 2',
      );
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
      await bad.close();
    }
  });
}

test('a stream whose chunked framing breaks after its first event: the client gets an error event, counted as malformed', async () => {
  const event = `data: ${JSON.stringify({ id: 'cmpl-0', choices: [{ index: 0, text: 'a' }] })}\n\n`;
  const size = Buffer.byteLength(event).toString(16);
  // the first chunk is whole; the next one's size line is not hexadecimal
  const bad = await rawEngine(() => [
    `HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n${size}\r\n${event}\r\n`,
    'zz\r\nhello\r\n',
  ]);
  const g = await gatewayWith(bad.url, false);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'framing', max_tokens: 2, stream: true });
    assert.equal(r.status, 200, r.text);
    assert.ok(r.text.startsWith(event), r.text);
    assert.match(r.text, /"error":\{"message":"the engine failed mid-stream"/);
    assert.ok(r.text.endsWith('data: [DONE]\n\n'), r.text);
    assert.equal(bad.requests, 1);
    assert.equal(
      await g.metricLine('contextforge_stream_failures_total{worker="bad"'),
      'contextforge_stream_failures_total{worker="bad",reason="malformed"} 1',
    );
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await bad.close();
  }
});
