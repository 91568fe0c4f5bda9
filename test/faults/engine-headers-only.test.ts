/**
 * Engines that answer with headers and little or nothing after them: a connection closed right
 * after a 200's headers, an empty 200, a 200 that declares no type, informational answers (1xx)
 * before the real one, a header block too large to read. Nothing of such an answer has reached the
 * client, so another worker takes the request, the failure counts against the engine that failed,
 * and the client gets one whole answer.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { test } from 'node:test';
import { badFirstGateway, fakeEngine, post, type BadFirstGateway } from './harness.js';

/** An engine answering its completions with `answer` once the request is read (other paths: 404). */
async function engineAnswering(answer: (res: ServerResponse) => void) {
  const counts = { completions: 0 };
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    counts.completions++;
    req.on('end', () => answer(res));
  });
  return Object.assign(counts, { url: engine.url, close: () => engine.close() });
}

/**
 * Runs `check` on a round-robin gateway whose first worker is an engine answering completions
 * with `answer` (and, `withGood`, a good engine second), then closes both.
 */
async function withBadFirst(
  answer: (res: ServerResponse) => void,
  withGood: boolean,
  check: (g: BadFirstGateway, bad: { completions: number }) => Promise<void>,
): Promise<void> {
  const bad = await engineAnswering(answer);
  const g = await badFirstGateway(bad.url, withGood);
  try {
    await check(g, bad);
  } finally {
    await g.close();
    await bad.close();
  }
}

/** A counter's value for `worker` on the gateway's /metrics (0 when it has none yet). */
async function counter(base: string, name: string, worker: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(`worker="${worker}"`));
  return line === undefined ? 0 : Number(line.split(' ').at(-1));
}

/**
 * Sends `n` completions (streamed or not) through a gateway whose first worker is `bad` and second
 * a good engine: each must be the good engine's whole answer, and every attempt on `bad` one
 * failure and one retry of it, the router's in-flight accounting and the budgets settled.
 */
async function assertRetriedOnGood(g: BadFirstGateway, bad: { completions: number }, stream: boolean): Promise<void> {
  const n = 2;
  for (let i = 0; i < n; i++) {
    const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 2, stream });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
    if (stream) assert.match(r.text, /data: \[DONE\]\n\n$/);
    else assert.equal((JSON.parse(r.text) as { usage: { completion_tokens: number } }).usage.completion_tokens, 2);
  }
  const tried = bad.completions;
  assert.ok(tried >= 1, 'the failing engine was tried');
  assert.equal(await counter(g.base, 'contextforge_upstream_failures_total', 'bad'), tried);
  assert.equal(await counter(g.base, 'contextforge_upstream_retries_total', 'bad'), tried);
  assert.equal(await counter(g.base, 'contextforge_upstream_failures_total', 'good'), 0);
  assert.equal(g.router.getStats().inFlightRequests, 0);
  assert.equal(g.gateway.answerBudget.used, 0);
  assert.equal(g.gateway.bodyBudget.used, 0);
}

for (const stream of [true, false]) {
  for (const type of ['text/event-stream', 'application/json']) {
    for (const close of ['end', 'destroy'] as const) {
      test(`a 200 (${type}) whose connection closes (${close}) right after its headers is retried on another worker (stream: ${stream})`, async () => {
        await withBadFirst(
          (res) => {
            res.writeHead(200, { 'content-type': type });
            res.flushHeaders();
            setImmediate(() => res.socket?.[close]());
          },
          true,
          async (g, bad) => {
            await assertRetriedOnGood(g, bad, stream);
          },
        );
      });
    }
  }
}

test('a JSON answer reset halfway through its declared length is retried on another worker', async () => {
  await withBadFirst(
    (res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '200' });
      res.write('{"id":"cmpl-1","choices":[{"text":"hel', () => (res.socket as Socket).resetAndDestroy());
    },
    true,
    async (g, bad) => {
      await assertRetriedOnGood(g, bad, false);
    },
  );
});

