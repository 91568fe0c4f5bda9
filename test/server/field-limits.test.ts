/**
 * The client-controlled fields the engines key, log or look up by, and those that size what an
 * engine computes per token, are bounded, not by the body size alone:
 *
 * - ids and names the engines keep (vLLM's `request_id`, SGLang's `rid`, `session_id`,
 *   `session_params.id`/`.rid`, `lora_path`, `extra_key`): at most 4 × maxIdBytes UTF-8 bytes,
 *   as `model` and `user`;
 * - SGLang's `custom_logit_processor` (a serialized callable): at most 64 KiB;
 * - `logprobs` (completions), `top_logprobs` (chat) and SGLang's `top_logprobs_num`: integers
 *   from 0 to maxLogprobs (20);
 * - SGLang's `stop_regex`: as `stop`, at most maxStopSequences patterns of at most
 *   4 × maxIdBytes bytes;
 * - vLLM's `logprob_token_ids`: at most maxLogprobs token ids;
 * - `logit_bias`: at most MAX_BIASED_TOKENS (1,024) entries, each a number from -100 to 100;
 *   vLLM's `allowed_token_ids`: at most MAX_BIASED_TOKENS ids;
 * - the grammars, regexes and schemas an engine compiles (vLLM's `structured_outputs` and
 *   `guided_*`, `response_format`, SGLang's `regex`, `ebnf` and `json_schema`): at most
 *   maxGrammarBytes (64 KiB), a string as it is, an object as compact JSON, and so are the
 *   `parameters` of the tools an engine compiles (every tool's when `tool_choice` is
 *   `required`, the named one's when it names a function, the `strict` ones' under `auto`), together.
 *
 * Over a limit is a 400 naming the field, whose message never repeats the value, and nothing
 * reaches the engine; at the limit passes. The endpoint picker reads the body through the same
 * checks.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  checkRequestLimits,
  CUSTOM_LOGIT_PROCESSOR_BYTES,
  DEFAULT_REQUEST_LIMITS,
  GRAMMAR_FIELDS,
  MAX_BIASED_TOKENS,
} from '../../src/server/request-limits.js';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { bodyWith, LIMIT_PATHS, passes, postText, refused as refusedOn } from '../helpers/limit-checks.js';
import { resolveServe } from '../helpers/serve-config.js';
import { pickerFleetWithEnvoy } from '../epp/harness.js';

/** Refused on the fast path and on Fastify's route (a query string takes a request past the fast path). */
const refused = (setup: GatewayOnEngine, path: string, fields: object, param: string) =>
  refusedOn(setup, path, fields, param, ['', '?via=fastify']);

let defaults: GatewayOnEngine;
let tight: GatewayOnEngine;
/** No log probabilities at all. */
let none: GatewayOnEngine;
/** Grammars of at most 64 bytes. */
let grammar: GatewayOnEngine;
before(async () => {
  defaults = await gatewayOnEngine();
  grammar = await gatewayOnEngine({ limits: { maxGrammarBytes: 64 } });
  tight = await gatewayOnEngine({ limits: { maxIdBytes: 8, maxLogprobs: 2, maxStopSequences: 2 } });
  none = await gatewayOnEngine({ limits: { maxLogprobs: 0 } });
});
after(async () => {
  await defaults.close();
  await tight.close();
  await none.close();
  await grammar.close();
});

