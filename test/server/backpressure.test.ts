/**
 * A client that reads slower than the engine writes: the engine's socket waits for the
 * client's, with one 'drain' listener per forward whatever undici delivers meanwhile, and the
 * client gets the whole stream once it reads.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { fakeEngine } from '../faults/harness.js';
import { forwardTo, SlowClientResponse } from '../helpers/forward-stand-in.js';
import { until } from '../helpers/wait.js';

const event = (i: number) => `data: {"n":${i}}\n\n`;
/** The event vLLM and SGLang end a stream with. */
const DONE = 'data: [DONE]\n\n';

test('chunks that arrive before the client drains add no second drain listener; the stream arrives whole', async () => {
  const res = new SlowClientResponse();
  const { h, outcome, resumed } = forwardTo(res);
  // undici delivers chunks it already parsed though the first one asked it to wait
  for (let i = 0; i < 50; i++) {
    assert.equal(h.onData!(Buffer.from(event(i))), false, 'the engine is told to wait');
    assert.equal(res.listenerCount('drain'), 1, `one drain listener after chunk ${i}`);
  }
  res.drain();
  assert.equal(resumed(), 1, 'the engine is resumed once');
  assert.equal(res.listenerCount('drain'), 0);
  for (let i = 50; i < 60; i++) assert.equal(h.onData!(Buffer.from(event(i))), true);
  // the client falls behind again: one listener again
  res.full = true;
  for (let i = 60; i < 70; i++) assert.equal(h.onData!(Buffer.from(event(i))), false);
  assert.equal(res.listenerCount('drain'), 1);
  res.drain();
  assert.equal(resumed(), 2);
  h.onData!(Buffer.from(DONE));
  h.onComplete!([]);
  assert.equal(await outcome, 'done');
  assert.ok(res.ended);
  assert.equal(Buffer.concat(res.written).toString(), Array.from({ length: 70 }, (_, i) => event(i)).join('') + DONE);
});

test('an attempt that ends while it waits for the client leaves no drain listener behind', async () => {
  const res = new SlowClientResponse();
  const { h, outcome } = forwardTo(res);
  for (let i = 0; i < 20; i++) h.onData!(Buffer.from(event(i)));
  // the engine fails mid-stream: the stream is ended with an error event
  h.onError!(new Error('engine gone'));
  assert.equal(await outcome, 'cut');
  assert.equal(res.listenerCount('drain'), 0);
  assert.match(Buffer.concat(res.written).toString(), /the engine failed mid-stream/);
});

/** The body of a chunked HTTP/1.1 response. */
function dechunk(body: Buffer): Buffer {
  const parts: Buffer[] = [];
  let at = 0;
  for (;;) {
    const eol = body.indexOf('\r\n', at);
    assert.ok(eol > at, 'a chunk size line');
    const size = parseInt(body.subarray(at, eol).toString('latin1'), 16);
    if (size === 0) return Buffer.concat(parts);
    parts.push(body.subarray(eol + 2, eol + 2 + size));
    at = eol + 2 + size + 2;
  }
}

test('a client that stops reading holds the engine back with one drain listener, and gets the whole stream once it reads', async () => {
  // each event's data a JSON object of 1000 bytes, as a chunk is (a first event that is not JSON is no answer)
  const line = `data: {"x":"${'x'.repeat(992)}"}\n\n`;
  // the engine writes as fast as the gateway takes it until the test has seen the client's
  // socket fill up (however much the sockets between them buffer), then ends the stream
  let sent = 0;
  let enough = false;
  const engine = await fakeEngine((req, res) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', async () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      while (!enough) {
        sent++;
        if (!res.write(line)) await once(res, 'drain');
      }
      res.end('data: [DONE]\n\n');
    });
  });
  const gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
    workers: [{ id: 'e0', url: engine.url }],
  });
  let client: Socket | undefined;
  try {
    let response: ServerResponse | undefined;
    gateway.app.server.on('request', (_req, res: ServerResponse) => (response = res));
    await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const { port } = gateway.app.server.address() as { port: number };

    client = connect(port, '127.0.0.1');
    client.pause(); // reads nothing until the test says
    const body = JSON.stringify({ model: 'm', prompt: 'p', stream: true });
    client.write(
      `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n` +
        `content-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`,
    );
    let most = 0;
    const drainListeners = () => {
      const n = response?.listenerCount('drain') ?? 0;
      most = Math.max(most, n);
      return n;
    };
    // the client's socket filled up: the gateway waits for it
    await until(() => drainListeners() > 0 && response!.writableNeedDrain, 'the gateway to wait for the client', {
      timeoutMs: 60_000,
    });
    // while the client reads nothing, the engine stays held back with a single listener
    for (let i = 0; i < 20; i++) {
      drainListeners();
      await new Promise((r) => setImmediate(r));
    }
    assert.equal(most, 1, 'never more than one drain listener');
    enough = true;

    const received: Buffer[] = [];
    client.on('data', (d: Buffer) => {
      received.push(d);
      drainListeners();
    });
    const closed = once(client, 'close');
    client.resume();
    await closed;
    assert.equal(most, 1, 'never more than one drain listener');
    assert.equal(response!.listenerCount('drain'), 0, 'none left once the answer ended');

    const raw = Buffer.concat(received);
    const headerEnd = raw.indexOf('\r\n\r\n');
    assert.match(raw.subarray(0, headerEnd).toString('latin1'), /^HTTP\/1\.1 200 /);
    const stream = dechunk(raw.subarray(headerEnd + 4));
    assert.equal(stream.length, sent * line.length + 'data: [DONE]\n\n'.length);
    assert.ok(stream.subarray(0, line.length).equals(Buffer.from(line)));
    assert.equal(stream.subarray(-14).toString(), 'data: [DONE]\n\n');
  } finally {
    client?.destroy(); // a client that never read would hold the gateway's close
    await gateway.close();
    await engine.close();
  }
});

test('a client that reads slowly is not taken for a stalled engine: the next event is due only once it has drained', async () => {
  const interChunkTimeoutMs = 50;
  // a stream whose client stops reading after its first event
  const slow = new SlowClientResponse();
  const held = forwardTo(slow, 'text/event-stream', { interChunkTimeoutMs });
  assert.equal(held.h.onData!(Buffer.from(event(0))), false, 'the engine is told to wait for the client');
  // started after it with the same deadline, a stream whose client reads and whose engine sends nothing more
  const reading = new SlowClientResponse();
  reading.full = false;
  const stalled = forwardTo(reading, 'text/event-stream', { interChunkTimeoutMs });
  assert.equal(stalled.h.onData!(Buffer.from(event(0))), true);
  await until(() => stalled.aborted() !== undefined, 'the stalled stream to be given up');
  // a deadline of the same length started earlier would have passed first
  assert.equal(held.aborted(), undefined, 'the stream waiting for its client still stands');
  stalled.h.onError!(stalled.aborted()!);
  assert.equal(await stalled.outcome, 'cut');
  assert.match(reading.text(), /the engine failed mid-stream/);
  // the client catches up: the engine's next event is due from now, and arrives
  slow.full = false;
  slow.drain();
  assert.equal(held.resumed(), 1);
  assert.equal(held.h.onData!(Buffer.from(event(1) + DONE)), true);
  held.h.onComplete!([]);
  assert.equal(await held.outcome, 'done');
  assert.equal(slow.text(), event(0) + event(1) + DONE);
});
