/**
 * A body the gateway has to change before forwarding it (the `contextforge` field removed, a
 * tenant's or an isolated request's cache_salt set) keeps everything else as the client wrote
 * it: a 64-bit seed is not rounded to a double, and nothing else is re-serialised.
 */
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { loadApiKeysFile } from '../../src/server/api-keys.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { editedBodyText } from '../../src/server/openai-request.js';
import { recordingEngine, type FakeEngine } from '../faults/harness.js';
import { forwardedTo, SEED_64_BIT } from '../helpers/forwarded-text.js';

const received: string[] = [];
let engine: FakeEngine;
let keyed: Gateway;
let open: Gateway;
let keyedUrl = '';
let openUrl = '';

before(async () => {
  engine = await recordingEngine(received);
  const dir = mkdtempSync(join(tmpdir(), 'cf-forwarded-'));
  const file = join(dir, 'keys.yaml');
  writeFileSync(file, 'sk-tenant-a-0123456789: team-a\n');
  chmodSync(file, 0o600);
  const common = { workers: [{ id: 'e0', url: engine.url }], metricsIntervalMs: 0, healthCheckIntervalMs: 0 };
  keyed = await createGateway({ router: new KVAwareRouter(), apiKeys: loadApiKeysFile(file), ...common });
  open = await createGateway({ router: new KVAwareRouter(), ...common });
  keyedUrl = await keyed.app.listen({ host: '127.0.0.1', port: 0 });
  openUrl = await open.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await keyed.close(0);
  await open.close(0);
  await engine.close();
});

/** POSTs `text` as it is to `path` at `url`; returns the body the engine received. */
const forwarded = forwardedTo(received);
const COMPLETIONS = '/v1/completions';

test("a tenant's request reaches the engine with its 64-bit seed as written", async () => {
  const body = await forwarded(keyedUrl, COMPLETIONS, `{"prompt":"hi","seed":${SEED_64_BIT},"max_tokens":3}`, {
    authorization: 'Bearer sk-tenant-a-0123456789',
  });
  assert.match(body, new RegExp(`"seed":\\s*${SEED_64_BIT}[,}]`));
  assert.equal((JSON.parse(body) as { cache_salt: string }).cache_salt, 'tenant/team-a');
});

test('a body with the contextforge field reaches the engine without it, the rest as written', async () => {
  const body = await forwarded(
    openUrl,
    COMPLETIONS,
    `{"contextforge":{"workflowId":"wf"},"prompt":"hi","seed":${SEED_64_BIT},"logit_bias":{"50256":-100}}`,
  );
  assert.match(body, new RegExp(`"seed":\\s*${SEED_64_BIT}[,}]`));
  assert.deepEqual(Object.keys(JSON.parse(body) as object), ['prompt', 'seed', 'logit_bias']);
});

test('an isolated request gets its private cache_salt, the rest as written', async () => {
  const body = await forwarded(openUrl, COMPLETIONS, `{"prompt":"hi","seed":${SEED_64_BIT},"cache_salt":"mine"}`, {
    'x-kv-isolate': '1',
  });
  assert.match(body, new RegExp(`"seed":\\s*${SEED_64_BIT}[,}]`));
  const salt = (JSON.parse(body) as { cache_salt: string }).cache_salt;
  assert.ok(salt !== 'mine' && salt.startsWith('cf-'), salt);
});

test('editing a body: top-level members only, every copy of a key, escaped keys too', () => {
  const text = ` { "contextforge" : {"cache_salt":"inner"} , "a" : [1,{"contextforge":2}] ,"cache_salt":"x", "contextforg\\u0065":"y","s":"\\"}{","cache_salt":"z"} `;
  const edited = editedBodyText(text, 'salt/1');
  assert.deepEqual(JSON.parse(edited), { cache_salt: 'salt/1', a: [1, { contextforge: 2 }], s: '"}{' });
  // without a salt to set, the client's own stays
  assert.equal(editedBodyText('{"cache_salt":"mine","contextforge":{},"n":1}'), '{"cache_salt":"mine","n":1}');
  assert.match(editedBodyText('{"contextforge":{},"n":12345678901234567891}'), /12345678901234567891/);
  assert.equal(editedBodyText('{"contextforge":{}}'), '{}');
});
