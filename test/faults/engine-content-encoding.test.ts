/**
 * Engines (or the proxies in front of them) that compress their answers. The gateway asks for
 * answers without a content coding; one that comes compressed anyway passes to the client as
 * it came, its Content-Encoding with it: its bytes are not JSON or events the gateway can read,
 * so it is neither checked as JSON nor cut into events, and a stream of it that fails is cut,
 * never followed by an error event the client's decoder would read as more of the stream.
 */
import assert from 'node:assert/strict';
import { request, type IncomingMessage, type ServerResponse } from 'node:http';
import { test } from 'node:test';
import { brotliCompressSync, gzipSync } from 'node:zlib';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayOptions } from '../../src/server/gateway.js';
import { fakeEngine, post } from './harness.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0 };

const completion = JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'ok' }] });
const events = `data: ${completion}\n\ndata: [DONE]\n\n`;

/** A gateway in front of the one engine `url` (worker e0), with `options`; `check` runs with its address. */
async function through(
  url: string,
  check: (base: string) => Promise<void>,
  options: Partial<GatewayOptions> = {},
): Promise<void> {
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'e0', url }],
    ...quiet,
    ...options,
  });
  try {
    await check(await gateway.app.listen({ host: '127.0.0.1', port: 0 }));
  } finally {
    await gateway.close();
  }
}

/** An engine answering its completions with `answer`; `acceptEncodings` records what each request accepted. */
async function engineAnswering(answer: (res: ServerResponse) => void) {
  const acceptEncodings: Array<string | undefined> = [];
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    acceptEncodings.push(req.headers['accept-encoding']);
    req.resume();
    req.on('end', () => answer(res));
  });
  return Object.assign(engine, { acceptEncodings });
}

/** The raw bytes of the gateway's answer (no decoding), and whether the answer ended whole. */
function rawAnswer(
  base: string,
  body: unknown,
): Promise<{ headers: IncomingMessage['headers']; bytes: Buffer; whole: boolean }> {
  return new Promise((resolve, reject) => {
    const req = request(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } });
    req.on('error', reject);
    req.on('response', (res) => {
      const parts: Buffer[] = [];
      res.on('data', (d: Buffer) => parts.push(d));
      res.on('error', () => {});
      res.on('close', () => resolve({ headers: res.headers, bytes: Buffer.concat(parts), whole: res.complete }));
    });
    req.end(JSON.stringify(body));
  });
}

test('the gateway asks an engine for its answers without a content coding', async () => {
  const engine = await engineAnswering((res) =>
    res.writeHead(200, { 'content-type': 'application/json' }).end(completion),
  );
  try {
    await through(engine.url, async (base) => {
      const r = await post(base, '/v1/completions', { prompt: 'p' }, { 'accept-encoding': 'gzip, br' });
      assert.equal(r.status, 200, r.text);
    });
    // the completion, and the gateway's own requests (its read of /v1/models)
    assert.ok(engine.acceptEncodings.length >= 1);
    assert.ok(
      engine.acceptEncodings.every((a) => a === 'identity'),
      JSON.stringify(engine.acceptEncodings),
    );
  } finally {
    await engine.close();
  }
});

for (const [coding, encode] of [
  ['gzip', gzipSync],
  ['br', brotliCompressSync],
] as const) {
  test(`a JSON answer compressed anyway (${coding}) reaches the client with its Content-Encoding, not as a 502`, async () => {
    const compressed = encode(completion);
    const engine = await engineAnswering((res) =>
      res
        .writeHead(200, {
          'content-type': 'application/json',
          'content-encoding': coding,
          'content-length': compressed.length,
        })
        .end(compressed),
    );
    try {
      await through(engine.url, async (base) => {
        const r = await rawAnswer(base, { prompt: 'p' });
        assert.equal(r.headers['content-encoding'], coding);
        assert.deepEqual(r.bytes, compressed, 'the bytes as the engine sent them');
        // a client that decodes (fetch does) gets the answer
        const decoded = await post(base, '/v1/completions', { prompt: 'p' });
        assert.equal(decoded.status, 200, decoded.text);
        assert.deepEqual(JSON.parse(decoded.text), JSON.parse(completion));
      });
    } finally {
      await engine.close();
    }
  });
}

test('an event stream compressed anyway reaches the client with its Content-Encoding, bytes unchanged', async () => {
  const compressed = gzipSync(events);
  const engine = await engineAnswering((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' });
    // in two pieces, neither of them ending in a blank line once compressed
    res.write(compressed.subarray(0, 10));
    res.end(compressed.subarray(10));
  });
  try {
    await through(engine.url, async (base) => {
      const r = await rawAnswer(base, { prompt: 'p', stream: true });
      assert.equal(r.headers['content-encoding'], 'gzip');
      assert.ok(r.whole);
      assert.deepEqual(r.bytes, compressed);
      const decoded = await post(base, '/v1/completions', { prompt: 'p', stream: true });
      assert.equal(decoded.status, 200);
      assert.equal(decoded.text, events);
    });
  } finally {
    await engine.close();
  }
});

test('a compressed event stream that fails after it reached the client is cut, no plain error event appended', async () => {
  const compressed = gzipSync(events);
  const engine = await engineAnswering((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' });
    res.write(compressed.subarray(0, 20), () => res.socket?.resetAndDestroy());
  });
  try {
    await through(engine.url, async (base) => {
      const r = await rawAnswer(base, { prompt: 'p', stream: true });
      assert.equal(r.headers['content-encoding'], 'gzip');
      assert.equal(r.whole, false, 'the answer is cut, not ended as if whole');
      assert.deepEqual(r.bytes, compressed.subarray(0, 20), 'only what the engine sent');
    });
  } finally {
    await engine.close();
  }
});

test('a compressed event stream that flows for longer than the inter-chunk timeout reaches its end', async () => {
  // a long generation: its events cannot be told apart, but each piece comes well within the
  // inter-chunk timeout, and the whole takes several times it
  const compressed = gzipSync(events.repeat(40));
  const pieces = 24;
  const size = Math.ceil(compressed.length / pieces);
  const engine = await engineAnswering((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' });
    let at = 0;
    const t = setInterval(() => {
      const piece = compressed.subarray(at, (at += size));
      if (at < compressed.length) res.write(piece);
      else {
        clearInterval(t);
        res.end(piece);
      }
    }, 50);
    res.on('close', () => clearInterval(t));
  });
  try {
    await through(
      engine.url,
      async (base) => {
        const r = await rawAnswer(base, { prompt: 'p', stream: true });
        assert.equal(r.headers['content-encoding'], 'gzip');
        assert.ok(r.whole, 'the stream ended whole, not cut');
        assert.deepEqual(r.bytes, compressed);
      },
      { timeouts: { firstByteTimeoutMs: 60_000, interChunkTimeoutMs: 300 } },
    );
  } finally {
    await engine.close();
  }
});