describe('ids and names the engines keep', () => {
  for (const param of ['request_id', 'rid', 'session_id', 'lora_path', 'extra_key'] as const) {
    for (const { path } of Object.values(LIMIT_PATHS)) {
      test(`${param}: over 4 × maxIdBytes bytes is refused, at it passes (${path})`, async () => {
        const message = await refused(defaults, path, { [param]: 'x'.repeat(1025) }, param);
        assert.equal(message, `${param} is longer than 1024 bytes`);
        await passes(defaults, path, { [param]: 'x'.repeat(1024) });
        await refused(defaults, path, { [param]: 'é'.repeat(513) }, param);
        await passes(defaults, path, { [param]: 'é'.repeat(512) });
        await refused(tight, path, { [param]: 'x'.repeat(33) }, param);
        await passes(tight, path, { [param]: 'x'.repeat(32) });
      });
    }
    test(`${param}: a megabyte value is refused without being echoed back; absent or null passes`, async () => {
      const message = await refused(defaults, LIMIT_PATHS.chat.path, { [param]: 'y'.repeat(1 << 20) }, param);
      assert.ok(!message.includes('yyyy'), message.slice(0, 80));
      await passes(defaults, LIMIT_PATHS.completions.path, { [param]: null });
    });
    test(`${param}: a value that is neither a string nor a list is refused, as the engines refuse it`, async () => {
      for (const value of [5, true, { id: 'x' }]) {
        const message = await refused(defaults, LIMIT_PATHS.completions.path, { [param]: value }, param);
        assert.match(message, new RegExp(`^${param} must be a string`));
      }
    });
  }
  test('SGLang’s lists (one per prompt) of rid, lora_path and extra_key: each element is bounded', async () => {
    const { path } = LIMIT_PATHS.completions;
    for (const param of ['rid', 'lora_path', 'extra_key']) {
      const message = await refused(defaults, path, { prompt: ['a', 'b'], [param]: ['ok', 'x'.repeat(1025)] }, param);
      assert.equal(message, `${param}[1] is longer than 1024 bytes`);
      await passes(defaults, path, { prompt: ['a', 'b'], [param]: ['x'.repeat(1024), 'ok'] });
      await refused(defaults, path, { prompt: ['a', 'b'], [param]: ['ok', 7] }, param);
    }
    // SGLang's lora_path list takes null for "the base model" (List[Optional[str]])
    await passes(defaults, path, { prompt: ['a', 'b'], lora_path: [null, 'adapter'] });
  });
  test('request_id and session_id are one string each (vLLM and SGLang declare str): a list is refused', async () => {
    await refused(defaults, LIMIT_PATHS.chat.path, { request_id: ['a'] }, 'request_id');
    await refused(defaults, LIMIT_PATHS.chat.path, { session_id: ['a'] }, 'session_id');
  });
  test('SGLang’s session_params: its id and rid are bounded as names', async () => {
    for (const { path } of Object.values(LIMIT_PATHS)) {
      for (const key of ['id', 'rid']) {
        const message = await refused(
          defaults,
          path,
          { session_params: { [key]: 'x'.repeat(1025) } },
          `session_params.${key}`,
        );
        assert.equal(message, `session_params.${key} is longer than 1024 bytes`);
        await refused(tight, path, { session_params: { [key]: 'x'.repeat(33) } }, `session_params.${key}`);
      }
      await passes(defaults, path, { session_params: { id: 'x'.repeat(1024), rid: 'r', offset: 3, replace: false } });
      await passes(defaults, path, { session_params: null });
    }
  });
});

describe("SGLang's per-prompt lists", () => {
  test('at most one entry per prompt of `prompt`; a chat is one prompt', async () => {
    const { path } = LIMIT_PATHS.completions;
    for (const param of ['rid', 'lora_path', 'extra_key']) {
      const message = await refused(defaults, path, { prompt: ['a', 'b'], [param]: ['x', 'y', 'z'] }, param);
      assert.equal(message, `${param} must have at most 2 entries, one per prompt`);
      await passes(defaults, path, { prompt: [[1], [2], [3]], [param]: ['x', 'y', 'z'] });
      await refused(defaults, path, { prompt: [1, 2, 3], [param]: ['x', 'y'] }, param);
      const chat = await refused(defaults, LIMIT_PATHS.chat.path, { [param]: ['x', 'y'] }, param);
      assert.equal(chat, `${param} must have at most 1 entry, one per prompt`);
      await passes(defaults, LIMIT_PATHS.chat.path, { [param]: ['x'] });
    }
  });
  test("token_ids_logprob is not read on SGLang's OpenAI paths (its request models have no such field)", async () => {
    for (const { path } of Object.values(LIMIT_PATHS))
      await passes(defaults, path, { token_ids_logprob: Array(100).fill(1) });
  });
});

