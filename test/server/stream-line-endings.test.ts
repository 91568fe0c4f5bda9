/**
 * Event streams whose lines end in CRLF, LF or CR (WHATWG HTML, server-sent events): an event
 * ends at the line end of an empty line whatever the line ends are, so the gateway passes each
 * event on as soon as its end arrives, and never passes the start of an event whose end has not.
 * A CR at the end of a chunk ends its line whatever follows; an LF at the start of the next
 * chunk completes that CRLF and is no line of its own. The bytes reach the client unchanged.
 */
import assert from 'node:assert/strict';
import { createServer, request, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { forwardTo, SlowClientResponse } from '../helpers/forward-stand-in.js';
import { until } from '../helpers/wait.js';

/** Streams of two or more events, each with the line ends of one style, ended as engines end them (data: [DONE]). */
const STREAMS: Record<string, string> = {
  LF: 'data: {"n":0}\n\ndata: {"n":1}\n\ndata: [DONE]\n\n',
  CRLF: 'data: {"n":0}\r\n\r\ndata: {"n":1}\r\n\r\ndata: [DONE]\r\n\r\n',
  CR: 'data: {"n":0}\r\rdata: {"n":1}\r\rdata: [DONE]\r\r',
  // events of several lines, each line end of another kind; every blank line's end is unlike the last
  mixed:
    'data: {"n":0,\r\ndata: "m":0}\r\r\n' +
    'id: 1\ndata: {"n":1}\r\n\n' +
    ': note\rdata: {"n":2}\n\r\n' +
    'data: {"n":3}\n\r' +
    'data: {"n":4}\r\n\r\n' +
    'data: [DONE]\n\r',
};

/**
 * Where the stream's events end, read as the spec reads it: each blank line's line end, from
 * its first byte (the event is dispatched there: a CR ends the line whatever follows) to its last.
 */
function eventEnds(s: string): Array<{ start: number; end: number }> {
  const ends: Array<{ start: number; end: number }> = [];
  let blank = true;
  for (let i = 0; i < s.length;) {
    const c = s[i];
    if (c === '\r' || c === '\n') {
      const len = c === '\r' && s[i + 1] === '\n' ? 2 : 1;
      if (blank) ends.push({ start: i, end: i + len });
      blank = true;
      i += len;
    } else {
      blank = false;
      i++;
    }
  }
  return ends;
}

/** What of the stream's first `k` bytes the client must have: every event whose end has begun to arrive, no more. */
function due(s: string, k: number): string {
  let upTo = 0;
  for (const { start, end } of eventEnds(s)) if (start < k) upTo = Math.min(end, k);
  return s.slice(0, upTo);
}

const ERROR_EVENT = `data: ${JSON.stringify({ error: { message: 'the engine failed mid-stream', type: 'server_error', param: null, code: null } })}\n\ndata: [DONE]\n\n`;

for (const [style, s] of Object.entries(STREAMS)) {
  test(`${style} line ends, cut into three chunks at every pair of positions: each event passes when its end arrives, the bytes unchanged`, async () => {
    assert.ok(eventEnds(s).length >= 2, 'the stream has several events');
    for (let a = 0; a <= s.length; a++)
      for (let b = a; b <= s.length; b++) {
        const res = new SlowClientResponse();
        res.full = false;
        const { h, outcome } = forwardTo(res);
        const at = `cut at ${a} and ${b}: ${JSON.stringify(s.slice(0, a))} | ${JSON.stringify(s.slice(a, b))}`;
        h.onData!(Buffer.from(s.slice(0, a)));
        assert.equal(res.text(), due(s, a), `after the first chunk, ${at}`);
        h.onData!(Buffer.from(s.slice(a, b)));
        assert.equal(res.text(), due(s, b), `after the second chunk, ${at}`);
        h.onData!(Buffer.from(s.slice(b)));
        assert.equal(res.text(), s, `after the last chunk, ${at}`);
        h.onComplete!([]);
        assert.equal(await outcome, 'done');
        assert.equal(res.text(), s);
      }
  });

  test(`${style} line ends, the engine failing after any byte: the client has whole events, then the error event (none after the last)`, async () => {
    for (let k = 0; k < s.length; k++) {
      const res = new SlowClientResponse();
      res.full = false;
      const { h, outcome } = forwardTo(res);
      // byte by byte: every CR at the end of a chunk, every LF at the start of one
      for (let i = 0; i < k; i++) h.onData!(Buffer.from(s[i]));
      h.onError!(new Error('other side closed'));
      const at = `failed after ${JSON.stringify(s.slice(0, k))}`;
      if (due(s, k) === '') {
        // nothing whole reached the client: another worker can take the request
        assert.equal(await outcome, 'retry', at);
        assert.equal(res.text(), '', at);
      } else if (/data: \[DONE\][\r\n]*$/.test(due(s, k))) {
        // the stream's last event reached the client: it has the whole answer
        assert.equal(await outcome, 'done', at);
        assert.equal(res.text(), due(s, k), at);
      } else {
        assert.equal(await outcome, 'cut', at);
        assert.equal(res.text(), due(s, k) + ERROR_EVENT, at);
      }
    }
  });
}

/** An engine streaming the events of `events` one at a time, each when the test releases it. */
async function pacedEngine(events: string[]) {
  let released = 0;
  let wake: (() => void) | undefined;
  const server = createServer((req, res: ServerResponse) => {
    req.resume();
    req.on('end', async () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (let i = 0; i < events.length; i++) {
        while (released <= i) await new Promise<void>((r) => (wake = r));
        res.write(events[i]);
      }
      res.end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    release: () => {
      released++;
      wake?.();
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

const PACED: Record<string, string[]> = {
  LF: ['data: {"n":0}\n\n', 'data: {"n":1}\n\n', 'data: [DONE]\n\n'],
  CRLF: ['data: {"n":0}\r\n\r\n', 'data: {"n":1}\r\n\r\n', 'data: [DONE]\r\n\r\n'],
  CR: ['data: {"n":0}\r\r', 'data: {"n":1}\r\r', 'data: [DONE]\r\r'],
  mixed: ['data: {"n":0}\r\n\n', 'id: 1\rdata: {"n":1}\n\r\n', 'data: {"n":2}\r\r\n', 'data: [DONE]\n\r'],
};

for (const [style, events] of Object.entries(PACED)) {
  test(`an engine streaming events with ${style} line ends, pausing between them: each reaches the client before the next is written`, async () => {
    const engine = await pacedEngine(events);
    const gateway = await createGateway({
      router: new KVAwareRouter({ policy: 'round-robin' }),
      workers: [{ id: 'e0', url: engine.url }],
      healthCheckIntervalMs: 0,
      metricsIntervalMs: 0,
    });
    const base = new URL(await gateway.app.listen({ host: '127.0.0.1', port: 0 }));
    try {
      const received: Buffer[] = [];
      let ended = false;
      const body = JSON.stringify({ prompt: 'p', max_tokens: 4, stream: true });
      const req = request({
        host: base.hostname,
        port: base.port,
        path: '/v1/completions',
        method: 'POST',
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
      });
      // the gateway's close cuts a stream a failed wait left open
      req.on('error', () => {});
      req.on('response', (res) => {
        assert.equal(res.statusCode, 200);
        res.on('data', (c: Buffer) => received.push(c));
        res.on('end', () => (ended = true));
      });
      req.end(body);
      const got = () => Buffer.concat(received).toString();
      for (let i = 0; i < events.length; i++) {
        engine.release();
        const expected = events.slice(0, i + 1).join('');
        await until(() => got() === expected, `event ${i} at the client (it has ${JSON.stringify(got())})`, {
          timeoutMs: 5000,
        });
      }
      await until(() => ended, 'the end of the stream');
      assert.equal(got(), events.join(''));
      assert.equal(gateway.router.getStats().inFlightRequests, 0);
    } finally {
      // a stream held back must not hold the close: the engine writes the rest, the connections are cut
      for (let i = 0; i < events.length; i++) engine.release();
      await gateway.close(0);
      await engine.close();
    }
  });
}

test('an event too large to hold, its blank line ending in CRs in chunks of their own: the error event after it needs no line end of its own', async () => {
  const res = new SlowClientResponse();
  res.full = false;
  const { h, outcome } = forwardTo(res);
  // after the first event (a first event is held whole past the bound, event-size.test.ts)
  const first = 'data: {"n":0}\n\n';
  h.onData!(Buffer.from(first));
  const large = `${first}data: ${'x'.repeat(1024 * 1024 + 1)}`;
  h.onData!(Buffer.from(large.slice(first.length)));
  assert.equal(res.text(), large, 'an event over the bound passes through as it comes');
  h.onData!(Buffer.from('\r'));
  // the CR ends the data line: the event is not over, and nothing waits to be sent
  h.onData!(Buffer.from('\r'));
  h.onData!(Buffer.from('\ndata: {"n"'));
  h.onError!(new Error('other side closed'));
  assert.equal(await outcome, 'cut');
  // the LF completes the blank line's CRLF; the start of the next event is dropped
  assert.equal(res.text(), `${large}\r\r\n${ERROR_EVENT}`);
});
