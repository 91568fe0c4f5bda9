/**
 * A content anchor's KV is its namespace's (LoRA adapter, cache salt, CLA group): a replica that
 * hears another's decision keys its anchors as the deciding one did. Two replicas on real Redis;
 * a decision of an earlier release (no namespace) is published as one would.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import type { KVAwareRouter, RouteRequest } from '../../src/core/router/index.js';
import { REDIS_URL, redisRouters } from '../helpers/redis-routers.js';
import { until } from '../helpers/wait.js';

const routers = redisRouters();
const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
after(async () => {
  await routers.close();
  redis.disconnect();
});

/** The anchor's tokens `router` credits its worker e0 with for a request of `ns`. */
function anchorTokens(router: KVAwareRouter, id: string, ns: Partial<RouteRequest>): number {
  const d = router.route(
    { text: 'a question of its own', contentAnchors: [{ id, tokens: 900 }], ...ns },
    { dryRun: true, explain: true },
  );
  return d.explain!.find((e) => e.worker === 'e0')!.anchorTokens;
}

test("a replica keys another's content anchors under the namespace they were made in", async () => {
  const a = await routers.replica('a');
  const b = await routers.replica('b');
  const d = a.router.route(
    { text: 'a question on the passage', contentAnchors: [{ id: 'doc', tokens: 900 }], lora: 'adapter-a' },
    { share: true },
  );
  a.store.decisionMade(d.shared!);
  await until(() => Number(b.store.stats().decisionsApplied) >= 1, "B to apply A's decision");
  assert.equal(anchorTokens(b.router, 'doc', { lora: 'adapter-a' }), 900);
  assert.equal(anchorTokens(b.router, 'doc', { lora: 'adapter-b' }), 0);
  assert.equal(anchorTokens(b.router, 'doc', {}), 0);

  // a replica of an earlier release sends no namespace: the anchors are taken as its CLA group's
  const channel = (b.store as unknown as { keys: { channel: string } }).keys.channel;
  const earlier = { r: 'older', k: 'd', w: 'e0', h: '', a: 'seed-doc', c: 3, ca: [{ id: 'old-doc', tokens: 900 }] };
  await redis.publish(channel, JSON.stringify(earlier));
  await until(() => Number(b.store.stats().decisionsApplied) >= 2, "B to apply the earlier release's decision");
  assert.equal(anchorTokens(b.router, 'old-doc', { claGroup: 3 }), 900);
  assert.equal(anchorTokens(b.router, 'old-doc', { claGroup: 4 }), 0);
});
