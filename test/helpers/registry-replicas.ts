/**
 * Gateway replicas sharing a worker registry in Redis, driven through their admin API, and the
 * registry read back, for the tests of admin worker changes (redis-admin-order,
 * redis-resync-records).
 */
import assert from 'node:assert/strict';
import type { Redis } from 'ioredis';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';

export const REGISTRY_ADMIN_TOKEN = 'registry-replicas-test-token-0123456789';

/**
 * A replica: a gateway configured with worker e0 (at a port nothing serves), sharing the
 * registry under `prefix` through the Redis at `url`; kept in `gateways` for closing.
 */
export async function registryReplica(
  gateways: Gateway[],
  url: string,
  prefix: string,
  id: string,
  log: (message: string) => void = () => {},
): Promise<Gateway> {
  const g = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'e0', url: 'http://127.0.0.1:9' }],
    state: new RedisStateStore({ url, prefix, replicaId: id, syncIntervalMs: 60_000 }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: REGISTRY_ADMIN_TOKEN,
    log,
  });
  gateways.push(g);
  return g;
}

/** An admin API call: its status, its JSON body and the body as text. */
export async function adminCall(g: Gateway, method: 'GET' | 'POST' | 'DELETE', url: string, body?: unknown) {
  const res = await g.app.inject({
    method,
    url,
    headers: { authorization: `Bearer ${REGISTRY_ADMIN_TOKEN}` },
    ...(body === undefined ? {} : { payload: body as Record<string, unknown> }),
  });
  return { status: res.statusCode, body: res.json() as Record<string, unknown>, text: res.body };
}

/** What a replica lists (`id url`, ` draining` when it is), sorted. */
export async function listedWorkers(g: Gateway): Promise<string[]> {
  const res = await adminCall(g, 'GET', '/admin/workers');
  assert.equal(res.status, 200, res.text);
  const workers = res.body.workers as Array<{ id: string; url: string; draining: boolean }>;
  return workers.map((w) => `${w.id} ${w.url}${w.draining ? ' draining' : ''}`).sort();
}

/** The registry in Redis under `prefix`, as listedWorkers() lists a replica. */
export async function registryWorkers(redis: Redis, prefix: string): Promise<string[]> {
  const [workers, draining] = await Promise.all([
    redis.hgetall(`${prefix}workers`),
    redis.hgetall(`${prefix}draining`),
  ]);
  return Object.entries(workers)
    .map(([id, json]) => `${id} ${(JSON.parse(json) as { url: string }).url}${draining[id] ? ' draining' : ''}`)
    .sort();
}
