/**
 * A Redis that answers, but refuses what the replicas write: out of memory under `noeviction`
 * (OOM). Decisions must still reach the other replicas (PUBLISH needs no memory), the refusal
 * is logged once and counted, requests are served, and a replica starting meanwhile comes up.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { MockEngine } from '../../src/engines/mock-engine.js';
import type { Gateway } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { post, RedisProcess, stateReplica, unhandledRejections } from './harness.js';
import { until } from '../helpers/wait.js';

test('Redis out of memory: decisions still reach the other replicas, the refusal is logged once, a new replica comes up', async () => {
  const redis = await new RedisProcess(['--maxmemory-policy', 'noeviction']).start();
  const engine = await new MockEngine({ decodeTokS: 2000 }).start();
  const filler = new Redis({ port: redis.port, lazyConnect: true, maxRetriesPerRequest: 0 });
  const logs: string[][] = [[], [], []];
  const stores: RedisStateStore[] = [];
  const gateways: Gateway[] = [];
  const unhandled = unhandledRejections();
  const replica = async () => {
    const i = stores.length;
    const state = new RedisStateStore({ url: redis.url, prefix: 'cf-oom:', syncIntervalMs: 50 });
    stores.push(state);
    const { gateway, base } = await stateReplica(state, `http://127.0.0.1:${engine.port}`, (m) => logs[i].push(m));
    gateways.push(gateway);
    return base;
  };
  try {
    const base = await replica();
    await replica();
    await until(() => stores.every((s) => s.stats().connected === true), 'the replicas to connect');
    // past maxmemory: every command that may grow the dataset is refused from now on
    await filler.connect();
    for (let i = 0; i < 4; i++) await filler.set(`cf-oom-filler-${i}`, 'x'.repeat(512 * 1024));
    await filler.config('SET', 'maxmemory', '1mb');
    await assert.rejects(filler.set('cf-oom-probe', '1'), /OOM/);

    const heard = stores[1].stats().decisionsApplied as number;
    for (let i = 0; i < 20; i++) {
      const r = await post(base, '/v1/completions', {
        prompt: `out of memory ${i} `.repeat(8),
        max_tokens: 1,
        contextforge: { workflowId: `oom-wf-${i}`, workflowStep: 0 },
      });
      assert.equal(r.status, 200, r.text);
    }
    await until(
      () => (stores[1].stats().decisionsApplied as number) >= heard + 20,
      "the second replica to hear the first's decisions",
    );
    assert.ok((stores[0].stats().refused as number) > 0);
    assert.equal(stores[0].stats().lastRefusal, 'OOM');
    assert.equal(logs[0].filter((m) => m.includes('OOM')).length, 1, logs[0].join('\n'));

    // a replica starting now cannot write its workers back, and still comes up and loads the rest
    await replica();
    await until(() => stores[2].stats().connected === true, 'the third replica to come up');
    assert.equal(logs[2].filter((m) => m.includes('resynchronising')).length, 0, logs[2].join('\n'));
    assert.deepEqual(unhandled.seen.map(String), []);
  } finally {
    unhandled.stop();
    filler.disconnect();
    for (const g of gateways) await g.close();
    await engine.close();
    await redis.kill();
  }
});
