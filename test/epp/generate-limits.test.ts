/**
 * The endpoint picker checks SGLang's native `/generate` bodies against the request limits the
 * gateway applies to the OpenAI paths, on the fields where they sit in SGLang's GenerateReqInput
 * (python/sglang/srt/managers/io_struct.py): `rid`, `session_id`, `session_params`, `lora_path`,
 * `extra_key`, `custom_logit_processor`, `top_logprobs_num` and `token_ids_logprob` at the top
 * level; `n`, `stop`, `stop_regex`, `stop_token_ids`, `logit_bias` and the constraints SGLang
 * compiles (`json_schema`, `regex`, `ebnf`, `structural_tag`) inside `sampling_params` (an object,
 * or a list of them, one per prompt). SGLang's lists hold at most one entry per prompt of the
 * body, and `text`, `input_ids` and `input_embeds` at most maxPrompts prompts.
 * A violation is an immediate 400 naming the field, and nothing is forwarded; at the limits the
 * body is routed as the client wrote it (but for the KV-transfer and code fields, removed by
 * default). `/v1/responses` and other paths are read for those fields only, as before.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { EnvoyRole } from './envoy-role.js';
import { startPickerFleet, type PickerFleet } from './harness.js';

let defaults: PickerFleet;
let tight: PickerFleet;
let defaultsEnvoy: EnvoyRole;
let tightEnvoy: EnvoyRole;
/** Limits small enough that a body at them is short; they come from the gateway's settings. */
const TIGHT = {
  maxIdBytes: 8,
  maxChoices: 2,
  maxStopSequences: 2,
  maxLogprobs: 2,
  maxPrompts: 2,
  maxGrammarBytes: 16,
  maxJsonObjectMembers: 8,
};
before(async () => {
  defaults = await startPickerFleet({ engines: 1 });
  tight = await startPickerFleet({ engines: 1, gateway: { limits: TIGHT } });
  defaultsEnvoy = new EnvoyRole(defaults.addresses[0]);
  tightEnvoy = new EnvoyRole(tight.addresses[0]);
});
after(async () => {
  defaultsEnvoy.close();
  tightEnvoy.close();
  await defaults.close();
  await tight.close();
});

/** The immediate response's status and error for `body` sent to `path`; fails if it was routed. */
async function refusal(envoy: EnvoyRole, path: string, body: string): Promise<{ status: number; param: string }> {
  const out = await envoy.request({ headers: { ':path': path }, body });
  if (out.kind === 'routed') await out.stream.end();
  assert.equal(out.kind, 'immediate', `${path} ${body.slice(0, 120)}: routed, not refused`);
  if (out.kind !== 'immediate') return { status: 0, param: '' };
  const { error } = JSON.parse(out.body) as { error: { param: string; message: string } };
  assert.ok(!error.message.includes('xxxx'), `the message repeats the value: ${error.message.slice(0, 80)}`);
  return { status: out.status, param: error.param };
}

/** The body Envoy forwards for `body` sent to `path` (the client's own when the picker changed nothing). */
async function forwarded(envoy: EnvoyRole, path: string, body: string): Promise<string> {
  const out = await envoy.request({ headers: { ':path': path }, body });
  assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
  if (out.kind !== 'routed') return '';
  const text = out.body.length > 0 ? out.body.toString() : body;
  await out.stream.end();
  return text;
}

const LONG_NAME = 'x'.repeat(1025); // 4 × maxIdBytes (256) + 1

