/**
 * vLLM's per-request `kv_cache_report_mode` (read from SamplingParams.extra_args, which a client
 * sets through the body's `vllm_xargs` object): "full" makes the engine emit BlockStored again for
 * blocks it reuses from its prefix cache, which the router counts as further copies of the block,
 * so its index would outlive the engine's cache. The gateway removes that one member of
 * `vllm_xargs` from what it forwards, on both completion paths, streamed or not; the other members
 * of `vllm_xargs` and the rest of the body reach the engine as written.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { recordingEngine, type FakeEngine } from '../faults/harness.js';
import { forwardedTo, SEED_64_BIT } from '../helpers/forwarded-text.js';

const received: string[] = [];
let engine: FakeEngine;
let gateway: Gateway;
let url = '';

before(async () => {
  engine = await recordingEngine(received);
  gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    // the setting that keeps the KV-transfer fields does not keep this one
    forwardKvTransferParams: true,
  });
  url = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close(0);
  await engine.close();
});

/** POSTs `text` as it is to `path` at `url`; returns the body the engine received. */
const forwarded = forwardedTo(received);

const CASES = [
  { path: '/v1/completions', kept: '"model":"m","prompt":"hi","max_tokens":3' },
  { path: '/v1/chat/completions', kept: '"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3' },
];

describe("vllm_xargs' kv_cache_report_mode", () => {
  for (const { path, kept } of CASES) {
    for (const stream of [false, true]) {
      test(`is removed, the other vllm_xargs members kept as written (${path}${stream ? ', streamed' : ''})`, async () => {
        const sent =
          `{${kept},"stream":${stream},"vllm_xargs":{"a":${SEED_64_BIT},"kv_cache_report_mode":"full","b":["x",1.5]},` +
          `"seed":${SEED_64_BIT}}`;
        const got = await forwarded(url, path, sent);
        assert.equal(
          got,
          `{${kept},"stream":${stream},"vllm_xargs":{"a":${SEED_64_BIT},"b":["x",1.5]},"seed":${SEED_64_BIT}}`,
        );
      });
    }
  }

  test('every copy goes, escaped spellings too; an emptied vllm_xargs stays an empty object', async () => {
    const sent =
      '{"prompt":"hi","vllm_xargs":{"kv_cache_report_mode":"full"},' +
      '"vllm_xargs":{ "kv\\u005fcache_report_mode" : "full" , "kv_cache_report_mode":"full"},' +
      '"extra":{"kv_cache_report_mode":"full"}}';
    assert.equal(
      await forwarded(url, '/v1/completions', sent),
      '{"prompt":"hi","vllm_xargs":{},"vllm_xargs":{},"extra":{"kv_cache_report_mode":"full"}}',
    );
  });

  test('with the KV-transfer fields and the router metadata removed alongside', async () => {
    const sent =
      '{"prompt":"hi","contextforge":{"workflowId":"w"},"vllm_xargs":{"kv_cache_report_mode":"full","k":1},' +
      '"kv_transfer_params":{"a":1}}';
    assert.equal(
      await forwarded(url, '/v1/completions', sent),
      '{"prompt":"hi","vllm_xargs":{"k":1},"kv_transfer_params":{"a":1}}',
    );
  });

  test('a body whose vllm_xargs lacks it is forwarded byte for byte', async () => {
    const sent = `{ "prompt" : "hi", "vllm_xargs" : { "k" : "kv_cache_report_mode" }, "seed": ${SEED_64_BIT} }`;
    assert.equal(await forwarded(url, '/v1/completions', sent), sent);
  });
});
