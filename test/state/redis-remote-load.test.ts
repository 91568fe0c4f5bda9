import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import type { InFlightLoad } from '../../src/core/router/index.js';
import { redisRouters } from '../helpers/redis-routers.js';
import { until } from '../helpers/wait.js';

// Two router replicas on the machine's Redis (127.0.0.1:6379, which .ci/run starts when
// nothing answers there), without gateways: what B sees of A's request as it moves from
// queued prefill to decode to done. Nothing is mocked; nothing is skipped.
const routers = redisRouters();
after(() => routers.close());

async function replica(id: string) {
  const { router, store } = await routers.replica(id);
  return { router, store, load: (): InFlightLoad => router.listWorkers()[0] };
}

const view = (l: InFlightLoad) => ({
  inFlightRequests: l.inFlightRequests,
  queuedPrefillTokens: l.queuedPrefillTokens,
  activeDecodeTokens: l.activeDecodeTokens,
});

test("B sees A's request as queued prefill, then as decode load after A's prefill-done, then not at all", async () => {
  const a = await replica('a');
  const b = await replica('b');
  const d = a.router.route({ text: 'x'.repeat(4000), promptTokens: 1000 }, { share: true });
  const shared = d.shared!;
  assert.equal(shared.prefillTokens, 1000);
  assert.equal(shared.decodeTokens, 1000);
  a.store.decisionMade(shared);
  await until(() => b.load().inFlightRequests === 1, 'B to count the decision');
  assert.deepEqual(view(b.load()), { inFlightRequests: 1, queuedPrefillTokens: 1000, activeDecodeTokens: 0 });

  a.router.markPrefillDone(d.ticket);
  a.store.decisionPrefilled(shared);
  a.store.decisionPrefilled(shared); // once per decision, however often it is called
  await until(() => b.load().activeDecodeTokens > 0, 'B to move it to decode');
  assert.deepEqual(view(b.load()), { inFlightRequests: 1, queuedPrefillTokens: 0, activeDecodeTokens: 1000 });
  // B's own part stays empty: what it shares in its snapshot is only its own work
  assert.deepEqual(view(b.router.localLoad('e0')), {
    inFlightRequests: 0,
    queuedPrefillTokens: 0,
    activeDecodeTokens: 0,
  });

  a.router.release(d.ticket);
  a.store.decisionEnded(shared);
  await until(() => b.load().inFlightRequests === 0, 'B to drop it');
  assert.deepEqual(view(b.load()), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
});

test('a release from a replica that never sent prefill-done (format version 1) still takes its prefill off', async () => {
  const a = await replica('a1');
  const b = await replica('b1');
  const d = a.router.route({ text: 'y'.repeat(4000), promptTokens: 600 }, { share: true });
  a.store.decisionMade(d.shared!);
  await until(() => b.load().queuedPrefillTokens === 600, 'B to count the decision');
  a.router.release(d.ticket);
  a.store.decisionEnded(d.shared!);
  await until(() => b.load().inFlightRequests === 0, 'B to drop it');
  assert.deepEqual(view(b.load()), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
});
