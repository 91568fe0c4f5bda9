/**
 * The headers an engine reads to name and trace a request — `x-request-id` (vLLM's request id,
 * echoed in its answer with --enable-request-id-headers) and W3C Trace Context's `traceparent`
 * and `tracestate` (vLLM's OpenTelemetry tracing) — reach the engine as the client sent them,
 * streamed or not, on the fast path and on Fastify's route; the engine's `x-request-id` answer
 * header reaches the client. Each is bounded: one too long, or a single-value one given twice,
 * is refused 400 naming it, and nothing reaches the engine.
 */
import assert from 'node:assert/strict';
import type { IncomingHttpHeaders } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { MAX_PASSED_HEADER_BYTES } from '../../src/server/passed-headers.js';
import { fakeEngine, type FakeEngine } from '../faults/harness.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

const TRACEPARENT = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
const TRACESTATE = 'rojo=00f067aa0ba902b7,congo=t61rcWkgMzE';

/** Refused or answered on the fast path (no query) and on Fastify's route (a query string takes a request past the fast path). */
const QUERIES = ['', '?via=fastify'];

/**
 * An engine that records each completion's headers and answers it (an event stream when asked
 * for one) with the request's x-request-id echoed in its answer, as vLLM does with
 * --enable-request-id-headers.
 */
async function echoingEngine(): Promise<FakeEngine & { seen: IncomingHttpHeaders[] }> {
  const seen: IncomingHttpHeaders[] = [];
  const engine = await fakeEngine((req, res) => {
    let text = '';
    req.setEncoding('utf8');
    req.on('data', (d: string) => (text += d));
    req.on('end', () => {
      // the gateway's own reads (the models list) are not completions
      if (req.method !== 'POST') return void res.writeHead(404).end();
      seen.push(req.headers);
      const echoed = req.headers['x-request-id'];
      const id: Record<string, string> = typeof echoed === 'string' ? { 'x-request-id': echoed } : {};
      if ((JSON.parse(text) as { stream?: unknown }).stream === true) {
        res.writeHead(200, { 'content-type': 'text/event-stream', ...id });
        res.end('data: {"choices":[{"text":"ok"}]}\n\ndata: [DONE]\n\n');
        return;
      }
      const answer = '{"choices":[{"text":"ok"}]}';
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': answer.length, ...id }).end(answer);
    });
  });
  return Object.assign(engine, { seen });
}

async function withGateway(
  run: (base: string, engine: FakeEngine & { seen: IncomingHttpHeaders[] }, gateway: Gateway) => Promise<void>,
) {
  const engine = await echoingEngine();
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'e', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    await run(base, engine, gateway);
  } finally {
    await gateway.close(0);
    await engine.close();
  }
}

function completion(base: string, query: string, stream: boolean, headers: Record<string, string>) {
  return fetch(`${base}/v1/completions${query}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ prompt: 'hello there', max_tokens: 2, stream }),
  });
}

test("the client's x-request-id, traceparent and tracestate reach the engine, and the engine's x-request-id the client", async () => {
  await withGateway(async (base, engine) => {
    for (const query of QUERIES)
      for (const stream of [false, true]) {
        const at = `${query || 'fast path'}, stream ${stream}`;
        const id = `client-id-${query.length}-${stream}`;
        const res = await completion(base, query, stream, {
          'x-request-id': id,
          traceparent: TRACEPARENT,
          tracestate: TRACESTATE,
        });
        const text = await res.text();
        assert.equal(res.status, 200, `${at}: ${text}`);
        assert.equal(res.headers.get('x-request-id'), id, `${at}: the engine's x-request-id reaches the client`);
        const got = engine.seen.at(-1)!;
        assert.equal(got['x-request-id'], id, `${at}: x-request-id`);
        assert.equal(got.traceparent, TRACEPARENT, `${at}: traceparent`);
        assert.equal(got.tracestate, TRACESTATE, `${at}: tracestate`);
      }
  });
});

test('without them the engine gets none of them, and the client no x-request-id', async () => {
  await withGateway(async (base, engine) => {
    for (const query of QUERIES)
      for (const stream of [false, true]) {
        const res = await completion(base, query, stream, {});
        await res.text();
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('x-request-id'), null);
        const got = engine.seen.at(-1)!;
        for (const name of ['x-request-id', 'traceparent', 'tracestate'])
          assert.equal(got[name], undefined, `${query || 'fast path'}, stream ${stream}: no ${name}`);
      }
  });
});

test('an x-request-id, traceparent or tracestate longer than the bound is refused 400 naming it; one at the bound passes', async () => {
  await withGateway(async (base, engine) => {
    for (const name of ['x-request-id', 'traceparent', 'tracestate'])
      for (const query of QUERIES) {
        const at = `${name}, ${query || 'fast path'}`;
        const before = engine.seen.length;
        const res = await completion(base, query, false, { [name]: 'a'.repeat(MAX_PASSED_HEADER_BYTES + 1) });
        const body = (await res.json()) as { error: { message: string; param: unknown; type: string } };
        assert.equal(res.status, 400, at);
        assert.equal(body.error.param, name, at);
        assert.equal(body.error.type, 'invalid_request_error', at);
        assert.match(body.error.message, new RegExp(`${name}.*${MAX_PASSED_HEADER_BYTES} bytes`), at);
        assert.equal(engine.seen.length, before, `${at}: nothing reached the engine`);
        const atBound = await completion(base, query, false, { [name]: 'b'.repeat(MAX_PASSED_HEADER_BYTES) });
        await atBound.text();
        assert.equal(atBound.status, 200, `${at}: at the bound`);
        assert.equal(engine.seen.at(-1)![name], 'b'.repeat(MAX_PASSED_HEADER_BYTES), `${at}: forwarded whole`);
      }
  });
});

test('x-request-id or traceparent given twice is refused 400 naming it; tracestate lines join as one list', async () => {
  await withGateway(async (base, engine, gateway) => {
    const port = (gateway.app.server.address() as { port: number }).port;
    const body = JSON.stringify({ prompt: 'hello there', max_tokens: 2 });
    const send = async (path: string, lines: string) => {
      const client = await rawClient(port);
      client.socket.write(
        `POST ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n` +
          `content-length: ${body.length}\r\nconnection: close\r\n${lines}\r\n${body}`,
      );
      await until(() => client.closed(), `the answer to ${path}`);
      return client.received();
    };
    for (const path of ['/v1/completions', '/v1/completions?via=fastify']) {
      for (const name of ['x-request-id', 'traceparent']) {
        const before = engine.seen.length;
        const answer = await send(path, `${name}: one\r\n${name}: two\r\n`);
        assert.match(answer, /^HTTP\/1\.1 400 /, `${path} ${name}`);
        assert.match(answer, new RegExp(`"param":"${name}"`), `${path} ${name}`);
        assert.equal(engine.seen.length, before, `${path} ${name}: nothing reached the engine`);
      }
      const answer = await send(path, 'tracestate: rojo=1\r\ntracestate: congo=2\r\n');
      assert.match(answer, /^HTTP\/1\.1 200 /, path);
      assert.equal(engine.seen.at(-1)!.tracestate, 'rojo=1, congo=2', path);
    }
  });
});
