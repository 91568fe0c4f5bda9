/**
 * Engines that keep an answer alive without ever getting on with it: a byte every few tens of
 * milliseconds, never enough to make a stream's next event or to end a whole answer. Each byte
 * resets undici's body timeout, which bounds the gap between two reads of the socket only; the
 * gateway's deadlines are on what reaches the client (a stream's whole events, a whole answer),
 * so such an engine cannot hold a client, a connection and the router's in-flight ticket forever.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { until } from '../helpers/wait.js';
import { badFirstGateway, fakeEngine, type BadFirstGateway } from './harness.js';

/** How often a trickling engine writes its next byte (ms): well inside every timeout of these tests. */
const TRICKLE_MS = 40;

/**
 * An engine that answers its completions with `head`, then writes `byte` every TRICKLE_MS
 * until the gateway closes the connection. `open` counts the answers still trickling.
 */
async function tricklingEngine(head: (res: ServerResponse) => void, byte: string) {
  const state = { open: 0 };
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      head(res);
      state.open++;
      const t = setInterval(() => res.write(byte), TRICKLE_MS);
      res.on('close', () => {
        clearInterval(t);
        state.open--;
      });
    });
  });
  return {
    url: engine.url,
    close: () => engine.close(),
    get open() {
      return state.open;
    },
  };
}

/**
 * Waits for the gateway to let go of all a trickling answer held: the engine's connection, the
 * router's in-flight ticket, the body and answer budgets.
 */
async function assertLetGo(bad: { open: number }, g: BadFirstGateway): Promise<void> {
  await until(() => bad.open === 0, 'the trickling answer to be dropped');
  assert.equal(g.router.getStats().inFlightRequests, 0);
  await until(
    () => g.gateway.answerBudget.used === 0 && g.gateway.bodyBudget.used === 0,
    'the budgets to be given back',
  );
}

/** POSTs a completion request; the client gives up after 30 s (far past every deadline the gateway is given here). */
async function complete(base: string, body: Record<string, unknown>) {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

test('a stream whose first event never completes, its bytes trickling, moves to another worker at the first-byte deadline', async () => {
  const bad = await tricklingEngine((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: {"choices":[{"text":"');
  }, 'a');
  const g = await badFirstGateway(bad.url, true, {
    timeouts: { firstByteTimeoutMs: 300, interChunkTimeoutMs: 60_000 },
  });
  try {
    const r = await complete(g.base, { prompt: 'p', max_tokens: 2, stream: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
    assert.match(r.text, /data: \[DONE\]/);
    assert.doesNotMatch(r.text, /"te?x?t?":"a/, 'nothing of the trickled event reached the client');
    await assertLetGo(bad, g);
  } finally {
    await g.close();
    await bad.close();
  }
});

test('a stream that trickles bytes after its first event, never making another, ends with an error event and counts as a failure', async () => {
  const bad = await tricklingEngine((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: {"choices":[{"text":"a"}]}\n\n');
    res.write('data: {"choices":[{"text":"');
  }, 'b');
  const g = await badFirstGateway(bad.url, false, {
    timeouts: { firstByteTimeoutMs: 60_000, interChunkTimeoutMs: 300 },
    breakerFailures: 1,
  });
  try {
    const r = await complete(g.base, { prompt: 'p', max_tokens: 2, stream: true });
    assert.equal(r.status, 200);
    const events = r.text.split('\n\n').filter(Boolean);
    assert.equal(events[0], 'data: {"choices":[{"text":"a"}]}');
    assert.match(events[1], /"the engine failed mid-stream"/, 'the stream ends with the error event');
    assert.equal(events[2], 'data: [DONE]', 'then data: [DONE]');
    assert.equal(events.length, 3, `the whole event, then the error event and data: [DONE]: ${JSON.stringify(r.text)}`);
    await assertLetGo(bad, g);
    assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], 'the stalled stream counts as the engine failing');
  } finally {
    await g.close();
    await bad.close();
  }
});

for (const framing of ['content-length', 'chunked'] as const) {
  test(`a whole answer (${framing}) that trickles for longer than the inter-chunk timeout is retried on another worker`, async () => {
    const bad = await tricklingEngine((res) => {
      res.writeHead(200, {
        'content-type': 'application/json',
        ...(framing === 'content-length' ? { 'content-length': '100000' } : {}),
      });
      res.write('{"choices":[{"text":"');
    }, 'a');
    const g = await badFirstGateway(bad.url, true, {
      timeouts: { firstByteTimeoutMs: 60_000, interChunkTimeoutMs: 300 },
    });
    try {
      const r = await complete(g.base, { prompt: 'p', max_tokens: 2 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'good');
      assert.doesNotThrow(() => JSON.parse(r.text));
      await assertLetGo(bad, g);
    } finally {
      await g.close();
      await bad.close();
    }
  });
}

test('a whole answer passing through ungathered (the answer budget full) that trickles is cut at the inter-chunk timeout', async () => {
  const bad = await tricklingEngine((res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"choices":[{"text":"');
  }, 'a');
  // a budget smaller than the answer's first chunk: it passes through as it comes
  const g = await badFirstGateway(bad.url, false, {
    bufferedAnswerLimit: 8,
    breakerFailures: 1,
    timeouts: { firstByteTimeoutMs: 60_000, interChunkTimeoutMs: 300 },
  });
  try {
    const res = await fetch(`${g.base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'p', max_tokens: 2 }),
      signal: AbortSignal.timeout(30_000),
    });
    assert.equal(res.status, 200);
    // cut, never ended as if whole
    await assert.rejects(res.text(), (err: Error) => !/aborted due to timeout/.test(String(err.cause ?? err)));
    await assertLetGo(bad, g);
    assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], 'the stalled answer counts as the engine failing');
  } finally {
    await g.close();
    await bad.close();
  }
});

// an engine answering a streamed request with no event stream (a whole JSON answer of undeclared
// length, an error page) is gathered as any whole answer is, and writes it at once like one
for (const [status, contentType, head] of [
  [200, 'application/json', '{"choices":[{"text":"'],
  [404, 'text/html', '<html><body>'],
] as const) {
  test(`a whole answer (${status} ${contentType}) to a streamed request that trickles is given up at the inter-chunk timeout`, async () => {
    const bad = await tricklingEngine((res) => {
      res.writeHead(status, { 'content-type': contentType });
      res.write(head);
    }, ' ');
    const g = await badFirstGateway(bad.url, false, {
      breakerFailures: 1,
      timeouts: { firstByteTimeoutMs: 60_000, interChunkTimeoutMs: 300 },
    });
    try {
      const res = await fetch(`${g.base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'p', max_tokens: 2, stream: true }),
        signal: AbortSignal.timeout(30_000),
      });
      // given up before any of it reached the client (the only worker failed), not left for the client to give up on
      assert.equal(res.status, 502, `${status} ${contentType}`);
      await res.text();
      await assertLetGo(bad, g);
      assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], 'the stalled answer counts as the engine failing');
    } finally {
      await g.close();
      await bad.close();
    }
  });
}
