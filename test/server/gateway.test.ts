import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { KvEventSubscriber } from '../../src/engines/kv-events/subscriber.js';
import type { ChatMessage } from '../../src/core/hashing.js';
import { MockEngine, mockChatPrompt, mockTokenize } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { settled, until } from '../helpers/wait.js';

// The official openai SDK (v6) against the router, two mock engines behind it with KV events.
let gateway: Gateway;
let base = '';
let client: OpenAI;
const engines: MockEngine[] = [];
const subs: KvEventSubscriber[] = [];

before(async () => {
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
  const applier = new KvEventApplier(router);
  for (let i = 0; i < 2; i++)
    engines.push(
      await new MockEngine({ decodeTokS: 2000, events: 'tcp://127.0.0.1:*', replay: 'tcp://127.0.0.1:*' }).start(),
    );
  gateway = await createGateway({
    router,
    workers: engines.map((e, i) => ({ id: `e${i}`, url: `http://127.0.0.1:${e.port}` })),
    adminToken: 'sekret-token',
    bodyLimit: 64 * 1024,
    cachedTokensHeader: true,
    // token ids from the engine's /tokenize: the keys the engines' KV events are hashed to
    tokenize: 'engine',
  });
  engines.forEach((e, i) =>
    subs.push(
      new KvEventSubscriber({
        workerId: `e${i}`,
        endpoint: e.eventsEndpoint,
        replayEndpoint: e.replayEndpoint,
        applier,
      }).start(),
    ),
  );
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  for (const s of subs) await s.close();
  await gateway.close();
  for (const e of engines) await e.close();
});

const longDoc = Array.from({ length: 300 }, (_, i) => `fact${i % 97}`).join(' ');

describe('the gateway through the openai SDK', () => {
  test('chat completions, with the router headers', async () => {
    const { data, response } = await client.chat.completions
      .create({ model: 'mock', messages: [{ role: 'user', content: 'hello' }], max_tokens: 3 })
      .withResponse();
    assert.equal(data.choices[0].message.role, 'assistant');
    assert.equal(data.usage!.completion_tokens, 3);
    assert.match(response.headers.get('x-contextforge-worker')!, /^e[01]$/);
    // the suite's first request: nothing is cached anywhere yet
    assert.equal(response.headers.get('x-contextforge-cached-tokens'), '0');
  });

  test('completions with a text prompt and with token ids', async () => {
    const a = await client.completions.create({ model: 'mock', prompt: 'Once upon a time', max_tokens: 2 });
    assert.equal(a.usage!.completion_tokens, 2);
    const b = await client.completions.create({ model: 'mock', prompt: [101, 102, 103], max_tokens: 1 });
    assert.equal(b.usage!.prompt_tokens, 3);
  });

  test('streaming passes through, with the usage chunk', async () => {
    const stream = await client.chat.completions.create({
      model: 'mock',
      messages: [{ role: 'user', content: 'stream please' }],
      max_tokens: 6,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, 'tok0 tok1 tok2 tok3 tok4 tok5 ');
    assert.equal(usage?.completion_tokens, 6);
  });

  test('a conversation stays on the worker that holds its prefix, and the router says so', async () => {
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'system', content: longDoc },
      { role: 'user', content: 'first question' },
    ];
    const first = await client.chat.completions.create({ model: 'mock', messages, max_tokens: 2 }).withResponse();
    const worker = first.response.headers.get('x-contextforge-worker');
    const next: OpenAI.ChatCompletionMessageParam[] = [
      ...messages,
      { role: 'assistant', content: 'ok' },
      { role: 'user', content: 'second' },
    ];
    // the engine's KV events reach the router: wait (with a deadline) until it predicts the prefix cached
    const predicted = async () =>
      (
        (await (
          await fetch(`${base}/v1/route`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', authorization: 'Bearer sekret-token' },
            body: JSON.stringify({ messages: next }),
          })
        ).json()) as { cachedTokens: number }
      ).cachedTokens;
    await until(async () => (await predicted()) > 0, 'the router to predict the prefix cached');
    const prediction = await predicted();
    const second = await client.chat.completions
      .create({ model: 'mock', messages: next, max_tokens: 2 })
      .withResponse();
    assert.equal(second.response.headers.get('x-contextforge-worker'), worker);
    assert.equal(second.response.headers.get('x-contextforge-cached-tokens'), String(prediction));
    // the engine's hit: the full 16-token blocks of the prefix both prompts share, in its own tokens
    const a = mockTokenize(mockChatPrompt(messages as ChatMessage[]));
    const b = mockTokenize(mockChatPrompt(next as ChatMessage[]));
    let shared = 0;
    while (shared < a.length && a[shared] === b[shared]) shared++;
    assert.equal(
      second.data.usage!.prompt_tokens_details!.cached_tokens,
      Math.floor(shared / 16) * 16,
      'the engine found the shared prefix cached',
    );
  });

  test('error responses from an engine come back as OpenAI errors', async () => {
    await assert.rejects(
      client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 }),
      (e: unknown) => e instanceof OpenAI.NotFoundError,
    );
  });
});

