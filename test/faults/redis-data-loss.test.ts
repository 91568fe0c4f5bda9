/**
 * Redis losing its data without closing the replicas' connections: flushed, or failed over
 * to a server that does not have it (a replica promoted after a resync from an empty primary).
 * Nothing reconnects, so the write-back that follows a reconnection never ran: the registry and
 * the workflows stayed lost for any replica that starts afterwards.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { MockEngine } from '../../src/engines/mock-engine.js';
import type { Gateway } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { post, RedisProcess, stateReplicas } from './harness.js';
import { until } from '../helpers/wait.js';

test('Redis emptied under running replicas (FLUSHALL, a failover): they notice and write their state back', async () => {
  const redis = await new RedisProcess().start();
  const engine = await new MockEngine({ decodeTokS: 2000 }).start();
  const admin = new Redis({ port: redis.port, lazyConnect: true, maxRetriesPerRequest: 0 });
  const stores = [0, 1].map(() => new RedisStateStore({ url: redis.url, prefix: 'cf-loss:', syncIntervalMs: 50 }));
  const logs: string[][] = [[], []];
  const gateways: Gateway[] = [];
  try {
    const bases = await stateReplicas(stores, `http://127.0.0.1:${engine.port}`, gateways, logs);
    for (let i = 0; i < 10; i++) {
      const r = await post(bases[i % 2], '/v1/completions', {
        prompt: `data loss ${i} `.repeat(8),
        max_tokens: 1,
        contextforge: { workflowId: `loss-wf-${i}`, workflowStep: 0 },
      });
      assert.equal(r.status, 200, r.text);
    }
    await admin.connect();
    const workflows = () => admin.exists(...Array.from({ length: 10 }, (_, i) => `cf-loss:wf:loss-wf-${i}`));
    await until(async () => (await workflows()) === 10, 'the workflows to be written');

    await admin.flushall();
    await until(
      async () =>
        stores.every((s) => (s.stats().stateLost as number) >= 1) &&
        (await workflows()) === 10 &&
        (await admin.hlen('cf-loss:workers')) === 1,
      'every replica to notice, and the workflows and the registry to be written back',
    );
    // logged once per loss noticed
    for (const [i, l] of logs.entries())
      assert.equal(
        l.filter((m) => m.includes('lost the shared state')).length,
        stores[i].stats().stateLost,
        l.join('\n'),
      );
    for (const s of stores) assert.equal(s.stats().connected, true);
  } finally {
    admin.disconnect();
    for (const g of gateways) await g.close();
    await engine.close();
    await redis.kill();
  }
});
