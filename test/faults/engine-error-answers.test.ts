/**
 * Engine answers that say 200 but are not answers. An engine's error object in a 200 JSON body
 * (vLLM's `{"error": {"message", "type", "param", "code"}}`, or the `{"object": "error", "message",
 * "type", "param", "code"}` of SGLang and of vLLM before 0.10; vLLM answers 200 with one when
 * its route hands back its ErrorResponse instead of a JSONResponse, as for "The model does not
 * support Completions API") is handled as the status its code names: a server error is the
 * engine's failure (retried elsewhere, counted by the failure metric, and by the breaker once
 * another engine answers the request; never a first byte), a client error reaches the client with that status. And an attempt that fails
 * after its first byte but before anything reached the client does not feed the
 * time-to-first-byte histogram: only the answer the client gets does.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { badFirstGateway, fakeEngine, post, sample } from './harness.js';

/** vLLM's ErrorResponse (0.10 and later), as json.dumps / JSONResponse write it. */
const vllmError = (code: number, message = 'Internal server error', type = 'InternalServerError') =>
  JSON.stringify({ error: { message, type, param: null, code } });
/** SGLang's ErrorResponse (and vLLM's before 0.10). */
const sglangError = (code: number, message = 'Internal server error', type = 'InternalServerError') =>
  JSON.stringify({ object: 'error', message, type, param: null, code });

/** An engine answering its completions with `answer` (other paths: 404); `completions` counts them. */
async function engineAnswering(answer: (res: ServerResponse) => void) {
  let completions = 0;
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    completions++;
    req.on('end', () => answer(res));
  });
  return Object.assign(engine, { completions: () => completions });
}

/** An engine answering 200 with the JSON `body`. */
const answering200 = (body: string) =>
  engineAnswering((res) =>
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body),
  );

/**
 * A gateway in front of `bad` alone, or `bad` first and a good mock engine second (round robin);
 * `breakerFailures` failures in a row open a worker's circuit.
 */
const gatewayWith = (badUrl: string, withGood: boolean, breakerFailures = 100) =>
  badFirstGateway(badUrl, withGood, { breakerFailures });

for (const [shape, body] of [
  ['vLLM', vllmError(500)],
  ['SGLang', sglangError(500)],
] as const) {
  test(`a 200 whose body is ${shape}'s error object for a server error is the engine's failure: retried elsewhere, never passed on`, async () => {
    const bad = await answering200(body);
    const g = await gatewayWith(bad.url, true);
    try {
      for (let i = 0; i < 4; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 2 });
        assert.equal(r.status, 200, `request ${i}: ${r.text}`);
        assert.equal(r.headers.get('x-contextforge-worker'), 'good', `request ${i}`);
        assert.doesNotMatch(r.text, /"error"/);
      }
      assert.ok(bad.completions() >= 1, 'the failing engine was tried');
      assert.equal(
        await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="bad"}'),
        bad.completions(),
        'each of its error answers is counted as its failure',
      );
      assert.equal(
        await sample(g.gateway.metrics, 'contextforge_time_to_first_byte_seconds_count'),
        4,
        'only the answers the clients got are first bytes',
      );
      assert.equal(g.gateway.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
      await bad.close();
    }
  });
}

test('an engine that answers every request 200 with a server error object gets 502 to the client when alone, and its circuit opens where another engine answers', async () => {
  const bad = await answering200(vllmError(500));
  const alone = await gatewayWith(bad.url, false, 2);
  try {
    for (let i = 0; i < 2; i++) {
      const r = await post(alone.base, '/v1/completions', { prompt: `q${i}`, max_tokens: 2 });
      assert.equal(r.status, 502, r.text);
      assert.equal((JSON.parse(r.text) as { error: { type: string } }).error.type, 'server_error');
    }
    // no other engine answered these requests: they, not the engine, may be what fails
    assert.deepEqual(alone.gateway.health.reasons('bad'), [], 'its circuit stays closed');
    assert.equal(await sample(alone.gateway.metrics, 'contextforge_time_to_first_byte_seconds_count'), 0);
  } finally {
    await alone.close();
  }
  const g = await gatewayWith(bad.url, true, 2);
  try {
    for (let i = 0; i < 4 && g.gateway.health.reasons('bad').length === 0; i++) {
      const r = await post(g.base, '/v1/completions', { prompt: `r${i}`, max_tokens: 2 });
      assert.equal(r.status, 200, r.text);
    }
    assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], 'two failures in a row open its circuit');
  } finally {
    await g.close();
    await bad.close();
  }
});