describe('custom_logit_processor', () => {
  test('a serialized callable of at most 64 KiB passes, a longer one is refused and not echoed', async () => {
    assert.equal(CUSTOM_LOGIT_PROCESSOR_BYTES, 64 * 1024);
    for (const { path } of Object.values(LIMIT_PATHS)) {
      const big = 'a'.repeat(CUSTOM_LOGIT_PROCESSOR_BYTES);
      await passes(defaults, path, { custom_logit_processor: big });
      const message = await refused(defaults, path, { custom_logit_processor: big + 'b' }, 'custom_logit_processor');
      assert.equal(message, `custom_logit_processor is longer than ${CUSTOM_LOGIT_PROCESSOR_BYTES} bytes`);
      // not scaled by maxIdBytes: a callable is not an id
      await passes(tight, path, { custom_logit_processor: big });
    }
  });
  test('SGLang’s chat list form: each element is bounded', async () => {
    const { path } = LIMIT_PATHS.chat;
    const message = await refused(
      defaults,
      path,
      { custom_logit_processor: ['a'.repeat(CUSTOM_LOGIT_PROCESSOR_BYTES + 1)] },
      'custom_logit_processor',
    );
    assert.match(message, /^custom_logit_processor\[0\] is longer than/);
    await passes(defaults, path, { custom_logit_processor: ['{"callable": "80"}'] });
    await passes(defaults, path, { custom_logit_processor: [null] });
    await refused(defaults, path, { custom_logit_processor: 5 }, 'custom_logit_processor');
  });
});

describe('logprobs, top_logprobs and top_logprobs_num', () => {
  const cases = [
    { param: 'logprobs', path: LIMIT_PATHS.completions.path },
    { param: 'top_logprobs', path: LIMIT_PATHS.chat.path },
    { param: 'top_logprobs_num', path: LIMIT_PATHS.completions.path },
    { param: 'top_logprobs_num', path: LIMIT_PATHS.chat.path },
  ];
  for (const { param, path } of cases) {
    test(`${param}: an integer from 0 to maxLogprobs (${path})`, async () => {
      const extra = param === 'top_logprobs' ? { logprobs: true } : {};
      const message = await refused(defaults, path, { ...extra, [param]: 21 }, param);
      assert.match(message, new RegExp(`^${param} must be an integer from 0 to 20`));
      await passes(defaults, path, { ...extra, [param]: 20 });
      await passes(defaults, path, { ...extra, [param]: 0 });
      await passes(defaults, path, { ...extra, [param]: null });
      await refused(defaults, path, { ...extra, [param]: 1e9 }, param);
      await refused(tight, path, { ...extra, [param]: 3 }, param);
      await passes(tight, path, { ...extra, [param]: 2 });
    });
    test(`${param}: -1 (vLLM's "the whole vocabulary"), a string or a fraction is refused (${path})`, async () => {
      for (const value of [-1, '5', 2.5]) await refused(defaults, path, { [param]: value }, param);
    });
    test(`${param}: a boolean counts as 0 or 1, as vLLM's request models take it (${path})`, async () => {
      // pydantic's lax mode reads true as 1 for an Optional[int] field
      await passes(defaults, path, { [param]: true });
      await passes(defaults, path, { [param]: false });
      await refused(none, path, { [param]: true }, param);
      await passes(none, path, { [param]: false });
    });
  }
  test('vLLM’s prompt_logprobs is bounded as the others: an integer from 0 to maxLogprobs', async () => {
    for (const { path } of Object.values(LIMIT_PATHS)) {
      await passes(defaults, path, { prompt_logprobs: 20 });
      await passes(defaults, path, { prompt_logprobs: null });
      for (const value of [21, -1, 1000, '5'])
        await refused(defaults, path, { prompt_logprobs: value }, 'prompt_logprobs');
      await refused(tight, path, { prompt_logprobs: 3 }, 'prompt_logprobs');
    }
  });
  test('chat’s logprobs is a switch: true and false pass, a number is bounded as a count', async () => {
    const { path } = LIMIT_PATHS.chat;
    await passes(defaults, path, { logprobs: true, top_logprobs: 5 });
    await passes(defaults, path, { logprobs: false });
    await refused(defaults, path, { logprobs: 21 }, 'logprobs');
    await refused(defaults, path, { logprobs: -1 }, 'logprobs');
  });
});

