/**
 * A streamed request (`stream: true`) that the engine, or a proxy in front of it that does not
 * stream, answers with its whole completion as one JSON body. vLLM and SGLang never do so, but an
 * OpenAI client that asked for a stream reads events only: given a JSON body its SDK finds no
 * event in it and ends the stream empty, without an error. The gateway holds the whole completion
 * already, so it answers as the engine would have streamed it: one chunk per choice (the message
 * as its delta), the usage chunk when the client asked for it, then `data: [DONE]`. JSON that is
 * no completion is a failed attempt, as an answer of the wrong form is.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import OpenAI from 'openai';
import { badFirstGateway, fakeEngine, post, sample, type BadFirstGateway } from './harness.js';

const usage = { prompt_tokens: 5, total_tokens: 7, completion_tokens: 2, prompt_tokens_details: null };

/** vLLM's ChatCompletionResponse, as it writes one. */
const chatCompletion = (message: Record<string, unknown>, finish_reason = 'stop') => ({
  id: 'chatcmpl-7',
  object: 'chat.completion',
  created: 1_700_000_000,
  model: 'm',
  choices: [{ index: 0, message, logprobs: null, finish_reason, stop_reason: null }],
  service_tier: null,
  system_fingerprint: null,
  usage,
  prompt_logprobs: null,
  kv_transfer_params: null,
});

/** vLLM's CompletionResponse, as it writes one. */
const textCompletion = (...texts: string[]) => ({
  id: 'cmpl-9',
  object: 'text_completion',
  created: 1_700_000_000,
  model: 'm',
  choices: texts.map((text, index) => ({
    index,
    text,
    logprobs: null,
    finish_reason: 'length',
    stop_reason: null,
    prompt_logprobs: null,
  })),
  usage,
  kv_transfer_params: null,
});

/** An engine answering every completion with `body()` as JSON, with its length or chunked. */
const jsonEngine = (body: () => unknown, chunked = false) =>
  fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.method !== 'POST') return void res.writeHead(404).end();
    req.on('end', () => {
      const text = JSON.stringify(body());
      const headers: Record<string, string | number> = { 'content-type': 'application/json' };
      if (!chunked) headers['content-length'] = Buffer.byteLength(text);
      res.writeHead(200, headers);
      if (chunked) res.write(text.slice(0, 10));
      res.end(chunked ? text.slice(10) : text);
    });
  });

/** The data of each event of an SSE body, `[DONE]` included. */
const eventData = (text: string) =>
  text
    .split('\n\n')
    .filter(Boolean)
    .map((e) => {
      assert.match(e, /^data: /, `an SSE event: ${JSON.stringify(e)}`);
      return e.slice('data: '.length);
    });

async function settled(g: BadFirstGateway) {
  // the answer was the request's first token, and the request is released
  assert.equal(await sample(g.gateway.metrics, 'contextforge_time_to_first_byte_seconds_count'), 1);
  // the operator sees the worker that answers streams whole
  assert.equal(await sample(g.gateway.metrics, 'contextforge_whole_answers_streamed_total{worker="bad"}'), 1);
  assert.equal(g.router.getStats().inFlightRequests, 0);
  assert.equal(await sample(g.gateway.metrics, 'contextforge_upstream_failures_total'), 0);
  assert.equal(await sample(g.gateway.metrics, 'contextforge_stream_failures_total'), 0);
}

for (const chunked of [false, true]) {
  test(`a chat completion answered whole to a streamed request (${chunked ? 'chunked' : 'with its length'}) reaches the client as the stream of it`, async () => {
    const answer = chatCompletion({
      role: 'assistant',
      content: 'Hello there',
      reasoning_content: null,
      tool_calls: [],
    });
    const bad = await jsonEngine(() => answer, chunked);
    const g = await badFirstGateway(bad.url, false);
    try {
      const r = await post(g.base, '/v1/chat/completions', {
        model: 'm',
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
      });
      assert.equal(r.status, 200, r.text);
      assert.match(r.headers.get('content-type') ?? '', /^text\/event-stream/);
      assert.equal(r.headers.get('x-contextforge-worker'), 'bad');
      const data = eventData(r.text);
      assert.equal(data.pop(), '[DONE]');
      assert.deepEqual(
        data.map((d) => JSON.parse(d) as unknown),
        [
          {
            id: 'chatcmpl-7',
            object: 'chat.completion.chunk',
            created: 1_700_000_000,
            model: 'm',
            choices: [
              {
                index: 0,
                delta: { role: 'assistant', content: 'Hello there', reasoning_content: null },
                logprobs: null,
                finish_reason: 'stop',
                stop_reason: null,
              },
            ],
            service_tier: null,
            system_fingerprint: null,
            prompt_logprobs: null,
            kv_transfer_params: null,
          },
        ],
        'one chunk, no usage: the client did not ask for it',
      );
      await settled(g);
    } finally {
      await g.close();
      await bad.close();
    }
  });
}