const emptyOrUntyped: [string, (res: ServerResponse) => void][] = [
  ['an empty 200 without a Content-Type', (res) => res.writeHead(200, { 'content-length': '0' }).end()],
  ['an empty chunked 200 without a Content-Type', (res) => res.writeHead(200).end()],
  ['an empty 200 typed text/plain', (res) => res.writeHead(200, { 'content-type': 'text/plain' }).end()],
  ['a 200 without a Content-Type whose body is not JSON', (res) => res.writeHead(200).end('<html>Bad Gateway</html>')],
];
for (const [what, answer] of emptyOrUntyped) {
  test(`${what} to a completion is no answer: retried on another worker, never passed on as JSON`, async () => {
    await withBadFirst(answer, true, async (g, bad) => {
      await assertRetriedOnGood(g, bad, false);
    });
  });
}

test('an empty 200 from the only engine is a 502 naming the cause, not an empty answer', async () => {
  await withBadFirst(
    (res) => res.writeHead(200, { 'content-length': '0' }).end(),
    false,
    async (g) => {
      const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2 });
      assert.equal(r.status, 502, r.text);
      assert.equal((JSON.parse(r.text) as { error: { code: string } }).error.code, 'engine_answer_incomplete');
    },
  );
});

test('a 200 without a Content-Type holding a whole JSON answer passes on as JSON', async () => {
  const body = '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi"}]}';
  await withBadFirst(
    (res) => res.writeHead(200, { 'content-length': String(body.length) }).end(body),
    false,
    async (g) => {
      const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('content-type'), 'application/json');
      assert.equal(r.text, body);
    },
  );
});

/**
 * An engine speaking raw HTTP/1.1 that sends `before` (informational answers) ahead of a whole
 * answer of its own to each completion request.
 */
async function rawEngine(before: string, stream: boolean) {
  const server = createTcpServer((s) => {
    s.on('error', () => {});
    let buf = '';
    s.on('data', (d: Buffer) => {
      buf += d.toString('latin1');
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(buf)?.[1] ?? 0);
      if (buf.length < end + 4 + length) return;
      const post = buf.startsWith('POST /v1/completions ');
      buf = '';
      if (!post) return void s.write('HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n');
      const body = stream
        ? 'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n'
        : '{"id":"cmpl-1","choices":[{"text":"a"}]}';
      const type = stream ? 'text/event-stream' : 'application/json';
      s.write(before);
      s.write(`HTTP/1.1 200 OK\r\ncontent-type: ${type}\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

for (const stream of [true, false]) {
  test(`informational answers (102, 103) before the answer are skipped: the client gets the answer (stream: ${stream})`, async () => {
    const engine = await rawEngine(
      'HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n',
      stream,
    );
    const g = await badFirstGateway(engine.url, false);
    try {
      const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('link'), null, 'an informational answer’s headers stay with the engine');
      assert.equal(
        r.text,
        stream ? 'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n' : '{"id":"cmpl-1","choices":[{"text":"a"}]}',
      );
      assert.equal(await counter(g.base, 'contextforge_upstream_failures_total', 'bad'), 0);
    } finally {
      await g.close();
      await engine.close();
    }
  });
}

test('a header block too large to read is a failed attempt, retried on another worker', async () => {
  await withBadFirst(
    (res) => {
      const headers: Record<string, string> = { 'content-type': 'application/json' };
      for (let i = 0; i < 100; i++) headers[`x-filler-${i}`] = 'v'.repeat(1000);
      res.writeHead(200, headers).end('{"id":"cmpl-1","choices":[]}');
    },
    true,
    async (g, bad) => {
      await assertRetriedOnGood(g, bad, false);
    },
  );
});

test("a client error without a Content-Type reaches the client with its status: not the engine's failure, never retried", async () => {
  for (const [status, body] of [
    [400, 'Bad Request: prompt too long'],
    [404, ''],
  ] as const) {
    await withBadFirst(
      (res) => res.writeHead(status).end(body),
      true,
      async (g, bad) => {
        const r = await post(g.base, '/v1/completions', { prompt: `p${status}`, max_tokens: 2 });
        assert.equal(r.status, status, r.text);
        assert.equal(r.headers.get('x-contextforge-worker'), 'bad');
        assert.equal(bad.completions, 1, 'tried once');
        assert.equal(await counter(g.base, 'contextforge_upstream_failures_total', 'bad'), 0);
        assert.deepEqual(g.gateway.health.reasons('bad'), []);
      },
    );
  }
});