describe("vLLM's logprob_token_ids", () => {
  const ids = (count: number) => Array.from({ length: count }, (_, i) => i);
  for (const { path } of Object.values(LIMIT_PATHS)) {
    test(`at most maxLogprobs token ids, each a token id (${path})`, async () => {
      const message = await refused(defaults, path, { logprobs: 1, logprob_token_ids: ids(21) }, 'logprob_token_ids');
      assert.equal(
        message,
        'logprob_token_ids has more than 20 token ids (the most log probabilities a token may report)',
      );
      await passes(defaults, path, { logprobs: 1, logprob_token_ids: ids(20) });
      await passes(defaults, path, { logprob_token_ids: null });
      await refused(defaults, path, { logprob_token_ids: [1, -1] }, 'logprob_token_ids[1]');
      await refused(defaults, path, { logprob_token_ids: 5 }, 'logprob_token_ids');
      await refused(tight, path, { logprob_token_ids: ids(3) }, 'logprob_token_ids');
      await passes(tight, path, { logprob_token_ids: ids(2) });
      await refused(none, path, { logprob_token_ids: [5] }, 'logprob_token_ids');
      await passes(none, path, { logprob_token_ids: [] });
    });
  }
});

describe('stop_regex', () => {
  const many = (count: number) => Array.from({ length: count }, (_, i) => `r${i}\\d+`);
  for (const { path } of Object.values(LIMIT_PATHS)) {
    test(`more patterns than maxStopSequences are refused, as many pass (${path})`, async () => {
      const message = await refused(defaults, path, { stop_regex: many(65) }, 'stop_regex');
      assert.match(message, /^stop_regex has more than 64 /);
      await passes(defaults, path, { stop_regex: many(64) });
      await refused(tight, path, { stop_regex: many(3) }, 'stop_regex');
      await passes(tight, path, { stop_regex: many(2) });
    });
  }
  test('each pattern is at most 4 × maxIdBytes UTF-8 bytes, in a list or alone', async () => {
    const { path } = LIMIT_PATHS.completions;
    await passes(defaults, path, { stop_regex: 'x'.repeat(1024) });
    await passes(defaults, path, { stop_regex: ['é'.repeat(512)] });
    const message = await refused(defaults, path, { stop_regex: ['ok', 'x'.repeat(1025)] }, 'stop_regex');
    assert.equal(message, 'stop_regex[1] is longer than 1024 bytes');
    await refused(defaults, path, { stop_regex: 'é'.repeat(513) }, 'stop_regex');
    await refused(tight, path, { stop_regex: 'x'.repeat(33) }, 'stop_regex');
    await passes(tight, path, { stop_regex: ['x'.repeat(32)] });
    await passes(defaults, path, { stop_regex: null });
  });
});

