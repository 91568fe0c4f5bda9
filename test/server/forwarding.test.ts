import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { ApiKeys } from '../../src/server/api-keys.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';

// What the engine receives and what the client gets back, byte for byte: an engine that records
// each request body and answers as the test asks (through the prompt it is sent).

interface Seen {
  body: Buffer;
  headers: IncomingMessage['headers'];
}

const seen: Seen[] = [];
let engine: Server;
let gateway: Gateway;
let tenantGateway: Gateway;
let base = '';
let tenantBase = '';
const KEY = 'sk-test-0123456789abcdef';

/** The engine's answer, chosen by the request's `answer` field. */
function answer(kind: string, res: ServerResponse): void {
  switch (kind) {
    case 'chunked-json':
      // a JSON answer without content-length: gathered (one cut short is retried), sent with its length
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"id":"a",');
      res.end('"choices":[]}');
      return;
    case 'sse':
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"n":1}\n\n');
      res.write('data: {"n":2}\n\n');
      res.end('data: [DONE]\n\n');
      return;
    case 'large-sse': {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      // each event's data a JSON object of 1000 bytes, as a chunk is (a first event that is not JSON is no answer)
      const line = `data: {"x":"${'x'.repeat(992)}"}\n\n`;
      for (let i = 0; i < 4000; i++) res.write(line);
      res.end('data: [DONE]\n\n');
      return;
    }
    case 'bad-request': {
      const body = JSON.stringify({ error: { message: 'too long', type: 'invalid_request_error' } });
      res.writeHead(400, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
      return;
    }
    case 'empty':
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': 0 });
      res.end();
      return;
    default: {
      const body = JSON.stringify({ id: 'ok', choices: [{ text: 'é✓' }] });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    }
  }
}

before(async () => {
  engine = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      const body = Buffer.concat(parts);
      seen.push({ body, headers: req.headers });
      let kind = 'json';
      try {
        kind = String((JSON.parse(body.toString()) as { answer?: string }).answer ?? 'json');
      } catch {
        // not JSON: the default answer
      }
      answer(kind, res);
    });
  });
  await new Promise<void>((r) => engine.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
  const options = { healthCheckIntervalMs: 0, metricsIntervalMs: 0, workers: [{ id: 'e0', url }] };
  gateway = await createGateway({ router: new KVAwareRouter({ blockSize: 16 }), ...options });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  tenantGateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    apiKeys: new ApiKeys({ [KEY]: 'team-a' }),
    ...options,
  });
  tenantBase = await tenantGateway.app.listen({ host: '127.0.0.1', port: 0 });
});

after(async () => {
  await gateway.close();
  await tenantGateway.close();
  await new Promise((r) => engine.close(r));
});

