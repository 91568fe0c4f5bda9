/**
 * A replica closed while it is still connecting to Redis (the gateway stopped during its
 * start) must not connect afterwards: nothing of it may stay open.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { RedisProcess, RedisProxy } from '../faults/harness.js';
import { until } from '../helpers/wait.js';

test('a store closed while attaching leaves no connection to Redis open', async () => {
  const redis = await new RedisProcess().start();
  const proxy = await new RedisProxy(redis.port).start();
  const connections = () => (proxy as unknown as { sockets: Set<unknown> }).sockets.size;
  const state = new RedisStateStore({ url: proxy.url, prefix: 'cf-close-attach:' });
  try {
    // Redis accepts the connection but its answers do not come back: the start waits
    proxy.withhold('');
    const router = new KVAwareRouter({ blockSize: 16 });
    const attached = state.attach({
      router,
      listWorkers: () => [],
      addWorkerFromState: () => {},
      removeWorkerFromState: () => {},
      log: () => {},
    });
    await until(() => proxy.withheld >= 1, 'the store to start connecting');
    await state.close();
    (proxy as unknown as { word: string | undefined }).word = undefined; // Redis answers again
    await attached;
    // whatever the start was doing when it was closed, it ends without a connection
    await until(() => connections() === 0, 'every connection of the closed store to end', { timeoutMs: 3000 });
    assert.equal(state.stats().connected, false);
  } finally {
    await proxy.close();
    await redis.kill();
  }
});