describe('logit_bias and allowed_token_ids', () => {
  /** A logit_bias of `count` entries, token ids 0, 1, … each biased by `value`. */
  const bias = (count: number, value: unknown = 1) =>
    Object.fromEntries(Array.from({ length: count }, (_, i) => [String(i), value]));
  const ids = (count: number) => Array.from({ length: count }, (_, i) => i);
  for (const { path } of Object.values(LIMIT_PATHS)) {
    test(`logit_bias: at most ${MAX_BIASED_TOKENS} entries pass, one more is refused (${path})`, async () => {
      assert.equal(MAX_BIASED_TOKENS, 1024);
      await passes(defaults, path, { logit_bias: bias(MAX_BIASED_TOKENS) });
      const message = await refused(defaults, path, { logit_bias: bias(MAX_BIASED_TOKENS + 1) }, 'logit_bias');
      assert.equal(message, 'logit_bias has more than 1024 entries (the most tokens a request may bias)');
      // what a probe sent: a map of a hundred thousand keys reaches no engine, refused before
      // the body is parsed (an object of more than --max-json-object-members)
      assert.equal(
        await refused(defaults, path, { logit_bias: bias(100_000) }, 'body'),
        'an object in the body has more than 4096 members',
      );
    });
    test(`logit_bias: each bias a number from -100 to 100, as the OpenAI API documents (${path})`, async () => {
      await passes(defaults, path, { logit_bias: { '50256': -100, '198': 100, '11': 0.5 } });
      await passes(defaults, path, { logit_bias: null });
      await passes(defaults, path, { logit_bias: {} });
      for (const value of [-100.5, 101, 1e9, '5', true, null, [1], { b: 1 }]) {
        const message = await refused(defaults, path, { logit_bias: { '7': 1, '8': value } }, 'logit_bias');
        assert.equal(message, 'logit_bias values must be numbers from -100 to 100 (the bias added to a token’s logit)');
      }
    });
    test(`logit_bias: anything but an object is refused (${path})`, async () => {
      for (const value of [[1, 2], 'x', 5, true]) {
        const message = await refused(defaults, path, { logit_bias: value }, 'logit_bias');
        assert.equal(message, 'logit_bias must be an object mapping token ids to biases');
      }
    });
    test(`vLLM’s allowed_token_ids: at most ${MAX_BIASED_TOKENS} ids (${path})`, async () => {
      await passes(defaults, path, { allowed_token_ids: ids(MAX_BIASED_TOKENS) });
      await passes(defaults, path, { allowed_token_ids: null });
      const message = await refused(
        defaults,
        path,
        { allowed_token_ids: ids(MAX_BIASED_TOKENS + 1) },
        'allowed_token_ids',
      );
      assert.equal(message, 'allowed_token_ids has more than 1024 ids (the most tokens a request may bias)');
      await refused(defaults, path, { allowed_token_ids: ids(100_000) }, 'allowed_token_ids');
    });
  }
});

