/**
 * Engines whose answers break in the ways real ones do: cut short mid-event or mid-body,
 * too large to hold, refusing with 429. What the client sees, and that the router's
 * accounting settles.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayOptions } from '../../src/server/gateway.js';
import type { GatewayTimeouts } from '../../src/server/timeouts.js';
import { failingEngine, fakeEngine, post } from './harness.js';
import { tiers } from '../helpers/prompts.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0, adminToken: 'fault-suite-admin' };

/** An engine answering its completions with `answer` (other paths: 404). */
const engineAnswering = (answer: (res: ServerResponse) => void) =>
  fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => answer(res));
  });

/** A gateway in front of `bad` alone, or `bad` first and a good mock engine second (round robin). */
async function gatewayWith(
  badUrl: string,
  withGood: boolean,
  timeouts?: Partial<GatewayTimeouts>,
  options: Partial<GatewayOptions> = {},
) {
  const good = withGood ? await new MockEngine().start() : undefined;
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const workers = [{ id: 'bad', url: badUrl }];
  if (good) workers.push({ id: 'good', url: `http://127.0.0.1:${good.port}` });
  const gateway = await createGateway({ router, workers, ...quiet, timeouts, ...options });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return {
    router,
    base,
    close: async () => {
      await gateway.close();
      await good?.close();
    },
  };
}

test('a stream cut in the middle of an event ends with a clean error event, not one glued to the broken event', async () => {
  const bad = await engineAnswering((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: {"choices":[{"text":"a"}]}\n\n');
    // the engine dies halfway through its second event
    res.write('data: {"choices":[{"te', () => res.socket?.destroy());
  });
  const g = await gatewayWith(bad.url, false);
  const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 4, stream: true });
  assert.equal(r.status, 200);
  const events = r.text.split('\n\n').filter(Boolean);
  // the stream ends with data: [DONE], after the error event
  assert.equal(events.pop(), 'data: [DONE]');
  for (const e of events) {
    assert.match(e, /^data: /, `an SSE event: ${JSON.stringify(e)}`);
    assert.doesNotThrow(() => JSON.parse(e.slice('data: '.length)), `every event is whole JSON: ${JSON.stringify(e)}`);
  }
  assert.deepEqual(
    events.map((e) => Object.keys(JSON.parse(e.slice('data: '.length)) as object)[0]),
    ['choices', 'error'],
  );
  assert.equal(g.router.getStats().inFlightRequests, 0);
  await g.close();
  await bad.close();
});