describe("SGLang's /generate through the endpoint picker (default limits)", () => {
  const CASES: Array<{ name: string; body: object; param: string; path?: string }> = [
    {
      name: 'n of 10^8 in sampling_params',
      body: { text: 'hi', sampling_params: { n: 100_000_000 } },
      param: 'sampling_params.n',
    },
    { name: 'n as a string', body: { text: 'hi', sampling_params: { n: '100000000' } }, param: 'sampling_params.n' },
    {
      name: 'one bad element of list-form sampling_params',
      body: { text: ['a', 'b'], sampling_params: [{ max_new_tokens: 4 }, { n: 129 }] },
      param: 'sampling_params[1].n',
    },
    {
      name: '65 stop strings',
      body: { text: 'hi', sampling_params: { stop: Array(65).fill('a') } },
      param: 'sampling_params.stop',
    },
    {
      name: 'a stop string over 1 KiB in list-form sampling_params',
      body: { text: ['a', 'b'], sampling_params: [{ stop: 'a' }, { stop: ['b', 'x'.repeat(1025)] }] },
      param: 'sampling_params[1].stop',
    },
    {
      name: 'a stop_regex pattern over 1 KiB',
      body: { text: 'hi', sampling_params: { stop_regex: 'x'.repeat(1025) } },
      param: 'sampling_params.stop_regex',
    },
    {
      name: '65 stop_token_ids',
      body: { text: 'hi', sampling_params: { stop_token_ids: Array(65).fill(2) } },
      param: 'sampling_params.stop_token_ids',
    },
    { name: 'an over-long rid', body: { text: 'hi', rid: LONG_NAME }, param: 'rid' },
    { name: 'an over-long rid in a list', body: { text: ['a', 'b'], rid: ['r0', LONG_NAME] }, param: 'rid' },
    { name: 'an over-long lora_path', body: { text: 'hi', lora_path: LONG_NAME }, param: 'lora_path' },
    { name: 'an over-long extra_key', body: { text: 'hi', extra_key: LONG_NAME }, param: 'extra_key' },
    { name: 'an over-long session_id', body: { text: 'hi', session_id: LONG_NAME }, param: 'session_id' },
    {
      name: 'an over-long session_params.id',
      body: { text: 'hi', session_params: { id: LONG_NAME } },
      param: 'session_params.id',
    },
    {
      name: 'an over-long session_params.id in list-form session_params',
      body: { text: ['a', 'b'], session_params: [{ id: 's' }, { id: LONG_NAME }] },
      param: 'session_params[1].id',
    },
    {
      name: 'an over-long session_params.rid in list-form session_params',
      body: { text: ['a', 'b'], session_params: [null, { rid: LONG_NAME }] },
      param: 'session_params[1].rid',
    },
    {
      name: 'a custom_logit_processor over 64 KiB',
      body: { text: 'hi', custom_logit_processor: 'x'.repeat(64 * 1024 + 1) },
      param: 'custom_logit_processor',
    },
    {
      name: 'top_logprobs_num of 21',
      body: { text: 'hi', return_logprob: true, top_logprobs_num: 21 },
      param: 'top_logprobs_num',
    },
    {
      name: 'top_logprobs_num of -1 in a list',
      body: { text: ['a', 'b'], return_logprob: [true, true], top_logprobs_num: [0, -1] },
      param: 'top_logprobs_num[1]',
    },
    { name: 'three rids for two prompts', body: { text: ['a', 'b'], rid: ['r0', 'r1', 'r2'] }, param: 'rid' },
    {
      name: 'two rids for one prompt with n of 4 (one per prompt, not per sequence)',
      body: { text: ['a'], rid: ['r0', 'r1'], sampling_params: { n: 4 } },
      param: 'rid',
    },
    { name: 'two lora_paths for one prompt', body: { text: 'hi', lora_path: ['a', 'b'] }, param: 'lora_path' },
    {
      name: 'three extra_keys for two token-id prompts',
      body: { input_ids: [[1], [2]], extra_key: ['a', 'b', 'c'] },
      param: 'extra_key',
    },
    {
      name: 'two custom_logit_processors for one token-id prompt',
      body: { input_ids: [1, 2, 3], custom_logit_processor: [null, null] },
      param: 'custom_logit_processor',
    },
    {
      name: 'two session_params for one prompt',
      body: { text: 'hi', session_params: [{ id: 's' }, { id: 's' }] },
      param: 'session_params',
    },
    {
      name: 'three top_logprobs_num for two prompts',
      body: { text: ['a', 'b'], return_logprob: true, top_logprobs_num: [1, 1, 1] },
      param: 'top_logprobs_num',
    },
    {
      name: 'a hundred thousand sampling_params for one prompt',
      body: { text: 'hi', sampling_params: Array(100_000).fill(null) },
      param: 'sampling_params',
    },
    {
      name: '21 token_ids_logprob',
      body: { text: 'hi', return_logprob: true, token_ids_logprob: Array(21).fill(7) },
      param: 'token_ids_logprob',
    },
    {
      name: 'a negative id in token_ids_logprob',
      body: { text: 'hi', return_logprob: true, token_ids_logprob: [1, -1] },
      param: 'token_ids_logprob[1]',
    },
    {
      name: '21 ids in the second of list-form token_ids_logprob',
      body: { text: ['a', 'b'], return_logprob: true, token_ids_logprob: [[1], Array(21).fill(7)] },
      param: 'token_ids_logprob[1]',
    },
    {
      name: 'three token_ids_logprob lists for two prompts',
      body: { text: ['a', 'b'], return_logprob: true, token_ids_logprob: [[1], [2], [3]] },
      param: 'token_ids_logprob',
    },
    { name: '257 prompts in text', body: { text: Array(257).fill('a') }, param: 'text' },
    { name: '257 token-id prompts in input_ids', body: { input_ids: Array(257).fill([1]) }, param: 'input_ids' },
    {
      name: '257 prompts in an input_embeds batch',
      body: { input_embeds: Array(257).fill([[0.5]]) },
      param: 'input_embeds',
    },
    {
      name: 'a logit_bias of 1,025 entries in sampling_params',
      body: {
        text: 'hi',
        sampling_params: { logit_bias: Object.fromEntries(Array.from({ length: 1025 }, (_, i) => [String(i), 1])) },
      },
      param: 'sampling_params.logit_bias',
    },
    {
      name: 'a logit_bias of 101 in list-form sampling_params',
      body: { text: ['a', 'b'], sampling_params: [{ logit_bias: { '1': 5 } }, { logit_bias: { '1': 101 } }] },
      param: 'sampling_params[1].logit_bias',
    },
    ...['regex', 'ebnf', 'json_schema', 'structural_tag'].map((key) => ({
      name: `a ${key} over 64 KiB in sampling_params`,
      body: { text: 'hi', sampling_params: { [key]: 'x'.repeat(64 * 1024 + 1) } },
      param: `sampling_params.${key}`,
    })),
    {
      name: 'a regex over 64 KiB in list-form sampling_params',
      body: { text: ['a', 'b'], sampling_params: [{ regex: 'a' }, { regex: 'x'.repeat(64 * 1024 + 1) }] },
      param: 'sampling_params[1].regex',
    },
    {
      name: 'n of 10^8 with a query string',
      path: '/generate?trace=1',
      body: { text: 'hi', sampling_params: { n: 100_000_000 } },
      param: 'sampling_params.n',
    },
    {
      // a body with `prompt` is read as a completions body by its shape; its sampling_params
      // reach SGLang all the same
      name: 'n of 10^8 beside a prompt field',
      body: { model: 'mock', prompt: 'p', text: 'hi', sampling_params: { n: 100_000_000 } },
      param: 'sampling_params.n',
    },
  ];
  for (const { name, body, param, path } of CASES) {
    test(`${name}: 400 naming ${param}, nothing forwarded`, async () => {
      const { status, param: named } = await refusal(defaultsEnvoy, path ?? '/generate', JSON.stringify(body));
      assert.equal(status, 400);
      assert.equal(named, param);
    });
  }

  test('a number past the largest double (1e999, which SGLang reads as inf) is a 400 naming its path', async () => {
    for (const [body, param] of [
      ['{"text":"hi","sampling_params":{"temperature":1e999}}', 'sampling_params.temperature'],
      ['{"text":["a","b"],"sampling_params":[{},{"top_p":-1e999}]}', 'sampling_params[1].top_p'],
      ['{"input_embeds":[[0.5,1e999]]}', 'input_embeds[0][1]'],
      ['{"text":"hi","sampling_params":{"max_new_tokens":"8"}}', 'sampling_params.max_new_tokens'],
      ['{"text":"hi","sampling_params":{"max_new_tokens":-1}}', 'sampling_params.max_new_tokens'],
    ])
      assert.deepEqual(await refusal(defaultsEnvoy, '/generate', body), { status: 400, param }, body);
    // the OpenAI paths the picker reads, alike
    for (const [path, body, param] of [
      [
        '/v1/chat/completions',
        '{"model":"mock","messages":[{"role":"user","content":"hi"}],"temperature":1e999}',
        'temperature',
      ],
      ['/v1/completions', '{"model":"mock","prompt":"hi","max_tokens":-1e999}', 'max_tokens'],
      ['/v1/completions', '{"model":"mock","prompt":"hi","max_completion_tokens":true}', 'max_completion_tokens'],
    ])
      assert.deepEqual(await refusal(defaultsEnvoy, path, body), { status: 400, param }, body);
  });

  test('a body at the default limits is routed unchanged but for custom_logit_processor, removed by default', async () => {
    const fields = {
      text: ['a', 'b'],
      rid: ['x'.repeat(1024), null],
      lora_path: 'x'.repeat(1024),
      extra_key: ['k', 'x'.repeat(1024)],
      session_params: { id: 'x'.repeat(1024), rid: 'r' },
      return_logprob: true,
      top_logprobs_num: [20, 0],
      token_ids_logprob: [Array.from({ length: 20 }, (_, i) => i), [4294967295]],
      sampling_params: [
        { n: 128, stop: Array(64).fill('x'.repeat(1024)), stop_token_ids: Array(64).fill(2) },
        {
          n: 128,
          stop_regex: Array(64).fill('x'.repeat(1024)),
          max_new_tokens: 4,
          json_schema: 'x'.repeat(64 * 1024),
          logit_bias: Object.fromEntries(Array.from({ length: 1024 }, (_, i) => [String(i), i % 2 ? 100 : -100])),
        },
      ],
    };
    // at its bound it is not refused; the code it carries does not reach the engine
    const sent = JSON.stringify({ custom_logit_processor: 'x'.repeat(64 * 1024), ...fields });
    assert.equal(await forwarded(defaultsEnvoy, '/generate', sent), JSON.stringify(fields));
  });

  test('what the limits do not cover passes as written: text, input_ids, other sampling_params', async () => {
    const sent =
      '{"input_ids":[[1,2],[3]],"sampling_params":{"temperature":-5,"n":null,"stop":null,"stop_token_ids":"x"},"seed":18446744073709551557}';
    assert.equal(await forwarded(defaultsEnvoy, '/generate', sent), sent);
  });

  test('a stray prompt or messages (SGLang reads neither on /generate) does not change what the lists are counted by', async () => {
    for (const stray of [{ prompt: 'ignored by SGLang' }, { messages: [{ role: 'user', content: 'ignored' }] }]) {
      const sent = JSON.stringify({ text: ['a', 'b'], rid: ['r0', 'r1'], ...stray });
      assert.equal(await forwarded(defaultsEnvoy, '/generate', sent), sent);
    }
    // and the prompt SGLang does read is the one counted
    const over = JSON.stringify({ text: 'a', rid: ['r0', 'r1'], prompt: ['x', 'y'] });
    assert.deepEqual(await refusal(defaultsEnvoy, '/generate', over), { status: 400, param: 'rid' });
  });

  test('/v1/responses with a prompt template or a null prompt_embeds is forwarded, not read as a completion', async () => {
    for (const extra of [
      { prompt: { id: 'pmpt_1', variables: { x: 'y' } } },
      { prompt_embeds: null },
      { prompt: null },
    ]) {
      const sent = JSON.stringify({ model: 'mock', input: 'hi', ...extra });
      assert.equal(await forwarded(defaultsEnvoy, '/v1/responses', sent), sent);
    }
  });

  test('/v1/responses with n of 10^8 is forwarded as before', async () => {
    const sent = JSON.stringify({ model: 'mock', input: 'hi', n: 100_000_000, sampling_params: { n: 100_000_000 } });
    assert.equal(await forwarded(defaultsEnvoy, '/v1/responses', sent), sent);
  });

  test('a trailing slash is not /generate (SGLang redirects it): forwarded as before', async () => {
    const sent = JSON.stringify({ text: 'hi', sampling_params: { n: 100_000_000 } });
    assert.equal(await forwarded(defaultsEnvoy, '/generate/', sent), sent);
  });
});