describe('grammars, regexes and schemas the engine compiles', () => {
  const KIB64 = 64 * 1024;
  /** The fields whose value is a string (a regex, a grammar, a schema's text) in the engines' request models. */
  const STRING_FIELDS = [
    'guided_regex',
    'guided_grammar',
    'guided_whitespace_pattern',
    'structural_tag',
    'regex',
    'ebnf',
  ];
  test('the fields: vLLM’s structured_outputs and guided_*, response_format, SGLang’s regex, ebnf and json_schema', () => {
    assert.deepEqual([...GRAMMAR_FIELDS].sort(), [
      'ebnf',
      'guided_choice',
      'guided_grammar',
      'guided_json',
      'guided_regex',
      'guided_whitespace_pattern',
      'json_schema',
      'regex',
      'response_format',
      'structural_tag',
      'structured_outputs',
    ]);
    assert.equal(DEFAULT_REQUEST_LIMITS.maxGrammarBytes, KIB64);
  });
  for (const { path } of Object.values(LIMIT_PATHS)) {
    test(`a string of at most maxGrammarBytes UTF-8 bytes passes, a longer one is refused, not echoed (${path})`, async () => {
      for (const param of [...STRING_FIELDS, 'guided_json', 'json_schema']) {
        await passes(defaults, path, { [param]: 'x'.repeat(KIB64) });
        const message = await refused(defaults, path, { [param]: 'x'.repeat(KIB64 + 1) }, param);
        assert.equal(
          message,
          `${param} is longer than ${KIB64} bytes (the largest grammar, regex or schema an engine compiles)`,
        );
        await refused(grammar, path, { [param]: 'é'.repeat(33) }, param);
        await passes(grammar, path, { [param]: 'é'.repeat(32) });
      }
    });
    test(`an object or list is measured as compact JSON (${path})`, async () => {
      // {"type":"json_schema","json_schema":{"schema":{"x":"…"}}}: 56 bytes and the string
      const format = (n: number) => ({ type: 'json_schema', json_schema: { schema: { x: 'y'.repeat(n) } } });
      assert.equal(JSON.stringify(format(8)).length, 64);
      await passes(grammar, path, { response_format: format(8) });
      const message = await refused(grammar, path, { response_format: format(9) }, 'response_format');
      assert.equal(
        message,
        'response_format is longer than 64 bytes as JSON (the largest grammar, regex or schema an engine compiles)',
      );
      // {"regex":"…"}: 12 bytes and the pattern, its backslashes escaped as JSON writes them
      await passes(grammar, path, { structured_outputs: { regex: '\\d'.repeat(17) } });
      await refused(grammar, path, { structured_outputs: { regex: '\\d'.repeat(18) } }, 'structured_outputs');
      // {"a":["…"]}: 10 bytes and two bytes a character
      await passes(grammar, path, { guided_json: { a: ['é'.repeat(27)] } });
      await refused(grammar, path, { guided_json: { a: ['é'.repeat(28)] } }, 'guided_json');
      // ["a","a",…]: 4 bytes an entry, and the brackets less a comma
      await passes(grammar, path, { guided_choice: Array(15).fill('a') });
      await refused(grammar, path, { guided_choice: Array(16).fill('a') }, 'guided_choice');
      await refused(defaults, path, { guided_choice: Array(100_000).fill('yes') }, 'guided_choice');
      for (const param of GRAMMAR_FIELDS) await passes(grammar, path, { [param]: null });
    });
  }
  describe('tools whose parameters the engine compiles (tool_choice required or naming one)', () => {
    const chat = LIMIT_PATHS.chat.path;
    /** A function tool whose parameters schema is {"x":"…"}: 8 bytes and the string. */
    const tool = (name: string, n: number) => ({
      type: 'function',
      function: { name, parameters: { x: 'y'.repeat(n) } },
    });
    const named = (name: string) => ({ type: 'function', function: { name } });
    test('tool_choice "required": every tool’s parameters are bounded together (one schema is compiled of them), named by the tool that passes the bound', async () => {
      const tools = [tool('a', 24), tool('b', 25)];
      const message = await refused(grammar, chat, { tools, tool_choice: 'required' }, 'tools[1].function.parameters');
      assert.equal(
        message,
        "tools[1].function.parameters takes the tools' parameters the engine compiles past 64 bytes as JSON (the largest grammar, regex or schema an engine compiles)",
      );
      await passes(grammar, chat, { tools: [tool('a', 24), tool('b', 24)], tool_choice: 'required' });
      // split over many tools, a schema is no smaller
      await refused(
        grammar,
        chat,
        { tools: Array.from({ length: 16 }, (_, i) => tool(`t${i}`, 30)), tool_choice: 'required' },
        'tools[1].function.parameters',
      );
    });
    test('tool_choice auto or absent: the tools marked strict are compiled (SGLang) and bounded', async () => {
      const strict = (name: string, n: number) => ({
        type: 'function',
        function: { ...tool(name, n).function, strict: true },
      });
      for (const choice of ['auto', undefined, null]) {
        await refused(
          grammar,
          chat,
          { tools: [tool('big', 1000), strict('s', 57)], tool_choice: choice },
          'tools[1].function.parameters',
        );
        await passes(grammar, chat, { tools: [tool('big', 1000), strict('s', 56)], tool_choice: choice });
      }
      await passes(grammar, chat, { tools: [strict('s', 1000)], tool_choice: 'none' });
    });
    test('tool_choice naming a function: that tool’s parameters are bounded, the others are not', async () => {
      const tools = [tool('big', 1000), tool('f', 57)];
      await refused(grammar, chat, { tools, tool_choice: named('f') }, 'tools[1].function.parameters');
      await passes(grammar, chat, { tools: [tool('big', 1000), tool('f', 56)], tool_choice: named('f') });
    });
    test('completions take no tools (neither engine reads them there): not bounded there', async () => {
      await passes(grammar, LIMIT_PATHS.completions.path, { tools: [tool('a', 1000)], tool_choice: 'required' });
    });
    test('tool_choice auto, none or absent: tool lists are not bounded by maxGrammarBytes', async () => {
      const tools = [tool('a', 1000), tool('b', 1000)];
      for (const choice of ['auto', 'none', undefined, null])
        await passes(grammar, chat, { tools, tool_choice: choice });
    });
  });
});

test('vLLM’s prompt_embeds without prompt is forwarded, routed with nothing to hash', async () => {
  await passes(defaults, LIMIT_PATHS.completions.path, { prompt: undefined, prompt_embeds: 'AAAA' });
  await passes(defaults, LIMIT_PATHS.completions.path, { prompt: undefined, prompt_embeds: ['AAAA', 'BBBB'] });
  await refused(defaults, LIMIT_PATHS.completions.path, { prompt: undefined }, 'prompt');
});

