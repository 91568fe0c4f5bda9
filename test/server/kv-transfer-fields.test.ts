/**
 * The body fields that direct an engine's disaggregated KV transfer (vLLM's `kv_transfer_params`
 * and `ec_transfer_params`, SGLang's `bootstrap_*`, `decode_tp_size`, `disagg_prefill_dp_rank`,
 * `kv_router_hint`: request-limits.ts KV_TRANSFER_FIELDS) are
 * removed from what the gateway forwards unless `forwardKvTransferParams` keeps them: on both
 * completion paths, streamed or not, and the rest of the body reaches the engine as written.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { recordingEngine, type FakeEngine } from '../faults/harness.js';
import { forwardedTo, parsedWithSeed, SEED_64_BIT } from '../helpers/forwarded-text.js';

const received: string[] = [];
let engine: FakeEngine;
let stripping: Gateway;
let keeping: Gateway;
let strippingUrl = '';
let keepingUrl = '';

before(async () => {
  engine = await recordingEngine(received);
  const common = { workers: [{ id: 'e0', url: engine.url }], metricsIntervalMs: 0, healthCheckIntervalMs: 0 };
  stripping = await createGateway({ router: new KVAwareRouter(), ...common });
  keeping = await createGateway({ router: new KVAwareRouter(), forwardKvTransferParams: true, ...common });
  strippingUrl = await stripping.app.listen({ host: '127.0.0.1', port: 0 });
  keepingUrl = await keeping.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await stripping.close(0);
  await keeping.close(0);
  await engine.close();
});

/** POSTs `text` as it is to `path` at `url`; returns the body the engine received. */
const forwarded = forwardedTo(received);

/** What a client aiming a decode engine at a host of its choosing would send. */
const KV_FIELDS = {
  kv_transfer_params: {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_engine_id: 'attacker',
    remote_block_ids: [1, 2, 3],
    remote_request_id: 'r1',
    remote_host: '203.0.113.7',
    remote_port: 5600,
  },
  bootstrap_host: '203.0.113.7',
  bootstrap_port: 8998,
  bootstrap_room: 12345,
  bootstrap_pair_key: 'pair',
  decode_tp_size: 8,
  disagg_prefill_dp_rank: 0,
  kv_router_hint: { source_control_endpoint: 'tcp://203.0.113.7:5700', block_hashes: ['a'] },
  ec_transfer_params: { h0: { do_remote_encode: true, remote_host: '203.0.113.7', remote_port: 5601 } },
};

const CASES = [
  { path: '/v1/completions', body: { model: 'm', prompt: 'hi', max_tokens: 3 } },
  { path: '/v1/chat/completions', body: { model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 } },
];

/** The client's text: the body, the KV-transfer fields among its members, and a 64-bit seed JSON.parse would round. */
function clientText(body: object, stream: boolean): string {
  const members = JSON.stringify({ ...body, ...KV_FIELDS, stream, temperature: 0.5 }).slice(1, -1);
  return `{${members},"seed":${SEED_64_BIT}}`;
}

describe('KV-transfer fields a client sends', () => {
  for (const { path, body } of CASES) {
    for (const stream of [false, true]) {
      const label = `${path}${stream ? ', streamed' : ''}`;
      test(`are removed by default (${label}); the rest reaches the engine as written`, async () => {
        const sent = clientText(body, stream);
        const got = parsedWithSeed(await forwarded(strippingUrl, path, sent));
        const expected = parsedWithSeed(sent);
        for (const key of Object.keys(KV_FIELDS)) {
          assert.ok(!(key in got), `${key} reached the engine`);
          delete expected[key];
        }
        assert.deepEqual(got, expected);
      });
      test(`are kept with forwardKvTransferParams (${label})`, async () => {
        const sent = clientText(body, stream);
        assert.deepEqual(parsedWithSeed(await forwarded(keepingUrl, path, sent)), parsedWithSeed(sent));
      });
    }
  }

  test('every copy of a key goes, escaped spellings too; nested ones are the client’s own', async () => {
    const sent =
      '{"prompt":"hi","kv_transfer_params":{"remote_host":"a"},"kv\\u005ftransfer_params":{"remote_host":"b"},' +
      '"bootstrap_host":"c","bootstrap_host":"d","extra":{"kv_transfer_params":1}}';
    assert.deepEqual(JSON.parse(await forwarded(strippingUrl, '/v1/completions', sent)), {
      prompt: 'hi',
      extra: { kv_transfer_params: 1 },
    });
  });

  test('a body without them is forwarded byte for byte', async () => {
    const sent = `{ "prompt" : "hi", "seed": ${SEED_64_BIT}, "note": "kv_transfer_params" }`;
    assert.equal(await forwarded(strippingUrl, '/v1/completions', sent), sent);
  });
});
