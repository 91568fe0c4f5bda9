import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { KVAwareRouter, type KVAwareRouterOptions } from '../../src/core/router/index.js';
import { RedisStateStore, type RedisStateOptions } from '../../src/state/redis-state-store.js';
import type { StateStoreHost, WorkerRecord } from '../../src/state/state-store.js';
import { RedisProcess, RedisProxy } from '../faults/harness.js';
import { until } from './wait.js';

/**
 * The tests' Redis: CONTEXTFORGE_TEST_REDIS (which scripts/test.sh sets to one it starts when
 * nothing answers on 127.0.0.1:6379), else the machine's on 127.0.0.1:6379.
 */
export const REDIS_URL = process.env.CONTEXTFORGE_TEST_REDIS ?? 'redis://127.0.0.1:6379';

/**
 * Router replicas sharing state through Redis, without gateways: each has one worker `e0` and
 * (unless `store` says otherwise) a long sync interval, so what one learns of another comes from
 * its messages, not from its snapshots. Every replica lives under one fresh key prefix, deleted
 * by close().
 */
export function redisRouters() {
  const prefix = `cf-test-${randomBytes(4).toString('hex')}:`;
  const stores: RedisStateStore[] = [];
  return {
    /**
     * `url`: the Redis this replica reaches (default the machine's; another server, or a proxy in
     * front of one); `store`: its store's options beside those.
     */
    async replica(
      id: string,
      options: Omit<KVAwareRouterOptions, 'blockSize'> & { blockSize?: number } = {},
      url = REDIS_URL,
      store: Omit<RedisStateOptions, 'url' | 'prefix' | 'replicaId'> = {},
    ) {
      const router = new KVAwareRouter({ blockSize: 16, ...options });
      const workers: WorkerRecord[] = [{ id: 'e0', url: 'http://e0' }];
      for (const w of workers) router.registerWorker(w.id);
      const host: StateStoreHost = {
        router,
        listWorkers: () => workers,
        addWorkerFromState: () => {},
        removeWorkerFromState: () => {},
        log: () => {},
      };
      const state = new RedisStateStore({ url, prefix, replicaId: id, syncIntervalMs: 60_000, ...store });
      stores.push(state);
      await state.attach(host);
      return { router, store: state };
    },
    async close() {
      for (const s of stores) await s.close();
      const r = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
      await r.connect();
      const keys = await r.keys(`${prefix}*`);
      if (keys.length > 0) await r.del(...keys);
      r.disconnect();
    },
  };
}

/** A replica of redisRouters(): its router and its store. */
export type TestReplica = Awaited<ReturnType<ReturnType<typeof redisRouters>['replica']>>;

/**
 * Two replicas on a Redis of their own, `a` through a TCP proxy that can cut it off and `b`
 * directly; `cutOff()` and `reconnect()` wait until `a`'s store has seen it. Everything is
 * closed after `run`, whatever it does.
 */
export async function withReplicaCutOff(
  run: (rig: { a: TestReplica; b: TestReplica; cutOff(): Promise<void>; reconnect(): Promise<void> }) => Promise<void>,
): Promise<void> {
  const redis = await new RedisProcess().start();
  const proxy = await new RedisProxy(redis.port).start();
  const routers = redisRouters();
  try {
    const a = await routers.replica('a', {}, proxy.url);
    const b = await routers.replica('b', {}, redis.url);
    await run({
      a,
      b,
      async cutOff() {
        await proxy.close();
        await until(() => a.store.stats().connected === false, 'A to lose Redis');
      },
      async reconnect() {
        await proxy.start();
        await until(() => a.store.stats().connected === true, 'A to reconnect');
      },
    });
  } finally {
    await routers.close();
    await proxy.close();
    await redis.kill();
  }
}
