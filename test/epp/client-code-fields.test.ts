/**
 * The endpoint picker removes the body fields that carry a client's code for an engine to run
 * (request-limits.ts CLIENT_CODE_FIELDS: SGLang's `custom_logit_processor`, vLLM's
 * `logits_processors`) from every JSON object body it reads, as it removes the KV-transfer
 * fields: SGLang's native `/generate`, the OpenAI paths and `/v1/responses` reach the engine
 * without them, every other member as the client wrote it. With `forwardCustomLogitProcessor`
 * they pass, a `custom_logit_processor` bounded as before.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { forwardedBody, strippingAndKeeping } from './harness.js';

const envoys = strippingAndKeeping({ forwardCustomLogitProcessor: true });

/** A 64-bit seed JSON.parse would round: kept only if the body is edited, not serialised again. */
const SEED = '18446744073709551557';

const PROCESSOR = JSON.stringify(JSON.stringify({ callable: '80049500' }));

const CASES = [
  {
    name: "SGLang's native /generate",
    path: '/generate',
    kept: `"text":"hi","sampling_params":{"max_new_tokens":4,"custom_params":{"thinking_budget":4}},"seed":${SEED}`,
    fields: `"custom_logit_processor":${PROCESSOR}`,
  },
  {
    name: "/generate with SGLang's list, one per prompt",
    path: '/generate',
    kept: `"text":["a","b"],"seed":${SEED}`,
    fields: `"custom_logit_processor":[${PROCESSOR},null]`,
  },
  {
    name: '/v1/chat/completions',
    path: '/v1/chat/completions',
    kept: `"model":"mock","messages":[{"role":"user","content":"hi"}],"custom_params":{"k":1},"seed":${SEED}`,
    fields: `"custom_logit_processor":${PROCESSOR},"logits_processors":[{"qualname":"subprocess.Popen","args":[["id"]]}]`,
  },
  {
    name: '/v1/completions',
    path: '/v1/completions',
    kept: `"model":"mock","prompt":"hi","seed":${SEED}`,
    fields: `"logits_processors":["os.system"]`,
  },
  {
    name: '/v1/responses',
    path: '/v1/responses',
    kept: `"model":"mock","input":"hi","seed":${SEED}`,
    fields: `"custom_logit_processor":${PROCESSOR},"logits_processors":["os.system"]`,
  },
];

describe('code fields through the endpoint picker', () => {
  for (const { name, path, kept, fields } of CASES) {
    test(`are removed on ${name}; every other member passes as written`, async () => {
      assert.equal(await forwardedBody(envoys.stripping, path, `{${fields},${kept}}`), `{${kept}}`);
    });
    test(`pass with forwardCustomLogitProcessor on ${name}`, async () => {
      const sent = `{${fields},${kept}}`;
      assert.equal(await forwardedBody(envoys.keeping, path, sent), sent);
    });
  }

  test('the KV-transfer fields are removed beside them, and kept as their own setting says', async () => {
    const sent = `{"text":"hi","bootstrap_host":"203.0.113.7","custom_logit_processor":${PROCESSOR}}`;
    assert.equal(await forwardedBody(envoys.stripping, '/generate', sent), '{"text":"hi"}');
    assert.equal(
      await forwardedBody(envoys.keeping, '/generate', sent),
      `{"text":"hi","custom_logit_processor":${PROCESSOR}}`,
    );
  });

  test('kept on /generate, a custom_logit_processor over 64 KiB is refused naming it', async () => {
    const at = 'x'.repeat(64 * 1024);
    const sent = JSON.stringify({ text: 'hi', custom_logit_processor: at });
    assert.equal(await forwardedBody(envoys.keeping, '/generate', sent), sent);
    const out = await envoys.keeping.request({
      headers: { ':path': '/generate' },
      body: JSON.stringify({ text: 'hi', custom_logit_processor: `${at}x` }),
    });
    if (out.kind === 'routed') await out.stream.end();
    assert.equal(out.kind, 'immediate');
    if (out.kind !== 'immediate') return;
    assert.equal(out.status, 400);
    assert.equal((JSON.parse(out.body) as { error: { param: string } }).error.param, 'custom_logit_processor');
  });
});