describe('the gateway over plain HTTP', () => {
  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${base}${path}`, {
      method: 'POST',
      body: typeof body === 'string' ? body : JSON.stringify(body),
      headers: { 'content-type': 'application/json', ...headers },
    });

  test('/v1/route answers the decision and its explanation without forwarding', async () => {
    const res = await post(
      '/v1/route',
      { messages: [{ role: 'user', content: 'dry run' }] },
      { 'x-workflow-id': 'wf-1', 'x-workflow-step': '2', authorization: 'Bearer sekret-token' },
    );
    assert.equal(res.status, 200);
    const r = (await res.json()) as {
      worker: string;
      policy: string;
      explain: Array<{ worker: string; terms: object }>;
    };
    assert.match(r.worker, /^e[01]$/);
    assert.equal(r.policy, 'cost');
    assert.equal(r.explain.length, 2);
  });

  test('malformed requests get a 4xx JSON error and the router stays up', async () => {
    const cases: Array<[string, unknown, Record<string, string>, number, RegExp]> = [
      ['/v1/chat/completions', '{oops', {}, 400, /JSON/i],
      ['/v1/chat/completions', { messages: [] }, {}, 400, /messages/],
      ['/v1/chat/completions', { messages: [{ content: 'x' }] }, {}, 400, /role/],
      ['/v1/completions', { prompt: { a: 1 } }, {}, 400, /prompt/],
      ['/v1/completions', { prompt: 'x' }, { 'x-workflow-step': 'abc' }, 400, /x-workflow-step/],
      ['/v1/completions', { prompt: 'x', contextforge: 5 }, {}, 400, /contextforge/],
      ['/v1/completions', { prompt: 'x'.repeat(70_000) }, {}, 413, /too large/],
      ['/v1/nothing', {}, {}, 404, /no route/],
      // an unknown path is a 404 whatever its body
      ['/v1/nothing', '{oops', {}, 404, /no route POST \/v1\/nothing/],
      ['/v1/chat/completion', '{oops', {}, 404, /no route/],
      ['/v1/nothing', '['.repeat(1000), {}, 404, /no route/],
      ['/v1/nothing', '{}', { 'content-encoding': 'gzip' }, 404, /no route/],
      ['/v1/nothing', '{}', { 'content-type': 'json' }, 404, /no route/],
      ['/v1/nothing', { prompt: 'x'.repeat(70_000) }, {}, 404, /no route/],
    ];
    for (const [path, body, headers, status, message] of cases) {
      const res = await post(path, body, headers);
      assert.equal(res.status, status, `${path} ${String(JSON.stringify(body)).slice(0, 30)}`);
      const err = (await res.json()) as { error: { message: string } };
      assert.match(err.error.message, message);
    }
    assert.equal((await fetch(`${base}/healthz`)).status, 200);
  });

  test('/v1/models is the union over the workers; /readyz and /metrics answer', async () => {
    const models = (await (await fetch(`${base}/v1/models`)).json()) as { data: Array<{ id: string }> };
    assert.deepEqual(
      models.data.map((m) => m.id),
      ['mock'],
    );
    assert.equal((await fetch(`${base}/readyz`)).status, 200);
    const metrics = await (await fetch(`${base}/metrics`)).text();
    for (const name of [
      'contextforge_requests_total',
      'contextforge_route_decisions_total',
      'contextforge_time_to_first_byte_seconds',
      'contextforge_worker_kv_usage',
      'contextforge_index_entries',
    ]) {
      assert.match(metrics, new RegExp(name));
    }
  });

  test('admin endpoints need the bearer token; workers can be added, drained and removed', async () => {
    assert.equal((await fetch(`${base}/admin/workers`)).status, 401);
    const auth = { authorization: 'Bearer sekret-token' };
    const list = (await (await fetch(`${base}/admin/workers`, { headers: auth })).json()) as {
      workers: Array<{ id: string }>;
    };
    assert.deepEqual(
      list.workers.map((w) => w.id),
      ['e0', 'e1'],
    );
    assert.equal((await post('/admin/workers', { id: 'dead', url: 'http://127.0.0.1:1' }, auth)).status, 201);
    assert.equal((await post('/admin/workers', { id: 'dead', url: 'http://127.0.0.1:1' }, auth)).status, 409);
    assert.equal((await post('/admin/workers', { id: 'x', url: 'ftp://nope' }, auth)).status, 400);
    // a "__proto__" key is refused by name, as any unknown key is, not dropped unseen
    const proto = await post('/admin/workers', '{"id":"p","url":"http://127.0.0.1:1","__proto__":{"dpSize":2}}', auth);
    assert.equal(proto.status, 400);
    const protoError = (await proto.json()) as { error: { message: string; param: string | null } };
    assert.match(protoError.error.message, /__proto__ is not a known key/);
    assert.equal(protoError.error.param, '__proto__');
    // a worker that refuses connections: requests fail over to the others, none is lost
    for (let i = 0; i < 6; i++) {
      const res = await post('/v1/completions', { prompt: `failover ${i}`, max_tokens: 1 });
      assert.equal(res.status, 200);
      assert.notEqual(res.headers.get('x-contextforge-worker'), 'dead');
    }
    assert.equal((await post('/admin/workers/e1/drain', {}, auth)).status, 200);
    for (let i = 0; i < 3; i++)
      assert.equal(
        (await post('/v1/completions', { prompt: `drain ${i}`, max_tokens: 1 })).headers.get('x-contextforge-worker'),
        'e0',
      );
    assert.equal((await post('/admin/workers/e1/resume', {}, auth)).status, 200);
    assert.equal((await fetch(`${base}/admin/workers/dead`, { method: 'DELETE', headers: auth })).status, 200);
    assert.equal((await fetch(`${base}/admin/workers/dead`, { method: 'DELETE', headers: auth })).status, 404);
  });

  test('a client that disconnects mid-stream reaches the engine', async () => {
    const ac = new AbortController();
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: 'a very long story', max_tokens: 5000, stream: true }),
      headers: { 'content-type': 'application/json' },
      signal: ac.signal,
    });
    const worker = Number(res.headers.get('x-contextforge-worker')!.slice(1));
    await res.body!.getReader().read();
    const running = async () =>
      /vllm:num_requests_running\{[^}]*\} (\d+)/.exec(
        await (await fetch(`http://127.0.0.1:${engines[worker].port}/metrics`)).text(),
      )![1];
    assert.equal(await running(), '1');
    ac.abort();
    assert.equal(await settled(running, (n) => n === '0'), '0');
    // and the router released its in-flight count
    const inFlight = async () =>
      (
        (await (await fetch(`${base}/admin/stats`, { headers: { authorization: 'Bearer sekret-token' } })).json()) as {
          inFlightRequests: number;
        }
      ).inFlightRequests;
    assert.equal(await settled(inFlight, (n) => n === 0), 0);
  });
});