async function post(body: string | Buffer, at = base, headers: Record<string, string> = {}) {
  const before = seen.length;
  const res = await fetch(`${at}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body,
  });
  const bytes = Buffer.from(await res.arrayBuffer());
  return { res, bytes, engineGot: seen.length > before ? seen[seen.length - 1] : undefined };
}

test('an unchanged body reaches the engine byte for byte, with its length', async () => {
  // spacing, key order, number spelling and escapes that JSON.stringify would change
  const body = Buffer.from('{ "prompt" : "caf\\u00e9 — ünï ✓",\n\t"max_tokens":1.0, "model":"m", "x": [1e2, "\\/"] }');
  const { res, engineGot } = await post(body);
  assert.equal(res.status, 200);
  assert.ok(engineGot, 'the engine got the request');
  assert.deepEqual(engineGot.body, body);
  assert.equal(engineGot.headers['content-length'], String(body.length));
  assert.equal(engineGot.headers['content-type'], 'application/json');
});

test('a body with the contextforge field reaches the engine without it, everything else kept', async () => {
  const { res, engineGot } = await post(
    JSON.stringify({ model: 'm', prompt: 'hello there', contextforge: { workflowId: 'wf-1' }, max_tokens: 2 }),
  );
  assert.equal(res.status, 200);
  assert.deepEqual(JSON.parse(engineGot!.body.toString()), { model: 'm', prompt: 'hello there', max_tokens: 2 });
});

test('an isolated request reaches the engine with the private cache_salt the router chose', async () => {
  const { res, engineGot } = await post(
    JSON.stringify({ model: 'm', prompt: 'secret', contextforge: { isolate: true } }),
  );
  assert.equal(res.status, 200);
  const got = JSON.parse(engineGot!.body.toString()) as Record<string, unknown>;
  assert.equal(got.prompt, 'secret');
  assert.equal(got.contextforge, undefined);
  assert.equal(typeof got.cache_salt, 'string');
});

test("a tenant's request reaches the engine with the tenant's cache_salt", async () => {
  const { res, engineGot } = await post(JSON.stringify({ model: 'm', prompt: 'hi', cache_salt: 'mine' }), tenantBase, {
    authorization: `Bearer ${KEY}`,
  });
  assert.equal(res.status, 200);
  assert.deepEqual(JSON.parse(engineGot!.body.toString()), {
    model: 'm',
    prompt: 'hi',
    cache_salt: 'tenant/team-a/mine',
  });
});

test("a tenant's request with cache_salt null gets the tenant's own salt, as one without a salt does", async () => {
  const { res, engineGot } = await post(JSON.stringify({ model: 'm', prompt: 'hi', cache_salt: null }), tenantBase, {
    authorization: `Bearer ${KEY}`,
  });
  assert.equal(res.status, 200);
  assert.deepEqual(JSON.parse(engineGot!.body.toString()), { model: 'm', prompt: 'hi', cache_salt: 'tenant/team-a' });
});

test('cache_salt null reaches the engine as written: the engine reads it as no salt', async () => {
  const text = '{"model":"m","prompt":"hi","cache_salt":null}';
  const { res, engineGot } = await post(text);
  assert.equal(res.status, 200);
  assert.equal(engineGot!.body.toString(), text);
});

test('bytes that are not UTF-8 reach the engine as the router read them (replacement characters)', async () => {
  const body = Buffer.concat([Buffer.from('{"model":"m","prompt":"a'), Buffer.from([0xff, 0xfe]), Buffer.from('b"}')]);
  const { res, engineGot } = await post(body);
  assert.equal(res.status, 200);
  assert.equal(engineGot!.body.toString(), '{"model":"m","prompt":"a\ufffd\ufffdb"}');
});

test('answers pass back unchanged: JSON with its length, chunked JSON, a stream, an engine 400; an empty JSON body does not', async () => {
  const json = await post(JSON.stringify({ model: 'm', prompt: 'p' }));
  assert.equal(json.res.status, 200);
  assert.equal(json.bytes.toString(), JSON.stringify({ id: 'ok', choices: [{ text: 'é✓' }] }));
  assert.equal(json.res.headers.get('content-length'), String(json.bytes.length));
  assert.equal(json.res.headers.get('content-type'), 'application/json');
  assert.equal(json.res.headers.get('x-contextforge-worker'), 'e0');

  const chunked = await post(JSON.stringify({ model: 'm', prompt: 'p', answer: 'chunked-json' }));
  assert.equal(chunked.res.status, 200);
  assert.equal(chunked.bytes.toString(), '{"id":"a","choices":[]}');
  assert.equal(chunked.res.headers.get('content-length'), String(chunked.bytes.length));

  const sse = await post(JSON.stringify({ model: 'm', prompt: 'p', answer: 'sse', stream: true }));
  assert.equal(sse.res.status, 200);
  assert.equal(sse.res.headers.get('content-type'), 'text/event-stream');
  assert.equal(sse.res.headers.get('cache-control'), 'no-cache');
  assert.equal(sse.bytes.toString(), 'data: {"n":1}\n\ndata: {"n":2}\n\ndata: [DONE]\n\n');

  const bad = await post(JSON.stringify({ model: 'm', prompt: 'p', answer: 'bad-request' }));
  assert.equal(bad.res.status, 400);
  assert.deepEqual(JSON.parse(bad.bytes.toString()), {
    error: { message: 'too long', type: 'invalid_request_error' },
  });

  // a 200 declared JSON with nothing in it is no answer the client can read: the attempt failed
  // (as a 204 does), and with no other worker the client is told why
  const empty = await post(JSON.stringify({ model: 'm', prompt: 'p', answer: 'empty' }));
  assert.equal(empty.res.status, 502);
  assert.equal(
    (JSON.parse(empty.bytes.toString()) as { error: { code: string } }).error.code,
    'engine_answer_incomplete',
  );
});

test('a large stream read slowly by the client arrives whole', async () => {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: 'p', answer: 'large-sse', stream: true }),
  });
  const reader = res.body!.getReader();
  let bytes = 0;
  let text = '';
  for (let i = 0; ; i++) {
    const { done, value } = await reader.read();
    if (done) break;
    bytes += value.length;
    text = Buffer.from(value).toString().slice(-14);
    // a slow reader: the router must hold back the engine, not buffer without end or drop chunks
    if (i % 50 === 0) await new Promise((r) => setImmediate(r));
  }
  assert.equal(bytes, 4000 * (6 + 1000 + 2) + 'data: [DONE]\n\n'.length);
  assert.equal(text, 'data: [DONE]\n\n');
});

test('the common case and the Fastify route answer alike: errors, content types, metrics', async () => {
  // a query string (like chunked bodies and other content types) goes through Fastify; the plain case does not
  const send = async (path: string, body: string) => {
    const res = await fetch(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    });
    return {
      status: res.status,
      type: res.headers.get('content-type'),
      connection: res.headers.get('connection'),
      body: await res.text(),
    };
  };
  const cases = [
    'not json',
    '[1, 2]',
    '{"model":"m"}',
    '{"model":"m","prompt":"p","contextforge":{"workflowId":""}}',
    '{"a":'.repeat(100) + '1' + '}'.repeat(100),
    '',
  ];
  for (const body of cases) {
    const fast = await send('/v1/completions', body);
    const routed = await send('/v1/completions?via=fastify', body);
    assert.deepEqual(fast, routed, `the same answer for ${body.slice(0, 40)}`);
    assert.equal(fast.status, 400, body.slice(0, 40));
    assert.equal(fast.type, 'application/json; charset=utf-8');
  }
  // a body that is not readable JSON ends the connection (what follows it is not a request)
  assert.equal((await send('/v1/completions', 'not json')).connection, 'close');
  assert.equal((await send('/v1/completions', '{"model":"m"}')).connection, 'keep-alive');
  const ok = await send('/v1/chat/completions', '{"model":"m","messages":[{"role":"user","content":"hi"}]}');
  const okRouted = await send(
    '/v1/chat/completions?via=fastify',
    '{"model":"m","messages":[{"role":"user","content":"hi"}]}',
  );
  assert.deepEqual([ok.status, okRouted.status], [200, 200]);
  // both ways are counted under the route's path (the 400s: these twelve, the two after them and
  // the engine's one above)
  const metrics = await (await fetch(`${base}/metrics`)).text();
  assert.match(metrics, /contextforge_requests_total\{path="\/v1\/chat\/completions",status="200"\} 2/);
  assert.match(metrics, /contextforge_requests_total\{path="\/v1\/completions",status="400"\} 15/);
});
