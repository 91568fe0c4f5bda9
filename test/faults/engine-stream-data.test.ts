/**
 * Engines whose stream carries an event, after its first, whose data is neither JSON nor
 * `[DONE]` (a proxy in front of the engine writing text into the stream, say). The OpenAI SDKs
 * parse every event's data as JSON and fail on it, so it is the engine's defect: the client still
 * gets the stream as the engine sent it (a client that skips such events keeps its answer), and
 * the gateway counts it as a stream the engine broke (its failure metric, the breaker), with the
 * router's accounting of the request settled as for any stream.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { badFirstGateway, fakeEngine, post, sample } from './harness.js';

const event = (text: string) =>
  `data: ${JSON.stringify({ id: 'cmpl-1', object: 'text_completion', created: 1, model: 'm', choices: [{ index: 0, text, logprobs: null, finish_reason: null }] })}\n\n`;

/** An engine answering its completions with the stream `writes` (one write each). */
const streamingEngine = (writes: string[]) =>
  fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const next = (i: number): void => {
        if (i === writes.length) return void res.end();
        res.write(writes[i], () => setImmediate(() => next(i + 1)));
      };
      next(0);
    });
  });

for (const [what, writes] of [
  ['in a write of its own', [event('a'), 'data: engine overloaded, retrying\n\n', event('b'), 'data: [DONE]\n\n']],
  ['in the write of the first event', [event('a') + 'data: <html>oops</html>\n\n', event('b'), 'data: [DONE]\n\n']],
  ['as JSON cut short', [event('a'), 'data: {"id":"cmpl-1","choices":[{"te\n\n', 'data: [DONE]\n\n']],
] as const) {
  test(`an event whose data is not JSON after the first, ${what}: passed on as sent, counted as the engine's malformed stream`, async () => {
    const bad = await streamingEngine([...writes]);
    const g = await badFirstGateway(bad.url, false, { breakerFailures: 2 });
    try {
      const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream: true });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.text, writes.join(''), 'the client gets the stream as the engine sent it');
      assert.equal(
        await sample(g.gateway.metrics, 'contextforge_stream_failures_total{worker="bad",reason="malformed"}'),
        1,
      );
      assert.equal(await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="bad"}'), 0);
      // its first event was the request's first token, and the request is released
      assert.equal(await sample(g.gateway.metrics, 'contextforge_time_to_first_byte_seconds_count'), 1);
      assert.equal(g.router.getStats().inFlightRequests, 0);
      assert.deepEqual(g.gateway.health.reasons('bad'), [], 'one failure: the circuit stays closed');
      const again = await post(g.base, '/v1/completions', { prompt: 'q', max_tokens: 2, stream: true });
      assert.equal(again.text, writes.join(''));
      assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], 'two in a row open its circuit');
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
      await bad.close();
    }
  });
}

test('events the SSE format reads as JSON are no malformed stream: data spread over lines, comments, fields, [DONE] padded', async () => {
  const writes = [
    event('a'),
    ': keep-alive\n\n',
    'data: {"id":"cmpl-1","choices":\ndata: [{"index":0,"text":"b"}]}\n\n',
    'event: message\r\nid: 7\r\ndata: {"id":"cmpl-1","choices":[]}\r\n\r\n',
    'data:{"id":"cmpl-1","choices":[]}\n\n',
    'data: [DONE]  \n\n',
  ];
  const bad = await streamingEngine(writes);
  const g = await badFirstGateway(bad.url, false, { breakerFailures: 1 });
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.text, writes.join(''));
    assert.equal(await sample(g.gateway.metrics, 'contextforge_stream_failures_total{worker="bad"}'), 0);
    assert.deepEqual(g.gateway.health.reasons('bad'), []);
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await bad.close();
  }
});

test('a malformed event in a stream that then ends without [DONE]: the client still gets the error event and [DONE]', async () => {
  const writes = [event('a'), 'data: not json\n\n', event('b')];
  const bad = await streamingEngine(writes);
  const g = await badFirstGateway(bad.url, false);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream: true });
    assert.equal(r.status, 200, r.text);
    assert.ok(r.text.startsWith(writes.join('')), r.text);
    assert.match(r.text, /"error":\{"message":"the engine failed mid-stream"/);
    assert.ok(r.text.endsWith('data: [DONE]\n\n'), r.text);
    assert.equal(
      await sample(g.gateway.metrics, 'contextforge_stream_failures_total{worker="bad",reason="malformed"}'),
      1,
    );
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await bad.close();
  }
});
