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
