import { randomBytes } from 'node:crypto';
import { after } from 'node:test';
import { Redis } from 'ioredis';
import type { KVAwareRouter } from '../../src/core/router/index.js';
import type { RedisStateStore } from '../../src/state/redis-state-store.js';
import type { StateStore, StateStoreHost, WorkerRecord } from '../../src/state/state-store.js';
import { REDIS_URL } from './redis-routers.js';
import { settled } from './wait.js';

/**
 * The host a state store attaches to, as the gateway binds it: `configured` workers registered
 * with `router`, changes from the shared state applied to both. With `posted`, KV events from
 * another replica or process are recorded there as this one was given them. `unheldRemovals`
 * lists the removals the store asked for of workers the host no longer held.
 */
export function workerHost(
  router: KVAwareRouter,
  configured: string[],
  posted?: Array<[string, unknown]>,
): { host: StateStoreHost; workers: WorkerRecord[]; unheldRemovals: string[] } {
  const workers: WorkerRecord[] = configured.map((w) => ({ id: w, url: `http://${w}` }));
  const unheldRemovals: string[] = [];
  for (const w of workers) router.registerWorker(w.id);
  const host: StateStoreHost = {
    router,
    listWorkers: () => workers,
    addWorkerFromState: (w) => {
      workers.push(w);
      router.registerWorker(w.id);
    },
    removeWorkerFromState: (wid) => {
      const at = workers.findIndex((w) => w.id === wid);
      // as the gateway: nothing to remove; recorded, for a store must not ask it
      if (at === -1) return void unheldRemovals.push(wid);
      workers.splice(at, 1);
      router.removeWorker(wid);
    },
    drainWorkerFromState: (wid, draining) => (draining ? router.drainWorker(wid) : router.resumeWorker(wid)),
    ...(posted && { applyKvEventsFromState: (wid: string, events: unknown) => void posted.push([wid, events]) }),
    log: () => {},
  };
  return { host, workers, unheldRemovals };
}

/**
 * The host of a store whose workers stay as configured: `workerIds` registered with `router`,
 * the shared registry's changes ignored, the store's log lines recorded in `logs`.
 */
export function fixedWorkersHost(router: KVAwareRouter, workerIds: string[]): { host: StateStoreHost; logs: string[] } {
  for (const w of workerIds) router.registerWorker(w);
  const workers: WorkerRecord[] = workerIds.map((w) => ({ id: w, url: `http://${w}` }));
  const logs: string[] = [];
  const host: StateStoreHost = {
    router,
    listWorkers: () => workers,
    addWorkerFromState: () => {},
    removeWorkerFromState: () => {},
    log: (m) => logs.push(m),
  };
  return { host, logs };
}

/** The ids of the workers `router` holds draining. */
export const drainingAt = (router: KVAwareRouter): string[] =>
  router
    .listWorkers()
    .filter((w) => w.draining)
    .map((w) => w.id);

/**
 * Drains `workerId` at `from` as the admin API does and shares it; returns what `to` holds
 * draining once it holds one worker so (or the last value read at the deadline).
 */
export async function drainAndSettle(
  from: { router: KVAwareRouter; store: Pick<StateStore, 'workerDrained'> },
  to: { router: KVAwareRouter },
  workerId: string,
): Promise<string[]> {
  from.router.drainWorker(workerId);
  from.store.workerDrained(workerId, true);
  return settled(
    () => drainingAt(to.router),
    (d) => d.length === 1,
  );
}

/** The pub/sub channel `store` publishes on and listens to (a private member of RedisStateStore). */
export const channelOf = (store: RedisStateStore): string => (store as unknown as { channel: string }).channel;

/**
 * Fresh Redis key prefixes (`cf-test-<tag>-<random>:`) for one test file: `fresh()` makes one and
 * records it, `drop()` deletes every key under those made (after the stores using them close).
 */
export function testPrefixes(tag: string): { fresh(): string; drop(): Promise<void> } {
  const made: string[] = [];
  return {
    fresh() {
      const prefix = `cf-test-${tag}-${randomBytes(4).toString('hex')}:`;
      made.push(prefix);
      return prefix;
    },
    drop: () => dropPrefixes(made),
  };
}

/**
 * What a shared-state test file holds against the real Redis: its fresh prefixes (testPrefixes),
 * the stores it opens (pushed by the file) and a connection of its own for reading and editing
 * keys; after the file's tests, the stores are closed, the prefixes' keys deleted and the
 * connection closed.
 */
export function sharedStateScope(tag: string): {
  prefixes: ReturnType<typeof testPrefixes>;
  stores: RedisStateStore[];
  redis: Redis;
} {
  const prefixes = testPrefixes(tag);
  const stores: RedisStateStore[] = [];
  const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
  after(async () => {
    for (const s of stores) await s.close();
    await prefixes.drop();
    redis.disconnect();
  });
  return { prefixes, stores, redis };
}

/** Deletes every Redis key under each of `prefixes`. */
export async function dropPrefixes(prefixes: string[]): Promise<void> {
  const r = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
  await r.connect();
  for (const prefix of prefixes) {
    const keys = await r.keys(`${prefix}*`);
    if (keys.length > 0) await r.del(...keys);
  }
  r.disconnect();
}