describe("SGLang's /generate follows the gateway's configured limits", () => {
  test('at the limits the body is routed unchanged', async () => {
    const sent = JSON.stringify({
      text: ['hi', 'there'],
      rid: 'x'.repeat(32),
      top_logprobs_num: 2,
      token_ids_logprob: [5, 6],
      sampling_params: {
        n: 2,
        stop: ['x'.repeat(32), 'b'],
        stop_regex: 'r',
        stop_token_ids: [1, 2],
        regex: 'x'.repeat(16),
      },
    });
    assert.equal(await forwarded(tightEnvoy, '/generate', sent), sent);
  });

  const CASES: Array<{ body: object; param: string }> = [
    { body: { text: 'hi', sampling_params: { n: 3 } }, param: 'sampling_params.n' },
    { body: { text: 'hi', sampling_params: { stop: ['a', 'b', 'c'] } }, param: 'sampling_params.stop' },
    { body: { text: 'hi', sampling_params: { stop: 'x'.repeat(33) } }, param: 'sampling_params.stop' },
    {
      body: { text: 'hi', sampling_params: [{ stop_token_ids: [1, 2, 3] }] },
      param: 'sampling_params[0].stop_token_ids',
    },
    { body: { text: 'hi', rid: 'x'.repeat(33) }, param: 'rid' },
    { body: { text: 'hi', top_logprobs_num: 3 }, param: 'top_logprobs_num' },
    { body: { text: 'hi', token_ids_logprob: [5, 6, 7] }, param: 'token_ids_logprob' },
    { body: { text: ['a', 'b', 'c'] }, param: 'text' },
    { body: { input_ids: [[1], [2], [3]] }, param: 'input_ids' },
    { body: { text: 'hi', sampling_params: { ebnf: 'x'.repeat(17) } }, param: 'sampling_params.ebnf' },
  ];
  for (const { body, param } of CASES) {
    test(`one past the limit: 400 naming ${param}`, async () => {
      const { status, param: named } = await refusal(tightEnvoy, '/generate', JSON.stringify(body));
      assert.equal(status, 400);
      assert.equal(named, param);
    });
  }
});

