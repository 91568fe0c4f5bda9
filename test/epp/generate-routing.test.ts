/**
 * The endpoint picker routes SGLang's native `/generate` on its prompt, as it routes a
 * completion's: `input_ids` when given (what SGLang computes), else `text` (a list: its first
 * prompt, as a completion's list), with the blocks keyed by `lora_path`, `cache_salt` and
 * `extra_key` (of that first prompt, for SGLang's per-prompt lists); a body with only
 * `input_embeds`, or no prompt, is routed on load. A `prompt` or `messages` in the body is
 * nothing SGLang reads and is never routed on. The metadata headers apply as on the OpenAI
 * paths; an isolated request reaches SGLang with its private salt in `cache_salt`.
 *
 * Each affinity test holds a first request in flight on its endpoint: a request routed on load
 * alone goes to another (idle) endpoint, one that shares the first one's cached prefix joins it.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { pickerFleetWithEnvoy } from './harness.js';

const picker = pickerFleetWithEnvoy({ engines: 3 });

/** A request in flight: the endpoint it was sent to, and the end of its stream. */
interface Routed {
  endpoint: string;
  body: string;
  end(): Promise<void>;
}

/** Routes `body` on `/generate` and keeps the request in flight until end(). */
async function route(body: object | string, headers: Record<string, string> = {}): Promise<Routed> {
  const sent = typeof body === 'string' ? body : JSON.stringify(body);
  const out = await picker.envoy.request({ headers: { ':path': '/generate', ...headers }, body: sent });
  assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
  if (out.kind !== 'routed') throw new Error('not routed');
  return {
    endpoint: out.endpoints[0],
    body: out.body.length > 0 ? out.body.toString() : sent,
    end: () => out.stream.end(),
  };
}

/** Where `body` goes; the request ends at once (it adds no load to what follows). */
async function endpointOf(body: object): Promise<string> {
  const r = await route(body);
  await r.end();
  return r.endpoint;
}

/** The immediate answer's status and param for `body` on `/generate`; fails if it was routed. */
async function refusal(body: object, headers: Record<string, string> = {}): Promise<{ status: number; param: string }> {
  const out = await picker.envoy.request({ headers: { ':path': '/generate', ...headers }, body: JSON.stringify(body) });
  if (out.kind === 'routed') await out.stream.end();
  assert.equal(out.kind, 'immediate', `${JSON.stringify(body).slice(0, 80)}: routed, not refused`);
  if (out.kind !== 'immediate') return { status: 0, param: '' };
  return { status: out.status, param: (JSON.parse(out.body) as { error: { param: string } }).error.param };
}

/** With `first` in flight on its endpoint, runs `probe` (given that endpoint), then ends it. */
async function whileInFlight(first: object, probe: (busy: string) => Promise<void>): Promise<void> {
  const held = await route(first);
  try {
    await probe(held.endpoint);
  } finally {
    await held.end();
  }
}

let n = 0;
/** A long prefix no other test shares (about 60 blocks of 16). */
const prefix = () => `${++n} Summarise the following support ticket history for the on-call engineer. `.repeat(12);
/** As many token ids, distinct per call. */
const tokenPrefix = () => {
  const base = ++n * 1000;
  return Array.from({ length: 640 }, (_, i) => base + (i % 997));
};

describe('/generate is routed on its prompt', () => {
  test('two requests sharing a long text prefix go to the same endpoint', async () => {
    const p = prefix();
    await whileInFlight({ text: `${p} first`, sampling_params: { max_new_tokens: 8 } }, async (busy) => {
      assert.equal(await endpointOf({ text: `${p} second` }), busy, 'the prefix is cached there');
      assert.notEqual(await endpointOf({ text: `${prefix()} unrelated` }), busy, 'an unrelated prompt goes by load');
    });
  });

  test('input_ids: two requests sharing a long token prefix go to the same endpoint', async () => {
    const ids = tokenPrefix();
    await whileInFlight({ input_ids: [...ids, 1, 2] }, async (busy) => {
      assert.equal(await endpointOf({ input_ids: [...ids, 3, 4, 5] }), busy);
      // SGLang's batch of token-id lists: its first prompt, as a completion's list
      assert.equal(
        await endpointOf({
          input_ids: [
            [...ids, 6],
            [7, 8],
          ],
        }),
        busy,
      );
      assert.notEqual(await endpointOf({ input_ids: tokenPrefix() }), busy);
    });
  });

  test("a text batch is routed on its first prompt, as a completion's list", async () => {
    const p = prefix();
    await whileInFlight({ text: [`${p} a`, 'short'] }, async (busy) => {
      assert.equal(await endpointOf({ text: `${p} b` }), busy);
      assert.notEqual(await endpointOf({ text: [`${prefix()} c`, `${p} d`] }), busy);
    });
  });

  test('with both input_ids and text, the token ids SGLang computes are routed on', async () => {
    const ids = tokenPrefix();
    await whileInFlight({ input_ids: ids }, async (busy) => {
      assert.equal(await endpointOf({ text: prefix(), input_ids: [...ids, 9] }), busy);
    });
  });

  test('a stray prompt or messages is never routed on: the text is', async () => {
    const p = prefix();
    await whileInFlight({ text: `${p} x` }, async (busy) => {
      assert.equal(await endpointOf({ text: `${p} y`, prompt: prefix() }), busy, 'routed on text');
      assert.notEqual(await endpointOf({ text: prefix(), prompt: `${p} z` }), busy, 'not on prompt');
      assert.notEqual(
        await endpointOf({ text: prefix(), messages: [{ role: 'user', content: `${p} z` }] }),
        busy,
        'not on messages',
      );
    });
  });

  test('a body with only input_embeds is routed on load', async () => {
    const embeds = Array.from({ length: 64 }, () => [0.25, 0.5]);
    await whileInFlight({ input_embeds: embeds }, async (busy) => {
      assert.notEqual(await endpointOf({ input_embeds: embeds }), busy);
    });
  });
});

