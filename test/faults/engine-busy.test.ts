/**
 * An engine that says it is busy (429: its queue full, a rate limit in front of it) is serving, at
 * its limit, not broken: the request is tried on another worker, and the busy engine's circuit
 * does not count it, whether the 429 comes as the status, as a 200's error object or as a
 * stream's first error event. When every engine tried says so, the client gets 429 with the
 * shortest Retry-After they asked for (at most a minute).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { badFirstGateway, cannedEngine, fakeEngine, post, sample } from './harness.js';

/** The three ways an engine says it is busy, for a request streamed or not. */
const BUSY: Record<string, (stream: boolean) => { status: number; type: string; body: string }> = {
  '429 status': () => ({
    status: 429,
    type: 'application/json',
    body: '{"error":{"message":"too many requests","type":"TooManyRequests","code":429}}',
  }),
  '200 with an error object': () => ({
    status: 200,
    type: 'application/json',
    body: '{"error":{"message":"The server is overloaded","type":"TooManyRequests","param":null,"code":429}}',
  }),
  'error event (whole answers: 429 status)': (stream) =>
    stream
      ? {
          status: 200,
          type: 'text/event-stream',
          body: 'data: {"error":{"message":"overloaded","type":"TooManyRequests","code":429}}\n\ndata: [DONE]\n\n',
        }
      : {
          status: 429,
          type: 'application/json',
          body: '{"error":{"message":"too many requests","type":"TooManyRequests","code":429}}',
        },
};

/** An engine answering every completion as busy, in the `shape` given, with a Retry-After of 7 s. */
const busyEngine = (shape: (stream: boolean) => { status: number; type: string; body: string }) =>
  cannedEngine((stream) => {
    const a = shape(stream);
    return { status: a.status, headers: { 'content-type': a.type, 'retry-after': '7' }, body: a.body };
  });

for (const [name, shape] of Object.entries(BUSY)) {
  test(`an engine that says it is busy (${name}): another worker takes the request, and the busy engine's circuit stays closed`, async () => {
    const busy = await busyEngine(shape);
    // two failures in a row would open a circuit
    const g = await badFirstGateway(busy.url, true, { breakerFailures: 2 });
    try {
      for (let i = 0; i < 8; i++) {
        const stream = i % 2 === 1;
        const r = await post(g.base, '/v1/completions', { prompt: `b${i}`, max_tokens: 2, stream });
        assert.equal(r.status, 200, `${i}: ${r.text}`);
        assert.equal(r.headers.get('x-contextforge-worker'), 'good');
      }
      assert.ok(busy.completions() >= 3, `the busy engine was tried each time its turn came (${busy.completions()})`);
      assert.deepEqual(g.gateway.health.reasons('bad'), [], 'an engine refusing for load is not failing');
      assert.equal(
        await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="bad"}'),
        busy.completions(),
        'each refusal is a failed attempt all the same',
      );
      assert.equal(g.gateway.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
      await busy.close();
    }
  });
}

test("an engine's 429 leaves the streak of its real failures as it was: neither counted nor cleared", async () => {
  // the engine resets the connection, then says it is busy, then resets again: two failures in a
  // row with a 429 between them open its circuit (the 429 is no answer that clears the streak)
  let n = 0;
  const flaky = await fakeEngine((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      if (n++ % 2 === 1)
        res
          .writeHead(429, { 'content-type': 'application/json', 'retry-after': '7' })
          .end('{"error":{"message":"too many requests"}}');
      else res.socket?.destroy();
    });
  });
  const g = await badFirstGateway(flaky.url, true, { breakerFailures: 2 });
  try {
    for (let i = 0; i < 8 && g.gateway.health.reasons('bad').length === 0; i++) {
      const r = await post(g.base, '/v1/completions', { prompt: `f${i}`, max_tokens: 2 });
      assert.equal(r.status, 200, r.text);
    }
    assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker']);
    assert.ok(n >= 3, `reset, 429, reset (${n})`);
  } finally {
    await g.close();
    await flaky.close();
  }
});
