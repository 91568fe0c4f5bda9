/**
 * A connection the gateway keeps to an engine can be dead when a request is sent on it: the
 * engine restarted, or something between closed it, and the reset arrives only once the request
 * is written. Nothing reached the client and the engine holds none of the request, so it is
 * tried again, on the same engine when no other can take it: a gateway in front of one engine
 * must not answer 502 for a connection that was stale.
 */
import assert from 'node:assert/strict';
import { createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { test } from 'node:test';
import { badFirstGateway, post, sample } from './harness.js';
import { until } from '../helpers/wait.js';

const ANSWER = '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"a"}]}';
const STREAM = 'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n';

/**
 * Reads the HTTP/1.1 requests a client writes on `s` (bodies by Content-Length) and hands each
 * `POST /v1/completions` to `request` with its body; anything else is answered 404. The next
 * request already read is handled only while `request` returns true (false: it reset, closed or
 * holds the connection).
 */
function onCompletions(s: Socket, request: (body: string) => boolean): void {
  s.on('error', () => {});
  let buf = '';
  s.on('data', (d: Buffer) => {
    buf += d.toString('latin1');
    for (;;) {
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(buf)?.[1] ?? 0);
      if (buf.length < end + 4 + length) return;
      const head = buf.slice(0, end);
      const body = buf.slice(end + 4, end + 4 + length);
      buf = buf.slice(end + 4 + length);
      if (!head.startsWith('POST /v1/completions ')) {
        s.write('HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n');
        continue;
      }
      if (!request(body)) return;
    }
  });
}

/**
 * An engine speaking raw HTTP/1.1 that answers the first completion request of each connection
 * and resets the connection on any later one (`resets` counts them), as a connection gone stale
 * while it was pooled does; with `resetAll`, it resets every request.
 */
async function staleEngine(resetAll = false) {
  const counts = { answered: 0, resets: 0 };
  const server = createTcpServer((s: Socket) => {
    let onThisConnection = 0;
    onCompletions(s, (body) => {
      if (resetAll || ++onThisConnection > 1) {
        counts.resets++;
        s.resetAndDestroy();
        return false;
      }
      counts.answered++;
      const stream = (JSON.parse(body) as { stream?: boolean }).stream === true;
      const answer = stream ? STREAM : ANSWER;
      const type = stream ? 'text/event-stream' : 'application/json';
      s.write(`HTTP/1.1 200 OK\r\ncontent-type: ${type}\r\ncontent-length: ${answer.length}\r\n\r\n${answer}`);
      return true;
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return Object.assign(counts, {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((r) => server.close(() => r())),
  });
}

for (const stream of [false, true]) {
  test(`a request reset on a stale pooled connection to the only engine is sent again, not answered 502 (stream: ${stream})`, async () => {
    const engine = await staleEngine();
    const g = await badFirstGateway(engine.url, false);
    try {
      for (let i = 0; i < 3; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 1, stream });
        assert.equal(r.status, 200, `request ${i}: ${r.text}`);
        assert.equal(r.text, stream ? STREAM : ANSWER);
      }
      assert.ok(engine.resets >= 1, 'a request was sent on a pooled connection and reset');
      assert.equal(engine.answered, 3);
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
      await engine.close();
    }
  });
}

test('an only engine that resets every request is tried as often as the retries allow, then the client gets 502', async () => {
  const engine = await staleEngine(true);
  const g = await badFirstGateway(engine.url, false);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 1 });
    assert.equal(r.status, 502, r.text);
    assert.equal(engine.resets, 3, 'the first attempt and the 2 retries, no more');
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await engine.close();
  }
});

/**
 * An engine speaking raw HTTP/1.1 that restarts without the gateway seeing it: after restart(),
 * a request on a connection accepted before is held until `burst` such requests have arrived,
 * then each of those connections is broken (`how`: reset, or closed by the engine's side), as the
 * connections a gateway kept to an engine that restarted break at once under a burst of
 * requests; a request on a connection accepted after is answered. Before restart(), requests are
 * held until `burst` have arrived and then answered, so the gateway keeps `burst` connections.
 */
async function restartingEngine(burst: number, how: 'reset' | 'close') {
  const counts = { answered: 0, broken: 0, generation: 0 };
  let held: { s: Socket; stale: boolean }[] = [];
  const answer = (s: Socket) => {
    counts.answered++;
    s.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${ANSWER.length}\r\n\r\n${ANSWER}`);
  };
  const server = createTcpServer((s: Socket) => {
    const generation = counts.generation;
    onCompletions(s, () => {
      const stale = generation < counts.generation;
      // after the restart, a request on a new connection is answered at once
      if (counts.generation > 0 && !stale) {
        answer(s);
        return false;
      }
      held.push({ s, stale });
      if (held.length < burst) return false;
      const release = held;
      held = [];
      for (const h of release) {
        if (!h.stale) answer(h.s);
        else {
          counts.broken++;
          if (how === 'reset') h.s.resetAndDestroy();
          else h.s.destroy();
        }
      }
      return true;
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return Object.assign(counts, {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    restart: () => void counts.generation++,
    close: () => new Promise<void>((r) => server.close(() => r())),
  });
}

for (const how of ['reset', 'close'] as const) {
  test(`a burst of requests on the stale connections to an engine that restarted counts once toward its circuit, and is answered (${how})`, async () => {
    const burst = 16;
    const engine = await restartingEngine(burst, how);
    const g = await badFirstGateway(engine.url, false);
    const send = (i: number) => post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 1 });
    try {
      // the gateway keeps `burst` connections to the engine
      const warm = await Promise.all(Array.from({ length: burst }, (_, i) => send(i)));
      assert.deepEqual(
        warm.map((r) => r.status),
        warm.map(() => 200),
      );
      engine.restart();
      const after = await Promise.all(Array.from({ length: burst }, (_, i) => send(burst + i)));
      assert.equal(engine.broken, burst, 'every request of the burst was sent on a connection from before the restart');
      assert.deepEqual(
        after.map((r) => `${r.status} ${r.status === 200 ? '' : r.text}`),
        after.map(() => '200 '),
        'each is sent again on a new connection and answered',
      );
      assert.deepEqual(g.gateway.health.reasons('bad'), [], 'the circuit of the engine stays closed');
      const next = await send(2 * burst);
      assert.equal(next.status, 200, next.text);
      // every broken attempt still counts as a failure and a retry
      assert.equal(
        await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="bad",reason="reset"}'),
        burst,
      );
      assert.equal(await sample(g.gateway.metrics, 'contextforge_upstream_retries_total{worker="bad"}'), burst);
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
      await engine.close();
    }
  });
}

test('a burst of requests to an only engine that resets every request still opens its circuit', async () => {
  const engine = await staleEngine(true);
  const g = await badFirstGateway(engine.url, false);
  try {
    const burst = 16;
    const answers = await Promise.all(
      Array.from({ length: burst }, (_, i) => post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 1 })),
    );
    for (const r of answers) assert.ok(r.status === 502 || r.status === 503, `${r.status} ${r.text}`);
    await until(() => g.gateway.health.reasons('bad').includes('breaker'), 'the circuit of the engine to open');
    const next = await post(g.base, '/v1/completions', { prompt: 'next', max_tokens: 1 });
    assert.equal(next.status, 503, next.text);
    assert.match(next.text, /circuit breaker open/);
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await engine.close();
  }
});