describe('through the endpoint picker', () => {
  const picker = pickerFleetWithEnvoy({ engines: 1 });
  const CASES = [
    { path: '/v1/completions', fields: { prompt: 'p', logprobs: 21 }, param: 'logprobs' },
    { path: '/v1/completions', fields: { prompt: 'p', rid: 'x'.repeat(1025) }, param: 'rid' },
    {
      path: '/v1/chat/completions',
      fields: { messages: [{ role: 'user', content: 'p' }], stop_regex: Array(65).fill('a') },
      param: 'stop_regex',
    },
    {
      path: '/v1/chat/completions',
      fields: { messages: [{ role: 'user', content: 'p' }], session_params: { id: 'x'.repeat(1025) } },
      param: 'session_params.id',
    },
    {
      path: '/v1/chat/completions',
      fields: { messages: [{ role: 'user', content: 'p' }], logprobs: true, logprob_token_ids: Array(21).fill(7) },
      param: 'logprob_token_ids',
    },
    { path: '/v1/completions', fields: { prompt: Array(257).fill('p') }, param: 'prompt' },
    {
      path: '/v1/chat/completions',
      fields: { messages: [{ role: 'user', content: 'p' }], logit_bias: { '5': 101 } },
      param: 'logit_bias',
    },
    {
      path: '/v1/completions',
      fields: { prompt: 'p', allowed_token_ids: Array(1025).fill(1) },
      param: 'allowed_token_ids',
    },
    {
      path: '/v1/completions',
      fields: { prompt: 'p', guided_regex: 'x'.repeat(64 * 1024 + 1) },
      param: 'guided_regex',
    },
    {
      path: '/v1/chat/completions',
      fields: { messages: [{ role: 'user', content: 'p' }], structured_outputs: { grammar: 'x'.repeat(64 * 1024) } },
      param: 'structured_outputs',
    },
    {
      path: '/v1/chat/completions',
      fields: {
        messages: [{ role: 'user', content: 'p' }],
        tools: [{ type: 'function', function: { name: 'f', parameters: { x: 'x'.repeat(64 * 1024) } } }],
        tool_choice: 'required',
      },
      param: 'tools[0].function.parameters',
    },
    {
      path: '/v1/completions',
      fields: { prompt: Array(200).fill('p'), prompt_embeds: Array(57).fill('A') },
      param: 'prompt_embeds',
    },
    // a path the picker does not know: a body with prompt_embeds is a completion, as one with prompt is
    { path: '/predict', fields: { prompt_embeds: Array(257).fill('A') }, param: 'prompt_embeds' },
  ];
  for (const { path, fields, param } of CASES) {
    test(`${param} over its limit is refused with 400 naming it (${path})`, async () => {
      const out = await picker.envoy.request({
        headers: { ':path': path },
        body: JSON.stringify({ model: 'mock', ...fields }),
      });
      assert.equal(out.kind, 'immediate');
      if (out.kind !== 'immediate') return;
      assert.equal(out.status, 400);
      const { error } = JSON.parse(out.body) as { error: { param: string; message: string } };
      assert.equal(error.param, param);
      assert.ok(!error.message.includes('xxxx'), error.message.slice(0, 80));
    });
  }
  test('prompt_embeds without prompt is routed', async () => {
    const out = await picker.envoy.request({
      headers: { ':path': '/v1/completions' },
      body: JSON.stringify({ model: 'mock', prompt_embeds: ['AAAA', 'BBBB'] }),
    });
    assert.equal(out.kind, 'routed');
    if (out.kind === 'routed') await out.stream.end();
  });
  test('at the limits the request is routed', async () => {
    const out = await picker.envoy.request({
      headers: { ':path': '/v1/completions' },
      body: JSON.stringify({
        model: 'mock',
        prompt: Array(256).fill('p'),
        logprobs: 20,
        logprob_token_ids: Array(20).fill(7),
        rid: 'x'.repeat(1024),
        stop_regex: ['a'],
      }),
    });
    assert.equal(out.kind, 'routed');
    if (out.kind === 'routed') await out.stream.end();
  });
});

