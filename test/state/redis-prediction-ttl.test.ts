import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { REDIS_URL, redisRouters } from '../helpers/redis-routers.js';
import { until } from '../helpers/wait.js';

// The shared chain entries of a store given no lifetime of its own live as long as its router's
// predicted blocks: a replica that starts later must not record a prediction its maker dropped.
const routers = redisRouters();
const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
after(async () => {
  await routers.close();
  redis.disconnect();
});

async function chainTtl(id: string, options: Parameters<typeof routers.replica>[1]): Promise<number> {
  const { router, store } = await routers.replica(id, options);
  const d = router.route(
    { tokens: Array.from({ length: 64 }, (_, i) => i + id.charCodeAt(0) * 1000) },
    { share: true },
  );
  const prefix = (store as unknown as { keys: { prefix: string } }).keys.prefix;
  store.decisionMade(d.shared!);
  let keys: string[] = [];
  await until(async () => (keys = await redis.keys(`${prefix}chain:*`)).length > 0, 'a chain key');
  const ttl = await redis.pttl(keys[0]);
  await redis.del(...keys);
  return ttl;
}

test("without predictionTtlMs the chain entries live as long as the router's predictions", async () => {
  const precise = await chainTtl('P', { indexMode: 'precise' });
  assert.ok(precise > 0 && precise <= 5_000, `precise: PTTL ${precise}`);
  const approximate = await chainTtl('A', {});
  assert.ok(approximate > 5_000 && approximate <= 120_000, `approximate: PTTL ${approximate}`);
  const set = await chainTtl('S', { indexMode: 'precise', predictionTtlMs: 9_000 });
  assert.ok(set > 5_000 && set <= 9_000, `set: PTTL ${set}`);
});
