/**
 * Engines that answer garbage after their first byte: an event stream cut in the middle of an
 * event, a JSON answer of unknown length cut short. The client must see a clear failure (an
 * SSE error event it can parse, or a response that does not end cleanly), never a broken event
 * or a truncated 200 that looks complete; the router's ticket is released either way.
 */
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';
import { answeringEngine, fakeEngine, type FakeEngine } from './harness.js';

const chunk = (content: string) =>
  `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;

let engine: FakeEngine;
let gateway: Gateway;
let base = '';

before(async () => {
  // the prompt says how the engine fails
  engine = await fakeEngine((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      if (req.method !== 'POST') return void res.writeHead(404).end(); // /v1/models
      const { messages } = JSON.parse(body) as { messages: Array<{ content: string }> };
      const mode = messages[0].content;
      if (mode === 'cut-mid-event') {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        // a whole event, then half of the next one, then the engine dies
        res.write(chunk('par') + chunk('tial').slice(0, 30));
      } else {
        res.writeHead(200, { 'content-type': 'application/json' }); // chunked: no content-length
        res.write('{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"content":"hel');
      }
      setTimeout(() => res.socket?.destroy(), 30);
    });
  });
  gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'f0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close();
  await engine.close();
});

test('a stream cut in the middle of an event: the client gets the whole events, then an error event it can parse', async () => {
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'cut-mid-event' }], stream: true }),
  });
  assert.equal(res.status, 200);
  const text = await res.text();
  const events = text.split('\n\n').filter(Boolean);
  for (const e of events.slice(0, -1)) {
    assert.match(e, /^data: /, `an SSE event: ${JSON.stringify(e)}`);
    assert.doesNotThrow(
      () => JSON.parse(e.slice('data: '.length)),
      `every event but the end is JSON: ${JSON.stringify(e)}`,
    );
  }
  assert.equal(events.length, 3);
  assert.match(events[1], /failed mid-stream/);
  assert.equal(events[2], 'data: [DONE]');
  await until(() => gateway.router.getStats().inFlightRequests === 0, 'the ticket released');
  // the openai SDK reports the engine's failure, not a JSON syntax error
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
  const seen: string[] = [];
  await assert.rejects(async () => {
    const stream = await client.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'cut-mid-event' }],
      stream: true,
    });
    for await (const c of stream) seen.push(c.choices[0]?.delta.content ?? '');
  }, /failed mid-stream/);
  assert.deepEqual(seen, ['par']);
});

test('a JSON answer of unknown length cut short never reaches the client truncated', async () => {
  const body = JSON.stringify({ messages: [{ role: 'user', content: 'cut-json' }] });
  const outcome = await new Promise<{ status: number; ended: 'cleanly' | 'aborted' }>((resolve, reject) => {
    const req = request(
      `${base}/v1/chat/completions`,
      { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
      (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode!, ended: 'cleanly' }));
        res.on('aborted', () => resolve({ status: res.statusCode!, ended: 'aborted' }));
        res.on('error', () => resolve({ status: res.statusCode!, ended: 'aborted' }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
  // the answer is gathered before anything is sent, so the cut is a failure to retry; with the
  // only engine failing, the client gets a whole 502 rather than half an answer
  assert.equal(outcome.status, 502);
  assert.equal(outcome.ended, 'cleanly');
  await until(() => gateway.router.getStats().inFlightRequests === 0, 'the ticket released');
});

test("an engine's /tokenize answering ids that are not token ids: the request is routed on its text, not refused", async () => {
  const tokens: unknown[] = [[-1, 2], ['x'], [1.5], [1e300], []];
  let asked = 0;
  const tokenizing = await fakeEngine((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      if (req.url === '/tokenize') res.end(JSON.stringify({ tokens: tokens[asked++ % tokens.length] }));
      else res.end('{"id":"c1","object":"text_completion","choices":[]}');
    });
  });
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 't0', url: tokenizing.url }],
    tokenize: 'engine',
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    for (let i = 0; i < tokens.length; i++) {
      const res = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: `a prompt the engine tokenizes badly ${i}` }),
      });
      assert.equal(res.status, 200, `/tokenize answered ${JSON.stringify(tokens[i])}: ${await res.clone().text()}`);
      await res.text();
    }
    assert.equal(asked, tokens.length);
    assert.equal(gw.router.getStats().inFlightRequests, 0);
  } finally {
    await gw.close();
    await tokenizing.close();
  }
});

test("an engine refusing the gateway's credentials (401/403): the request goes elsewhere, the worker's circuit opens", async () => {
  const refusing = await answeringEngine(401, '{"error":"Unauthorized"}');
  const serving = await answeringEngine(200, '{"id":"c1","choices":[]}');
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [
      { id: 'wrong-key', url: refusing.url },
      { id: 'ok', url: serving.url },
    ],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    breakerFailures: 2,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    for (let i = 0; i < 4; i++) {
      const res = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: `request ${i}` }),
      });
      assert.equal(res.status, 200, `request ${i}: ${await res.clone().text()}`);
      assert.equal(res.headers.get('x-contextforge-worker'), 'ok');
      await res.text();
    }
    assert.equal(gw.router.listWorkers().find((w) => w.id === 'wrong-key')?.healthy, false);
    assert.equal(gw.router.getStats().inFlightRequests, 0);
  } finally {
    await gw.close();
    await refusing.close();
    await serving.close();
  }
});

test('engines that all answer 429 give the client a 429 with the shortest Retry-After they asked for', async () => {
  const busy = (retryAfter: string) =>
    answeringEngine(
      429,
      '{"error":{"message":"too many requests","type":"rate_limit_error","param":null,"code":null}}',
      { 'retry-after': retryAfter },
    );
  const engines = [await busy('7'), await busy('3')];
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: engines.map((e, i) => ({ id: `busy${i}`, url: e.url })),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    for (const stream of [false, true]) {
      const res = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'x', stream }),
      });
      const { error } = (await res.json()) as { error: { type: string } };
      assert.equal(res.status, 429, `stream: ${stream}`);
      assert.equal(res.headers.get('retry-after'), '3', `stream: ${stream}`);
      assert.equal(error.type, 'rate_limit_error');
    }
    assert.ok(
      engines.every((e) => e.requests >= 2),
      'each engine was tried',
    );
    assert.equal(gw.router.getStats().inFlightRequests, 0);
  } finally {
    await gw.close();
    for (const e of engines) await e.close();
  }
});

test('one engine overloaded and one failing: the client gets 502, not 429', async () => {
  const overloaded = await answeringEngine(429, '{}', { 'retry-after': '7' });
  const broken = await answeringEngine(500, '{}');
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [
      { id: 'overloaded', url: overloaded.url },
      { id: 'broken', url: broken.url },
    ],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'x' }),
    });
    await res.text();
    assert.equal(res.status, 502);
    assert.equal(res.headers.get('retry-after'), '1');
  } finally {
    await gw.close();
    await overloaded.close();
    await broken.close();
  }
});