describe("/generate's blocks are keyed as SGLang keys its radix cache", () => {
  for (const field of ['lora_path', 'extra_key', 'cache_salt'] as const) {
    test(`a different ${field} shares nothing; the same one does`, async () => {
      const p = prefix();
      await whileInFlight({ text: `${p} 1`, [field]: 'a' }, async (busy) => {
        assert.equal(await endpointOf({ text: `${p} 2`, [field]: 'a' }), busy, `the same ${field}`);
        assert.notEqual(await endpointOf({ text: `${p} 3`, [field]: 'b' }), busy, `another ${field}`);
        assert.notEqual(await endpointOf({ text: `${p} 4` }), busy, `no ${field}`);
        // SGLang's per-prompt list: the first prompt's entry keys the first prompt's blocks
        assert.equal(await endpointOf({ text: [`${p} 5`, 'other'], [field]: ['a', 'b'] }), busy);
        assert.notEqual(await endpointOf({ text: [`${p} 6`, 'other'], [field]: ['b', 'a'] }), busy);
      });
    });
  }

  test('an empty extra_key or cache_salt is none, as SGLang reads it', async () => {
    const p = prefix();
    await whileInFlight({ text: `${p} 1` }, async (busy) => {
      assert.equal(await endpointOf({ text: `${p} 2`, extra_key: '', cache_salt: '' }), busy);
    });
  });

  test('extra_key and cache_salt are apart: a salt is not an extra_key', async () => {
    const p = prefix();
    await whileInFlight({ text: `${p} 1`, cache_salt: 'k' }, async (busy) => {
      assert.notEqual(await endpointOf({ text: `${p} 2`, extra_key: 'k' }), busy);
      assert.equal(await endpointOf({ text: `${p} 3`, cache_salt: 'k' }), busy);
    });
  });
});

describe("/generate takes the router's metadata as the OpenAI paths do", () => {
  test('an isolated request is forwarded with its private salt in cache_salt, the rest as written', async () => {
    const seed = '18446744073709551557';
    const sent = `{"text":["hello","there"],"cache_salt":["t0","t1"],"seed":${seed}}`;
    const r = await route(sent, { 'x-kv-isolate': '1' });
    await r.end();
    const salt = /"cache_salt":"(cf-[^"]+)"/.exec(r.body)?.[1];
    assert.ok(salt !== undefined, `a private salt in ${r.body}`);
    assert.equal(r.body, `{"cache_salt":"${salt}","text":["hello","there"],"seed":${seed}}`);
  });

  test('an isolated request shares no cached prefix', async () => {
    const p = prefix();
    await whileInFlight({ text: `${p} 1` }, async (busy) => {
      const r = await route({ text: `${p} 2` }, { 'x-kv-isolate': 'true' });
      await r.end();
      assert.notEqual(r.endpoint, busy);
    });
  });

  test('the contextforge field is read as metadata and not forwarded', async () => {
    const r = await route('{"text":"hi","contextforge":{"workflowId":"wf-1"},"stream":true}');
    await r.end();
    assert.equal(r.body, '{"text":"hi","stream":true}');
  });

  test('a malformed metadata header is a 400 naming it', async () => {
    assert.deepEqual(await refusal({ text: 'hi' }, { 'x-kv-isolate': 'maybe' }), {
      status: 400,
      param: 'x-kv-isolate',
    });
  });
});

describe('a /generate prompt the router cannot read is refused naming its field', () => {
  const CASES: Array<{ name: string; body: object; param: string }> = [
    { name: 'text that is a number', body: { text: 5 }, param: 'text' },
    { name: 'text mixing strings and numbers', body: { text: ['a', 1] }, param: 'text' },
    { name: 'an empty text list', body: { text: [] }, param: 'text' },
    { name: 'a negative token id', body: { input_ids: [1, -1] }, param: 'input_ids[1]' },
    { name: 'an empty input_ids', body: { input_ids: [] }, param: 'input_ids' },
    { name: 'input_ids of strings', body: { input_ids: ['a'] }, param: 'input_ids' },
    { name: 'a bad id in the second token-id list', body: { input_ids: [[1], [2.5]] }, param: 'input_ids[1][0]' },
    {
      name: 'a cache_salt over --max-id-bytes',
      body: { text: 'hi', cache_salt: 'x'.repeat(257) },
      param: 'cache_salt',
    },
    { name: 'a cache_salt that is a number', body: { text: 'hi', cache_salt: 7 }, param: 'cache_salt' },
    { name: 'two cache_salts for one prompt', body: { text: 'hi', cache_salt: ['a', 'b'] }, param: 'cache_salt' },
  ];
  for (const { name, body, param } of CASES) {
    test(`${name}: 400 naming ${param}`, async () => {
      assert.deepEqual(await refusal(body), { status: 400, param });
    });
  }
});
