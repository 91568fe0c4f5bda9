/**
 * How an engine's stream ends. vLLM and SGLang end every stream of the completion APIs with the
 * event `data: [DONE]`, after an error event of their own too (vLLM's serving_completion.py and
 * serving_chat.py, SGLang's serving_completions.py and serving_chat.py: their generators yield it
 * last, whatever happened before). A stream that ends cleanly without it was cut short on its way:
 * the client must not take it for a whole answer, and the engine is not counted as answering.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { badFirstGateway, fakeEngine, post, type BadFirstGateway, type FakeEngine } from './harness.js';

const first = 'data: {"choices":[{"text":"a"}]}\n\n';

/** An engine answering its completions with an event stream of `body`, ended cleanly. */
const streamingEngine = (body: string) =>
  fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'text/event-stream' }).end(body));
  });

/**
 * Streams one completion through a gateway in front of `bad` first and, with `withGood`, a good
 * engine (one failure opens a worker's circuit), and hands `check` the answer and the gateway;
 * closes the gateway and `bad` after.
 */
async function streamedThrough(
  bad: FakeEngine,
  withGood: boolean,
  check: (r: Awaited<ReturnType<typeof post>>, g: BadFirstGateway) => void,
): Promise<void> {
  const g = await badFirstGateway(bad.url, withGood, { breakerFailures: 1 });
  try {
    check(await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream: true }), g);
  } finally {
    await g.close();
    await bad.close();
  }
}

test('a stream that ends cleanly without data: [DONE] after its first event ends with an error event and counts as a failure', async () => {
  await streamedThrough(await streamingEngine(first), false, (r, g) => {
    assert.equal(r.status, 200);
    const events = r.text.split('\n\n').filter(Boolean);
    assert.equal(events.length, 3, JSON.stringify(r.text));
    assert.equal(`${events[0]}\n\n`, first);
    assert.match(events[1], /^data: \{"error":.*"the engine failed mid-stream"/);
    assert.equal(
      events[2],
      'data: [DONE]',
      'the stream ends with data: [DONE], as an engine ends one after its error event',
    );
    assert.equal(g.router.getStats().inFlightRequests, 0);
    assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], 'the cut stream counts as the engine failing');
  });
});

test('a stream that ends cleanly before its first whole event is retried on another worker', async () => {
  for (const body of ['', 'data: {"choices":[{"te']) {
    await streamedThrough(await streamingEngine(body), true, (r, g) => {
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'good', `engine's stream ${JSON.stringify(body)}`);
      assert.match(r.text, /data: \[DONE\]/);
      assert.doesNotMatch(r.text, /"error"/);
      assert.equal(g.router.getStats().inFlightRequests, 0);
    });
  }
});

test('a stream ending with data: [DONE], whatever its line ends, is a whole answer', async () => {
  for (const end of [
    'data: [DONE]\n\n',
    'data:[DONE]\n\n',
    'data: [DONE]\r\n\r\n',
    'data: [DONE]\r\r',
    'data: [DONE]',
  ]) {
    await streamedThrough(await streamingEngine(first + end), false, (r, g) => {
      assert.equal(r.status, 200);
      assert.equal(r.text, first + end, 'the stream as the engine sent it');
      assert.deepEqual(g.gateway.health.reasons('bad'), [], `${JSON.stringify(end)}: an answer, not a failure`);
    });
  }
});

test('a stream whose connection fails after its data: [DONE] reached the client ends as the whole answer it is', async () => {
  // the engine (or a proxy in front of it) declares more than it sends, then closes: the
  // connection fails, but only after the last event of the stream (or a keep-alive comment
  // written with it, which goes no further)
  for (const whole of [`${first}data: [DONE]\n\n`, `${first}data: [DONE]\n\n: ping\n\n`]) {
    const bad = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'content-length': whole.length + 10 });
        res.write(whole, () => res.socket?.destroy());
      });
    });
    await streamedThrough(bad, false, (r, g) => {
      assert.equal(r.status, 200);
      assert.equal(r.text, `${first}data: [DONE]\n\n`, 'nothing after the last event');
      assert.equal(g.router.getStats().inFlightRequests, 0);
      assert.deepEqual(g.gateway.health.reasons('bad'), [], 'the engine answered in full');
    });
  }
});

test('a data: [DONE] followed by more in the same write of the engine ends the stream as a whole answer', async () => {
  // keep-alive comments, an event of another type, a comment line inside the [DONE] event, an
  // event after it: the client's stream ends with the [DONE] event (what follows it goes no
  // further), and the engine answered
  for (const [end, passed] of [
    ['data: [DONE]\n\n: ping\n\n', 'data: [DONE]\n\n'],
    ['data: [DONE]\r\n\r\n: keep-alive\r\n\r\n', 'data: [DONE]\r\n\r\n'],
    ['data: [DONE]\n\nevent: ping\ndata: {}\n\n', 'data: [DONE]\n\n'],
    ['data: [DONE]\n: ping\n\n', 'data: [DONE]\n: ping\n\n'],
    ['data:[DONE]\r\r: ping\r\r', 'data:[DONE]\r\r'],
    ['data: [DONE]\n\ndata: {"choices":[]}\n\n', 'data: [DONE]\n\n'],
    ['data: [DONE]\n\n: ping', 'data: [DONE]\n\n'],
    ['data: [DONE]\n\n: ping\n\ndata: [DONE]\n\n\n: ping', 'data: [DONE]\n\n'],
  ]) {
    await streamedThrough(await streamingEngine(first + end), false, (r, g) => {
      assert.equal(r.status, 200);
      assert.equal(r.text, first + passed, `${JSON.stringify(end)}: the stream up to its [DONE] event`);
      assert.equal(g.router.getStats().inFlightRequests, 0);
      assert.deepEqual(g.gateway.health.reasons('bad'), [], `${JSON.stringify(end)}: an answer, not a failure`);
    });
  }
});

test('a stream that is only a byte order mark and data: [DONE] is a whole answer', async () => {
  // a client's decoder drops one UTF-8 byte order mark at the start of a stream
  const stream = '\uFEFFdata: [DONE]\n\n';
  await streamedThrough(await streamingEngine(stream), false, (r, g) => {
    assert.equal(r.status, 200);
    assert.doesNotMatch(r.text, /failed mid-stream/, 'no error event after the end');
    assert.equal(g.router.getStats().inFlightRequests, 0);
    assert.deepEqual(g.gateway.health.reasons('bad'), [], 'an answer, not a failure');
  });
});

test('[DONE] anywhere but as the whole data of an event is no end of the stream', async () => {
  for (const body of [
    'data: {"choices":[{"text":"[DONE]"}]}\n\n',
    `${first}data:  [DONE]\n\n: ping\n\n`,
    `${first}: data: [DONE]\n\n`,
    `${first}xdata: [DONE]\n\n: ping\n\n`,
    `${first}event: [DONE]\n\n`,
  ]) {
    await streamedThrough(await streamingEngine(body), false, (r, g) => {
      assert.equal(r.status, 200);
      assert.ok(r.text.startsWith(body), `${JSON.stringify(body)}: the events as the engine sent them`);
      assert.match(
        r.text.slice(body.length),
        /^data: \{"error":.*"the engine failed mid-stream".*\n\ndata: \[DONE\]\n\n$/,
        JSON.stringify(body),
      );
      assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], `${JSON.stringify(body)}: a stream cut short`);
    });
  }
});
