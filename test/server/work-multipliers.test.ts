/**
 * The fields that multiply an engine's work for one request — the prompts of `prompt`, `n` and
 * `best_of` (sequences run), `stop`, `bad_words` and `stop_token_ids` (checked at every generated
 * token) — are bounded by maxPrompts, maxChoices and maxStopSequences, not by the body size alone: over a limit is a 400 naming the field and
 * nothing reaches the engine; at the limit, and whatever the OpenAI API accepts, passes.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { checkRequestLimits, DEFAULT_REQUEST_LIMITS } from '../../src/server/request-limits.js';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { LIMIT_PATHS, passes, postText, refused } from '../helpers/limit-checks.js';
import { resolveServe } from '../helpers/serve-config.js';

let defaults: GatewayOnEngine;
let tight: GatewayOnEngine;
before(async () => {
  defaults = await gatewayOnEngine();
  tight = await gatewayOnEngine({ limits: { maxChoices: 3, maxStopSequences: 2, maxIdBytes: 8, maxPrompts: 2 } });
});
after(async () => {
  await defaults.close();
  await tight.close();
});

describe('n and best_of', () => {
  test('a 30-byte body asking for a hundred million choices is refused', async () => {
    const text = '{"prompt":"x","n":100000000}';
    assert.ok(text.length <= 30);
    const r = await postText(defaults, LIMIT_PATHS.completions.path, text);
    assert.deepEqual([r.status, r.error?.param, r.reached], [400, 'n', 0]);
    assert.match(r.error!.message, /^n must be an integer from 1 to 128/);
  });
  for (const { path } of Object.values(LIMIT_PATHS)) {
    test(`over maxChoices is refused, at it passes (${path})`, async () => {
      await refused(defaults, path, { n: 129 }, 'n');
      await refused(defaults, path, { best_of: 129 }, 'best_of');
      await refused(defaults, path, { n: 1e20 }, 'n');
      await passes(defaults, path, { n: 128, best_of: 128 });
      await refused(tight, path, { n: 4 }, 'n');
      await refused(tight, path, { n: 2, best_of: 4 }, 'best_of');
      await passes(tight, path, { n: 3, best_of: 3 });
    });
  }
  test('a number the engines would coerce from a string is refused, as the OpenAI API refuses it', async () => {
    // pydantic (vLLM, SGLang) reads "100000000" as the integer
    await refused(defaults, LIMIT_PATHS.completions.path, { n: '100000000' }, 'n');
    await refused(defaults, LIMIT_PATHS.completions.path, { best_of: '2' }, 'best_of');
    await refused(defaults, LIMIT_PATHS.completions.path, { n: 0 }, 'n');
    await refused(defaults, LIMIT_PATHS.completions.path, { n: 2.5 }, 'n');
    await refused(defaults, LIMIT_PATHS.completions.path, { n: true }, 'n');
  });
  test('absent or null is the engine’s default', async () => {
    await passes(defaults, LIMIT_PATHS.completions.path, { n: null, best_of: null });
    await passes(defaults, LIMIT_PATHS.chat.path, {});
  });
});

describe('prompts', () => {
  const { path } = LIMIT_PATHS.completions;
  test('a list of more than maxPrompts prompts is refused before its elements are read; at it passes', async () => {
    const message = await refused(defaults, path, { prompt: Array(257).fill('a') }, 'prompt');
    assert.equal(message, 'prompt has more than 256 prompts (--max-prompts)');
    await refused(defaults, path, { prompt: Array(257).fill([1, 2]) }, 'prompt');
    // the count, not the bad element, is what a long list is refused for
    assert.match(
      await refused(defaults, path, { prompt: [[1], [-1], ...Array(255).fill([1])] }, 'prompt'),
      /^prompt has/,
    );
    await passes(defaults, path, { prompt: Array(256).fill('a'), n: 128 });
    await refused(tight, path, { prompt: ['a', 'b', 'c'] }, 'prompt');
    await passes(tight, path, { prompt: [[1], [2]] });
  });
  test('a list of token ids is one prompt, however long', async () => {
    await passes(tight, path, { prompt: Array.from({ length: 5000 }, (_, i) => i) });
  });
});

describe('stop', () => {
  for (const { path } of Object.values(LIMIT_PATHS)) {
    test(`more stop sequences than maxStopSequences are refused, as many pass (${path})`, async () => {
      const many = (count: number) => Array.from({ length: count }, (_, i) => `s${i}`);
      const message = await refused(defaults, path, { stop: many(65) }, 'stop');
      assert.match(message, /more than 64/);
      await passes(defaults, path, { stop: many(64) });
      await refused(tight, path, { stop: many(3) }, 'stop');
      await passes(tight, path, { stop: many(2) });
    });
  }
  test('each stop string is at most 4 × maxIdBytes UTF-8 bytes, in a list or alone', async () => {
    const { path } = LIMIT_PATHS.completions;
    await passes(defaults, path, { stop: ['x'.repeat(1024)] });
    await passes(defaults, path, { stop: 'é'.repeat(512) });
    const message = await refused(defaults, path, { stop: ['ok', 'x'.repeat(1025)] }, 'stop');
    assert.match(message, /stop\[1\] is longer than 1024 bytes/);
    await refused(defaults, path, { stop: 'é'.repeat(513) }, 'stop');
    await refused(tight, path, { stop: 'x'.repeat(33) }, 'stop');
    await passes(tight, path, { stop: ['x'.repeat(32)] });
  });
  test('what the OpenAI API and the engines’ own examples send passes', async () => {
    const { path } = LIMIT_PATHS.chat;
    for (const stop of ['\n', ['\n\n', '</s>', '<|im_end|>', 'Observation:'], [], null])
      await passes(defaults, path, { stop });
  });
});

describe('bad_words and stop_token_ids', () => {
  const many = (count: number) => Array.from({ length: count }, (_, i) => `w${i}`);
  for (const { path } of Object.values(LIMIT_PATHS)) {
    test(`more bad_words than maxStopSequences are refused, as many pass (${path})`, async () => {
      const message = await refused(defaults, path, { bad_words: many(65) }, 'bad_words');
      assert.match(message, /^bad_words has more than 64 /);
      await passes(defaults, path, { bad_words: many(64) });
      await refused(tight, path, { bad_words: many(3) }, 'bad_words');
      await passes(tight, path, { bad_words: many(2) });
    });
    test(`more stop_token_ids than maxStopSequences are refused, as many pass (${path})`, async () => {
      const ids = (count: number) => Array.from({ length: count }, (_, i) => i + 1);
      const message = await refused(defaults, path, { stop_token_ids: ids(65) }, 'stop_token_ids');
      assert.match(message, /^stop_token_ids has more than 64 /);
      await passes(defaults, path, { stop_token_ids: ids(64) });
      await refused(tight, path, { stop_token_ids: ids(3) }, 'stop_token_ids');
      await passes(tight, path, { stop_token_ids: [128001, 128009] });
    });
  }
  test('each bad word is at most 4 × maxIdBytes UTF-8 bytes, as a stop string is', async () => {
    const { path } = LIMIT_PATHS.completions;
    await passes(defaults, path, { bad_words: ['x'.repeat(1024), 'é'.repeat(512)] });
    const message = await refused(defaults, path, { bad_words: ['ok', 'x'.repeat(1025)] }, 'bad_words');
    assert.match(message, /bad_words\[1\] is longer than 1024 bytes/);
    await refused(tight, path, { bad_words: ['x'.repeat(33)] }, 'bad_words');
    await passes(tight, path, { bad_words: ['x'.repeat(32)] });
  });
  test('absent, null or empty is the engine’s default', async () => {
    await passes(defaults, LIMIT_PATHS.completions.path, { bad_words: null, stop_token_ids: null });
    await passes(defaults, LIMIT_PATHS.chat.path, { bad_words: [], stop_token_ids: [] });
  });
});

test('the limits are settings with defaults past what the OpenAI API accepts (n <= 128, stop <= 4), prompts 256', () => {
  assert.equal(DEFAULT_REQUEST_LIMITS.maxChoices, 128);
  assert.equal(DEFAULT_REQUEST_LIMITS.maxStopSequences, 64);
  assert.equal(DEFAULT_REQUEST_LIMITS.maxPrompts, 256);
  assert.equal(resolveServe(['--max-prompts', '5']).config.maxPrompts, 5);
  assert.equal(resolveServe([], { CONTEXTFORGE_MAX_PROMPTS: '7' }).config.maxPrompts, 7);
  assert.equal(resolveServe([]).config.maxPrompts, 256);
  assert.throws(() => checkRequestLimits({ maxPrompts: 0 }), { message: 'limits.maxPrompts must be >= 1 (got 0)' });
  assert.equal(checkRequestLimits({ maxChoices: 1, maxStopSequences: 1 }).maxStopSequences, 1);
  assert.throws(() => checkRequestLimits({ maxChoices: 0 }), { message: 'limits.maxChoices must be >= 1 (got 0)' });
  assert.throws(() => checkRequestLimits({ maxStopSequences: 0 }), {
    message: 'limits.maxStopSequences must be >= 1 (got 0)',
  });
});