test('a stream cut before its first whole event is retried on another worker', async () => {
  const bad = await engineAnswering((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: {"choices":[{"te', () => res.socket?.destroy());
  });
  const g = await gatewayWith(bad.url, true);
  for (let i = 0; i < 2; i++) {
    const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 2, stream: true });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
    assert.match(r.text, /data: \[DONE\]\n\n$/);
  }
  assert.ok(bad.requests >= 1, 'the failing engine was tried');
  assert.equal(g.router.getStats().inFlightRequests, 0);
  await g.close();
  await bad.close();
});

test('a non-streamed answer without a length, cut short, is retried on another worker (never a truncated 200)', async () => {
  const bad = await engineAnswering((res) => {
    // chunked, as a proxy in front of an engine may send it
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"id":"cmpl-1","choices":[{"text":"hel', () => res.socket?.destroy());
  });
  const g = await gatewayWith(bad.url, true);
  for (let i = 0; i < 2; i++) {
    const r = await post(g.base, '/v1/completions', { prompt: `n${i}`, max_tokens: 2 });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
    assert.equal((JSON.parse(r.text) as { usage: { completion_tokens: number } }).usage.completion_tokens, 2);
  }
  assert.ok(bad.requests >= 1, 'the failing engine was tried');
  assert.equal(g.router.getStats().inFlightRequests, 0);
  await g.close();
  await bad.close();
});

test('an answer that is not an event stream, cut after it reached the client, is cut for the client too', async () => {
  // a stream was asked for, the engine answers plain JSON without a length, passed through as it
  // comes (the answer budget cannot take it)
  const bad = await engineAnswering((res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"id":"cmpl-1","choices":[{"text":"hel');
    setImmediate(() => res.socket?.destroy());
  });
  const g = await gatewayWith(bad.url, false, undefined, { bufferedAnswerLimit: 1 });
  const answer = fetch(`${g.base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'c', max_tokens: 2, stream: true }),
  }).then((res) => res.text());
  await assert.rejects(answer, 'the client sees the answer cut, not a complete body');
  assert.equal(g.router.getStats().inFlightRequests, 0);
  await g.close();
  await bad.close();
});

test('a streamed request answered with JSON without a length, cut short: retried on another worker (never a truncated 200)', async () => {
  // chunked, or delimited by the connection's close: checked whole as an answer with a length is
  for (const close of [false, true]) {
    const bad = await engineAnswering((res) => {
      if (close) res.shouldKeepAlive = false;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"id":"cmpl-1","choices":[{"text":"hel', () => res.end());
    });
    const g = await gatewayWith(bad.url, true);
    try {
      for (let i = 0; i < 2; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `s${i}`, max_tokens: 2, stream: true });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.headers.get('x-contextforge-worker'), 'good', `close: ${close}`);
        assert.match(r.text, /data: \[DONE\]\n\n$/);
      }
      assert.ok(bad.requests >= 1, 'the failing engine was tried');
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
      await bad.close();
    }
  }
});

test('a streamed request answered 200 with an error object for a server error, chunked: retried elsewhere, not passed as success', () =>
  checkNotAnAnswer((res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: 'Internal server error', type: 'InternalServerError', code: 500 } }));
  }, 'nothing stays on the worker whose chunked 200 was an error'));

test('a request that is not streamed answered with an event stream: a failed attempt, retried on another worker', async () => {
  const bad = await engineAnswering((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end('data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n');
  });
  const g = await gatewayWith(bad.url, true);
  const alone = await gatewayWith(bad.url, false);
  try {
    for (let i = 0; i < 2; i++) {
      const r = await post(g.base, '/v1/completions', { prompt: `e${i}`, max_tokens: 2 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'good');
      assert.match(r.headers.get('content-type') ?? '', /^application\/json/);
      assert.equal((JSON.parse(r.text) as { usage: { completion_tokens: number } }).usage.completion_tokens, 2);
    }
    assert.ok(bad.requests >= 1, 'the engine answering a stream was tried');
    // alone: the client is told the engine failed; a streamed request takes the stream as ever
    const r = await post(alone.base, '/v1/completions', { prompt: 'e', max_tokens: 2 });
    assert.equal(r.status, 502, r.text);
    const streamed = await post(alone.base, '/v1/completions', { prompt: 'e', max_tokens: 2, stream: true });
    assert.equal(streamed.status, 200, streamed.text);
    assert.match(streamed.text, /data: \[DONE\]\n\n$/);
    assert.equal(g.router.getStats().inFlightRequests, 0);
    assert.equal(alone.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await alone.close();
    await bad.close();
  }
});

test('an engine answering 200 with an HTML page (a sign-in page of a proxy in front): not passed to the client, retried elsewhere', () =>
  checkNotAnAnswer(
    (res) => res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end('<html>Sign in</html>'),
    'nothing stays on the worker that answered a page',
  ));

test('a 200 typed text/plain is read as JSON: whole JSON is an answer, anything else a failed attempt', async () => {
  const json = await engineAnswering((res) =>
    res.writeHead(200, { 'content-type': 'text/plain' }).end('{"choices":[{"text":"plain"}]}'),
  );
  const text = await engineAnswering((res) => res.writeHead(200, { 'content-type': 'text/plain' }).end('Sign in'));
  const ok = await gatewayWith(json.url, false);
  const bad = await gatewayWith(text.url, false);
  try {
    for (const stream of [false, true]) {
      const r = await post(ok.base, '/v1/completions', { prompt: 'p', max_tokens: 1, stream });
      assert.equal(r.status, 200, r.text);
      // a streamed request gets the stream of the whole answer (whole-answer-stream.ts)
      assert.equal(
        r.text,
        stream
          ? 'data: {"object":"text_completion","choices":[{"text":"plain"}]}\n\ndata: [DONE]\n\n'
          : '{"choices":[{"text":"plain"}]}',
      );
      const refused = await post(bad.base, '/v1/completions', { prompt: 'p', max_tokens: 1, stream });
      assert.equal(refused.status, 502, refused.text);
    }
  } finally {
    await ok.close();
    await bad.close();
    await json.close();
    await text.close();
  }
});

test('an answer too large to hold passes through as it comes instead of being gathered in memory', async () => {
  const MiB = 1024 * 1024;
  for (const withLength of [true, false]) {
    let finish: (() => void) | undefined;
    const bad = await engineAnswering((res) => {
      res.writeHead(200, withLength ? { 'content-type': 'application/json', 'content-length': String(64 * MiB) } : {});
      // 20 MiB, then the engine waits: a gateway gathering the whole answer never answers the client
      for (let i = 0; i < 20; i++) res.write(Buffer.alloc(MiB, 0x20));
      finish = () => {
        for (let i = 20; i < 64; i++) res.write(Buffer.alloc(MiB, 0x20));
        res.end();
      };
    });
    const g = await gatewayWith(bad.url, false);
    const res = await fetch(`${g.base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'big', max_tokens: 2 }),
      signal: AbortSignal.timeout(10_000),
    });
    assert.equal(res.status, 200, 'the headers came while the engine was still sending');
    finish!();
    assert.equal((await res.arrayBuffer()).byteLength, 64 * MiB, `whole answer (content-length sent: ${withLength})`);
    assert.equal(g.router.getStats().inFlightRequests, 0);
    await g.close();
    await bad.close();
  }
});

test('an engine answering 429 (overloaded) has its requests retried on another worker', async () => {
  const busy = await engineAnswering((res) =>
    res
      .writeHead(429, { 'content-type': 'application/json', 'retry-after': '7' })
      .end('{"error":{"message":"too many requests"}}'),
  );
  const g = await gatewayWith(busy.url, true);
  for (let i = 0; i < 3; i++) {
    const r = await post(g.base, '/v1/completions', { prompt: `b${i}`, max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
  }
  assert.ok(busy.requests >= 1, 'the busy engine was tried');
  assert.equal(g.router.getStats().inFlightRequests, 0);
  await g.close();
  await busy.close();
});

test('an engine failing with an error body that never ends: the request is retried on another worker, not held', async () => {
  for (const status of [500, 429]) {
    let trickles: NodeJS.Timeout | undefined;
    const bad = await engineAnswering((res) => {
      // a proxy in front of the engine, say, that sends its error page a byte at a time
      res.writeHead(status, { 'content-type': 'text/plain' });
      trickles = setInterval(() => res.write('x'), 50);
      res.on('close', () => clearInterval(trickles));
    });
    // the inter-chunk timeout (the only bound on a non-streamed answer) far above the test's deadline
    const g = await gatewayWith(bad.url, true, { interChunkTimeoutMs: 600_000 });
    try {
      for (const stream of [false, true]) {
        const res = await fetch(`${g.base}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ prompt: `t${status}${stream}`, max_tokens: 1, stream }),
          signal: AbortSignal.timeout(30_000),
        });
        assert.equal(res.status, 200, `${status}, stream ${stream}`);
        assert.equal(res.headers.get('x-contextforge-worker'), 'good');
        await res.text();
      }
      assert.ok(bad.requests >= 1, 'the failing engine was tried');
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      clearInterval(trickles);
      await g.close();
      await bad.close();
    }
  }
});

test('an engine refusing a prompt as too long (400): what the router predicted for it is withdrawn, a served prompt keeps its blocks', async () => {
  const contextTokens = 100;
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    if (req.url !== '/v1/completions') return void req.resume().on('end', () => res.writeHead(404).end());
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      const { prompt } = JSON.parse(Buffer.concat(parts).toString()) as { prompt: number[] };
      // vLLM refuses a prompt past the model's context before it computes any of it
      const [status, body] =
        prompt.length > contextTokens
          ? [400, { error: { message: `This model's maximum context length is ${contextTokens} tokens`, code: 400 } }]
          : [200, { id: 'cmpl-1', choices: [{ index: 0, text: 'ok', finish_reason: 'length' }] }];
      res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    });
  });
  const g = await gatewayWith(engine.url, false); // approximate mode: the router's own predictions
  const bs = g.router.blockSize;
  const tokens = (family: number, blocks: number) => Array.from({ length: blocks * bs }, (_, i) => family * 1000 + i);
  const served = tokens(1, 4);
  const ok = await post(g.base, '/v1/completions', { prompt: served, max_tokens: 1 });
  assert.equal(ok.status, 200, ok.text);
  // the same four blocks and six more: past the engine's context
  const tooLong = [...served, ...tokens(2, 6)];
  const refused = await post(g.base, '/v1/completions', { prompt: tooLong, max_tokens: 1 });
  assert.equal(refused.status, 400);
  assert.match(refused.text, /maximum context length/);
  assert.deepEqual(tiers(g.router, 'bad', tooLong), [...Array(4).fill('predicted'), ...Array(6).fill(null)]);
  assert.deepEqual(tiers(g.router, 'bad', served), Array(4).fill('predicted'), "the served prompt's blocks stay");
  assert.equal(g.router.index.entryCount, 4);
  assert.equal(g.router.getStats().inFlightRequests, 0);
  await g.close();
  await engine.close();
});

/** Token prompts of whole blocks, distinct per family. */
const blocksOf = (router: KVAwareRouter, family: number, blocks: number) =>
  Array.from({ length: blocks * router.blockSize }, (_, i) => family * 1000 + i);

test('an engine failing a request (500) or never reached holds none of it: its predictions are withdrawn, the retry keeps its own', async () => {
  const failing = await engineAnswering((res) =>
    res
      .writeHead(500, { 'content-type': 'application/json' })
      .end(JSON.stringify({ error: { message: 'EngineCore encountered an issue', code: 500 } })),
  );
  // a port nothing listens on: the connection is refused before the engine sees the request
  const closed = await fakeEngine((_req, res) => res.end());
  await closed.close();
  for (const [label, url] of [
    ['500', failing.url],
    ['refused', closed.url],
  ] as const) {
    const g = await gatewayWith(url, true); // round robin: the bad worker first, approximate mode
    try {
      const prompt = blocksOf(g.router, 1, 4);
      const r = await post(g.base, '/v1/completions', { prompt, max_tokens: 1 });
      assert.equal(r.status, 200, `${label}: ${r.text}`);
      assert.equal(r.headers.get('x-contextforge-worker'), 'good', label);
      assert.deepEqual(
        tiers(g.router, 'bad', prompt),
        Array(4).fill(null),
        `${label}: nothing stays on the bad worker`,
      );
      assert.deepEqual(
        tiers(g.router, 'good', prompt),
        Array(4).fill('predicted'),
        `${label}: the retry's blocks stay`,
      );
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
    }
  }
  await failing.close();
});

/**
 * An engine whose answer is no answer for the client (`answer` writes it): with a good worker
 * beside it the request is retried there and nothing stays predicted on `bad`; alone, the
 * client gets 502, streamed or not, and nothing stays in flight.
 */
async function checkNotAnAnswer(answer: (res: ServerResponse) => void, nothingStays: string): Promise<void> {
  const failing = await engineAnswering(answer);
  try {
    const g = await gatewayWith(failing.url, true); // round robin: the failing worker first
    try {
      const prompt = blocksOf(g.router, 3, 4);
      const r = await post(g.base, '/v1/completions', { prompt, max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'good');
      assert.deepEqual(tiers(g.router, 'bad', prompt), Array(4).fill(null), nothingStays);
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
    }
    const alone = await gatewayWith(failing.url, false);
    try {
      for (const stream of [false, true]) {
        const r = await post(alone.base, '/v1/completions', { prompt: 'p', max_tokens: 1, stream });
        assert.equal(r.status, 502, r.text);
        assert.equal((JSON.parse(r.text) as { error: { type: string } }).error.type, 'server_error');
      }
      assert.equal(alone.router.getStats().inFlightRequests, 0);
    } finally {
      await alone.close();
    }
  } finally {
    await failing.close();
  }
}

test('an engine answering with a redirect: not passed to the client, retried elsewhere, its predictions withdrawn', () =>
  // a worker URL that is not the engine's own: http:// behind an ingress that redirects to https://
  // (alone, it is an engine failure the client is told of, not a redirect without its Location)
  checkNotAnAnswer(
    (res) => res.writeHead(308, { location: 'https://engine.example/v1/completions', 'content-length': '0' }).end(),
    'nothing stays on the redirecting worker',
  ));

test('an engine answering 204 No Content: not passed to the client, retried elsewhere, its predictions withdrawn', () =>
  // alone, it is an engine failure the client is told of, not an empty answer labelled JSON
  checkNotAnAnswer((res) => res.writeHead(204).end(), 'nothing stays on the worker that answered 204'));

test('an engine answering 205 Reset Content: not passed to the client as an answer labelled JSON, retried elsewhere', () =>
  // 205 forbids content as 204 does: no answer for a completion request either
  checkNotAnAnswer((res) => res.writeHead(205).end(), 'nothing stays on the worker that answered 205'));

test('an engine answering 304 Not Modified: not passed to the client, retried elsewhere, its predictions withdrawn', () =>
  checkNotAnAnswer((res) => res.writeHead(304).end(), 'nothing stays on the worker that answered 304'));

test('an engine answering 200 with its error object for a server error: not passed to the client, retried elsewhere, its predictions withdrawn', () =>
  // vLLM's ErrorResponse; the engine failed the request as when it answers 500
  checkNotAnAnswer((res) => {
    const body = JSON.stringify({
      error: { message: 'Internal server error', type: 'InternalServerError', param: null, code: 500 },
    });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body);
  }, 'nothing stays on the worker whose 200 was an error'));

test('an engine failing a stream with an error event before its first event: retried elsewhere, its predictions withdrawn', () =>
  // the engine failed the request as when it answers 500, only after its headers
  checkNotAnAnswer(
    (res) =>
      res
        .writeHead(200, { 'content-type': 'text/event-stream' })
        .end('event: error\ndata: {"error": {"message": "Internal server error", "code": 500}}\n\ndata: [DONE]\n\n'),
    'nothing stays on the worker that failed the stream',
  ));

test('a request the gateway stopped waiting for keeps its predictions: the engine may be computing it', async () => {
  // a streamed answer whose first byte never comes: the gateway gives up and tries the other worker
  const silent = await engineAnswering(() => {});
  const g = await gatewayWith(silent.url, true, { firstByteTimeoutMs: 300 });
  try {
    const prompt = blocksOf(g.router, 2, 3);
    const r = await post(g.base, '/v1/completions', { prompt, max_tokens: 1, stream: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
    assert.deepEqual(tiers(g.router, 'bad', prompt), Array(3).fill('predicted'));
  } finally {
    await g.close();
    await silent.close();
  }
});

test('an engine that fails its streams after the first event (reset, or stalled past the inter-chunk timeout) opens its circuit', async () => {
  let answered = 0;
  const bad = await engineAnswering((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: {"choices":[{"text":"a"}]}\n\n');
    // the first stream is reset after its first event, the second stalls after it
    if (answered++ === 0) setImmediate(() => res.socket?.resetAndDestroy());
  });
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers: [{ id: 'bad', url: bad.url }],
    ...quiet,
    breakerFailures: 2,
    breakerCooldownMs: 60_000,
    timeouts: { interChunkTimeoutMs: 300 },
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  for (let i = 0; i < 2; i++) {
    const r = await post(base, '/v1/completions', { prompt: `s${i}`, max_tokens: 4, stream: true });
    assert.equal(r.status, 200);
    assert.match(r.text, /"the engine failed mid-stream"/, 'the stream ends with the error event');
    assert.equal(router.getStats().inFlightRequests, 0);
  }
  assert.deepEqual(gateway.health.reasons('bad'), ['breaker'], 'two failed streams in a row open the circuit');
  // with its circuit open, the next request finds no worker instead of another stream that fails
  const r = await post(base, '/v1/completions', { prompt: 's2', max_tokens: 4, stream: true });
  assert.equal(r.status, 503);
  assert.equal(answered, 2, 'the engine got no third stream');
  await gateway.close();
  await bad.close();
});

test('a retry is counted only when another worker takes the request, not when none is left', async () => {
  const failing = [await failingEngine(), await failingEngine()];
  for (const n of [1, 2]) {
    const router = new KVAwareRouter({ policy: 'round-robin' });
    const workers = failing.slice(0, n).map((e, i) => ({ id: `f${i}`, url: e.url }));
    const gateway = await createGateway({ router, workers, ...quiet, breakerFailures: 10 });
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const r = await post(base, '/v1/completions', { prompt: `r${n}`, max_tokens: 2 });
    assert.equal(r.status, 502);
    const retries = (await gateway.metrics.getSingleMetric('contextforge_upstream_retries_total')!.get()).values;
    // each worker is tried once: the request moved to another worker n - 1 times
    assert.equal(
      retries.reduce((sum, v) => sum + v.value, 0),
      n - 1,
      `${n} failing worker(s): ${JSON.stringify(retries)}`,
    );
    await gateway.close();
  }
  for (const e of failing) await e.close();
});
