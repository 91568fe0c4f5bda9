/**
 * The endpoint picker removes the body fields that direct an engine's disaggregated KV transfer
 * (request-limits.ts KV_TRANSFER_FIELDS) from every JSON object body it reads, not only from the
 * OpenAI completion paths: SGLang's native `/generate`, `/v1/responses` and a path with a trailing
 * slash reach the engine without them, every other member as the client wrote it. With
 * `forwardKvTransferParams` they pass.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { forwardedBody, strippingAndKeeping } from './harness.js';

const envoys = strippingAndKeeping({ forwardKvTransferParams: true });

/** A 64-bit seed JSON.parse would round: kept only if the body is edited, not serialised again. */
const SEED = '18446744073709551557';

const CASES = [
  {
    name: "SGLang's native /generate",
    path: '/generate',
    kept: `"text":"hi","sampling_params":{"max_new_tokens":4},"seed":${SEED}`,
    fields: `"bootstrap_host":"203.0.113.7","bootstrap_port":8998,"bootstrap_room":1,"bootstrap_pair_key":"k","decode_tp_size":8,"disagg_prefill_dp_rank":0`,
  },
  {
    name: '/v1/responses',
    path: '/v1/responses',
    kept: `"model":"mock","input":"hi","seed":${SEED}`,
    fields: `"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"203.0.113.7"},"ec_transfer_params":{"h":{"do_remote_encode":true}}`,
  },
  {
    name: 'a completions path with a trailing slash',
    path: '/v1/completions/',
    kept: `"model":"mock","input":"hi","seed":${SEED}`,
    fields: `"kv_transfer_params":{"remote_host":"203.0.113.7"}`,
  },
  {
    name: '/v1/completions',
    path: '/v1/completions',
    kept: `"model":"mock","prompt":"hi","seed":${SEED}`,
    fields: `"ec_transfer_params":{"h":{"do_remote_encode":true,"remote_host":"203.0.113.7"}},"decode_tp_size":8,"kv_router_hint":{"source_control_endpoint":"tcp://203.0.113.7:1"}`,
  },
];

describe('KV-transfer fields through the endpoint picker', () => {
  for (const { name, path, kept, fields } of CASES) {
    test(`are removed on ${name}; every other member passes as written`, async () => {
      const text = await forwardedBody(envoys.stripping, path, `{${fields},${kept}}`);
      assert.equal(text, `{${kept}}`);
    });
    test(`pass with forwardKvTransferParams on ${name}`, async () => {
      const sent = `{${fields},${kept}}`;
      assert.equal(await forwardedBody(envoys.keeping, path, sent), sent);
    });
  }

  test('a body without them on another path passes byte for byte', async () => {
    const sent = `{ "text" : "hi", "seed": ${SEED}, "note": "bootstrap_host" }`;
    assert.equal(await forwardedBody(envoys.stripping, '/generate', sent), sent);
  });

  test('every copy goes, escaped spellings too, with a model rewrite on another path', async () => {
    const out = await envoys.stripping.request({
      headers: { ':path': '/v1/responses', 'x-gateway-model-name-rewrite': 'mock' },
      body: `{"model":"other","input":"hi","bootstrap\\u005fhost":"a","bootstrap_host":"b","seed":${SEED}}`,
    });
    assert.equal(out.kind, 'routed');
    if (out.kind !== 'routed') return;
    assert.equal(out.body.toString(), `{"model":"mock","input":"hi","seed":${SEED}}`);
    await out.stream.end();
  });

  test('an isolated request gets its private salt with the rest of the body as written, the fields removed', async () => {
    const out = await envoys.stripping.request({
      headers: { ':path': '/v1/completions' },
      body: `{"model":"mock","prompt":"p","kv_transfer_params":{"a":1},"contextforge":{"isolate":true},"seed":${SEED}}`,
    });
    assert.equal(out.kind, 'routed');
    if (out.kind !== 'routed') return;
    const text = out.body.toString();
    const salt = (JSON.parse(text) as { cache_salt?: unknown }).cache_salt;
    assert.equal(typeof salt, 'string');
    assert.equal(text, `{"cache_salt":${JSON.stringify(salt)},"model":"mock","prompt":"p","seed":${SEED}}`);
    await out.stream.end();
  });
});

describe("vllm_xargs' kv_cache_report_mode through the endpoint picker", () => {
  for (const path of ['/v1/completions', '/v1/chat/completions', '/v1/responses']) {
    test(`is removed on ${path}, with forwardKvTransferParams too; the other members pass as written`, async () => {
      const body = path === '/v1/chat/completions' ? '"messages":[{"role":"user","content":"hi"}]' : '"prompt":"hi"';
      const sent = `{"model":"mock",${body},"vllm_xargs":{"kv_cache_report_mode":"full","k":${SEED}},"seed":${SEED}}`;
      const expected = `{"model":"mock",${body},"vllm_xargs":{"k":${SEED}},"seed":${SEED}}`;
      assert.equal(await forwardedBody(envoys.stripping, path, sent), expected);
      assert.equal(await forwardedBody(envoys.keeping, path, sent), expected);
    });
  }
});