describe('numbers past the largest double, and max_tokens', () => {
  /** The body of `path` with `members` (JSON text) added, posted on the fast path and on Fastify's route. */
  const post = (path: string, members: string, query = '') => {
    const base = JSON.stringify(bodyWith(path, {}));
    return postText(defaults, path, `${base.slice(0, -1)},${members}}`, query);
  };
  const FIELDS = ['temperature', 'top_p', 'presence_penalty', 'frequency_penalty', 'min_p', 'repetition_penalty'];
  for (const { path } of Object.values(LIMIT_PATHS)) {
    test(`a sampling field of 1e999 or -1e999 is a 400 naming it, and reaches no engine (${path})`, async () => {
      for (const field of [...FIELDS, 'top_k', 'seed', 'max_tokens', 'max_completion_tokens'])
        for (const literal of ['1e999', '-1e999'])
          for (const query of ['', '?via=fastify']) {
            const r = await post(path, `"${field}":${literal}`, query);
            assert.deepEqual(
              [r.status, r.error?.param, r.error?.type, r.reached],
              [400, field, 'invalid_request_error', 0],
            );
          }
      const r = await post(path, '"temperature":1e999');
      assert.equal(
        r.error?.message,
        'temperature must be a finite number: its literal is past the largest double, which the engine reads as infinity',
      );
      const nested = await post(
        path,
        '"stream":true,"stream_options":{"include_usage":true},"vllm_xargs":{"w":[0.5,-1e999]}',
      );
      assert.deepEqual([nested.status, nested.error?.param], [400, 'vllm_xargs.w[1]']);
    });
    test(`max_tokens and max_completion_tokens: a non-negative integer or null, as n is checked (${path})`, async () => {
      for (const field of ['max_tokens', 'max_completion_tokens']) {
        for (const value of [0, 16, null]) await passes(defaults, path, { [field]: value });
        for (const value of ['16', true, 1.5, -1, 2 ** 53]) {
          const message = await refused(defaults, path, { [field]: value }, field);
          assert.equal(message, `${field} must be a non-negative integer (the most tokens to generate)`);
        }
      }
    });
  }
  test('numbers the engine renders into the prompt or compiles keep an overflow, forwarded as written', async () => {
    const tools = '"tools":[{"type":"function","function":{"name":"f","parameters":{"maximum":1E400}}}]';
    const r = await post(LIMIT_PATHS.chat.path, `${tools},"response_format":{"type":"json_object","x":-1e999}`);
    assert.deepEqual([r.status, r.reached], [200, 1]);
    const finite = await post(LIMIT_PATHS.completions.path, '"seed":18446744073709551557,"temperature":1e-999');
    assert.deepEqual([finite.status, finite.reached], [200, 1]);
  });
});

test('maxLogprobs is a setting: default 20 (the OpenAI API’s top_logprobs maximum), 0 or more', () => {
  assert.equal(DEFAULT_REQUEST_LIMITS.maxLogprobs, 20);
  assert.equal(checkRequestLimits({ maxLogprobs: 0 }).maxLogprobs, 0);
  assert.throws(() => checkRequestLimits({ maxLogprobs: -1 }), { message: 'limits.maxLogprobs must be >= 0 (got -1)' });
  assert.equal(resolveServe(['--max-logprobs', '5']).config.maxLogprobs, 5);
  assert.equal(resolveServe([], { CONTEXTFORGE_MAX_LOGPROBS: '7' }).config.maxLogprobs, 7);
  assert.equal(resolveServe([]).config.maxLogprobs, 20);
});

test('maxGrammarBytes is a setting: default 64 KiB, 1 or more', () => {
  assert.equal(checkRequestLimits({ maxGrammarBytes: 1 }).maxGrammarBytes, 1);
  assert.throws(() => checkRequestLimits({ maxGrammarBytes: 0 }), {
    message: 'limits.maxGrammarBytes must be >= 1 (got 0)',
  });
  assert.equal(resolveServe(['--max-grammar-bytes', '1024']).config.maxGrammarBytes, 1024);
  assert.equal(resolveServe([], { CONTEXTFORGE_MAX_GRAMMAR_BYTES: '2048' }).config.maxGrammarBytes, 2048);
  assert.equal(resolveServe([]).config.maxGrammarBytes, 64 * 1024);
});
