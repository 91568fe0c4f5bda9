/**
 * An engine whose KV events say it holds more than any engine does (its removals lost, or a
 * broken publisher): what the router keeps for it stays bounded, and the index agrees with it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KvEventApplier, emptyCounts } from '../../src/engines/kv-events/applier.js';
import { KVAwareRouter } from '../../src/index.js';
import { eventBatch, storedEvent } from '../helpers/kv-event-builders.js';

test('stores without removals past the bound drop the worker entries instead of growing without end', () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise', maxIndexEntries: 1000 });
  router.registerWorker('w');
  const applier = new KvEventApplier(router, new Map(), { maxTrackedBlocks: 100 });
  const counts = emptyCounts();
  for (let n = 0; n < 250; n++)
    applier.apply('w', eventBatch(null, storedEvent([BigInt(n + 1)], null, n * 4, 4)), counts);
  assert.ok(applier.trackedBlocks('w') <= 100, `tracked ${applier.trackedBlocks('w')} blocks`);
  assert.equal(counts.skipped.over_capacity, 2);
  // the index holds exactly what the applier tracks: the blocks since the last drop
  assert.equal(router.getStats().workerLoads.w.activeBlocks, applier.trackedBlocks('w'));
  assert.equal(
    router.route({ tokens: [248 * 4, 248 * 4 + 1, 248 * 4 + 2, 248 * 4 + 3] }, { dryRun: true }).cachedTokens,
    4,
  );
});

test("the bound defaults to the router's own index capacity (maxIndexEntries)", () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise', maxIndexEntries: 50 });
  router.registerWorker('w');
  const applier = new KvEventApplier(router);
  const counts = emptyCounts();
  for (let n = 0; n < 120; n++)
    applier.apply('w', eventBatch(null, storedEvent([BigInt(n + 1)], null, n * 4, 4)), counts);
  assert.ok(applier.trackedBlocks('w') <= 50, `tracked ${applier.trackedBlocks('w')} blocks`);
  assert.equal(counts.skipped.over_capacity, 2);
});
