/**
 * What an engine's event stream must hold to count as an answer, through a real gateway: blocks
 * without a data line (keep-alive comments such as sse-starlette's `: ping`, TGI's, an `event:
 * ping` with no data) are no events (WHATWG HTML, "Server-sent events": an event without data is
 * not dispatched). They neither commit the response nor reset the first-event or inter-event
 * deadlines; once the answer is committed they pass on to the client. A first event whose data is
 * not JSON (nor `[DONE]`) is a failed attempt, as is an engine's page that is no error object for
 * a 404; any other client error in a page is wrapped in an OpenAI error object. The media type is
 * read without regard to case (RFC 9110 §8.3.1), and the 502 after every attempt failed says why.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test, type TestContext } from 'node:test';
import { badFirstGateway, fakeEngine } from '../faults/harness.js';

const CHUNK = JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'tok' }] });
const SSE = { 'content-type': 'text/event-stream' };

/** An engine that reads each completion whole, then answers it with `answer`; closed with the test. */
async function engine(answer: (res: ServerResponse) => void) {
  return fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => answer(res));
  });
}

/** Writes `block` every 50 ms until the response closes (a keep-alive the engine sends while it computes). */
function every50ms(res: ServerResponse, block: string): void {
  const t = setInterval(() => res.write(block), 50);
  res.on('close', () => clearInterval(t));
}

async function complete(base: string, stream = true) {
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'hello there', max_tokens: 3, stream }),
    // a gateway that never gives up on the engine fails the test instead of hanging it
    signal: AbortSignal.timeout(8000),
  });
  return {
    status: r.status,
    worker: r.headers.get('x-contextforge-worker'),
    type: r.headers.get('content-type'),
    text: await r.text(),
  };
}

const FAST = { timeouts: { firstByteTimeoutMs: 300, interChunkTimeoutMs: 600 } };

/**
 * Puts an engine that answers with `answer` first behind a gateway (with a good engine after it
 * when `withGood`), both closed with the test, and sends it one completion (streamed unless
 * `stream` is false). Returns the answer, the gateway's base URL and how long the completion took.
 */
async function viaBadFirst(
  t: TestContext,
  answer: (res: ServerResponse) => void,
  {
    withGood = false,
    stream = true,
    options = FAST,
  }: { withGood?: boolean; stream?: boolean; options?: Parameters<typeof badFirstGateway>[2] } = {},
) {
  const bad = await engine(answer);
  const gw = await badFirstGateway(bad.url, withGood, options);
  t.after(async () => {
    await gw.close();
    await bad.close();
  });
  const r = await complete(gw.base, stream);
  return { r, base: gw.base };
}

for (const block of [': ping\n\n', 'event: ping\n\n', ': ping\r\n\r\nid: 4\r\n\r\n']) {
  test(`an engine that sends only ${JSON.stringify(block)} has not answered: its first event is overdue and another worker takes the request`, async (t) => {
    const { r } = await viaBadFirst(
      t,
      (res) => {
        res.writeHead(200, SSE);
        res.write(block);
        every50ms(res, block);
      },
      { withGood: true },
    );
    assert.equal(r.status, 200);
    assert.equal(r.worker, 'good', 'the request moved to the engine that answered');
    assert.ok(!r.text.includes('ping'), 'nothing of the failed attempt reached the client');
    assert.match(r.text, /data: \[DONE\]/);
  });
}

test('alone, an engine that sends only keep-alive comments is answered 502 once its first event is overdue, saying so', async (t) => {
  const { r, base } = await viaBadFirst(
    t,
    (res) => {
      res.writeHead(200, SSE);
      every50ms(res, ': ping\n\n');
    },
    { options: { ...FAST, maxRetries: 0 } },
  );
  assert.equal(r.status, 502);
  assert.match(r.text, /timeout/, 'the 502 names why the engine failed');
  const metrics = await (await fetch(`${base}/metrics`)).text();
  assert.match(metrics, /contextforge_upstream_failures_total\{worker="bad",reason="timeout"\} 1/);
});

test('after the first event, keep-alive comments pass on but do not hold off the inter-event deadline', async (t) => {
  const { r } = await viaBadFirst(t, (res) => {
    res.writeHead(200, SSE);
    res.write(`data: ${CHUNK}\n\n`);
    every50ms(res, ': keep-alive\n\n');
  });
  assert.equal(r.status, 200);
  assert.ok(r.text.startsWith(`data: ${CHUNK}\n\n`));
  assert.match(r.text, /: keep-alive\n\n/, 'the keep-alives reached the client');
  assert.match(r.text, /the engine failed mid-stream/, 'the stream was cut once no event came');
  // held by the comments, the stream would run until the client's 8 s deadline fails the test
  assert.ok(r.text.endsWith('data: [DONE]\n\n'));
});