test('workers that list their models only get requests for those models; admin adds workers with models', async () => {
  const a = await new MockEngine({ model: 'alpha' }).start();
  const b = await new MockEngine({ model: 'beta' }).start();
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gw = await createGateway({
    router,
    workers: [{ id: 'a', url: `http://127.0.0.1:${a.port}`, models: ['alpha'] }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  const auth = { authorization: `Bearer ${gw.adminToken}` };
  const post = (path: string, body: unknown) =>
    fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...auth },
      body: JSON.stringify(body),
    });
  const added = await post('/admin/workers', { id: 'b', url: `http://127.0.0.1:${b.port}`, models: ['beta'] });
  assert.equal(added.status, 201);
  const badModels = await post('/admin/workers', { id: 'c', url: 'http://127.0.0.1:1', models: 'beta' });
  assert.equal(badModels.status, 400);
  assert.match(((await badModels.json()) as { error: { message: string } }).error.message, /models must be a list/);
  for (const model of ['alpha', 'beta', 'alpha', 'beta']) {
    const r = await post('/v1/completions', { model, prompt: 'same prompt', max_tokens: 1 });
    assert.equal(r.status, 200, `model ${model}`);
    assert.equal(r.headers.get('x-contextforge-worker'), model === 'alpha' ? 'a' : 'b');
    await r.arrayBuffer();
  }
  const route = (await (await post('/v1/route', { model: 'beta', prompt: 'same prompt' })).json()) as {
    worker: string;
  };
  assert.equal(route.worker, 'b');
  const none = await post('/v1/completions', { model: 'gamma', prompt: 'x' });
  assert.equal(none.status, 404);
  assert.equal(((await none.json()) as { error: { code: string } }).error.code, 'model_not_found');
  const listed = (await (await fetch(`${url}/admin/workers`, { headers: auth })).json()) as {
    workers: Array<{ id: string; models: string[] | null }>;
  };
  assert.deepEqual(
    listed.workers.map((w) => [w.id, w.models]),
    [
      ['a', ['alpha']],
      ['b', ['beta']],
    ],
  );
  await gw.close();
  await a.close();
  await b.close();
});