describe("the picker bounds the members of a body's objects as the gateway does", () => {
  /** An object of `n` members `"k0": 1, …`. */
  const members = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, 1]));
  /** The immediate response's status and error for `body` sent to `path`; fails if it was routed. */
  async function refused(
    envoy: EnvoyRole,
    path: string,
    body: string,
  ): Promise<{ status: number; error: { param: string; message: string } }> {
    const out = await envoy.request({ headers: { ':path': path }, body });
    if (out.kind === 'routed') await out.stream.end();
    if (out.kind !== 'immediate') assert.fail(`${path}: routed, not refused`);
    return { status: out.status, error: (JSON.parse(out.body) as { error: { param: string; message: string } }).error };
  }

  for (const [name, limit] of [
    ['default', 4096],
    ['configured', 8],
  ] as const) {
    test(`${name} limit (${limit}): one member past it is a 400 naming the body, at it the body is routed unchanged`, async () => {
      const envoy = limit === 8 ? tightEnvoy : defaultsEnvoy;
      for (const [path, body] of [
        ['/generate', { text: 'hi', sampling_params: { n: 1, ...members(limit) } }],
        ['/v1/completions', { model: 'mock', prompt: 'hi', extra: [members(limit + 1)] }],
      ] as const) {
        const { status, error } = await refused(envoy, path, JSON.stringify(body));
        assert.equal(status, 400, path);
        assert.equal(error.param, 'body', path);
        assert.equal(error.message, `an object in the body has more than ${limit} members`, path);
      }
      // a list of more elements than the limit is not bounded by it
      const sent = JSON.stringify({
        text: 'hi',
        sampling_params: members(limit),
        padding: Array.from({ length: limit * 2 }, () => 1),
      });
      assert.equal(await forwarded(envoy, '/generate', sent), sent);
    });
  }
});
