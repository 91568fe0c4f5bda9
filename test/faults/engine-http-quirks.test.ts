/**
 * What deployed engines (and the proxies in front of them) send that a hand-written stub
 * rarely does: a Retry-After given as an HTTP date instead of seconds, and connections an engine
 * closes once they are idle for a few seconds without announcing it. The gateway must read them
 * as the engines mean them.
 */
import assert from 'node:assert/strict';
import { createServer, type AddressInfo, type Socket } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';
import { answeringEngine, post } from './harness.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0 };

/**
 * Runs `check` with a round-robin gateway over `engines` (workers e0, e1, …) and the answer to
 * one completion request through it, then closes the gateway and the engines.
 */
async function withAnswer(
  engines: ReadonlyArray<{ url: string; close: () => Promise<void> }>,
  check: (answer: { status: number; headers: Headers; text: string }) => Promise<void> | void,
): Promise<void> {
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: engines.map((e, i) => ({ id: `e${i}`, url: e.url })),
    ...quiet,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    await check(await post(url, '/v1/completions', { prompt: 'x' }));
  } finally {
    await gw.close();
    for (const e of engines) await e.close();
  }
}

test('a 429 whose Retry-After is an HTTP date gives the client the wait that date means, in seconds', async () => {
  // RFC 9110 §10.2.3: Retry-After = HTTP-date / delay-seconds; an hour from now, in the preferred format
  const inAnHour = new Date(Date.now() + 3600_000).toUTCString();
  const inThePast = new Date(Date.now() - 3600_000).toUTCString();
  const inHalfAMinute = new Date(Date.now() + 30_000).toUTCString();
  for (const [retryAfter, low, high] of [
    [inHalfAMinute, 25, 30],
    // past a minute, a minute (MAX_CLIENT_RETRY_AFTER_S)
    [inAnHour, 60, 60],
    [inThePast, 1, 1],
  ] as const) {
    const engine = await answeringEngine(429, '{"error":{"message":"too many requests"}}', {
      'retry-after': retryAfter,
    });
    await withAnswer([engine], (res) => {
      assert.equal(res.status, 429);
      const seconds = Number(res.headers.get('retry-after'));
      assert.ok(
        Number.isInteger(seconds) && seconds >= low && seconds <= high,
        `engine's Retry-After ${retryAfter}: the client's is ${res.headers.get('retry-after')}, not within [${low}, ${high}]`,
      );
    });
  }
});

test('a 429 whose Retry-After is a longer number of seconds than a minute gives the client a minute, however many digits', async () => {
  for (const [retryAfter, expected] of [
    ['59', '59'],
    ['61', '60'],
    ['86399', '60'],
    ['1000000', '60'],
    ['99999999999999999999999', '60'],
    ['0000000000007', '7'],
  ] as const) {
    const engine = await answeringEngine(429, '{"error":{"message":"too many requests"}}', {
      'retry-after': retryAfter,
    });
    await withAnswer([engine], (res) => {
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('retry-after'), expected, `engine's Retry-After ${retryAfter}`);
    });
  }
});

/** How long vLLM and SGLang keep an idle connection (uvicorn's timeout_keep_alive; VLLM_HTTP_TIMEOUT_KEEP_ALIVE). */
const ENGINE_KEEP_ALIVE_MS = 5000;

/**
 * An engine served as uvicorn serves vLLM and SGLang: HTTP/1.1 keep-alive without a Keep-Alive
 * header announcing how long, and a connection idle for ENGINE_KEEP_ALIVE_MS closed by the engine.
 * `closedBy` records, per connection that carried a completion request, which side closed it first.
 */
async function uvicornLikeEngine() {
  const closedBy: Array<'engine' | 'gateway'> = [];
  const answer = JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'ok' }] });
  const server = createServer((socket: Socket) => {
    let idle: NodeJS.Timeout | undefined;
    let closed = false;
    // a connection of the proxied requests (the gateway's side requests have connections of their own)
    let proxied = false;
    const close = (by: 'engine' | 'gateway') => {
      if (closed) return;
      closed = true;
      if (proxied) closedBy.push(by);
      clearTimeout(idle);
      socket.end();
    };
    const rest = () => {
      clearTimeout(idle);
      idle = setTimeout(() => close('engine'), ENGINE_KEEP_ALIVE_MS);
    };
    let pending = '';
    socket.on('error', () => {});
    socket.on('end', () => close('gateway'));
    socket.on('data', (d: Buffer) => {
      clearTimeout(idle);
      pending += d.toString('latin1');
      for (;;) {
        const head = pending.indexOf('\r\n\r\n');
        if (head < 0) return;
        const length = Number(/content-length: *(\d+)/i.exec(pending.slice(0, head))?.[1] ?? 0);
        if (pending.length < head + 4 + length) return;
        proxied ||= pending.startsWith('POST ');
        pending = pending.slice(head + 4 + length);
        socket.write(
          `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${answer.length}\r\n\r\n${answer}`,
        );
        rest();
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    closedBy,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

test('the gateway closes an idle engine connection before the engine does (no request sent on a closing one)', async () => {
  // an engine closing a connection at the moment the gateway sends a request on it resets the
  // request: the attempt fails before it reached the engine, as a failure of the engine
  const engine = await uvicornLikeEngine();
  await withAnswer([engine], async (res) => {
    assert.equal(res.status, 200);
    await until(() => engine.closedBy.length > 0, 'the idle engine connection to close', {
      timeoutMs: ENGINE_KEEP_ALIVE_MS * 2,
    });
    assert.deepEqual(engine.closedBy, ['gateway']);
  });
});

test('engines that all answer 503 with a Retry-After give the client a 503 with the shortest, not a 502', async () => {
  // vLLM answers 503 while it cannot serve (sleeping, shutting down) and a proxy in front of an
  // engine answers 503 + Retry-After during a rollout: the client should wait, not report a fault
  const engines = [
    await answeringEngine(503, '{"error":{"message":"unavailable"}}', { 'retry-after': '30' }),
    await answeringEngine(503, '{"error":{"message":"unavailable"}}', { 'retry-after': '45' }),
  ];
  await withAnswer(engines, (res) => {
    assert.equal(res.status, 503);
    assert.equal(res.headers.get('retry-after'), '30');
    assert.equal((JSON.parse(res.text) as { error: { code: string } }).error.code, 'engines_unavailable');
  });
});

test('one engine asking for a day does not tell the client to wait a day while another asks for a second', async () => {
  // the request may go through as soon as any engine frees: the shortest wait, not the longest
  for (const [first, second, expected] of [
    ['86400', '1', '1'],
    ['1', '86400', '1'],
    ['86400', '86400', '60'],
  ] as const) {
    const engines = [
      await answeringEngine(503, '{"error":{"message":"unavailable"}}', { 'retry-after': first }),
      await answeringEngine(429, '{"error":{"message":"too many requests"}}', { 'retry-after': second }),
    ];
    await withAnswer(engines, (res) => {
      assert.equal(res.status, 503);
      assert.equal(res.headers.get('retry-after'), expected, `engines' Retry-After ${first} and ${second}`);
    });
  }
});

test('a 503 without a Retry-After is an engine failure: the client gets 502 when every engine failed', async () => {
  const engine = await answeringEngine(503, '{"error":{"message":"unavailable"}}');
  await withAnswer([engine], (res) => assert.equal(res.status, 502));
});
