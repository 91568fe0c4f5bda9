import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { startGateway } from '../../src/cli/commands/serve-run.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { resolveServe } from '../helpers/serve-config.js';
import { until } from '../helpers/wait.js';
import { REDIS_URL } from '../helpers/redis-routers.js';

// the machine's Redis, database 9 only: every key this test writes is under a fresh prefix
const STATE = (() => {
  const url = new URL(REDIS_URL);
  url.pathname = '/9';
  return url.toString();
})();

test('--prediction-ttl-ms is the lifetime of the shared chain entries in Redis', async () => {
  const engine = await new MockEngine({}).start();
  const prefix = `cf-ttl-${randomBytes(4).toString('hex')}:`;
  const redis = new Redis(STATE, { maxRetriesPerRequest: 1 });
  const { config } = resolveServe(
    [
      '--state',
      STATE,
      '--state-prefix',
      prefix,
      '--prediction-ttl-ms',
      '3000',
      '--worker',
      `id=w1,url=http://127.0.0.1:${engine.port}`,
    ],
    { CONTEXTFORGE_ADMIN_TOKEN: 'prediction-ttl-test-token' },
  );
  const { gateway, close } = await startGateway(config, () => {});
  try {
    const res = await gateway.app.inject({
      method: 'POST',
      url: '/v1/completions',
      payload: { model: 'mock', prompt: 'a prompt long enough to fill a block or two of tokens '.repeat(8) },
    });
    assert.equal(res.statusCode, 200, res.body);
    let keys: string[] = [];
    await until(async () => (keys = await redis.keys(`${prefix}chain:*`)).length > 0, 'a chain key');
    const pttl = await redis.pttl(keys[0]);
    assert.ok(pttl > 0 && pttl <= 3000, `PTTL ${pttl}`);
  } finally {
    await close();
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
    await engine.close();
  }
});

test('--prediction-ttl-ms is a whole number of milliseconds from 1 to 2^31 - 1', () => {
  for (const bad of ['0', '1.5', '1e20', '2147483648'])
    assert.throws(() => resolveServe(['--prediction-ttl-ms', bad]), /--prediction-ttl-ms must be/, bad);
  assert.throws(() => resolveServe([], { CONTEXTFORGE_PREDICTION_TTL_MS: '0' }), /CONTEXTFORGE_PREDICTION_TTL_MS/);
  assert.equal(resolveServe(['--prediction-ttl-ms', '1']).config.predictionTtlMs, 1);
  assert.equal(resolveServe(['--prediction-ttl-ms', '2147483647']).config.predictionTtlMs, 2 ** 31 - 1);
  assert.equal(resolveServe([]).config.predictionTtlMs, undefined);
});
