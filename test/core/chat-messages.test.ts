import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, describe, test } from 'node:test';
import { Tokenizer } from '@huggingface/tokenizers';
import { checkChatMessages, CONTENT_PART_TYPES } from '../../src/core/chat-messages.js';
import { ChatTokenizer, UntokenizableContentError } from '../../src/engines/chat-tokenizer.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { readMessages, RequestLimitError } from '../../src/server/request-limits.js';
import { REFUSED_PARTS, VLLM_PARTS } from '../helpers/content-parts.js';

/** Bad messages, the field each is refused for, and the message. */
const BAD: Array<{ messages: unknown; field: string; message: string | RegExp }> = [
  { messages: 'hi', field: 'messages', message: 'messages must be a non-empty array' },
  { messages: [null], field: 'messages[0]', message: 'messages[0] must be an object' },
  { messages: [['user', 'hi']], field: 'messages[0]', message: 'messages[0] must be an object' },
  { messages: [{ content: 'x' }], field: 'messages[0].role', message: 'messages[0] must have a string role' },
  { messages: [{ role: '', content: 'x' }], field: 'messages[0].role', message: 'messages[0] must have a string role' },
  {
    messages: [
      { role: 'user', content: 'a' },
      { role: 'user', name: 3 },
    ],
    field: 'messages[1].name',
    message: 'messages[1].name must be a string',
  },
  {
    messages: [{ role: 'user', content: 5 }],
    field: 'messages[0].content',
    message: 'messages[0].content must be a string, null or a list of content parts',
  },
  // each part vLLM refuses, after a good one (vllm/entrypoints/chat_utils.py)
  ...REFUSED_PARTS.map(({ part, field, message }) => ({
    messages: [{ role: 'user', content: [{ type: 'text', text: 'look' }, part] }],
    field: `messages[0].content[1]${field}`,
    message: typeof message === 'string' ? `messages[0].content[1]${message}` : message,
  })),
];

const GOOD = [
  { role: 'system', content: 'be brief' },
  {
    role: 'user',
    name: 'ana',
    content: [
      { type: 'text', text: 'hi' },
      { type: 'image_url', image_url: 'http://x' },
    ],
  },
  { role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] },
  { role: 'assistant', content: null },
  { role: 'tool' },
  // each part vLLM takes beyond OpenAI's own, after a good one
  ...VLLM_PARTS.map(({ part }) => ({ role: 'user', content: [{ type: 'text', text: 'look' }, part] })),
];

const matches = (actual: string, expected: string | RegExp) =>
  typeof expected === 'string' ? assert.equal(actual, expected) : assert.match(actual, expected);

describe('the chat-message check', () => {
  test('good messages pass and come back as they are', () => {
    assert.equal(checkChatMessages(GOOD), GOOD);
    for (const { name, part } of VLLM_PARTS)
      assert.doesNotThrow(() => checkChatMessages([{ role: 'user', content: [part] }]), name);
    // every type is taken in the shape vLLM reads it in
    const types = new Set(VLLM_PARTS.map(({ part }) => (part as { type?: unknown }).type));
    for (const type of CONTENT_PART_TYPES) if (type !== 'file') assert.ok(types.has(type), type);
    assert.doesNotThrow(() =>
      checkChatMessages([{ role: 'user', content: [{ type: 'file', file: { file_id: 'f' } }] }]),
    );
  });

  test('each bad field is reported with its path, through the error the caller builds', () => {
    for (const bad of BAD) {
      const faults: Array<[string, string]> = [];
      assert.throws(
        () =>
          checkChatMessages(bad.messages, (message, field) => {
            faults.push([message, field]);
            return new RangeError(message);
          }),
        RangeError,
      );
      assert.equal(faults.length, 1);
      matches(faults[0][0], bad.message);
      assert.equal(faults[0][1], bad.field, JSON.stringify(bad.messages));
    }
    assert.throws(() => checkChatMessages([{ role: 7 }]), TypeError);
  });

  test('an empty list passes only when allowed', () => {
    assert.throws(() => checkChatMessages([]), /messages must be a non-empty array/);
    assert.deepEqual(checkChatMessages([], undefined, true), []);
    assert.throws(() => checkChatMessages({}, undefined, true), /^TypeError: messages must be an array$/);
  });
});

describe('every place messages enter refuses the same messages alike', () => {
  const dir = new URL('../fixtures/tokenizer/', import.meta.url);
  const config = JSON.parse(readFileSync(new URL('tokenizer_config.json', dir), 'utf8')) as { chat_template: string };
  const tokenizer = new ChatTokenizer(
    new Tokenizer(JSON.parse(readFileSync(new URL('tokenizer.json', dir), 'utf8')) as object, config),
    config,
  );
  const router = new KVAwareRouter();
  router.registerWorker('w0');
  let engine: MockEngine | undefined;
  after(async () => engine?.close());

  test('route(), the gateway request check, the chat tokenizer and the mock engine', async () => {
    engine = await new MockEngine({}).start();
    for (const bad of BAD) {
      // route() accepts an empty list but otherwise refuses what the others refuse
      assert.throws(
        () => router.route({ messages: bad.messages as never }),
        (e: Error) => {
          assert.ok(e instanceof TypeError);
          matches(e.message, bad.field === 'messages' ? 'messages must be an array' : bad.message);
          return true;
        },
      );
      assert.throws(
        () => readMessages(bad.messages),
        (e: unknown) => {
          assert.ok(e instanceof RequestLimitError);
          assert.equal(e.param, bad.field);
          matches(e.message, bad.message);
          return true;
        },
      );
      assert.throws(
        () => tokenizer.tokenizeChatRequest({ messages: bad.messages as never }),
        (e: Error) => {
          assert.ok(e instanceof RangeError);
          matches(e.message, bad.message);
          return true;
        },
      );
      const res = await fetch(`http://127.0.0.1:${engine.port}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'mock', messages: bad.messages, max_tokens: 1 }),
      });
      assert.equal(res.status, 400);
      const { error } = (await res.json()) as { error: { message: string; param: string } };
      assert.equal(error.param, bad.field);
      matches(error.message, bad.message);
    }
    assert.equal(router.route({ messages: GOOD as never }).workerId, 'w0');
    assert.equal(router.route({ messages: [] }).blocks, 0);
  });

  test('the chat tokenizer reads a plain string and each text-like part as text; media without a type is media', () => {
    const tokens = (...content: unknown[]) =>
      tokenizer.tokenizeChatRequest({ messages: [{ role: 'user', content }] as never });
    const hi = tokens({ type: 'text', text: 'hi' });
    assert.deepEqual(tokens('hi'), hi);
    assert.deepEqual(tokens({ type: 'thinking', thinking: 'hi' }), hi);
    assert.deepEqual(tokens({ type: 'output_text', text: 'hi' }), hi);
    assert.deepEqual(tokens({ type: 'text', text: null }, 'hi'), hi);
    for (const media of [{ image_url: 'http://x/a.png' }, { type: 'image_url', image_url: null, uuid: 'img-1' }])
      assert.throws(
        () => tokens('hi', media),
        (e: Error) => e instanceof UntokenizableContentError && /a image_url part cannot be tokenized/u.test(e.message),
      );
  });
});
