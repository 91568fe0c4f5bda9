/**
 * An engine whose stream's event never ends: its bytes keep coming, no blank line ever. The
 * start of an event is held back up to 1 MiB (so memory stays bounded), and past that it
 * passes through as it comes; but passing bytes is not answering: the next whole event is due
 * within the inter-chunk timeout however many bytes of an unfinished one arrive, and the time the
 * client takes to read them does not count either way.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { until } from '../helpers/wait.js';
import { badFirstGateway, fakeEngine } from './harness.js';

const FIRST = 'data: {"choices":[{"text":"a"}]}\n\n';

/** An engine that answers its completions with FIRST, then `rest(res)`; `open` counts the answers still open. */
async function engineStreaming(rest: (res: ServerResponse) => void) {
  const state = { open: 0 };
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => {
      state.open++;
      res.on('close', () => state.open--);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(FIRST);
      rest(res);
    });
  });
  return Object.assign(state, { url: engine.url, close: () => engine.close() });
}

/** Reads a stream to its end; the client gives up after 30 s (far past every deadline the gateway is given here). */
async function readStream(base: string): Promise<{ status: number; text: string }> {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'p', max_tokens: 2, stream: true }),
    signal: AbortSignal.timeout(30_000),
  });
  return { status: res.status, text: await res.text() };
}

test('an event that never ends, its bytes flooding past the held-back limit, is cut at the inter-chunk timeout', async () => {
  const chunk = 'x'.repeat(64 * 1024);
  const bad = await engineStreaming((res) => {
    res.write('data: "');
    const t = setInterval(() => res.write(chunk), 5);
    res.on('close', () => clearInterval(t));
  });
  const g = await badFirstGateway(bad.url, false, {
    timeouts: { firstByteTimeoutMs: 60_000, interChunkTimeoutMs: 500 },
    breakerFailures: 1,
  });
  try {
    const r = await readStream(g.base);
    assert.equal(r.status, 200);
    assert.ok(r.text.startsWith(FIRST), 'the whole first event came first');
    assert.ok(r.text.length > 1024 * 1024, 'the unfinished event passed through past the held-back limit');
    assert.ok(
      r.text.endsWith(
        '\n\ndata: {"error":{"message":"the engine failed mid-stream","type":"server_error","param":null,"code":null}}\n\ndata: [DONE]\n\n',
      ),
      'the error event, an event of its own, then data: [DONE]',
    );
    await until(() => bad.open === 0, 'the engine connection to be dropped');
    assert.equal(g.router.getStats().inFlightRequests, 0);
    assert.deepEqual(g.gateway.health.reasons('bad'), ['breaker'], 'the endless event counts as the engine failing');
  } finally {
    await g.close();
    await bad.close();
  }
});

test('an event larger than the held-back limit that ends passes whole, and the stream goes on', async () => {
  const big = `data: "${'y'.repeat(3 * 1024 * 1024)}"\n\n`;
  const bad = await engineStreaming((res) => {
    let at = 0;
    const t = setInterval(() => {
      if (at < big.length) {
        res.write(big.slice(at, at + 256 * 1024));
        at += 256 * 1024;
      } else {
        clearInterval(t);
        res.end('data: [DONE]\n\n');
      }
    }, 5);
    res.on('close', () => clearInterval(t));
  });
  const g = await badFirstGateway(bad.url, false, {
    timeouts: { firstByteTimeoutMs: 60_000, interChunkTimeoutMs: 5_000 },
  });
  try {
    const r = await readStream(g.base);
    assert.equal(r.status, 200);
    assert.equal(r.text, `${FIRST}${big}data: [DONE]\n\n`);
    assert.deepEqual(g.gateway.health.reasons('bad'), []);
  } finally {
    await g.close();
    await bad.close();
  }
});

/** `bytes` bytes of hex counters (8 digits and a space each): text of an event's data. */
function counters(from: number, bytes: number): string {
  let s = '';
  for (let i = from; s.length < bytes; i++) s += `${i.toString(16).padStart(8, '0')} `;
  return s.slice(0, bytes);
}

const MID_STREAM_ERROR =
  '\n\ndata: {"error":{"message":"the engine failed mid-stream","type":"server_error","param":null,"code":null}}\n\ndata: [DONE]\n\n';

for (const then of ['stalls', 'closes'] as const) {
  test(`an event past the held-back limit, then the engine ${then}: every byte it sent reaches the client, at once, before the error event`, async () => {
    // one event, then 2.5 MiB of the next without its end, in 256 KiB writes
    let sent = 'data: {"choices":[{"index":0,"delta":{"content":"';
    for (let i = 0; i < 10; i++) sent += counters(i * 29128, 256 * 1024);
    const bad = await engineStreaming((res) => {
      let at = 0;
      const t = setInterval(() => {
        const next = sent.slice(at, at + 256 * 1024 + 60);
        at += next.length;
        if (next.length > 0) res.write(next);
        else {
          clearInterval(t);
          if (then === 'closes') res.destroy();
        }
      }, 5);
      res.on('close', () => clearInterval(t));
    });
    const g = await badFirstGateway(bad.url, false, {
      timeouts: { firstByteTimeoutMs: 60_000, interChunkTimeoutMs: 3_000 },
    });
    try {
      const res = await fetch(`${g.base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'p', max_tokens: 2, stream: true }),
        signal: AbortSignal.timeout(30_000),
      });
      assert.equal(res.status, 200);
      const reader = res.body!.getReader();
      const parts: Uint8Array[] = [];
      let received = 0;
      let ended = false;
      const reading = (async () => {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) return void (ended = true);
          parts.push(value);
          received += value.length;
        }
      })();
      const expected = Buffer.byteLength(FIRST + sent);
      if (then === 'stalls') {
        // the engine stalls with its bytes written: they reach the client before the timeout cuts the stream
        await until(() => received >= expected || ended, 'the bytes sent, or the end of the stream');
        assert.ok(!ended, `the bytes reached the client before the stream was cut (${received} of ${expected})`);
        assert.equal(received, expected, 'every byte the engine sent, and no more, before the stall is over');
      }
      await reading;
      const text = Buffer.concat(parts).toString();
      assert.ok(
        text.startsWith(FIRST + sent),
        `every byte the engine sent came first (${text.length} bytes, ${expected} sent)`,
      );
      assert.equal(
        text.slice(expected),
        MID_STREAM_ERROR,
        'then the error event, on a line of its own, and data: [DONE]',
      );
      await until(() => bad.open === 0, 'the engine connection to be dropped');
    } finally {
      await g.close();
      await bad.close();
    }
  });
}
