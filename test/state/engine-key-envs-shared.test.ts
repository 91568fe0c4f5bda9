/**
 * A worker another replica adds through the shared state is held to this replica's own list
 * of engine-key variables (--engine-key-envs): one it may not read is not added here, and the
 * replica says so in its log instead of dropping the message unseen.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { dropPrefixes } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

const TOKEN = 'engine-key-envs-test-token-0123456789';
const gateways: Gateway[] = [];
const prefixes: string[] = [];
after(async () => {
  for (const g of gateways) await g.close();
  await dropPrefixes(prefixes);
});

async function replica(prefix: string, options: Partial<GatewayOptions>): Promise<Gateway> {
  const g = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'base', url: 'http://127.0.0.1:1' }],
    state: new RedisStateStore({ url: REDIS_URL, prefix, syncIntervalMs: 60_000 }),
    env: { CF_K_1: 'engine-key' },
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: TOKEN,
    ...options,
  });
  gateways.push(g);
  return g;
}

const workerIds = (g: Gateway) =>
  g.router
    .listWorkers()
    .map((w) => w.id)
    .sort();

test('a worker whose engine-key variable this replica may not read is not added here, and the log says why', async () => {
  const prefix = `cf-test-keyenv-${randomBytes(4).toString('hex')}:`;
  prefixes.push(prefix);
  const allowing = await replica(prefix, { engineKeyEnvs: ['CF_K_*'], log: () => {} });
  const logs: string[] = [];
  const strict = await replica(prefix, { log: (m) => logs.push(m) });
  const res = await allowing.app.inject({
    method: 'POST',
    url: '/admin/workers',
    headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
    payload: { id: 'keyed', url: 'http://127.0.0.1:3', apiKeyEnv: 'CF_K_1' },
  });
  assert.equal(res.statusCode, 201, res.body);
  await until(
    () => logs.some((m) => /worker 'keyed' added by another replica not added here: .*--engine-key-envs/.test(m)),
    'the strict replica to log the refusal',
  );
  assert.deepEqual(workerIds(strict), ['base']);
  assert.deepEqual(workerIds(allowing), ['base', 'keyed']);
  // a replica that starts later reads it from the shared registry, and says that
  const laterLogs: string[] = [];
  const later = await replica(prefix, { log: (m) => laterLogs.push(m) });
  assert.ok(
    laterLogs.some((m) => /^worker 'keyed' from the shared registry not added here: .*--engine-key-envs/.test(m)),
    laterLogs.join('\n'),
  );
  assert.deepEqual(workerIds(later), ['base']);
});
