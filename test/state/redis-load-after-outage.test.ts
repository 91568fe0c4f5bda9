/**
 * A replica cut off from Redis cannot publish the releases of its requests that end meanwhile;
 * the other replicas, which stayed connected, kept counting them on its workers. When it comes
 * back it says what it holds, and they replace their tally of it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import type { StateStoreHost, WorkerRecord } from '../../src/state/state-store.js';
import { RedisProcess, RedisProxy } from '../faults/harness.js';
import { until } from '../helpers/wait.js';

function replica(url: string, id: string) {
  const router = new KVAwareRouter({ blockSize: 16 });
  const workers: WorkerRecord[] = [{ id: 'e0', url: 'http://e0' }];
  router.registerWorker('e0');
  const host: StateStoreHost = {
    router,
    listWorkers: () => workers,
    addWorkerFromState: () => {},
    removeWorkerFromState: () => {},
    log: () => {},
  };
  // a long sync interval: what B knows of A comes from A's messages
  const store = new RedisStateStore({ url, prefix: 'cf-ld:', replicaId: id, syncIntervalMs: 60_000 });
  return { router, store, host, inFlight: () => router.listWorkers()[0].inFlightRequests };
}

test("a request that ended while its replica was cut off from Redis leaves the others' view when it is back", async () => {
  const redis = await new RedisProcess().start();
  const proxy = await new RedisProxy(redis.port).start();
  const a = replica(proxy.url, 'a');
  const b = replica(redis.url, 'b');
  try {
    await a.store.attach(a.host);
    await b.store.attach(b.host);
    const ended = a.router.route({ text: 'x'.repeat(4000), promptTokens: 1000 }, { share: true });
    const running = a.router.route({ text: 'y'.repeat(4000), promptTokens: 500 }, { share: true });
    a.store.decisionMade(ended.shared!);
    a.store.decisionMade(running.shared!);
    await until(() => b.inFlight() === 2, "B to count A's two requests");

    // A is cut off (B is not) while one of its requests ends
    await proxy.close();
    await until(() => a.store.stats().connected === false, 'A to lose Redis');
    a.router.release(ended.ticket);
    a.store.decisionEnded(ended.shared!);
    await proxy.start();
    await until(() => a.store.stats().connected === true, 'A to reconnect');

    await until(() => b.inFlight() === 1, "B to count only A's request still running", { timeoutMs: 5000 });
    assert.equal(b.router.listWorkers()[0].queuedPrefillTokens, a.router.localLoad('e0').queuedPrefillTokens);
  } finally {
    await a.store.close();
    await b.store.close();
    await proxy.close();
    await redis.kill();
  }
});
