/**
 * A whole completion made into the stream a streamed request asked for (whole-answer-stream.ts):
 * the chunks as the OpenAI API and vLLM write them, and JSON that is no completion left alone.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { wholeAnswerEvents } from '../../src/server/whole-answer-stream.js';

const events = (answer: unknown, chat: boolean, includeUsage = false) => {
  const text = typeof answer === 'string' ? answer : JSON.stringify(answer);
  return wholeAnswerEvents(Buffer.from(text), chat, includeUsage)?.toString();
};

test('each choice is a chunk of its own, then the usage chunk when asked for, then [DONE]', () => {
  const answer = {
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1,
    model: 'm',
    choices: [
      { index: 0, message: { content: 'a' }, finish_reason: 'stop' },
      { index: 1, message: { role: 'assistant', content: 'b', tool_calls: [] }, finish_reason: 'length' },
    ],
    usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
    system_fingerprint: 'fp',
  };
  const chunk = (choices: unknown[], extra: object) =>
    `data: ${JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices, ...extra })}\n\n`;
  assert.equal(
    events(answer, true, true),
    chunk([{ index: 0, delta: { role: 'assistant', content: 'a' }, finish_reason: 'stop' }], {
      system_fingerprint: 'fp',
    }) +
      chunk([{ index: 1, delta: { role: 'assistant', content: 'b' }, finish_reason: 'length' }], {}) +
      chunk([], { usage: answer.usage }) +
      'data: [DONE]\n\n',
    "the answer's other members in the first chunk only",
  );
});

test("a large member of the answer goes once: the stream is about the answer's size, whatever its number of choices", () => {
  // vLLM's answer carries prompt_logprobs (and prompt_token_ids) at its top level, as large as
  // the client makes them, and the client sets n
  const n = 8;
  const answer = JSON.stringify({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1,
    model: 'm',
    choices: Array.from({ length: n }, (_, index) => ({
      index,
      message: { role: 'assistant', content: 'a' },
      logprobs: null,
      finish_reason: 'stop',
      stop_reason: null,
    })),
    usage: { prompt_tokens: 1, completion_tokens: n, total_tokens: n + 1 },
    prompt_logprobs: [null, { '1': { logprob: 0, rank: 1, decoded_token: 'x'.repeat(1024 * 1024) } }],
    prompt_token_ids: Array.from({ length: 1000 }, (_, i) => i),
    kv_transfer_params: null,
  });
  const out = wholeAnswerEvents(Buffer.from(answer), true, true)!;
  // each chunk's own members (id, object, created, model, the SSE framing) and the usage chunk
  const perChunk = 200;
  assert.ok(
    out.length <= answer.length + (n + 2) * perChunk,
    `a stream of ${out.length} bytes for an answer of ${answer.length}`,
  );
  const chunks = out
    .toString()
    .split('\n\n')
    .filter((e) => e !== '' && e !== 'data: [DONE]')
    .map((e) => JSON.parse(e.slice('data: '.length)) as Record<string, unknown>);
  assert.equal(chunks.length, n + 1);
  assert.deepEqual(Object.keys(chunks[0]), [
    'id',
    'object',
    'created',
    'model',
    'choices',
    'prompt_logprobs',
    'prompt_token_ids',
    'kv_transfer_params',
  ]);
  for (const chunk of chunks.slice(1)) assert.deepEqual(Object.keys(chunk).slice(5), chunk.usage ? ['usage'] : []);
});

test("a tool call keeps an index of its own, and gets its place's when it has none", () => {
  const calls = [
    { id: 'c0', type: 'function', function: { name: 'f', arguments: '{}' } },
    { index: 5, id: 'c1' },
  ];
  const out = events({ choices: [{ index: 0, message: { content: null, tool_calls: calls } }] }, true);
  const first = JSON.parse(out!.split('\n\n')[0].slice('data: '.length)) as {
    choices: Array<{ delta: { tool_calls: unknown[] } }>;
  };
  assert.deepEqual(first.choices[0].delta.tool_calls, [{ index: 0, ...calls[0] }, calls[1]]);
});

test('a text completion keeps its object and its choices as they are; a byte order mark before it is skipped', () => {
  const choice = { index: 0, text: 'x', logprobs: null, finish_reason: 'length', stop_reason: null };
  assert.equal(
    events(
      `\uFEFF${JSON.stringify({ id: 'cmpl-1', object: 'text_completion', choices: [choice], usage: null })}`,
      false,
    ),
    `data: ${JSON.stringify({ id: 'cmpl-1', object: 'text_completion', choices: [choice] })}\n\ndata: [DONE]\n\n`,
  );
});

test('JSON that is no completion of the kind asked for is none', () => {
  for (const [answer, chat] of [
    ['{"choices": [', false],
    [[], false],
    [{ status: 'ok' }, false],
    [{ choices: {} }, false],
    [{ choices: [{ index: 0, message: { content: 'a' } }] }, false],
    [{ choices: [{ index: 0, text: 'a' }] }, true],
    [{ object: 'chat.completion', choices: [{ index: 0, text: 'a' }] }, false],
    [{ object: 'chat.completion.chunk', choices: [{ index: 0, message: {} }] }, true],
    [{ choices: [null] }, true],
  ] as const)
    assert.equal(events(answer, chat), undefined, JSON.stringify(answer));
});