test("a keep-alive comment, then the engine's error event: another worker takes the request", async (t) => {
  const { r } = await viaBadFirst(
    t,
    (res) => {
      res.writeHead(200, SSE);
      res.write(': ping\n\n');
      // the error event comes once the comment has reached the gateway (a write of its own)
      setImmediate(() =>
        res.end(
          'data: {"error":{"message":"engine dead","type":"InternalServerError","param":null,"code":500}}\n\ndata: [DONE]\n\n',
        ),
      );
    },
    { withGood: true },
  );
  assert.equal(r.status, 200);
  assert.equal(r.worker, 'good');
  assert.ok(!r.text.includes('engine dead'));
});

test('a keep-alive comment, then the connection closes: another worker takes the request', async (t) => {
  const { r } = await viaBadFirst(
    t,
    (res) => {
      res.writeHead(200, SSE);
      res.write(': ping\n\n', () => res.socket?.destroy());
    },
    { withGood: true },
  );
  assert.equal(r.status, 200);
  assert.equal(r.worker, 'good');
});

test('an event stream whose media type is written in capitals is one (RFC 9110: case-insensitive)', async (t) => {
  const { r } = await viaBadFirst(t, (res) => {
    res.writeHead(200, { 'content-type': 'Text/Event-Stream; charset=utf-8' });
    res.end(`data: ${CHUNK}\n\ndata: [DONE]\n\n`);
  });
  assert.equal(r.status, 200);
  assert.equal(r.text, `data: ${CHUNK}\n\ndata: [DONE]\n\n`);
  // and one to a request that is not streamed is no answer, whatever its case
  const { r: j } = await viaBadFirst(
    t,
    (res) => {
      res.writeHead(200, { 'content-type': 'TEXT/EVENT-STREAM' });
      res.end(`data: ${CHUNK}\n\ndata: [DONE]\n\n`);
    },
    { withGood: true, stream: false },
  );
  assert.equal(j.status, 200);
  assert.equal(j.worker, 'good');
});

test('a first event whose data is not JSON is a failed attempt: another worker takes the request', async (t) => {
  const { r, base } = await viaBadFirst(
    t,
    (res) => {
      res.writeHead(200, SSE);
      res.end(`data: {"id": "c1", "choices": [ {oops\n\ndata: ${CHUNK}\n\ndata: [DONE]\n\n`);
    },
    { withGood: true },
  );
  assert.equal(r.status, 200);
  assert.equal(r.worker, 'good');
  assert.ok(!r.text.includes('oops'));
  const metrics = await (await fetch(`${base}/metrics`)).text();
  assert.match(metrics, /contextforge_upstream_failures_total\{worker="bad",reason="malformed"\} 1/);
});

test("an engine's client error as a page that is not JSON reaches the client as an OpenAI error object", async () => {
  const pages: Record<string, [number, string, string, string]> = {
    html413: [
      413,
      'text/html',
      '<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body><center>nginx</center></body>\r\n</html>\r\n',
      '413 Request Entity Too Large',
    ],
    plain400: [400, 'text/plain', 'bad', ': bad'],
  };
  for (const [name, [status, type, body, quoted]] of Object.entries(pages)) {
    const bad = await engine((res) => res.writeHead(status, { 'content-type': type }).end(body));
    const gw = await badFirstGateway(bad.url, false, FAST);
    try {
      for (const stream of [false, true]) {
        const r = await complete(gw.base, stream);
        assert.equal(r.status, status, name);
        assert.match(r.type ?? '', /^application\/json/, name);
        const { error } = JSON.parse(r.text) as { error: { message: string; type: string; code: unknown } };
        assert.ok(error, name);
        assert.equal(error.code, status);
        assert.equal(error.type, 'invalid_request_error');
        assert.ok(error.message.includes(quoted), `${name}: ${error.message}`);
      }
    } finally {
      await gw.close();
      await bad.close();
    }
  }
});

test("an engine's 404 page that is not JSON (a wrong URL, another service) is a failed attempt, as a redirect is", async (t) => {
  const { r, base } = await viaBadFirst(
    t,
    (res) =>
      res.writeHead(404, { 'content-type': 'text/html' }).end('<html><body><h1>404 Not Found</h1>nginx</body></html>'),
    { withGood: true, stream: false },
  );
  assert.equal(r.status, 200);
  assert.equal(r.worker, 'good');
  const metrics = await (await fetch(`${base}/metrics`)).text();
  assert.match(metrics, /contextforge_upstream_failures_total\{worker="bad",reason="status"\} 1/);
});

test('the 502 after every engine failed names the last failure: a reset', async (t) => {
  const bad = await fakeEngine((req) => req.socket.destroy());
  const gw = await badFirstGateway(bad.url, false, { ...FAST, maxRetries: 0 });
  t.after(async () => {
    await gw.close();
    await bad.close();
  });
  const r = await complete(gw.base, false);
  assert.equal(r.status, 502);
  const { error } = JSON.parse(r.text) as { error: { message: string } };
  assert.match(error.message, /\(last: bad, reset\)/);
  const metrics = await (await fetch(`${gw.base}/metrics`)).text();
  assert.match(metrics, /contextforge_upstream_failures_total\{worker="bad",reason="reset"\} 1/);
});
