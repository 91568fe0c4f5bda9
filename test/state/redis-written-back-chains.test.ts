/**
 * A replica cut off from Redis keeps routing, and writes its decisions' block entries back when
 * it is back. The replicas that stayed connected load no entries then: unless the entries
 * written back are announced, they never learn of those decisions. Real Redis behind a TCP
 * proxy that cuts one replica off.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RedisProcess, RedisProxy } from '../faults/harness.js';
import { redisRouters } from '../helpers/redis-routers.js';
import { until } from '../helpers/wait.js';

test('the block entries a replica writes back after an outage reach the replicas that stayed connected', async () => {
  const redis = await new RedisProcess().start();
  const proxy = await new RedisProxy(redis.port).start();
  const routers = redisRouters();
  try {
    const a = await routers.replica('a', {}, proxy.url);
    const b = await routers.replica('b', {}, redis.url);
    assert.equal(b.router.getStats().index.entries, 0);

    await proxy.close();
    await until(() => a.store.stats().connected === false, 'A to lose Redis');
    const d = a.router.route({ text: 'outage prompt '.repeat(100), promptTokens: 400 }, { share: true });
    a.store.decisionMade(d.shared!);
    a.router.release(d.ticket);
    a.store.decisionEnded(d.shared!);
    await proxy.start();
    await until(() => a.store.stats().connected === true, 'A to reconnect');

    await until(() => b.router.getStats().index.entries > 0, "B to learn the blocks of A's decision");
    assert.equal(b.router.getStats().index.entries, a.router.getStats().index.entries);
    // the announcement is no request in flight
    assert.equal(b.router.listWorkers()[0].inFlightRequests, 0);
  } finally {
    await routers.close();
    await proxy.close();
    await redis.kill();
  }
});
