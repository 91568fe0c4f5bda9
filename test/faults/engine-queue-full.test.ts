/**
 * An engine that will not queue a request: SGLang's scheduler refuses one when its waiting queue
 * is full (`--max-queued-requests`), when a request of higher priority takes its place, or when it
 * waited past SGLANG_REQ_WAITING_TIMEOUT, and answers 503 without a Retry-After (an ErrorResponse
 * for a whole answer, an error event then `data: [DONE]` for a stream). That is the engine
 * overloaded for now, not failing: another worker takes the request, its circuit does not count it,
 * and when every engine says so the client is told to back off. A 503 that says anything else
 * still counts against the engine that answered it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { badFirstGateway, cannedEngine, fakeEngine, post, sample } from './harness.js';

/** SGLang's whole answer for a request its scheduler aborted with 503 (OpenAIServingBase.handle_request). */
const sglangAnswer = (message: string) =>
  JSON.stringify({ object: 'error', message, type: '503', param: null, code: 503 });
/** SGLang's stream for it (serving_chat.py, serving_completions.py): the error event, then the end. */
const sglangStream = (message: string) =>
  `data: ${JSON.stringify({ error: { message, type: 'SERVICE_UNAVAILABLE', code: 503 } })}\n\ndata: [DONE]\n\n`;

const QUEUE_FULL = 'The request queue is full.';
const REFUSALS = [
  QUEUE_FULL,
  'The request is aborted by a higher priority request.',
  'Request waiting timeout reached.',
];

/** An engine answering every completion as SGLang does when it will not queue it (`message`). */
const refusingEngine = (message: string) =>
  cannedEngine((stream) =>
    stream
      ? { status: 200, headers: { 'content-type': 'text/event-stream' }, body: sglangStream(message) }
      : { status: 503, headers: { 'content-type': 'application/json' }, body: sglangAnswer(message) },
  );

for (const stream of [false, true]) {
  test(`an SGLang engine that will not queue a request (${stream ? 'streamed' : 'whole answer'}): another worker takes it, and its circuit stays closed`, async () => {
    for (const message of REFUSALS) {
      const bad = await refusingEngine(message);
      // two failures in a row would open a circuit
      const g = await badFirstGateway(bad.url, true, { breakerFailures: 2 });
      try {
        for (let i = 0; i < 6; i++) {
          const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 2, stream });
          assert.equal(r.status, 200, `${message} ${i}: ${r.text}`);
          assert.equal(r.headers.get('x-contextforge-worker'), 'good');
          assert.doesNotMatch(r.text, /queue|priority|timeout/);
        }
        assert.deepEqual(g.gateway.health.reasons('bad'), [], `${message}: an engine refusing for load is not failing`);
        assert.ok(bad.completions() >= 3, `${message}: the busy engine was tried each time its turn came`);
        assert.equal(g.gateway.router.getStats().inFlightRequests, 0);
      } finally {
        await g.close();
        await bad.close();
      }
    }
  });

  test(`every engine refusing a request as its queue is full (${stream ? 'streamed' : 'whole answer'}): the client gets 429 with a Retry-After, not 502`, async () => {
    const bad = await refusingEngine(QUEUE_FULL);
    const g = await badFirstGateway(bad.url, false, { breakerFailures: 2 });
    try {
      for (let i = 0; i < 3; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `q${i}`, max_tokens: 2, stream });
        assert.equal(r.status, 429, r.text);
        assert.equal(r.headers.get('retry-after'), '1');
        assert.equal((JSON.parse(r.text) as { error: { code: string } }).error.code, 'rate_limit_exceeded');
      }
      assert.deepEqual(g.gateway.health.reasons('bad'), [], 'its circuit stays closed');
      assert.equal(
        await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="bad"}'),
        3,
        'each refusal is a failed attempt all the same',
      );
    } finally {
      await g.close();
      await bad.close();
    }
  });
}

test("a 503 that does not say the engine's queue is full still counts against the engine: its circuit opens where another answers", async () => {
  for (const body of [
    '',
    sglangAnswer('Internal server error'),
    sglangAnswer('The request queue is full. Also the engine died.'),
    JSON.stringify({ object: 'error', message: QUEUE_FULL, type: '500', param: null, code: 500 }),
  ]) {
    const bad = await fakeEngine((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(503, { 'content-type': 'application/json' }).end(body));
    });
    const g = await badFirstGateway(bad.url, true, { breakerFailures: 2 });
    try {
      for (let i = 0; i < 6 && g.gateway.health.reasons('bad').length === 0; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `d${i}`, max_tokens: 2 });
        assert.equal(r.status, 200, r.text);
      }
      assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], `a dead engine's 503 (${JSON.stringify(body)})`);
    } finally {
      await g.close();
      await bad.close();
    }
  }
});

/**
 * vLLM's admission control (`--max-num-queued-reqs`, `--max-num-queued-tokens`, v0.29.0) refuses a
 * request with HTTP 503 and its ErrorResponse, before any stream starts (the check runs before the
 * request is handed to the engine), so a streamed request gets the same status and body.
 */
const vllmAnswer = (message: string) =>
  JSON.stringify({ error: { message, type: 'Service Unavailable', param: null, code: 503 } });
const VLLM_REFUSALS = [
  'The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.',
  'The engine has reached its prefill token backlog limit. Please try again later or on a different instance.',
];
const vllmRefusingEngine = (message: string) =>
  cannedEngine(() => ({ status: 503, headers: { 'content-type': 'application/json' }, body: vllmAnswer(message) }));

for (const stream of [false, true]) {
  test(`a vLLM engine whose admission control refuses a request (${stream ? 'streamed' : 'whole answer'}): another worker takes it, and its circuit stays closed`, async () => {
    for (const message of VLLM_REFUSALS) {
      const bad = await vllmRefusingEngine(message);
      const g = await badFirstGateway(bad.url, true, { breakerFailures: 2 });
      try {
        for (let i = 0; i < 6; i++) {
          const r = await post(g.base, '/v1/completions', { prompt: `v${i}`, max_tokens: 2, stream });
          assert.equal(r.status, 200, `${message} ${i}: ${r.text}`);
          assert.equal(r.headers.get('x-contextforge-worker'), 'good');
        }
        assert.deepEqual(g.gateway.health.reasons('bad'), [], `${message}: an engine refusing for load is not failing`);
        assert.ok(bad.completions() >= 3, `${message}: the busy engine was tried each time its turn came`);
      } finally {
        await g.close();
        await bad.close();
      }
    }
  });

  test(`every vLLM engine refusing a request at admission (${stream ? 'streamed' : 'whole answer'}): the client gets 429 with a Retry-After, not 502`, async () => {
    const bad = await vllmRefusingEngine(VLLM_REFUSALS[0]);
    const g = await badFirstGateway(bad.url, false, { breakerFailures: 2 });
    try {
      for (let i = 0; i < 3; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `w${i}`, max_tokens: 2, stream });
        assert.equal(r.status, 429, r.text);
        assert.equal(r.headers.get('retry-after'), '1');
        assert.equal((JSON.parse(r.text) as { error: { code: string } }).error.code, 'rate_limit_exceeded');
      }
      assert.deepEqual(g.gateway.health.reasons('bad'), [], 'its circuit stays closed');
    } finally {
      await g.close();
      await bad.close();
    }
  });
}