test("a 200 whose body is an error object for a client error reaches the client with that status, as the engine's answer", async () => {
  for (const body of [
    vllmError(400, 'The model does not support Completions API', 'BadRequestError'),
    sglangError(400, 'The model does not support Completions API', 'BadRequestError'),
  ]) {
    const bad = await answering200(body);
    const g = await gatewayWith(bad.url, false, 2);
    try {
      for (let i = 0; i < 2; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `q${i}`, max_tokens: 2 });
        assert.equal(r.status, 400, `an honest status, not 200: ${r.text}`);
        assert.equal(r.text, body, "the engine's error as it sent it");
        assert.equal(r.headers.get('x-contextforge-worker'), 'bad');
      }
      assert.equal(bad.completions(), 2, 'not retried: the client asked for what the engine refuses');
      assert.deepEqual(g.gateway.health.reasons('bad'), [], "the client's error is not the engine's failure");
      assert.equal(await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="bad"}'), 0);
      assert.equal(
        await sample(g.gateway.metrics, 'contextforge_time_to_first_byte_seconds_count'),
        0,
        'an error is no first byte',
      );
    } finally {
      await g.close();
      await bad.close();
    }
  }
});

test('a 200 whose error object says the engine is overloaded (429) is tried elsewhere, and the client is told to back off when every engine says so', async () => {
  const bad = await answering200(vllmError(429, 'The server is overloaded', 'TooManyRequests'));
  const g = await gatewayWith(bad.url, false);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'q', max_tokens: 2 });
    assert.equal(r.status, 429, r.text);
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal((JSON.parse(r.text) as { error: { code: string } }).error.code, 'rate_limit_exceeded');
  } finally {
    await g.close();
    await bad.close();
  }
});

test('an answer that merely mentions errors is an answer', async () => {
  const body = JSON.stringify({
    id: 'c1',
    object: 'text_completion',
    choices: [{ index: 0, text: 'the word "error"', finish_reason: 'stop', error: null }],
    error: null,
  });
  const bad = await answering200(body);
  const g = await gatewayWith(bad.url, false);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'q', max_tokens: 2 });
    assert.equal(r.status, 200);
    assert.equal(r.text, body);
  } finally {
    await g.close();
    await bad.close();
  }
});

test("a failed attempt's first byte is not the request's time to first byte", async () => {
  for (const [what, streaming, answer] of [
    [
      'a stream cut in its first event',
      true,
      (res: ServerResponse) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {"choices":[{"te', () => res.socket?.destroy());
      },
    ],
    [
      "a stream whose first event is the engine's error",
      true,
      (res: ServerResponse) =>
        res.writeHead(200, { 'content-type': 'text/event-stream' }).end(`data: ${vllmError(500)}\n\ndata: [DONE]\n\n`),
    ],
    [
      'JSON that is not whole',
      false,
      (res: ServerResponse) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[{"te'),
    ],
  ] as const) {
    const bad = await engineAnswering(answer);
    const g = await gatewayWith(bad.url, true);
    try {
      for (let i = 0; i < 4; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 2, stream: streaming });
        assert.equal(r.status, 200, `${what}, request ${i}: ${r.text}`);
        assert.equal(r.headers.get('x-contextforge-worker'), 'good', `${what}, request ${i}`);
      }
      assert.ok(bad.completions() >= 1, `${what}: the failing engine was tried`);
      assert.equal(
        await sample(g.gateway.metrics, 'contextforge_time_to_first_byte_seconds_count'),
        4,
        `${what}: one first byte per request, the answer's`,
      );
    } finally {
      await g.close();
      await bad.close();
    }
  }
});

test("an engine's 408 or 421 is its failure, not the client's: the request is taken by another worker", async () => {
  // 408: the engine gave up waiting for the request the gateway sent it; 421: the engine does
  // not serve the authority it was reached at (a worker URL pointing at the wrong server)
  for (const status of [408, 421]) {
    const bad = await engineAnswering((res) =>
      res.writeHead(status, { 'content-type': 'application/json' }).end(vllmError(status, 'refused', 'Refused')),
    );
    const g = await gatewayWith(bad.url, true);
    try {
      const r = await post(g.base, '/v1/completions', { prompt: `s${status}`, max_tokens: 2 });
      assert.equal(r.status, 200, `${status}: ${r.text}`);
      assert.equal(r.headers.get('x-contextforge-worker'), 'good', String(status));
      assert.equal(bad.completions(), 1, `${status}: the first attempt went to the engine that refused`);
      assert.equal(await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="bad"}'), 1);
    } finally {
      await g.close();
      await bad.close();
    }
  }
});
