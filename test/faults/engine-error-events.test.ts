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

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0 };

/** A chunk of a completion stream. */
const textEvent = (text: string) =>
  `data: ${JSON.stringify({ id: 'c1', object: 'text_completion', created: 1, model: 'm', choices: [{ index: 0, text, finish_reason: null }] })}\n\n`;

/** vLLM's error event (serving_chat / serving_completion: json.dumps of its ErrorResponse, default separators). */
const errorEvent = (code: number, type: string) =>
  `data: {"error": {"message": "Internal server error", "type": "${type}", "param": null, "code": ${code}}}\n\n`;

/** An engine answering its completions with the event stream `events` (other paths: 404). */
const streamingEngine = (events: string) =>
  fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => res.writeHead(200, { 'content-type': 'text/event-stream' }).end(events));
  });

test('a stream whose first event is an engine error (code 500) is retried on another worker, never passed on', async () => {
  const bad = await streamingEngine(errorEvent(500, 'InternalServerError') + 'data: [DONE]\n\n');
  const good = await new MockEngine().start();
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [
      { id: 'bad', url: bad.url },
      { id: 'good', url: `http://127.0.0.1:${good.port}` },
    ],
    ...quiet,
  });
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
      /contextforge_upstream_failures_total\{worker="bad"\} [1-9]/,
      'its failures are counted',
    );
    assert.equal(gateway.router.getStats().inFlightRequests, 0);
  } finally {
    await gateway.close();
    await good.close();
    await bad.close();
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
    const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' }).write(textEvent('a'));
        streams.push(res);
      });
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
