import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import type { InFlightLoad, KVAwareRouter } from '../../src/core/router/index.js';
import type { RedisStateStore } from '../../src/state/redis-state-store.js';
import { REDIS_URL, redisRouters } from '../helpers/redis-routers.js';
import { channelOf } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

// Two router replicas on the machine's Redis, syncing every 50 ms: what A counts of B's work is
// kept by B's messages, and checked against B's own snapshot once B has been quiet. A forged
// message under B's id must not stay counted while B heartbeats; B's genuine traffic must not
// be touched by the check.
const fleets: Array<ReturnType<typeof redisRouters>> = [];
const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
after(async () => {
  for (const f of fleets) await f.close();
  redis.disconnect();
});

/** Replicas A and B of a fleet of their own (one key prefix), B seen by A. */
async function pair(a: string, b: string) {
  const routers = redisRouters();
  fleets.push(routers);
  const pair = { a: await routers.replica(a, {}, REDIS_URL, SYNC), b: await routers.replica(b, {}, REDIS_URL, SYNC) };
  // A has B tallied from its (idle) snapshot before B's traffic starts: a tally that messages
  // start while A reads that snapshot lacks what it held, which the check would rightly correct
  await seeded(pair.a.store, a);
  return pair;
}

const SYNC = { syncIntervalMs: 50 };

const view = (l: InFlightLoad) => ({
  inFlightRequests: l.inFlightRequests,
  queuedPrefillTokens: l.queuedPrefillTokens,
  activeDecodeTokens: l.activeDecodeTokens,
});

/** What A counts of the other replicas' work on e0: its total less its own. */
function remoteOf(router: KVAwareRouter): InFlightLoad {
  const w = router.listWorkers()[0];
  return {
    inFlightRequests: w.remoteInFlightRequests,
    queuedPrefillTokens: w.remoteQueuedPrefillTokens,
    activeDecodeTokens: w.remoteActiveDecodeTokens,
  };
}

/** Starts a request on B, shared: its ticket and how to move it on. */
function start(b: { router: KVAwareRouter; store: RedisStateStore }, tokens: number) {
  const d = b.router.route({ text: `p${Math.random()}`.repeat(200), promptTokens: tokens }, { share: true });
  b.store.decisionMade(d.shared!);
  return {
    prefilled() {
      b.router.markPrefillDone(d.ticket);
      b.store.decisionPrefilled(d.shared!);
    },
    end() {
      b.router.release(d.ticket);
      b.store.decisionEnded(d.shared!);
    },
  };
}

test("a forged 'ld' under a live replica's id is corrected from its snapshot within a few syncs", async () => {
  const { a, b } = await pair('A1', 'B1');
  // B has one genuine request in flight, which A counts
  start(b, 300);
  await until(() => remoteOf(a.router).inFlightRequests === 1, 'A to count B’s request');
  const genuine = view(b.router.localLoad('e0'));
  // anything that can publish on the channel says B holds 5,000 requests on e0
  await redis.publish(channelOf(a.store), JSON.stringify({ r: 'B1', k: 'ld', l: { e0: '5000,100000000,100000000' } }));
  await until(() => remoteOf(a.router).inFlightRequests === 5000, 'A to apply the forged load');
  // B keeps heartbeating and writing its snapshot (one request): A's tally of it follows that
  await until(() => remoteOf(a.router).inFlightRequests === 1, 'the forged load to be replaced from B’s snapshot', {
    timeoutMs: 5000,
  });
  assert.deepEqual(view(remoteOf(a.router)), genuine);
  assert.equal(a.store.stats().remoteLoadCorrected, 1);
  assert.equal(b.store.stats().remoteLoadCorrected, 0);
});

test("a genuine replica's load is not disturbed by the check under steady traffic", async () => {
  const { a, b } = await pair('A2', 'B2');
  const open: Array<ReturnType<typeof start> & { first: boolean }> = [];
  // bursts of requests starting, getting their first token and ending every few milliseconds,
  // with pauses between bursts long enough for A to check B's tally against its snapshot (B
  // quiet for two syncs and a command timeout: 350 ms here), requests left in flight across them
  for (let burst = 0; burst < 4; burst++) {
    const end = Date.now() + 600;
    while (Date.now() < end) {
      open.push({ ...start(b, 100 + Math.floor(Math.random() * 900)), first: false });
      await sleep(2);
      const waiting = open.find((r) => !r.first);
      if (waiting && Math.random() < 0.7) {
        waiting.prefilled();
        waiting.first = true;
      }
      if (open.length > 6) open.shift()!.end();
      await sleep(2);
    }
    await until(() => sameLoad(a.router, b.router), `A to agree with B after burst ${burst}`);
    // B quiet, with requests in flight: A checks its tally against B's snapshot, and keeps it
    const quietFrom = Date.now();
    await until(() => Date.now() - quietFrom > 700, 'B to stay quiet past the check', { intervalMs: 50 });
    assert.equal(a.store.stats().remoteLoadCorrected, 0, `burst ${burst}: nothing corrected`);
    assert.deepEqual(view(remoteOf(a.router)), view(b.router.localLoad('e0')), `burst ${burst}`);
    assert.ok(b.router.localLoad('e0').inFlightRequests > 0, 'requests in flight across the pause');
  }
  for (const r of open.splice(0)) r.end();
  await until(() => remoteOf(a.router).inFlightRequests === 0, 'A to see every request end');
  assert.equal(a.store.stats().remoteLoadCorrected, 0);
});

/**
 * Waits until `store` (replica `id`) has seen its peer and finished the load sync that did: the
 * sync that first lists a replica seeds its tally, and the next heartbeat is written only after it.
 */
async function seeded(store: RedisStateStore, id: string): Promise<void> {
  await until(() => store.stats().replicasSeen === 2, 'the replica to see its peer');
  const replicas = channelOf(store).replace(/events$/, 'replicas');
  const seen = Number(await redis.zscore(replicas, id));
  await until(async () => Number(await redis.zscore(replicas, id)) > seen, 'its next load sync');
}

function sameLoad(a: KVAwareRouter, b: KVAwareRouter): boolean {
  return JSON.stringify(view(remoteOf(a))) === JSON.stringify(view(b.localLoad('e0')));
}
