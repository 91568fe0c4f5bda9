/**
 * An engine that fails after its answer started reaching the client (its connection broken, its
 * next event overdue, its stream ended without `data: [DONE]`, an error event of its own for a
 * server error) cannot be retried: the client gets the events that came, then an error event. It
 * still shows: contextforge_stream_failures_total{worker,reason} counts it, under the reasons of
 * contextforge_upstream_failures_total (which counts only failures before the first byte), and it
 * counts as one of the worker's consecutive failures for its circuit.
 */
import assert from 'node:assert/strict';
import { request, type IncomingMessage, type ServerResponse } from 'node:http';
import { test } from 'node:test';
import type { FailureReason } from '../../src/server/metrics.js';
import { badFirstGateway, fakeEngine, post, sample } from '../faults/harness.js';
import { until } from '../helpers/wait.js';

const FIRST = 'data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":"tok"}]}\n\n';
const SSE = { 'content-type': 'text/event-stream' };

/**
 * How an engine breaks off its stream once its first event has reached the client, and the
 * reason it counts under.
 */
const breaks: Array<[FailureReason, string, (res: ServerResponse) => void]> = [
  ['reset', 'its connection breaks', (res) => res.socket?.destroy()],
  ['timeout', 'its next event never comes', () => {}],
  ['malformed', 'it ends the stream without data: [DONE]', (res) => res.end()],
  [
    'status',
    'it sends an error event of its own for a server error',
    (res) =>
      res.end(
        'data: {"error":{"message":"engine core died","type":"server_error","param":null,"code":500}}\n\ndata: [DONE]\n\n',
      ),
  ],
];

/**
 * Streams one completion from `base`; `firstEvent` is called once the client has read the
 * stream's first event. Resolves to the status and the whole text the client got.
 */
async function streamed(base: string, firstEvent: () => void): Promise<{ status: number; text: string }> {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'p', max_tokens: 3, stream: true }),
    // a gateway that never ends the stream fails the test instead of hanging it
    signal: AbortSignal.timeout(10_000),
  });
  const decoder = new TextDecoder();
  let text = '';
  let told = false;
  for await (const chunk of res.body!) {
    text += decoder.decode(chunk, { stream: true });
    if (!told && text.includes('\n\n')) {
      told = true;
      firstEvent();
    }
  }
  return { status: res.status, text };
}

for (const [reason, how, fail] of breaks) {
  test(`a stream whose engine fails after its first event (${how}) counts in contextforge_stream_failures_total{reason="${reason}"} and opens the circuit`, async (t) => {
    let engineRes: ServerResponse | undefined;
    const bad = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        if (req.url !== '/v1/completions') return void res.writeHead(404).end();
        engineRes = res;
        res.writeHead(200, SSE);
        res.write(FIRST);
      });
    });
    const g = await badFirstGateway(bad.url, false, {
      breakerFailures: 1,
      timeouts: { firstByteTimeoutMs: 5000, interChunkTimeoutMs: 300 },
    });
    t.after(async () => {
      await g.close();
      await bad.close();
    });
    // the engine fails only once the client has the first event: the answer is committed
    const r = await streamed(g.base, () => fail(engineRes!));
    assert.equal(r.status, 200);
    assert.ok(r.text.startsWith(FIRST), r.text);
    assert.match(r.text, /"error"/, 'the client was told');
    assert.ok(r.text.endsWith('data: [DONE]\n\n'), r.text);

    const metrics = g.gateway.metrics;
    assert.equal(await sample(metrics, `contextforge_stream_failures_total{worker="bad",reason="${reason}"}`), 1);
    assert.equal(await sample(metrics, 'contextforge_stream_failures_total'), 1, 'counted once, under one reason');
    assert.equal(
      await sample(metrics, 'contextforge_upstream_failures_total'),
      0,
      'not a failure before the first byte',
    );
    assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], 'the failure counts for the breaker');
    assert.equal(g.router.getStats().inFlightRequests, 0);

    // a removed worker's series leave with it
    assert.ok(g.gateway.removeWorker('bad'));
    assert.doesNotMatch(await metrics.metrics(), /contextforge_stream_failures_total\{worker="bad"/);
  });
}

test('a whole stream, and a client that leaves in the middle of one, count no stream failure', async (t) => {
  // the first request gets a whole stream; the second its first event, then nothing
  let answered = 0;
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      res.writeHead(200, SSE);
      if (answered++ === 0) res.end(`${FIRST}data: [DONE]\n\n`);
      else res.write(FIRST);
    });
  });
  const g = await badFirstGateway(engine.url, false, {
    breakerFailures: 1,
    timeouts: { firstByteTimeoutMs: 2000, interChunkTimeoutMs: 60_000 },
  });
  t.after(async () => {
    await g.close();
    await engine.close();
  });
  const whole = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 3, stream: true });
  assert.equal(whole.text, `${FIRST}data: [DONE]\n\n`);

  // the client leaves (closes its connection) once it has the first event
  await new Promise<void>((resolve, reject) => {
    const client = request(`${g.base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
    });
    client.on('response', (res) => res.once('data', () => client.destroy()));
    client.on('close', resolve);
    client.on('error', (err) => (client.destroyed ? resolve() : reject(err)));
    client.end(JSON.stringify({ prompt: 'q', max_tokens: 3, stream: true }));
  });

  await until(() => g.router.getStats().inFlightRequests === 0, 'the abandoned request to be released');
  const metrics = g.gateway.metrics;
  assert.equal(await sample(metrics, 'contextforge_stream_failures_total'), 0);
  assert.deepEqual(g.gateway.health.reasons('bad'), [], 'no breaker count');
});
