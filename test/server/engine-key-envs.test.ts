/**
 * Engine-key variables of workers added while the gateway runs: the admin API (and another
 * replica) may name only a variable a configured worker names or one --engine-key-envs lists,
 * never the router's own settings; a configured worker may name any but those.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { parseWorkerSpec } from '../../src/cli/commands/serve.js';
import { EngineKeyEnvs } from '../../src/server/worker-input.js';
import { resolveServe } from '../helpers/serve-config.js';

const ADMIN = 'admin-token-for-tests';
const auth = { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' };
let engine: MockEngine;
let gateway: Gateway;
let base: string;

before(async () => {
  engine = await new MockEngine().start();
  gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'w0', url: `http://127.0.0.1:${engine.port}`, apiKeyEnv: 'CF_KEY_CONFIGURED' }],
    env: {
      CF_KEY_CONFIGURED: 'configured-key',
      CF_ALLOWED_X: 'allowed-key',
      HOME: '/root',
      CONTEXTFORGE_STATE: 'redis://:password@127.0.0.1:6379',
    },
    engineKeyEnvs: ['CF_ALLOWED_*'],
    adminToken: ADMIN,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close();
  await engine.close();
});

async function addWorker(id: string, apiKeyEnv: string) {
  const res = await fetch(`${base}/admin/workers`, {
    method: 'POST',
    headers: auth,
    body: JSON.stringify({ id, url: `http://127.0.0.1:${engine.port}`, apiKeyEnv }),
  });
  return { status: res.status, body: (await res.json()) as { error?: { message: string; param: string | null } } };
}

const workerIds = () =>
  gateway.router
    .listWorkers()
    .map((w) => w.id)
    .sort();

test('the admin API may not name a variable no configured worker names and --engine-key-envs does not list', async () => {
  for (const name of ['HOME', 'CF_KEY_OTHER']) {
    const { status, body } = await addWorker('stranger', name);
    assert.equal(status, 400, name);
    assert.equal(body.error?.param, 'apiKeyEnv');
    assert.match(body.error!.message, /--engine-key-envs/);
  }
  assert.deepEqual(workerIds(), ['w0'], 'nothing added');
});

test("the router's own settings are never an engine key, listed or not", async () => {
  const { status, body } = await addWorker('state', 'CONTEXTFORGE_STATE');
  assert.equal(status, 400);
  assert.equal(body.error?.param, 'apiKeyEnv');
  assert.match(body.error!.message, /may not name CONTEXTFORGE_STATE/);
  assert.throws(
    () => new EngineKeyEnvs(['not a name']),
    (err: unknown) => err instanceof RangeError && /engine-key-envs/.test((err as Error).message),
  );
  assert.throws(() => parseWorkerSpec('id=w1,url=http://x,api-key-env=CONTEXTFORGE_STATE'), /may not name/);
});

test("a configured worker's variable and a listed one may be named; an unset listed one is refused naming the field", async () => {
  assert.equal((await addWorker('same-key', 'CF_KEY_CONFIGURED')).status, 201);
  assert.equal((await addWorker('listed', 'CF_ALLOWED_X')).status, 201);
  const unset = await addWorker('unset', 'CF_ALLOWED_UNSET');
  assert.equal(unset.status, 400);
  assert.equal(unset.body.error?.param, 'apiKeyEnv');
  assert.match(unset.body.error!.message, /is not set/);
  assert.deepEqual(workerIds(), ['listed', 'same-key', 'w0']);
});

test('--engine-key-envs: a list from the flag, the environment or the config file; a bad entry names the setting', () => {
  assert.deepEqual(resolveServe(['--engine-key-envs', 'VLLM_KEY_*,SGLANG_KEY']).config.engineKeyEnvs, [
    'VLLM_KEY_*',
    'SGLANG_KEY',
  ]);
  assert.deepEqual(resolveServe([], { CONTEXTFORGE_ENGINE_KEY_ENVS: 'A_KEY' }).config.engineKeyEnvs, ['A_KEY']);
  assert.deepEqual(resolveServe([]).config.engineKeyEnvs, []);
  assert.throws(() => resolveServe(['--engine-key-envs', 'BAD-NAME']), /engine-key-envs/);
});
