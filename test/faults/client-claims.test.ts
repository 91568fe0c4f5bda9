/**
 * What a client claims about its own request, taken at its word only as far as it can be:
 * content anchors that claim more cached tokens than the prompt has, metadata headers given
 * twice.
 */
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { after, before, test } from 'node:test';
import { ChatTokenizer } from '../../src/engines/chat-tokenizer.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { fakeEngine } from './harness.js';

let engine: MockEngine;
let gateway: Gateway;
let base = '';

before(async () => {
  engine = await new MockEngine({ decodeTokS: 10_000 }).start();
  gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
    cachedTokensHeader: true,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close();
  await engine.close();
});

const counter = async (name: string) => {
  const text = await (await fetch(`${base}/metrics`)).text();
  return Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
};

test('an anchor claiming 2^53 tokens cannot push the cached-tokens metric or header past the prompt', async () => {
  const body = JSON.stringify({
    prompt: 'hi',
    max_tokens: 1,
    contextforge: { anchors: [{ id: 'huge', tokens: Number.MAX_SAFE_INTEGER }] },
  });
  const headers: string[] = [];
  // the first request records the anchor on the worker, the second is scored with it
  for (let i = 0; i < 2; i++) {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    });
    assert.equal(res.status, 200);
    headers.push(res.headers.get('x-contextforge-cached-tokens') ?? '');
    await res.text();
  }
  const cached = await counter('contextforge_predicted_cached_tokens_total');
  const prompt = await counter('contextforge_prompt_tokens_total');
  assert.ok(cached <= prompt, `cached tokens counted (${cached}) exceed the prompt tokens counted (${prompt})`);
  for (const h of headers) assert.ok(Number(h) <= prompt, `x-contextforge-cached-tokens: ${h}`);
});

