/**
 * An engine's client error (4xx) whose body is too large to pass on whole: over the 16 MiB a
 * whole answer is gathered up to, or more than the answer budget can take. A client error is the
 * engine's word on the request, whatever its size: the client gets it as an OpenAI error object
 * of the same status quoting the start of the engine's message, never the engine's raw body (a
 * page of text the client's SDK cannot read, or many megabytes of it), and not after the engine
 * has finished sending an endless one.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { badFirstGateway, fakeEngine, post } from './harness.js';

const MiB = 1024 * 1024;

/** An engine answering every completion with `answer(res)` (other paths: 404). */
const engineAnswering = (answer: (res: ServerResponse) => void) =>
  fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.method !== 'POST') return void res.writeHead(404).end();
    req.on('end', () => answer(res));
  });

interface ErrorBody {
  error: { message: string; type: string; param: unknown; code: unknown };
}

/**
 * The client's answer: the status, and its body as an OpenAI error object; within 20 s (the
 * gateway must not wait for the end of a body it does not pass on).
 */
async function errorOf(base: string): Promise<{ status: number; type: string | null; error: ErrorBody['error'] }> {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'p', max_tokens: 2 }),
    signal: AbortSignal.timeout(20_000),
  });
  const text = await res.text();
  assert.ok(text.length < 4096, `a bounded answer, not the engine's body (${text.length} characters)`);
  return { status: res.status, type: res.headers.get('content-type'), error: (JSON.parse(text) as ErrorBody).error };
}

for (const [what, answer] of [
  [
    'a text page with a Content-Length over 16 MiB',
    (res: ServerResponse) => {
      res.writeHead(400, { 'content-type': 'text/plain', 'content-length': String(64 * MiB) });
      // the start of it, then the engine holds the rest: the client is answered without it
      res.write(`prompt rejected: ${'x'.repeat(MiB)}`);
    },
  ],
  [
    'a chunked text page past 16 MiB that never ends',
    (res: ServerResponse) => {
      res.writeHead(400, { 'content-type': 'text/plain' });
      res.write('prompt rejected: ');
      for (let i = 0; i < 17; i++) res.write(Buffer.alloc(MiB, 0x78));
    },
  ],
] as const) {
  test(`a 400 whose body is ${what}: an OpenAI error of status 400 quoting its start`, async () => {
    const bad = await engineAnswering(answer);
    const g = await badFirstGateway(bad.url, false);
    try {
      const { status, type, error } = await errorOf(g.base);
      assert.equal(status, 400);
      assert.match(type ?? '', /^application\/json/);
      assert.equal(error.type, 'invalid_request_error');
      assert.equal(error.code, 400);
      assert.match(
        error.message,
        /^the engine answered 400 with a body too large to pass on \([^)]*\): prompt rejected: x+…$/,
      );
      assert.equal(g.router.getStats().inFlightRequests, 0);
    } finally {
      await g.close();
      await bad.close();
    }
  });
}

test("a JSON 400 over 16 MiB: an OpenAI error of status 400 quoting the start of the engine's message", async () => {
  const message = `This model's "maximum context length"\nis 4096 tokens: ${'y'.repeat(17 * MiB)}`;
  const body = JSON.stringify({ error: { message, type: 'BadRequestError', param: null, code: 400 } });
  const bad = await engineAnswering((res) =>
    res.writeHead(400, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body),
  );
  const g = await badFirstGateway(bad.url, false);
  try {
    const { status, error } = await errorOf(g.base);
    assert.equal(status, 400);
    assert.equal(error.code, 400);
    assert.match(
      error.message,
      /^the engine answered 400 with a body too large to pass on \(\d+ bytes\): This model's "maximum context length" is 4096 tokens: y+…$/,
    );
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await bad.close();
  }
});

test('a client error the answer budget cannot take: a small one as the engine wrote it, a larger one quoted', async () => {
  const small = JSON.stringify({
    error: { message: 'bad max_tokens', type: 'BadRequestError', param: null, code: 400 },
  });
  const page = `<html><body><h1>413 Request Entity Too Large</h1>${'<p>nginx</p>'.repeat(2000)}</body></html>`;
  let next: 'small' | 'page' = 'small';
  const bad = await engineAnswering((res) => {
    const chunked = next === 'page';
    res.writeHead(chunked ? 413 : 400, { 'content-type': chunked ? 'text/html' : 'application/json' });
    res.end(chunked ? page : small);
  });
  const g = await badFirstGateway(bad.url, false, { bufferedAnswerLimit: 1 });
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2 });
    assert.equal(r.status, 400);
    assert.equal(r.text, small, 'whole within what is kept of it: passed on as the engine wrote it');
    next = 'page';
    const { status, error } = await errorOf(g.base);
    assert.equal(status, 413);
    assert.match(
      error.message,
      /^the engine answered 413 with a body too large to pass on \(\d+ bytes\): 413 Request Entity Too Large nginx nginx/,
    );
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await bad.close();
  }
});

test('a 404 page over 16 MiB of a declared type that is not JSON: a failed attempt, taken by another worker', async () => {
  const bad = await engineAnswering((res) => {
    res.writeHead(404, { 'content-type': 'text/html' });
    for (let i = 0; i < 17; i++) res.write(Buffer.alloc(MiB, 0x78));
  });
  const g = await badFirstGateway(bad.url, true);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await bad.close();
  }
});
