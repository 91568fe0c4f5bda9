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
      chunk([{ index: 1, delta: { role: 'assistant', content: 'b' }, finish_reason: 'length' }], {
        system_fingerprint: 'fp',
      }) +
      chunk([], { usage: answer.usage }) +
      'data: [DONE]\n\n',
  );
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