/** POSTs `body` with `headers` as given (an array value is sent as repeated header lines; no content-length: chunked). */
function postRaw(
  path: string,
  body: string,
  headers: Record<string, string | string[]>,
): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = request(`${base}${path}`, { method: 'POST', headers }, (res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode!, text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

test('a metadata header given twice is refused naming it, not read as the values joined', async () => {
  const body = JSON.stringify({ prompt: 'a request with repeated metadata headers', max_tokens: 1 });
  const framings: Array<Record<string, string>> = [{ 'content-length': String(Buffer.byteLength(body)) }, {}];
  for (const framing of framings) {
    // with a length the request takes the gateway's fast path, chunked it goes through Fastify
    for (const [name, values] of [
      ['x-workflow-id', ['wf-a', 'wf-b']],
      ['x-agent-role', ['planner', 'judge']],
      ['x-workflow-step', ['1', '2']],
      ['x-kv-isolate', ['1', '0']],
    ] as const) {
      const res = await postRaw('/v1/completions', body, {
        'content-type': 'application/json',
        ...framing,
        [name]: [...values],
      });
      assert.equal(res.status, 400, `${JSON.stringify(framing)} ${name}: ${res.text}`);
      const { error } = JSON.parse(res.text) as { error: { message: string; param: string } };
      assert.equal(error.param, name);
      assert.match(error.message, /given once/);
    }
  }
  // a list header repeated is the list of both; one header holding ", " is one value
  const ok = await postRaw('/v1/completions', body, {
    'content-type': 'application/json',
    'x-anchor-ids': ['a1', 'a2'],
    'x-agent-role': 'planner, v2',
  });
  assert.equal(ok.status, 200, ok.text);
});

test('a model no worker serves is a 404 that does not echo a long model name; a 1 MB one is a 400', async () => {
  const gw = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}`, models: ['mock'] }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    // the longest name the limits take (4 × maxIdBytes) and one far past them
    for (const [model, status, code] of [
      ['m'.repeat(1024), 404, 'model_not_found'],
      ['m'.repeat(1 << 20), 400, null],
    ] as const) {
      const res = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'x', model }),
      });
      assert.equal(res.status, status, `a ${model.length}-byte model name`);
      const text = await res.text();
      const { error } = JSON.parse(text) as { error: { param: string; code: string | null } };
      assert.deepEqual([error.param, error.code], ['model', code]);
      assert.ok(text.length < 1024, `the error is ${text.length} bytes`);
    }
  } finally {
    await gw.close();
  }
});

test("tokenizer mode: a chat field the template cannot take is a 400 naming that field, not 'messages'", async () => {
  const gw = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
    tokenize: 'tokenizer',
    promptTokenizer: ChatTokenizer.load(new URL('../fixtures/tokenizer/', import.meta.url).pathname),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const messages = [{ role: 'user', content: 'hi' }];
    for (const [extra, param, says] of [
      [{ tools: 'x' }, 'tools', /tools must be a list/],
      [{ tools: [null] }, 'tools[0]', /tools\[0\] must be/],
      [{ documents: 5 }, 'documents', /documents must be a list/],
      [{ chat_template_kwargs: [] }, 'chat_template_kwargs', /must be an object/],
      [{ add_generation_prompt: 'yes' }, 'add_generation_prompt', /must be true or false/],
      [{ continue_final_message: 'x' }, 'continue_final_message', /must be true or false/],
      [{ continue_final_message: true, add_generation_prompt: true }, 'continue_final_message', /cannot both be true/],
    ] as const) {
      const res = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages, max_tokens: 1, ...extra }),
      });
      const text = await res.text();
      assert.equal(res.status, 400, `${JSON.stringify(extra)}: ${text}`);
      const { error } = JSON.parse(text) as { error: { message: string; param: string } };
      assert.equal(error.param, param, JSON.stringify(extra));
      assert.match(error.message, says);
    }
  } finally {
    await gw.close();
  }
});

test('a prompt over maxPromptTokens is refused before anything is recorded or sent', async () => {
  let completions = 0; // not the gateway's own reads of /v1/models
  const engine = await fakeEngine((req, res) => {
    if (req.method === 'POST') completions++;
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[]}'));
  });
  const gw = await createGateway({
    router: new KVAwareRouter({ blockSize: 16, maxPromptTokens: 100_000 }),
    workers: [{ id: 'r0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const send = async (path: string, body: unknown) => {
      const res = await fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      return {
        status: res.status,
        error: (JSON.parse(await res.text()) as { error: { message: string; param: string } }).error,
      };
    };
    const ids = await send('/v1/completions', {
      prompt: Array.from({ length: 160_000 }, (_, i) => i % 1000),
      max_tokens: 1,
    });
    assert.equal(ids.status, 400);
    assert.equal(ids.error.param, 'prompt');
    assert.match(ids.error.message, /160000 tokens, more than the 100000/);
    const text = await send('/v1/completions', { prompt: 'x'.repeat(4 * 160_000), max_tokens: 1 });
    assert.equal(text.status, 400);
    assert.equal(text.error.param, 'prompt');
    const chat = await send('/v1/chat/completions', {
      messages: [{ role: 'user', content: 'y'.repeat(4 * 160_000) }],
      max_tokens: 1,
    });
    assert.equal(chat.status, 400);
    assert.equal(chat.error.param, 'messages');
    assert.equal(gw.router.getStats().index.entries, 0, 'index entries left by refused prompts');
    assert.equal(completions, 0, 'nothing reached the engine');
    assert.equal(gw.router.localLoad('r0').inFlightRequests, 0);
    // under the limit, the same gateway routes as before
    const ok = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: Array.from({ length: 1600 }, (_, i) => i), max_tokens: 1 }),
    });
    assert.equal(ok.status, 200);
    await ok.text();
    assert.equal(completions, 1);
  } finally {
    await gw.close();
    await engine.close();
  }
});

test('a chat over maxPromptTokens once tokenized in process names messages, not prompt', async () => {
  const gw = await createGateway({
    router: new KVAwareRouter({ blockSize: 16, maxPromptTokens: 100 }),
    workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
    tokenize: 'tokenizer',
    promptTokenizer: ChatTokenizer.load(new URL('../fixtures/tokenizer/', import.meta.url).pathname),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  try {
    const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'word '.repeat(300) }], max_tokens: 1 }),
    });
    const error = (JSON.parse(await res.text()) as { error: { message: string; param: string } }).error;
    assert.equal(res.status, 400);
    assert.match(error.message, /tokens, more than the 100 this router takes/);
    assert.equal(error.param, 'messages');
  } finally {
    await gw.close();
  }
});
