/**
 * Engines that report a failure inside a 200 event stream, as vLLM and SGLang do once the
 * stream has begun: a data event `{"error": {"message", "type", "param", "code"}}`, then
 * `data: [DONE]`. A server error there (code 500: the engine failed the request) is the
 * engine's failure like any other: before anything reached the client, another worker takes
 * the request; after, the client gets the stream as the engine sent it and the worker's circuit
 * counts it (as a stream the engine broke off). A client's error (code 400) is not the engine's failure.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { fakeEngine, post } from './harness.js';
import { tiers } from '../helpers/prompts.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0 };

/** A chunk of a completion stream. */
const textEvent = (text: string) =>
  `data: ${JSON.stringify({ id: 'c1', object: 'text_completion', created: 1, model: 'm', choices: [{ index: 0, text, finish_reason: null }] })}\n\n`;

/** vLLM's error event (serving_chat / serving_completion: json.dumps of its ErrorResponse, default separators). */
const errorEvent = (code: number, type: string) =>
  `data: {"error": {"message": "Internal server error", "type": "${type}", "param": null, "code": ${code}}}\n\n`;

/** An engine answering each of its completions, once read, with `answer` (other paths: 404). */
const engineAnswering = (answer: (res: ServerResponse) => void) =>
  fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => answer(res));
  });

/** An engine answering its completions with the event stream `events` (other paths: 404). */
const streamingEngine = (events: string) =>
  engineAnswering((res) => res.writeHead(200, { 'content-type': 'text/event-stream' }).end(events));

/**
 * A round-robin gateway in front of `bad`, an engine answering its completions with the event
 * stream `events`, first, and a mock engine (`good`) second; `close` closes all three.
 */
async function badThenGood(events: string) {
  const bad = await streamingEngine(events);
  const good = await new MockEngine().start();
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [
      { id: 'bad', url: bad.url },
      { id: 'good', url: `http://127.0.0.1:${good.port}` },
    ],
    ...quiet,
  });
  return {
    bad,
    gateway,
    close: async () => {
      await gateway.close();
      await good.close();
      await bad.close();
    },
  };
}

test('a stream whose first event is an engine error (code 500) is retried on another worker, never passed on', async () => {
  const { bad, gateway, close } = await badThenGood(errorEvent(500, 'InternalServerError') + 'data: [DONE]\n\n');
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    for (let i = 0; i < 4; i++) {
      const r = await post(base, '/v1/completions', { prompt: `p${i}`, max_tokens: 2, stream: true });
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('x-contextforge-worker'), 'good', `request ${i}`);
      assert.doesNotMatch(r.text, /"error"/, `request ${i}: no error event`);
      assert.match(r.text, /data: \[DONE\]/);
    }
    assert.ok(bad.requests >= 1, 'the failing engine was tried');
    assert.match(
      await gateway.metrics.metrics(),
      /contextforge_upstream_failures_total\{worker="bad",reason="status"\} [1-9]/,
      'its failures are counted',
    );
    assert.equal(gateway.router.getStats().inFlightRequests, 0);
  } finally {
    await close();
  }
});