test('the usage chunk comes when the client asked for it, and the OpenAI SDK reads the stream whole, tool calls included', async () => {
  const toolCall = { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } };
  const bad = await jsonEngine(() =>
    chatCompletion({ role: 'assistant', content: null, tool_calls: [toolCall] }, 'tool_calls'),
  );
  const g = await badFirstGateway(bad.url, false);
  try {
    const client = new OpenAI({ baseURL: `${g.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const stream = client.chat.completions.stream({
      model: 'm',
      messages: [{ role: 'user', content: 'weather?' }],
      stream_options: { include_usage: true },
    });
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    stream.on('chunk', (c) => chunks.push(c));
    const final = await stream.finalChatCompletion();
    assert.equal(final.id, 'chatcmpl-7');
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(final.choices[0].message.tool_calls, [toolCall]);
    assert.deepEqual(final.usage, usage);
    assert.equal(chunks.length, 2);
    assert.deepEqual(chunks[0].choices[0].delta.tool_calls, [{ index: 0, ...toolCall }]);
    assert.equal(chunks[0].usage, undefined);
    assert.deepEqual(chunks[1].choices, [], 'the usage chunk holds no choice, as the OpenAI API has it');
    assert.equal(chunks[1].object, 'chat.completion.chunk');
    await settled(g);
  } finally {
    await g.close();
    await bad.close();
  }
});

test('a text completion answered whole to a streamed request: one chunk per choice, then the usage chunk asked for', async () => {
  const bad = await jsonEngine(() => textCompletion('one', 'two'));
  const g = await badFirstGateway(bad.url, false);
  try {
    const client = new OpenAI({ baseURL: `${g.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const stream = await client.completions.create({
      model: 'm',
      prompt: 'count',
      n: 2,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks: OpenAI.Completions.Completion[] = [];
    for await (const c of stream) chunks.push(c);
    assert.deepEqual(
      chunks.map((c) => [c.object, c.id, c.choices.map((ch) => [ch.index, ch.text, ch.finish_reason]), c.usage]),
      [
        ['text_completion', 'cmpl-9', [[0, 'one', 'length']], undefined],
        ['text_completion', 'cmpl-9', [[1, 'two', 'length']], undefined],
        ['text_completion', 'cmpl-9', [], usage],
      ],
    );
    await settled(g);
  } finally {
    await g.close();
    await bad.close();
  }
});

test('JSON that is no completion, answered to a streamed request: a failed attempt, taken by another worker', async () => {
  const bad = await jsonEngine(() => ({ status: 'ok' }));
  const g = await badFirstGateway(bad.url, true);
  const alone = await badFirstGateway(bad.url, false);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'good');
    assert.match(r.text, /data: \[DONE\]\n\n$/);
    assert.equal(
      await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="bad",reason="malformed"}'),
      1,
    );
    const a = await post(alone.base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream: true });
    assert.equal(a.status, 502, a.text);
    assert.match(a.text, /\(last: bad, malformed\)/);
    assert.equal(await sample(g.gateway.metrics, 'contextforge_whole_answers_streamed_total'), 0);
    assert.equal(g.router.getStats().inFlightRequests, 0);
    assert.equal(alone.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await alone.close();
    await bad.close();
  }
});

test("an engine's error object for a client error, answered 200 to a streamed request, reaches the client as JSON of that status", async () => {
  const error = { error: { message: 'max_tokens is too large', type: 'BadRequestError', param: null, code: 400 } };
  const bad = await jsonEngine(() => error);
  const g = await badFirstGateway(bad.url, false);
  try {
    const r = await post(g.base, '/v1/completions', { prompt: 'p', max_tokens: 2, stream: true });
    assert.equal(r.status, 400, r.text);
    assert.match(r.headers.get('content-type') ?? '', /^application\/json/);
    assert.deepEqual(JSON.parse(r.text), error);
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await bad.close();
  }
});

test("a completion the gateway fails to make into a stream: the gateway's own 500, no failure of the engine's", async () => {
  // JSON.parse reads a value nested this deep, JSON.stringify (which recurses) fails to write it
  // again: a completion, read whole, that the gateway cannot make into a stream
  const nested = `${'['.repeat(100_000)}${']'.repeat(100_000)}`;
  const bad = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.method !== 'POST') return void res.writeHead(404).end();
    req.on('end', () => {
      const message = { role: 'assistant', content: 'a', nested: null };
      const text = JSON.stringify(chatCompletion(message)).replace('"nested":null', `"nested":${nested}`);
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }).end(text);
    });
  });
  const g = await badFirstGateway(bad.url, false);
  try {
    // more than open the worker's circuit if they counted as its failures (breakerFailures: 3)
    for (let i = 0; i < 4; i++) {
      const r = await post(g.base, '/v1/chat/completions', {
        model: 'm',
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
      });
      assert.equal(r.status, 500, r.text);
      assert.match(r.headers.get('content-type') ?? '', /^application\/json/);
      assert.equal(r.headers.get('x-contextforge-worker'), 'bad');
      assert.equal((JSON.parse(r.text) as { error: { type: string } }).error.type, 'server_error');
    }
    assert.equal(await sample(g.gateway.metrics, 'contextforge_upstream_failures_total'), 0);
    assert.deepEqual(g.gateway.health.reasons('bad'), []);
    assert.equal(g.router.getStats().inFlightRequests, 0);
  } finally {
    await g.close();
    await bad.close();
  }
});
