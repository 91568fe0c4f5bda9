/**
 * The body fields that carry a client's code for an engine to run (SGLang's
 * `custom_logit_processor`, a pickled class; vLLM's `logits_processors`, names the engine imports
 * and constructs: request-limits.ts CLIENT_CODE_FIELDS) are removed from what the gateway
 * forwards unless `forwardCustomLogitProcessor` keeps them: on both completion paths, streamed or
 * not, the rest of the body as written. The setting is the operator's own, apart from
 * `forwardKvTransferParams`; kept, a `custom_logit_processor` is bounded as before.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { CUSTOM_LOGIT_PROCESSOR_BYTES } from '../../src/server/request-limits.js';
import { recordingEngine, type FakeEngine } from '../faults/harness.js';
import { parsedWithSeed, SEED_64_BIT } from '../helpers/forwarded-text.js';

const received: string[] = [];
let engine: FakeEngine;
const gateways: Gateway[] = [];
/** The default gateway's URL; one that forwards the code fields; one that forwards only the KV-transfer fields. */
let strippingUrl = '';
let keepingUrl = '';
let kvOnlyUrl = '';

before(async () => {
  engine = await recordingEngine(received);
  const start = async (options: Partial<GatewayOptions>) => {
    const gateway = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ id: 'e0', url: engine.url }],
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      ...options,
    });
    gateways.push(gateway);
    return gateway.app.listen({ host: '127.0.0.1', port: 0 });
  };
  strippingUrl = await start({});
  keepingUrl = await start({ forwardCustomLogitProcessor: true });
  kvOnlyUrl = await start({ forwardKvTransferParams: true });
});
after(async () => {
  for (const gateway of gateways) await gateway.close(0);
  await engine.close();
});

/** POSTs `text` as it is to `path`; the status, the answer, and the body the engine received (if any). */
async function post(url: string, path: string, text: string) {
  const before = received.length;
  const res = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: text,
  });
  const answer = await res.text();
  return { status: res.status, answer, got: received.length > before ? received[before] : undefined };
}

/** The body the engine received for `text`, which must have been answered. */
async function forwarded(url: string, path: string, text: string): Promise<string> {
  const { status, answer, got } = await post(url, path, text);
  assert.equal(status, 200, answer);
  assert.ok(got !== undefined, 'the engine got the request');
  return got;
}

/** What a client sending its own code would send: SGLang's serialized class and vLLM's processor names. */
const CODE_FIELDS = {
  custom_logit_processor: JSON.stringify({ callable: '80049500'.repeat(8) }),
  logits_processors: ['os.system', { qualname: 'subprocess.Popen', args: [['touch', '/tmp/x']], kwargs: {} }],
};

const CASES = [
  { path: '/v1/completions', body: { model: 'm', prompt: 'hi', max_tokens: 3 } },
  { path: '/v1/chat/completions', body: { model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 } },
];

/** The client's text: the body, the code fields, data for a processor, and a 64-bit seed JSON.parse would round. */
function clientText(body: object, stream: boolean): string {
  const members = JSON.stringify({ ...body, ...CODE_FIELDS, custom_params: { thinking_budget: 4 }, stream }).slice(
    1,
    -1,
  );
  return `{${members},"seed":${SEED_64_BIT}}`;
}

describe('code fields a client sends', () => {
  for (const { path, body } of CASES) {
    for (const stream of [false, true]) {
      const label = `${path}${stream ? ', streamed' : ''}`;
      test(`are removed by default (${label}); the rest, custom_params too, reaches the engine as written`, async () => {
        const sent = clientText(body, stream);
        const got = parsedWithSeed(await forwarded(strippingUrl, path, sent));
        const expected = parsedWithSeed(sent);
        for (const key of Object.keys(CODE_FIELDS)) {
          assert.ok(!(key in got), `${key} reached the engine`);
          delete expected[key];
        }
        assert.deepEqual(got, expected);
      });
      test(`are kept with forwardCustomLogitProcessor (${label})`, async () => {
        const sent = clientText(body, stream);
        assert.deepEqual(parsedWithSeed(await forwarded(keepingUrl, path, sent)), parsedWithSeed(sent));
      });
    }
  }

  test('forwardKvTransferParams does not forward them, nor forwardCustomLogitProcessor the KV-transfer fields', async () => {
    const sent = JSON.stringify({ prompt: 'hi', ...CODE_FIELDS, kv_transfer_params: { remote_host: '203.0.113.7' } });
    assert.deepEqual(JSON.parse(await forwarded(kvOnlyUrl, '/v1/completions', sent)), {
      prompt: 'hi',
      kv_transfer_params: { remote_host: '203.0.113.7' },
    });
    assert.deepEqual(JSON.parse(await forwarded(keepingUrl, '/v1/completions', sent)), {
      prompt: 'hi',
      ...CODE_FIELDS,
    });
  });

  test('every copy of a key goes, escaped spellings too; nested ones are the client’s own', async () => {
    const sent =
      '{"prompt":"hi","custom_logit_processor":"a","custom\\u005flogit_processor":"b",' +
      '"logits_processors":["x"],"logits_processors":["y"],"extra":{"custom_logit_processor":1}}';
    assert.deepEqual(JSON.parse(await forwarded(strippingUrl, '/v1/completions', sent)), {
      prompt: 'hi',
      extra: { custom_logit_processor: 1 },
    });
  });

  test('kept, a custom_logit_processor is bounded as before: 64 KiB passes, one byte more is refused', async () => {
    const at = 'a'.repeat(CUSTOM_LOGIT_PROCESSOR_BYTES);
    const sent = JSON.stringify({ prompt: 'hi', custom_logit_processor: at });
    assert.equal(await forwarded(keepingUrl, '/v1/completions', sent), sent);
    const over = await post(
      keepingUrl,
      '/v1/completions',
      JSON.stringify({ prompt: 'hi', custom_logit_processor: `${at}b` }),
    );
    assert.equal(over.status, 400);
    assert.equal((JSON.parse(over.answer) as { error: { param: string } }).error.param, 'custom_logit_processor');
    assert.equal(over.got, undefined, 'nothing reaches the engine');
  });

  test('a body without them is forwarded byte for byte', async () => {
    const sent = `{ "prompt" : "hi", "seed": ${SEED_64_BIT}, "note": "custom_logit_processor" }`;
    assert.equal(await forwarded(strippingUrl, '/v1/completions', sent), sent);
  });
});