test('an engine error event (code 500) after the first event reaches the client as sent and opens the circuit; a code 400 does not', async () => {
  for (const [code, type, opens] of [
    [500, 'InternalServerError', true],
    [400, 'BadRequestError', false],
  ] as const) {
    const rest = errorEvent(code, type) + 'data: [DONE]\n\n';
    // the first event goes out at once; the error event once the client has read it
    const streams: ServerResponse[] = [];
    const engine = await engineAnswering((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' }).write(textEvent('a'));
      streams.push(res);
    });
    const gateway = await createGateway({
      router: new KVAwareRouter({ policy: 'round-robin' }),
      workers: [{ id: 'e', url: engine.url }],
      ...quiet,
      breakerFailures: 2,
      breakerCooldownMs: 60_000,
    });
    try {
      const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
      for (let i = 0; i < 2; i++) {
        const res = await fetch(`${base}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ prompt: `q${i}`, max_tokens: 2, stream: true }),
        });
        assert.equal(res.status, 200);
        const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
        let text = '';
        while (!text.endsWith('\n\n')) {
          const { value, done } = await reader.read();
          assert.ok(!done, 'the first event arrives');
          text += value;
        }
        assert.equal(text, textEvent('a'));
        streams[i].end(rest);
        for (let r = await reader.read(); !r.done; r = await reader.read()) text += r.value;
        assert.equal(text, textEvent('a') + rest, `code ${code}: the client gets the stream as the engine sent it`);
      }
      assert.deepEqual(
        gateway.health.reasons('e'),
        opens ? ['breaker'] : [],
        `code ${code}: two such streams in a row ${opens ? 'open' : 'leave closed'} the circuit`,
      );
      assert.equal(gateway.router.getStats().inFlightRequests, 0);
    } finally {
      await gateway.close();
      await engine.close();
    }
  }
});

/**
 * Error events as the SSE format allows an engine (or a proxy in front of one) to write them:
 * an event's data lines join with "\n", its type is its `event:` field, its lines end in LF,
 * CRLF or CR, and a JSON value may have spaces anywhere between its tokens.
 */
const spreadErrorEvents: ReadonlyArray<readonly [string, string]> = [
  [
    'one JSON over two data lines',
    'data: {"error":\ndata: {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}\n\n',
  ],
  ['one JSON over three data lines', 'data: {\ndata: "error": {"message": "overloaded", "code": 503}\ndata: }\n\n'],
  ['CRLF line ends', 'data: {"error":\r\ndata: {"message": "Internal server error", "code": 500}}\r\n\r\n'],
  ['an error event type before its data', 'event: error\ndata: {"message": "Internal server error", "code": 500}\n\n'],
  ['an error event type after its data', 'data: {"message": "engine died"}\nevent: error\n\n'],
  ['spaces inside the JSON', 'data:{ "error" : { "code" : 500 } }\n\n'],
  ['a UTF-8 byte order mark before it, at the start of the stream', '\uFEFFdata: {"error": {"code": 500}}\n\n'],
  [
    'no code, the type of a server error (as this gateway and OpenAI write it)',
    'data: {"error": {"message": "the engine failed mid-stream", "type": "server_error", "param": null, "code": null}}\n\n',
  ],
];

test('an engine error event spread over several lines, or typed `event: error`, is recognised: the stream is retried on another worker', async () => {
  for (const [what, event] of spreadErrorEvents) {
    const { bad, gateway, close } = await badThenGood(event + 'data: [DONE]\n\n');
    try {
      const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
      for (let i = 0; i < 2; i++) {
        const r = await post(base, '/v1/completions', { prompt: `p${i}`, max_tokens: 2, stream: true });
        assert.equal(r.status, 200);
        assert.equal(r.headers.get('x-contextforge-worker'), 'good', `${what}, request ${i}`);
        assert.doesNotMatch(r.text, /error/, `${what}, request ${i}: no error event`);
      }
      assert.ok(bad.requests >= 1, `${what}: the failing engine was tried`);
      assert.match(
        await gateway.metrics.metrics(),
        /contextforge_upstream_failures_total\{worker="bad",reason="status"\} [1-9]/,
        `${what}: its failures are counted`,
      );
    } finally {
      await close();
    }
  }
});

test("a spread error event for a client's error, and events that only mention errors, pass on as the engine sent them", async () => {
  // [what, the engine's events, whether the client's first event is an answer (a first byte) or an error]
  for (const [what, events, answered] of [
    [
      'a client error over two data lines',
      'data: {"error":\ndata: {"message": "bad logit_bias", "type": "BadRequestError", "param": null, "code": 400}}\n\n',
      false,
    ],
    [
      'a client error typed `event: error`',
      'event: error\ndata: {"message": "bad logit_bias", "code": 400}\n\n',
      false,
    ],
    ['text that says error', textEvent('"error": {"code": 500}') + textEvent('error'), true],
    ['an event named otherwise', 'event: error_report\ndata: {"code": 500}\n\n', true],
    ['a comment', ': error\n\n' + textEvent('a'), true],
  ] as const) {
    const all = events + 'data: [DONE]\n\n';
    let completions = 0;
    const engine = await engineAnswering((res) => {
      completions++;
      res.writeHead(200, { 'content-type': 'text/event-stream' }).end(all);
    });
    const gateway = await createGateway({
      router: new KVAwareRouter({ policy: 'round-robin' }),
      workers: [{ id: 'e', url: engine.url }],
      ...quiet,
    });
    try {
      const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
      const r = await post(base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream: true });
      assert.equal(r.status, 200);
      assert.equal(r.text, all, `${what}: the client gets the stream as the engine sent it`);
      assert.equal(completions, 1, `${what}: not retried`);
      const metrics = await gateway.metrics.metrics();
      assert.doesNotMatch(metrics, /contextforge_upstream_failures_total\{worker="e",[^}]*\} [1-9]/);
      assert.match(
        metrics,
        new RegExp(`contextforge_time_to_first_byte_seconds_count ${answered ? 1 : 0}\n`),
        `${what}: ${answered ? 'a first byte' : 'an error is no first byte'}`,
      );
    } finally {
      await gateway.close();
      await engine.close();
    }
  }
});

test("a client's error after the first events of a stream withdraws nothing: the engine computed the prefill", async () => {
  const clientError = JSON.stringify({
    error: { message: 'bad logit_bias', type: 'BadRequestError', param: null, code: 400 },
  });
  // one write: an event of the answer, then the error, then the end
  const engine = await engineAnswering((res: ServerResponse) =>
    res
      .writeHead(200, { 'content-type': 'text/event-stream' })
      .end(`data: {"choices":[{"text":"a"}]}\n\ndata: ${clientError}\n\ndata: [DONE]\n\n`),
  );
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({ router, workers: [{ id: 'e', url: engine.url }], ...quiet });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const prompt = Array.from({ length: 4 * router.blockSize }, (_, i) => 3000 + i);
    const r = await post(base, '/v1/completions', { prompt, max_tokens: 2, stream: true });
    assert.equal(r.status, 200);
    assert.match(r.text, /"text":"a"/);
    assert.deepEqual(tiers(router, 'e', prompt), Array(4).fill('predicted'), 'the prediction stays');
    assert.equal(router.getStats().inFlightRequests, 0);
  } finally {
    await gateway.close();
    await engine.close();
  }
});

test("a stream whose first event is a client's error withdraws what the router predicted for it, as that status does", async () => {
  const clientError = JSON.stringify({
    error: { message: 'bad logit_bias', type: 'BadRequestError', param: null, code: 400 },
  });
  // [what, the status the client gets, how the engine answers]: the error event in a 2xx stream,
  // and the same error as a 200 JSON answer and as a real 400
  for (const [what, status, answer] of [
    [
      'an error event first in a 200 stream',
      200,
      (res: ServerResponse) =>
        res.writeHead(200, { 'content-type': 'text/event-stream' }).end(`data: ${clientError}\n\ndata: [DONE]\n\n`),
    ],
    [
      'a 200 JSON error object',
      400,
      (res: ServerResponse) =>
        res
          .writeHead(200, { 'content-type': 'application/json', 'content-length': clientError.length })
          .end(clientError),
    ],
    [
      'a 400',
      400,
      (res: ServerResponse) => res.writeHead(400, { 'content-type': 'application/json' }).end(clientError),
    ],
  ] as const) {
    const engine = await engineAnswering(answer);
    const router = new KVAwareRouter({ policy: 'round-robin' });
    const gateway = await createGateway({ router, workers: [{ id: 'e', url: engine.url }], ...quiet });
    try {
      const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
      const prompt = Array.from({ length: 4 * router.blockSize }, (_, i) => 1000 + i);
      const r = await post(base, '/v1/completions', { prompt, max_tokens: 2, stream: true });
      assert.equal(r.status, status, `${what}: ${r.text}`);
      assert.match(r.text, /bad logit_bias/, `${what}: the client gets the engine's error`);
      assert.deepEqual(
        tiers(router, 'e', prompt),
        Array(4).fill(null),
        `${what}: nothing stays predicted on the engine`,
      );
      assert.equal(router.getStats().inFlightRequests, 0);
    } finally {
      await gateway.close();
      await engine.close();
    }
  }
});

test('streams whose first event is an engine overloaded (code 429) on every worker: the client gets 429 with Retry-After, as for a 429 answer', async () => {
  const engines = [
    await streamingEngine(errorEvent(429, 'TooManyRequests') + 'data: [DONE]\n\n'),
    await streamingEngine(errorEvent(429, 'TooManyRequests') + 'data: [DONE]\n\n'),
  ];
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: engines.map((e, i) => ({ id: `e${i}`, url: e.url })),
    ...quiet,
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const r = await post(base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream: true });
    assert.equal(r.status, 429, r.text);
    assert.ok(Number(r.headers.get('retry-after')) >= 1, 'a Retry-After');
    assert.ok(
      engines.every((e) => e.requests >= 1),
      'every engine was tried',
    );
    assert.equal(gateway.router.getStats().inFlightRequests, 0);
  } finally {
    await gateway.close();
    for (const e of engines) await e.close();
  }
});
