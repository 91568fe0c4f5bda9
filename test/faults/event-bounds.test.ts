/**
 * An engine whose KV events say it holds more than any engine does (its removals lost, or a
 * broken publisher): what the router keeps for it stays bounded, and the index agrees with it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  KvEventApplier,
  MAX_KV_GROUPS_PER_WORKER,
  MAX_MEDIA_PER_WORKER,
  MAX_MEDIUM_CHARS,
  MIN_TRACKED_BLOCKS_PER_WORKER,
  emptyCounts,
  trackedBlocksBound,
} from '../../src/engines/kv-events/applier.js';
import type { KvEvent } from '../../src/engines/kv-events/decode.js';
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

const offloadCopy = (hash: bigint, medium: string): KvEvent => ({
  type: 'BlockStored',
  blockHashes: [hash],
  parentBlockHash: null,
  tokenIds: [],
  blockSize: 0,
  loraId: null,
  medium,
  loraName: null,
  groupIdx: null,
});

test('offload copies of unknown blocks, under ever new media, leave nothing behind', () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
  router.registerWorker('w');
  const applier = new KvEventApplier(router);
  const counts = emptyCounts();
  for (let n = 0; n < 5000; n++) applier.apply('w', eventBatch(null, offloadCopy(BigInt(n + 1), `m${n}`)), counts);
  assert.deepEqual(applier.trackedState('w'), { blocks: 0, media: 0, groups: 0 });
  assert.equal(applier.trackedWorkers(), 0);
  assert.equal(counts.skipped.unknown_offload, 5000);
  // removals of blocks never stored create nothing either
  applier.apply(
    'w',
    eventBatch(null, { type: 'BlockRemoved', blockHashes: [1n, 2n], medium: 'm1', groupIdx: null }),
    counts,
  );
  assert.equal(applier.trackedWorkers(), 0);
  assert.equal(counts.unknownRemovals, 2);
});

test('offload media kept per worker are bounded in number and name length; what is past them is skipped and counted', () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
  router.registerWorker('w');
  const applier = new KvEventApplier(router);
  const counts = emptyCounts();
  applier.apply('w', eventBatch(null, storedEvent([1n], null, 0, 4)), counts);
  for (let n = 0; n < 5000; n++) applier.apply('w', eventBatch(null, offloadCopy(1n, `m${n}`)), counts);
  assert.equal(applier.trackedState('w').media, MAX_MEDIA_PER_WORKER);
  assert.equal(counts.offloadBlocks, MAX_MEDIA_PER_WORKER);
  assert.equal(counts.skipped.unknown_offload, 5000 - MAX_MEDIA_PER_WORKER);
  // a medium named at length is not kept, even with room left
  applier.clearWorker('w');
  applier.apply('w', eventBatch(null, storedEvent([1n], null, 0, 4)), counts);
  applier.apply('w', eventBatch(null, offloadCopy(1n, 'x'.repeat(MAX_MEDIUM_CHARS + 1))), counts);
  assert.equal(applier.trackedState('w').media, 0);
  assert.deepEqual(applier.copies('w', 1n), { gpu: 1, offload: 0 });
  // the media vLLM uses are kept
  applier.apply('w', eventBatch(null, offloadCopy(1n, 'CPU')), counts);
  assert.equal(applier.trackedState('w').media, 1);
  assert.deepEqual(applier.copies('w', 1n), { gpu: 1, offload: 1 });
});

test('KV group kinds kept per worker are bounded; a store of a group past them is not indexed', () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
  router.registerWorker('w');
  const applier = new KvEventApplier(router);
  const counts = emptyCounts();
  for (let n = 0; n < 5000; n++)
    applier.apply(
      'w',
      eventBatch(null, {
        ...storedEvent([BigInt(n + 1)], null, 4 * n, 4),
        groupIdx: n + 1,
        kvCacheSpecKind: 'sliding_window',
      } as KvEvent),
      counts,
    );
  assert.equal(applier.trackedState('w').groups, MAX_KV_GROUPS_PER_WORKER);
  assert.equal(counts.skipped.other_group, 5000);
  const full = {
    ...storedEvent([9n], null, 40_000, 4),
    groupIdx: 99_999,
    kvCacheSpecKind: 'full_attention',
  } as KvEvent;
  applier.apply('w', eventBatch(null, full), counts);
  assert.equal(counts.skipped.other_group, 5001, 'a full-attention group past the bound is not indexed');
  assert.equal(applier.trackedState('w').groups, MAX_KV_GROUPS_PER_WORKER);
  assert.equal(applier.trackedBlocks('w'), 0);
});

test('clearing a worker (a gap, a restart, its removal) frees everything kept for it', () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
  router.registerWorker('w');
  router.registerWorker('v');
  const applier = new KvEventApplier(router);
  applier.apply(
    'w',
    eventBatch(
      null,
      { ...storedEvent([1n], null, 0, 4), groupIdx: 0, kvCacheSpecKind: 'full_attention' } as KvEvent,
      { ...storedEvent([2n], null, 100, 4), groupIdx: 1, kvCacheSpecKind: 'sliding_window' } as KvEvent,
      offloadCopy(1n, 'CPU'),
    ),
  );
  applier.apply('v', eventBatch(null, storedEvent([1n], null, 0, 4)));
  assert.deepEqual(applier.trackedState('w'), { blocks: 1, media: 1, groups: 2 });
  applier.clearWorker('w');
  assert.deepEqual(applier.trackedState('w'), { blocks: 0, media: 0, groups: 0 });
  assert.equal(applier.trackedWorkers(), 1, "only the other worker's state is left");
  applier.clearWorker('v');
  assert.equal(applier.trackedWorkers(), 0);
});

test("the default bound shares the index's capacity among the workers, so their total stays near it", () => {
  assert.equal(trackedBlocksBound(4_000_000, 1), 4_000_000);
  assert.equal(trackedBlocksBound(4_000_000, 8), 500_000);
  assert.equal(trackedBlocksBound(4_000_000, 1000), MIN_TRACKED_BLOCKS_PER_WORKER);
  assert.equal(trackedBlocksBound(50, 3), 50);
  const router = new KVAwareRouter({
    blockSize: 1,
    indexMode: 'precise',
    maxIndexEntries: 4 * MIN_TRACKED_BLOCKS_PER_WORKER,
  });
  const applier = new KvEventApplier(router);
  router.registerWorker('w0');
  assert.equal(applier.trackedBlocksLimit(), 4 * MIN_TRACKED_BLOCKS_PER_WORKER);
  for (let i = 1; i < 8; i++) router.registerWorker(`w${i}`);
  // 8 workers: a quarter of the index each would be twice it in all; the floor holds
  assert.equal(applier.trackedBlocksLimit(), MIN_TRACKED_BLOCKS_PER_WORKER);
  const counts = emptyCounts();
  const per = 4096;
  let parent: bigint | null = null;
  let n = 0;
  for (let b = 0; b < MIN_TRACKED_BLOCKS_PER_WORKER / per + 1; b++) {
    const hashes = Array.from({ length: per }, () => BigInt(++n));
    applier.apply('w0', eventBatch(null, storedEvent(hashes, parent, (n - per) % 50_000, 1)), counts);
    parent = hashes[per - 1];
    if (counts.skipped.over_capacity) parent = null;
  }
  assert.equal(counts.skipped.over_capacity, 1);
  assert.ok(applier.trackedBlocks('w0') <= MIN_TRACKED_BLOCKS_PER_WORKER, `tracked ${applier.trackedBlocks('w0')}`);
  // the index holds what the applier tracks: dropping the worker's hashes dropped its entries
  assert.equal(router.getStats().workerLoads.w0.activeBlocks, applier.trackedBlocks('w0'));
  // a removal of a dropped hash is skipped as unknown, the index untouched
  applier.apply(
    'w0',
    eventBatch(null, { type: 'BlockRemoved', blockHashes: [1n], medium: 'GPU', groupIdx: null } as KvEvent),
    counts,
  );
  assert.equal(counts.skipped.unknown_removal, 1);
  assert.equal(router.getStats().workerLoads.w0.activeBlocks, applier.trackedBlocks('w0'));
});

test('workers added after others filled up drop those past the lower bound at once, each drop counted in its own counts', () => {
  const cap = 2 * MIN_TRACKED_BLOCKS_PER_WORKER;
  const router = new KVAwareRouter({ blockSize: 1, indexMode: 'precise', maxIndexEntries: cap });
  const applier = new KvEventApplier(router);
  router.registerWorker('a');
  const aCounts = emptyCounts();
  let n = 0;
  const store = (id: string, blocks: number, counts = emptyCounts()) => {
    const hashes = Array.from({ length: blocks }, () => BigInt(++n));
    return applier.apply(id, eventBatch(null, storedEvent(hashes, null, n % 50_000, 1)), counts);
  };
  // alone, 'a' may track the whole capacity
  for (let i = 0; i < 24; i++) store('a', 4096, aCounts);
  assert.equal(applier.trackedBlocks('a'), 24 * 4096);
  assert.equal(aCounts.skipped.over_capacity, undefined);
  // a second worker halves the bound: 'a' is dropped at the next batch of any worker
  router.registerWorker('b');
  const bCounts = store('b', 1);
  assert.equal(applier.trackedBlocks('a'), 0);
  assert.equal(router.getStats().workerLoads.a.activeBlocks, 0);
  assert.equal(bCounts.skipped.over_capacity, undefined);
  // counted once, in 'a''s own counts
  store('a', 1, aCounts);
  assert.equal(aCounts.skipped.over_capacity, 1);
  store('a', 1, aCounts);
  assert.equal(aCounts.skipped.over_capacity, 1);
  assert.equal(applier.trackedBlocks('a'), 2);
  assert.equal(router.getStats().workerLoads.a.activeBlocks, 2);
});
