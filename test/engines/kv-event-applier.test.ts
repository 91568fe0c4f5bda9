import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { BlockHashes, hashTokenBlocks, hashTokenBlocksFrom } from '../../src/core/hashing.js';
import { decodeEventBatch, decodeJsonEvents, type KvEvent } from '../../src/engines/kv-events/decode.js';
import { VllmBlockHasher } from '../../src/core/vllm-block-hash.js';
import { KvEventApplier, MISMATCHES_BEFORE_GIVING_UP, emptyCounts } from '../../src/engines/kv-events/applier.js';
import { encodeEventBatch } from '../../src/engines/kv-events/encode.js';
import { KVAwareRouter } from '../../src/index.js';
import { storedTokens, tokenRange } from '../helpers/kv-event-builders.js';

const BS = 4;
const tokens = tokenRange;
const stored = (hashes: bigint[], parent: bigint | null, toks: number[], extra: Partial<KvEvent> = {}): KvEvent =>
  storedTokens(hashes, parent, toks, BS, extra);
const batch = (...events: KvEvent[]) => ({ ts: 1, events, dataParallelRank: null });

function setup() {
  const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
  router.registerWorker('w0');
  router.registerWorker('w1');
  return { router, applier: new KvEventApplier(router) };
}

describe('KV event applier', () => {
  test('hashing blocks in pieces, chained from the parent, equals hashing the prompt at once', () => {
    const all = hashTokenBlocks(tokens(0, 12), BS, undefined, new BlockHashes());
    const first = hashTokenBlocks(tokens(0, 8), BS, undefined, new BlockHashes());
    const rest = hashTokenBlocksFrom(first.hi[1], first.lo[1], tokens(8, 4), BS, new BlockHashes());
    assert.equal(rest.toHex(0), all.toHex(2));
  });

  test('stored events chained by parent hash make the worker hold the prompt', () => {
    const { router, applier } = setup();
    const c = applier.apply('w1', batch(stored([10n, 11n], null, tokens(0, 8)), stored([12n], 11n, tokens(8, 4))));
    assert.equal(c.storedBlocks, 3);
    const d = router.route({ tokens: tokens(0, 14) }, { dryRun: true });
    assert.equal(d.workerId, 'w1');
    assert.equal(d.cachedTokens, 12);
    assert.equal(applier.trackedBlocks('w1'), 3);
  });

  test("a worker of one CLA group keys its stored blocks under it, as that group's requests hash their prompts", () => {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('g2', { claGroups: [2] });
    router.registerWorker('g23', { claGroups: [2, 3] });
    router.registerWorker('plain');
    const applier = new KvEventApplier(router);
    for (const w of ['g2', 'g23', 'plain']) applier.apply(w, batch(stored([10n, 11n], null, tokens(0, 8))));
    const cached = (claGroup: number | null) => {
      const d = router.route({ tokens: tokens(0, 10), claGroup }, { dryRun: true, explain: true });
      return Object.fromEntries(d.explain!.map((e) => [e.worker, e.cachedTokens]));
    };
    // group 2's requests find the KV of the worker serving group 2 alone; a worker serving
    // several groups cannot tell which a block was made under, and keys it under none
    assert.deepEqual(cached(2), { g2: 8, g23: 0, plain: 0 });
    assert.deepEqual(cached(null), { g2: 0, g23: 8, plain: 8 });
    assert.equal(router.claGroupOf('g2'), 2);
    assert.equal(router.claGroupOf('g23'), null);
    assert.equal(router.claGroupOf('plain'), null);
  });

  test('removed events are applied through the engine-hash map; unknown ones are counted', () => {
    const { router, applier } = setup();
    applier.apply('w0', batch(stored([10n, 11n, 12n], null, tokens(0, 12))));
    const c = applier.apply(
      'w0',
      batch({ type: 'BlockRemoved', blockHashes: [12n, 99n], medium: 'GPU', groupIdx: null }),
    );
    assert.equal(c.removedBlocks, 1);
    assert.equal(c.unknownRemovals, 1);
    assert.deepEqual(c.skipped, { unknown_removal: 1 });
    assert.equal(router.route({ tokens: tokens(0, 12) }, { dryRun: true }).cachedTokens, 8);
  });

  test('an offloaded copy keeps the block (tier offload) when the GPU copy goes', () => {
    const { router, applier } = setup();
    applier.apply('w0', batch(stored([10n], null, tokens(0, 4)), stored([10n], null, tokens(0, 4), { medium: 'CPU' })));
    applier.apply('w0', batch({ type: 'BlockRemoved', blockHashes: [10n], medium: 'GPU', groupIdx: null }));
    const d = router.route({ tokens: tokens(0, 4) }, { dryRun: true, explain: true });
    const e = d.explain!.find((x) => x.worker === 'w0')!;
    assert.equal(e.overlapBlocks, 1);
    assert.equal(e.offloadBlocks, 1);
    assert.equal(applier.trackedBlocks('w0'), 1);
  });

  test('AllBlocksCleared drops the worker from the index and the map', () => {
    const { router, applier } = setup();
    applier.apply('w0', batch(stored([10n, 11n], null, tokens(0, 8))));
    const c = applier.apply('w0', batch({ type: 'AllBlocksCleared' }));
    assert.equal(c.cleared, 1);
    assert.equal(applier.trackedBlocks('w0'), 0);
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 0);
  });

  /**
   * w0 holding GPU blocks 10, 11, 12 and the OffloadingConnector's tokenless copies of 10 and 11
   * (block size 0), with w0's explain entry for the 12-token prompt they hold.
   */
  const withOffloadCopies = () => {
    const { router, applier } = setup();
    const explain = () =>
      router.route({ tokens: tokens(0, 12) }, { dryRun: true, explain: true }).explain!.find((x) => x.worker === 'w0')!;
    applier.apply(
      'w0',
      batch(
        stored([10n, 11n, 12n], null, tokens(0, 12)),
        stored([10n, 11n], null, [], { medium: 'CPU', blockSize: 0 }),
      ),
    );
    return { router, applier, explain };
  };

  test("AllBlocksCleared keeps the offload copies vLLM's connector still holds; they leave with their own removal", () => {
    const { router, applier, explain } = withOffloadCopies();
    // reset_prefix_cache with reset_connector=False: a bare AllBlocksCleared, the CPU tier kept
    const c = applier.apply('w0', batch({ type: 'AllBlocksCleared' }));
    assert.equal(c.cleared, 1);
    assert.deepEqual(applier.copies('w0', 10n), { gpu: 0, offload: 1 });
    assert.deepEqual(applier.copies('w0', 11n), { gpu: 0, offload: 1 });
    assert.deepEqual(applier.copies('w0', 12n), { gpu: 0, offload: 0 });
    assert.equal(applier.trackedBlocks('w0'), 2);
    let e = explain();
    assert.equal(e.overlapBlocks, 2);
    assert.equal(e.offloadBlocks, 2);
    // the GPU copy stored again is one copy, not a second
    applier.apply('w0', batch(stored([10n], null, tokens(0, 4))));
    assert.deepEqual(applier.copies('w0', 10n), { gpu: 1, offload: 1 });
    const r = applier.apply(
      'w0',
      batch(
        { type: 'BlockRemoved', blockHashes: [10n, 11n], medium: 'CPU', groupIdx: null },
        { type: 'BlockRemoved', blockHashes: [10n], medium: 'GPU', groupIdx: null },
      ),
    );
    assert.equal(r.removedBlocks, 3);
    assert.equal(r.unknownRemovals, 0);
    assert.equal(applier.trackedBlocks('w0'), 0);
    e = explain();
    assert.equal(e.overlapBlocks, 0);
    assert.equal(router.index.entriesFor(0), 0);
  });

  test('a clear right after a clear (nothing stored or removed between) walks nothing again; one after a store does', () => {
    const { router, applier, explain } = withOffloadCopies();
    // each clear the index is asked to apply walks every block the worker keeps offloaded
    let walks = 0;
    const applyCleared = router.applyCleared.bind(router);
    router.applyCleared = (...args: Parameters<typeof router.applyCleared>) => {
      walks++;
      applyCleared(...args);
    };
    const clear = { type: 'AllBlocksCleared' } as const;
    assert.equal(applier.workOf('w0', clear), 4, "a clear walks the worker's tracked blocks (and counts one)");
    const c = applier.apply('w0', batch(...Array.from({ length: 1000 }, () => clear)));
    assert.equal(c.cleared, 1000, 'every clear is counted');
    assert.equal(walks, 1, 'one walk for the run of clears');
    assert.equal(applier.workOf('w0', clear), 1, 'nothing to walk again');
    // and in a later batch too, until something is stored or removed
    applier.apply('w0', batch(clear));
    assert.equal(walks, 1);
    assert.deepEqual(applier.copies('w0', 10n), { gpu: 0, offload: 1 });
    assert.equal(explain().offloadBlocks, 2);
    applier.apply('w0', batch(stored([10n], null, tokens(0, 4)), clear, clear));
    assert.equal(walks, 2, 'a clear after a store walks again');
    assert.deepEqual(applier.copies('w0', 10n), { gpu: 0, offload: 1 }, 'the GPU copy stored between is cleared');
    assert.equal(applier.workOf('w0', clear, stored([10n], null, tokens(0, 4))), 3, 'after a store in the same slice');
    assert.equal(applier.workOf('w0', clear, clear), 1, 'after a clear in the same slice');
    // a worker dropped whole (a gap, a restart) starts afresh: its next clear is walked
    applier.clearWorker('w0');
    applier.apply('w0', batch(stored([10n], null, [], { medium: 'CPU', blockSize: 0 }), clear));
    assert.equal(explain().overlapBlocks, 0);
  });

  test("AllBlocksCleared forgets SGLang HiCache's host copies (CPU_PINNED), which its reset clears too", () => {
    const { router, applier } = setup();
    applier.apply(
      'w0',
      batch(stored([10n, 11n], null, tokens(0, 8)), stored([10n, 11n], null, tokens(0, 8), { medium: 'CPU_PINNED' })),
    );
    applier.apply('w0', batch({ type: 'BlockRemoved', blockHashes: [11n], medium: 'GPU', groupIdx: null }));
    assert.deepEqual(applier.copies('w0', 11n), { gpu: 0, offload: 1 });
    applier.apply('w0', batch({ type: 'AllBlocksCleared' }));
    assert.equal(applier.trackedBlocks('w0'), 0);
    assert.equal(applier.trackedWorkers(), 0);
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 0);
  });

  test('a sequence gap, a restart or a removal (clearWorker) still forgets the offload copies', () => {
    const { router, applier } = setup();
    applier.apply(
      'w0',
      batch(stored([10n], null, tokens(0, 4)), stored([10n], null, [], { medium: 'CPU', blockSize: 0 })),
    );
    applier.clearWorker('w0');
    assert.deepEqual(applier.copies('w0', 10n), { gpu: 0, offload: 0 });
    assert.equal(applier.trackedWorkers(), 0);
    assert.equal(router.route({ tokens: tokens(0, 4) }, { dryRun: true }).cachedTokens, 0);
  });

  test('a block whose parent was never seen is counted, not guessed', () => {
    const { router, applier } = setup();
    const c = applier.apply('w0', batch(stored([12n], 11n, tokens(8, 4))));
    assert.equal(c.orphanEvents, 1);
    assert.deepEqual(c.skipped, { orphan: 1 });
    assert.equal(c.storedBlocks, 0);
    assert.equal(router.getStats().index.entries, 0);
  });

  test('a LoRA adapter keys its blocks apart; a block-size mismatch is refused', () => {
    const { router, applier } = setup();
    applier.apply('w0', batch(stored([10n], null, tokens(0, 4), { loraName: 'sql' })));
    assert.equal(router.route({ tokens: tokens(0, 4) }, { dryRun: true }).cachedTokens, 0);
    assert.equal(router.route({ tokens: tokens(0, 4), lora: 'sql' }, { dryRun: true }).cachedTokens, 4);
    const c = applier.apply('w0', batch(stored([20n], null, tokens(0, 8), { blockSize: 8 })), emptyCounts());
    assert.equal(c.blockSizeMismatches, 1);
    assert.deepEqual(c.skipped, { block_size: 1 });
  });

  test('duplicate copies of one hash: the block stays until its last copy is removed', () => {
    const { router, applier } = setup();
    applier.apply('w0', batch(stored([10n], null, tokens(0, 4)), stored([10n], null, tokens(0, 4))));
    assert.deepEqual(applier.copies('w0', 10n), { gpu: 2, offload: 0 });
    const removed = (h: bigint) => batch({ type: 'BlockRemoved', blockHashes: [h], medium: 'GPU', groupIdx: null });
    let c = applier.apply('w0', removed(10n));
    assert.equal(c.removedBlocks, 0);
    assert.equal(router.route({ tokens: tokens(0, 4) }, { dryRun: true }).cachedTokens, 4);
    c = applier.apply('w0', removed(10n));
    assert.equal(c.removedBlocks, 1);
    assert.equal(router.route({ tokens: tokens(0, 4) }, { dryRun: true }).cachedTokens, 0);
    assert.equal(applier.trackedBlocks('w0'), 0);
  });

  test('block size is per worker: a worker of block size 1 (SGLang page size 1) applies its per-token events', () => {
    const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
    router.registerWorker('sg');
    const applier = new KvEventApplier(router, new Map([['sg', { blockSize: 1 }]]));
    const c = applier.apply('sg', decodeEventBatch(fixture('sglang-page1')));
    assert.equal(c.storedBlocks, 3);
    assert.equal(c.removedBlocks, 1);
    assert.deepEqual(c.skipped, {});
    assert.equal(applier.trackedBlocks('sg'), 2);
    // the same events on a worker configured for 16-token blocks are refused, counted
    const wrong = new KvEventApplier(router).apply('sg', decodeEventBatch(fixture('sglang-page1')));
    assert.equal(wrong.skipped.block_size, 3);
  });
});

const fixture = (name: string) =>
  new Uint8Array(readFileSync(new URL(`../fixtures/kv-events/${name}.bin`, import.meta.url)));

describe('KV event applier on engine-encoded fixtures', () => {
  function router16() {
    const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
    router.registerWorker('w0');
    return router;
  }
  const prompt = Array.from({ length: 32 }, (_, i) => 1000 + i);

  test('offload: the CPU copy marks known blocks (and the blocks it spans) offloaded, in the same batch as GPU stores', () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    const c = applier.apply('w0', decodeEventBatch(fixture('offload-cpu')));
    // GPU store of 2 blocks; the 32-token CPU copy spans both; then the CPU copy is removed
    assert.equal(c.storedBlocks, 2);
    assert.equal(c.offloadBlocks, 2);
    assert.deepEqual(c.skipped, {});
    assert.deepEqual(applier.copies('w0', 0x8000000000000001n), { gpu: 1, offload: 0 });
    assert.deepEqual(applier.copies('w0', 0xfedcba9876543210n), { gpu: 1, offload: 0 });
    // an offload copy of a block never seen is skipped, not the batch
    const lone = applier.apply('w0', {
      ts: 1,
      dataParallelRank: 0,
      events: [{ ...(decodeEventBatch(fixture('offload-cpu')).events[1] as KvEvent), blockHashes: [5n] } as KvEvent],
    });
    assert.deepEqual(lone.skipped, { unknown_offload: 1 });
    // GPU evicted, CPU copy kept: still a hit, in the offload tier
    const again = new KvEventApplier(router16());
    const events = decodeEventBatch(fixture('offload-cpu')).events;
    again.apply('w0', {
      ts: 1,
      dataParallelRank: 0,
      events: [
        events[0],
        events[1],
        { type: 'BlockRemoved', blockHashes: [0xfedcba9876543210n, 0x8000000000000001n], medium: 'GPU', groupIdx: 0 },
      ],
    });
    assert.deepEqual(again.copies('w0', 0x8000000000000001n), { gpu: 0, offload: 1 });
  });

  test('offload without a block size (block_size 0, as vLLM sends it now): the named block is offloaded', () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    const [gpuStore, cpuCopy, cpuRemoval] = decodeEventBatch(fixture('offload-cpu-unsized')).events;
    let c = applier.apply('w0', { ts: 1, dataParallelRank: 0, events: [gpuStore, cpuCopy] });
    assert.deepEqual(c.skipped, {});
    // the chunk's size is not sent: only the block it is named by is marked, never a guess
    assert.equal(c.offloadBlocks, 1);
    assert.deepEqual(applier.copies('w0', 0x8000000000000001n), { gpu: 1, offload: 1 });
    assert.deepEqual(applier.copies('w0', 0xfedcba9876543210n), { gpu: 1, offload: 0 });
    c = applier.apply('w0', { ts: 1, dataParallelRank: 0, events: [cpuRemoval] });
    assert.deepEqual(c.skipped, {});
    assert.deepEqual(applier.copies('w0', 0x8000000000000001n), { gpu: 1, offload: 0 });
    assert.deepEqual(applier.copies('w0', 0xfedcba9876543210n), { gpu: 1, offload: 0 });
  });

  test('a self-describing offload copy (token ids, parent, GPU block size) applies as a store in the offload tier', () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    const c = applier.apply('w0', decodeEventBatch(fixture('offload-cpu-described')));
    assert.deepEqual(c.skipped, {});
    // GPU stored, copied to CPU, then evicted from GPU: both blocks are held in the offload tier
    assert.deepEqual(applier.copies('w0', 0xfedcba9876543210n), { gpu: 0, offload: 1 });
    assert.deepEqual(applier.copies('w0', 0x8000000000000001n), { gpu: 0, offload: 1 });
    // both blocks still a hit, each credited at the offload tier's default 0.75
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 24);
  });

  test("storage tiers: a REMOTE copy (locality, vLLM v0.26) is not the worker's; its removal leaves the worker's LOCAL copy", () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    const batch = decodeEventBatch(fixture('storage-locality'));
    assert.deepEqual(
      batch.events.map((e) => (e.type === 'AllBlocksCleared' ? undefined : e.locality)),
      [undefined, 'LOCAL', 'REMOTE', 'REMOTE', undefined],
    );
    const c = applier.apply('w0', batch);
    // GPU store of both blocks; the engine's own storage copy of block 1; a shared (REMOTE) copy
    // of block 0, skipped; the REMOTE copy of block 1 removed, skipped; block 0 evicted from GPU
    assert.equal(c.storedBlocks, 2);
    assert.equal(c.offloadBlocks, 1);
    assert.equal(c.removedBlocks, 1);
    assert.deepEqual(c.skipped, { remote_locality: 2 });
    assert.deepEqual(applier.copies('w0', 0xfedcba9876543210n), { gpu: 0, offload: 0 });
    assert.deepEqual(applier.copies('w0', 0x8000000000000001n), { gpu: 1, offload: 1 });
    // block 0 is held nowhere this worker can read from its own cache: no prefix hit
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 0);
    // the same through the gateway's JSON events: a locality other than LOCAL is not credited either
    const json = new KvEventApplier(router16());
    const j = json.apply(
      'w0',
      decodeJsonEvents([
        {
          type: 'BlockStored',
          block_hashes: [1],
          parent_block_hash: null,
          token_ids: prompt.slice(0, 16),
          block_size: 16,
          lora_id: null,
          medium: 'STORAGE',
          locality: 'REMOTE',
        },
        {
          type: 'BlockStored',
          block_hashes: [2],
          parent_block_hash: null,
          token_ids: prompt.slice(0, 16),
          block_size: 16,
          lora_id: null,
          medium: 'STORAGE',
          locality: 'SHARED',
        },
        {
          type: 'BlockStored',
          block_hashes: [3],
          parent_block_hash: null,
          token_ids: prompt.slice(0, 16),
          block_size: 16,
          lora_id: null,
          medium: 'STORAGE',
          locality: 'LOCAL',
        },
      ]),
    );
    assert.deepEqual(j.skipped, { remote_locality: 2 });
    assert.equal(j.storedBlocks, 1);
  });

  test('hybrid model: only the full-attention group is indexed; other groups are skipped without error', () => {
    for (const name of ['hybrid', 'hybrid-array']) {
      const router = router16();
      const applier = new KvEventApplier(router);
      const c = applier.apply('w0', decodeEventBatch(fixture(name)));
      assert.equal(c.storedBlocks, 2, name);
      assert.equal(c.skipped.other_group, name === 'hybrid' ? 3 : 2, name); // sliding + mamba stores (+ the sliding removal)
      assert.equal(c.removedBlocks, 0, name);
      assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 32, name);
    }
  });

  test("a removal from a group whose kind was never learned is not the full group's once the worker taught kinds", () => {
    const { router, applier } = setup();
    const full = (hashes: bigint[]) =>
      stored(hashes, null, tokens(0, 8), { groupIdx: 1, kvCacheSpecKind: 'full_attention' });
    const swaRemoval = (h: bigint): KvEvent => ({ type: 'BlockRemoved', blockHashes: [h], medium: 'GPU', groupIdx: 0 });
    // group 0 (sliding window) stored block 301 before the router subscribed, or before the last
    // clear: only the full-attention group's store (group 1) and group 0's eviction are seen
    const c = applier.apply('w0', batch(full([301n, 302n]), swaRemoval(301n)));
    assert.equal(c.removedBlocks, 0);
    assert.deepEqual(c.skipped, { other_group: 1 });
    assert.deepEqual(applier.copies('w0', 301n), { gpu: 1, offload: 0 });
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 8);
    // the full group's own removal applies
    const r = applier.apply('w0', batch({ type: 'BlockRemoved', blockHashes: [302n], medium: 'GPU', groupIdx: 1 }));
    assert.equal(r.removedBlocks, 1);
  });

  test('a worker that taught no kind (a release without kv_cache_spec_kind) keeps group 0 as the full one', () => {
    const { router, applier } = setup();
    applier.apply('w0', batch(stored([10n, 11n], null, tokens(0, 8), { groupIdx: 0 })));
    const c = applier.apply(
      'w0',
      batch(
        { type: 'BlockRemoved', blockHashes: [11n], medium: 'GPU', groupIdx: 0 },
        { type: 'BlockRemoved', blockHashes: [10n], medium: 'GPU', groupIdx: 1 },
      ),
    );
    assert.equal(c.removedBlocks, 1);
    assert.deepEqual(c.skipped, { other_group: 1 });
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 4);
  });

  test('a worker whose only group is of kind unknown (vLLM: mixed layer kinds in one group) is indexed from it', () => {
    const { router, applier } = setup();
    const unknown = (hashes: bigint[], first: number, parent: bigint | null = null) =>
      stored(hashes, parent, tokens(first, hashes.length * BS), { groupIdx: 0, kvCacheSpecKind: 'unknown' });
    const c = applier.apply('w0', batch(unknown([201n, 202n], 0)));
    assert.equal(c.storedBlocks, 2);
    assert.equal(c.unknownKindStores, 1);
    assert.deepEqual(c.skipped, {});
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 8);
    // its removals apply too
    const r = applier.apply('w0', batch({ type: 'BlockRemoved', blockHashes: [202n], medium: 'GPU', groupIdx: 0 }));
    assert.equal(r.removedBlocks, 1);
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 4);
  });

  test('once a full-prefix group is seen, unknown groups are skipped and what they stored is dropped', () => {
    const { router, applier } = setup();
    const unknownStore = stored([201n, 202n], null, tokens(0, 8), { groupIdx: 0, kvCacheSpecKind: 'unknown' });
    const fullStore = stored([301n], null, tokens(100, 4), { groupIdx: 1, kvCacheSpecKind: 'full_attention' });
    const c = applier.apply('w0', batch(unknownStore, fullStore, unknownStore));
    assert.equal(c.storedBlocks, 3); // 201, 202 from the unknown group, then 301
    assert.deepEqual(c.skipped, { other_group: 1 });
    assert.equal(applier.trackedBlocks('w0'), 1);
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 0);
    assert.equal(router.route({ tokens: tokens(100, 4) }, { dryRun: true }).cachedTokens, 4);
    const r = applier.apply('w0', batch({ type: 'BlockRemoved', blockHashes: [201n], medium: 'GPU', groupIdx: 0 }));
    assert.deepEqual(r.skipped, { other_group: 1 });
    // a worker that started with its full group never indexes the unknown one
    const fresh = setup();
    const f = fresh.applier.apply('w0', batch(fullStore, unknownStore));
    assert.equal(f.unknownKindStores, 0);
    assert.deepEqual(f.skipped, { other_group: 1 });
  });

  test('MLA and sink-attention groups hold every token as full attention does: their stores are indexed', () => {
    for (const encoding of ['map', 'array'] as const) {
      for (const kind of ['full_attention', 'mla_attention', 'sink_full_attention']) {
        const router = router16();
        const applier = new KvEventApplier(router);
        const payload = encodeEventBatch(
          {
            ts: 1,
            dataParallelRank: null,
            events: [
              storedTokens([1n, 2n], null, prompt, 16, { groupIdx: 0, kvCacheSpecKind: kind }),
              { type: 'BlockRemoved', blockHashes: [2n], medium: 'GPU', groupIdx: 0 },
            ],
          },
          encoding,
        );
        const c = applier.apply('w0', decodeEventBatch(payload));
        const what = `${kind} (${encoding})`;
        assert.deepEqual(c.skipped, {}, what);
        assert.equal(c.storedBlocks, 2, what);
        // the group's removal applies too: it is known as a full-prefix group from its store
        assert.equal(c.removedBlocks, 1, what);
        assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 16, what);
      }
    }
  });

  test('blocks hashed by digests longer than 64 bytes are stored and removed by them', () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    // 4 x 32-byte sub-block digests per block, as vLLM concatenates them (hex in, bytes on the wire)
    const digest = (i: number) => `${i.toString(16).padStart(2, '0')}`.repeat(128);
    const send = (event: KvEvent) => applier.apply('w0', decodeEventBatch(encodeEventBatch(batch(event))));
    const c = send(storedTokens([digest(1), digest(2)], null, prompt, 16));
    assert.deepEqual(c.skipped, {});
    assert.equal(c.storedBlocks, 2);
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 32);
    const r = send({ type: 'BlockRemoved', blockHashes: [digest(2)], medium: 'GPU', groupIdx: null });
    assert.equal(r.removedBlocks, 1);
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 16);
  });

  test("cache salt in extra_keys keys the chain as the request's cache_salt; multimodal blocks never match text", () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    applier.apply('w0', decodeEventBatch(fixture('extra-keys-mm-salt')));
    // block 0 is salted with "salt-a", block 1 carries an image: the salted request matches block 0 only
    assert.equal(router.route({ tokens: prompt, cacheSalt: 'salt-a' }, { dryRun: true }).cachedTokens, 16);
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 0);
  });

  test('typed extra keys (event_version 1): the cache_salt isolates and the image keeps its block from text, as the bare keys do', () => {
    for (const name of ['extra-keys-mm-salt', 'typed-extra-keys-mm-salt']) {
      const router = router16();
      const c = new KvEventApplier(router).apply('w0', decodeEventBatch(fixture(name)));
      assert.deepEqual(c.skipped, {}, name);
      assert.equal(c.storedBlocks, 2, name);
      // block 0 salted with "salt-a", block 1 an image's: only the salted request finds block 0
      assert.equal(router.route({ tokens: prompt, cacheSalt: 'salt-a' }, { dryRun: true }).cachedTokens, 16, name);
      assert.equal(router.route({ tokens: prompt, cacheSalt: 'salt-b' }, { dryRun: true }).cachedTokens, 0, name);
      assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 0, name);
    }
  });

  test('a typed image key on unsalted blocks keeps them from a text prompt and from another image, as the bare pair does', () => {
    const image = (hash: string) => ({
      typed: { type: 'mm', modality: 'image', hash, block_offset: 0 },
      legacy: [hash, 0],
    });
    for (const form of ['typed', 'legacy'] as const) {
      const router = router16();
      const applier = new KvEventApplier(router);
      const send = (h: bigint, img: string) =>
        applier.apply(
          'w0',
          decodeEventBatch(
            encodeEventBatch(
              batch(storedTokens([h, h + 1n], null, prompt, 16, { extraKeys: [[image(img)[form]], null] })),
            ),
          ),
        );
      assert.equal(send(10n, 'imgA').storedBlocks, 2, form);
      // the same tokens (the image's placeholders) with another image: other blocks, no hit on A's
      assert.equal(send(20n, 'imgB').storedBlocks, 2, form);
      assert.equal(router.getStats().index.entries, 4, form);
      assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 0, form);
    }
  });

  test('a typed extra key of a kind the decoder does not know is taken for block content, never for text', () => {
    const router = router16();
    const future = { type: 'audio_span', start: 0, end: 16 };
    const event = storedTokens([10n, 11n], null, prompt, 16, { extraKeys: [[future], null] });
    const c = new KvEventApplier(router).apply('w0', decodeEventBatch(encodeEventBatch(batch(event))));
    assert.deepEqual(c.skipped, {});
    assert.equal(c.storedBlocks, 2);
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 0);
  });

  test('a prompt-embedding digest (bytes) in extra_keys is not taken for a cache salt', async () => {
    const { encode } = await import('@msgpack/msgpack');
    const router = router16();
    const applier = new KvEventApplier(router);
    const payload = encode([
      1.5,
      [
        {
          type: 'BlockStored',
          block_hashes: [7],
          parent_block_hash: null,
          token_ids: prompt.slice(0, 16),
          block_size: 16,
          lora_id: null,
          medium: 'GPU',
          lora_name: null,
          extra_keys: [[new Uint8Array([1, 2, 3])]],
        },
      ],
    ]);
    const batch = decodeEventBatch(payload);
    assert.deepEqual((batch.events[0] as { extraKeys: unknown }).extraKeys, [[{ bytes: '010203' }]]);
    const c = applier.apply('w0', batch);
    assert.deepEqual(c.skipped, {});
    assert.equal(c.storedBlocks, 1);
    // keyed by its digest, not by a salt: the block holds KV of embeddings, which no token prompt has
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 0);
  });

  test('prompt-embeds blocks (token ids 0, an embedding digest in extra_keys) never match a token prompt or each other', () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    const zeros = new Array<number>(16).fill(0);
    // vLLM sends token ids 0 for a prompt given as embeddings, and a digest of each block's
    // embeddings (bytes) in its extra_keys
    const digest = (i: number) => Uint8Array.from(Buffer.alloc(32, i));
    const send = (event: KvEvent) => applier.apply('w0', decodeEventBatch(encodeEventBatch(batch(event))));
    const embeds = (hash: bigint, parent: bigint | null, i: number) =>
      storedTokens([hash], parent, zeros, 16, { extraKeys: [[digest(i)]] });
    let c = send(embeds(1n, null, 1));
    c = applier.apply('w0', decodeEventBatch(encodeEventBatch(batch(embeds(2n, null, 2), embeds(3n, 1n, 3)))), c);
    assert.deepEqual(c.skipped, {});
    assert.equal(c.storedBlocks, 3);
    // three blocks, three keys: the same token ids under different embeddings are different KV
    assert.equal(new Set(applier.trackedHashes('w0')).size, 3);
    // a prompt of token 0 holds other KV than any of them
    assert.equal(router.route({ tokens: [...zeros, ...zeros] }, { dryRun: true }).cachedTokens, 0);
    // each is removed by its own hash
    const r = send({ type: 'BlockRemoved', blockHashes: [2n], medium: 'GPU', groupIdx: null });
    assert.equal(r.removedBlocks, 1);
    assert.equal(applier.trackedBlocks('w0'), 2);
  });

  test('every historical shape applies the same way', () => {
    for (const shape of ['v0.9', 'dp', 'medium', 'lora', 'extra', 'group', 'spec', 'mapev', 'map', 'future']) {
      const router = router16();
      const applier = new KvEventApplier(router);
      // stored-int has a parent the router never saw: an orphan in router hash mode
      const c = applier.apply('w0', decodeEventBatch(fixture(`${shape}-stored-int`)));
      assert.equal(c.orphanEvents, 1, shape);
      const v = new KvEventApplier(router, new Map(), { hashMode: 'vllm' });
      const d = v.apply('w0', decodeEventBatch(fixture(`${shape}-stored-int`)));
      assert.equal(d.storedBlocks, 2, shape);
      assert.equal(d.parentsProven, 1, shape);
      if (shape === 'future') continue;
      // the removal of both blocks, then AllBlocksCleared, as each shape sends them
      const r = v.apply('w0', decodeEventBatch(fixture(`${shape}-removed-int`)));
      assert.equal(r.removedBlocks, 2, shape);
      assert.equal(v.trackedBlocks('w0'), 1, shape); // the proven parent
      const c2 = v.apply('w0', decodeEventBatch(fixture(`${shape}-cleared`)));
      assert.equal(c2.cleared, 1, shape);
      assert.equal(v.trackedBlocks('w0'), 0, shape);
      assert.equal(router.getStats().index.entries, 0, shape);
    }
  });

  test('SGLang with page size 16: one event per page chained by signed 64-bit hashes', () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    const c = applier.apply('w0', decodeEventBatch(fixture('sglang-page16')));
    assert.equal(c.storedBlocks, 2);
    assert.equal(c.removedBlocks, 1);
    assert.deepEqual(c.skipped, {});
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 16);
  });

  test("SGLang's cache_salt (metadata after medium, or a field of its tagged maps) keys the page chain", () => {
    for (const name of ['sglang-salt-array', 'sglang-salt-map']) {
      const router = router16();
      const applier = new KvEventApplier(router);
      const c = applier.apply('w0', decodeEventBatch(fixture(name)));
      assert.deepEqual(c.skipped, {}, name);
      assert.equal(c.storedBlocks, 4, name);
      // the salted chain holds both pages; the unsalted store holds the first page only
      assert.equal(router.route({ tokens: prompt, cacheSalt: 'tenant-a' }, { dryRun: true }).cachedTokens, 32, name);
      assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 16, name);
      assert.equal(router.route({ tokens: prompt, cacheSalt: 'tenant-b' }, { dryRun: true }).cachedTokens, 0, name);
    }
  });

  test("SGLang's LoRA pages (lora_name in its tagged maps, lora_id None) are the adapter's: its requests hit, the base model's do not", () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    const c = applier.apply('w0', decodeEventBatch(fixture('sglang-lora-map')));
    assert.deepEqual(c.skipped, {});
    assert.equal(c.storedBlocks, 2);
    assert.equal(router.route({ tokens: prompt, lora: 'sql-adapter' }, { dryRun: true }).cachedTokens, 32);
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 0);
    assert.equal(router.route({ tokens: prompt, lora: 'other-adapter' }, { dryRun: true }).cachedTokens, 0);
  });

  test("SGLang's shared pool (medium EXTERNAL) is no cache of the worker's: its stores and removals are skipped", () => {
    const router = router16();
    const applier = new KvEventApplier(router);
    const c = applier.apply('w0', decodeEventBatch(fixture('sglang-external-map')));
    // two stores and the removal's one block on the pool skipped; the GPU page applied
    assert.deepEqual(c.skipped, { remote_locality: 3 });
    assert.equal(c.storedBlocks, 1);
    // the second page, in the pool alone, is not credited; the pool's removal of the first
    // leaves the worker's own GPU copy
    assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 16);
    assert.deepEqual(applier.copies('w0', -41n & 0xffffffffffffffffn), { gpu: 1, offload: 0 });
  });

  test("vllm hash mode: a prompt's first blocks hashed otherwise than the router hashes them are skipped, not indexed", () => {
    const cases = JSON.parse(
      readFileSync(new URL('../fixtures/kv-events/vllm-block-hash.json', import.meta.url), 'utf8'),
    ).cases as Array<{ tokens: number[] }>;
    const request = { tokens: cases[0].tokens.slice(0, 32) };
    const vllmRouter = () => {
      const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise', blockHash: 'vllm', pythonHashSeed: '0' });
      router.registerWorker('w0');
      return router;
    };
    // sha256_cbor under PYTHONHASHSEED=0, as the router computes: applied, and a request finds it
    const matching = vllmRouter();
    const ok = new KvEventApplier(matching).apply('w0', decodeEventBatch(fixture('vllm-seed0-first-blocks')));
    assert.equal(ok.storedBlocks, 2);
    assert.equal(ok.hashMismatches, 0);
    assert.equal(matching.route(request, { dryRun: true }).cachedTokens, 32);
    // vLLM's default sha256 (pickle), or sha256_cbor under another seed: keys no request can match
    const engines = {
      'vllm-sha256-pickle-first-blocks': { algo: 'sha256', seed: '0' },
      'vllm-seed1-first-blocks': { algo: 'sha256_cbor', seed: '1' },
    } as const;
    for (const [name, engine] of Object.entries(engines)) {
      const router = vllmRouter();
      const applier = new KvEventApplier(router);
      const c = applier.apply('w0', decodeEventBatch(fixture(name)));
      assert.equal(c.hashMismatches, 1, name);
      assert.deepEqual(c.skipped, { hash_mismatch: 1 }, name);
      assert.equal(c.storedBlocks, 0, name);
      assert.equal(applier.trackedBlocks('w0'), 0, name);
      assert.equal(router.getStats().index.entries, 0, name);
      // the fixture sends no extra_keys (a salted prompt would differ too): the worker is given up
      // on once as many distinct prompts' first blocks have differed, none matching
      const hasher = new VllmBlockHasher(engine.seed, engine.algo);
      for (let k = 1; k < MISMATCHES_BEFORE_GIVING_UP; k++) {
        const toks = tokens(100_000 * k, 16);
        const h = hasher.hashBlocks(toks, 16, {}, new BlockHashes()).toBigInt(0);
        const more = applier.apply('w0', batch(storedTokens([h], null, toks, 16)));
        assert.deepEqual(more.skipped, { hash_mismatch: 1 }, `${name}, prompt ${k}`);
      }
      // the prompt's next block, chained from the last skipped one: no better, skipped too
      const last = (decodeEventBatch(fixture(name)).events[0] as { blockHashes: bigint[] }).blockHashes[1];
      const next = applier.apply('w0', batch(storedTokens([77n], last, cases[0].tokens.slice(32, 48), 16)));
      assert.deepEqual(next.skipped, { hash_mismatch: 1 }, name);
      assert.equal(router.getStats().index.entries, 0, name);
      // until the worker's entries are cleared (it restarted): then it is judged afresh
      applier.clearWorker('w0');
      const fresh = applier.apply('w0', decodeEventBatch(fixture('vllm-seed0-first-blocks')));
      assert.equal(fresh.storedBlocks, 2, name);
    }
  });

  test('vllm hash mode: a salted prompt of a release that sends no extra_keys does not shut its worker out', () => {
    const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise', blockHash: 'vllm', pythonHashSeed: '0' });
    router.registerWorker('w0');
    const applier = new KvEventApplier(router);
    const hasher = new VllmBlockHasher('0', 'sha256_cbor');
    const engineHashes = (toks: number[], cacheSalt?: string) => {
      const h = hasher.hashBlocks(toks, 16, cacheSalt ? { cacheSalt } : {}, new BlockHashes());
      return Array.from({ length: h.length }, (_, i) => h.toBigInt(i));
    };
    const send = (event: KvEvent) => applier.apply('w0', decodeEventBatch(encodeEventBatch(batch(event))));
    // vLLM hashes the salt into the first block but this release does not send it: the router
    // cannot tell this store from one hashed otherwise, so it is skipped, the worker kept
    const salted = tokens(5000, 32);
    const first = send(storedTokens(engineHashes(salted, 'tenant-a'), null, salted, 16));
    assert.deepEqual(first.skipped, { hash_mismatch: 1 });
    for (let k = 0; k < 3; k++) {
      const plain = tokens(6000 + 100 * k, 32);
      const c = send(storedTokens(engineHashes(plain), null, plain, 16));
      assert.deepEqual(c.skipped, {}, `plain prompt ${k}`);
      assert.equal(c.storedBlocks, 2, `plain prompt ${k}`);
      assert.equal(router.route({ tokens: plain }, { dryRun: true }).cachedTokens, 32, `plain prompt ${k}`);
    }
    // once a first block has matched, salted ones without their keys are that prompt's own mismatch
    for (let k = 0; k < MISMATCHES_BEFORE_GIVING_UP; k++) {
      const more = tokens(7000 + 100 * k, 16);
      assert.deepEqual(send(storedTokens(engineHashes(more, `t${k}`), null, more, 16)).skipped, { hash_mismatch: 1 });
    }
    const later = tokens(9000, 32);
    assert.equal(send(storedTokens(engineHashes(later), null, later, 16)).storedBlocks, 2);
    // a release that sends extra_keys names the salt: the store matches and is indexed
    router.registerWorker('w1');
    const withKeys = new KvEventApplier(router);
    const c = withKeys.apply(
      'w1',
      decodeEventBatch(
        encodeEventBatch(
          batch(storedTokens(engineHashes(salted, 'tenant-a'), null, salted, 16, { extraKeys: [['tenant-a'], null] })),
        ),
      ),
    );
    assert.deepEqual(c.skipped, {});
    assert.equal(c.storedBlocks, 2);
  });

  test('vllm hash mode: a first block that differs though its extra_keys were sent gives the worker up at once', () => {
    const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise', blockHash: 'vllm', pythonHashSeed: '0' });
    router.registerWorker('w0');
    const applier = new KvEventApplier(router);
    // the engine hashes with sha256 (pickle), the router sha256_cbor
    const other = new VllmBlockHasher('0', 'sha256');
    const toks = tokens(5000, 32);
    const h = other.hashBlocks(toks, 16, {}, new BlockHashes());
    const hashes = [h.toBigInt(0), h.toBigInt(1)];
    const send = (event: KvEvent) => applier.apply('w0', decodeEventBatch(encodeEventBatch(batch(event))));
    assert.deepEqual(send(storedTokens(hashes, null, toks, 16, { extraKeys: [null, null] })).skipped, {
      hash_mismatch: 1,
    });
    // its continuation is no better: skipped too
    assert.deepEqual(send(storedTokens([77n], hashes[1], tokens(6000, 16), 16)).skipped, { hash_mismatch: 1 });
    assert.equal(router.getStats().index.entries, 0);
  });

  test('vllm hash mode: a typed cache_salt is checked as the bare salt is', () => {
    const toks = tokens(5000, 32);
    const salt = [{ type: 'cache_salt', salt: 'tenant-a' }];
    for (const [algo, matches] of [
      ['sha256_cbor', true],
      ['sha256', false],
    ] as const) {
      const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise', blockHash: 'vllm', pythonHashSeed: '0' });
      router.registerWorker('w0');
      const applier = new KvEventApplier(router);
      // the engine hashes the salt into the first block with its algorithm; the router with sha256_cbor
      const h = new VllmBlockHasher('0', algo).hashBlocks(toks, 16, { cacheSalt: 'tenant-a' }, new BlockHashes());
      const event = storedTokens([h.toBigInt(0), h.toBigInt(1)], null, toks, 16, { extraKeys: [salt, null] });
      const c = applier.apply('w0', decodeEventBatch(encodeEventBatch(batch(event))));
      if (matches) {
        assert.deepEqual(c.skipped, {}, algo);
        assert.equal(router.route({ tokens: toks, cacheSalt: 'tenant-a' }, { dryRun: true }).cachedTokens, 32, algo);
        assert.equal(router.route({ tokens: toks }, { dryRun: true }).cachedTokens, 0, algo);
      } else {
        // its keys were sent, the salt among them: the worker hashes otherwise
        assert.deepEqual(c.skipped, { hash_mismatch: 1 }, algo);
        assert.equal(router.getStats().index.entries, 0, algo);
      }
    }
  });

  test("vllm hash mode: the first-block check judges by the engines' --prefix-caching-hash-algo", () => {
    const cases = JSON.parse(
      readFileSync(new URL('../fixtures/kv-events/vllm-block-hash.json', import.meta.url), 'utf8'),
    ).cases as Array<{ tokens: number[] }>;
    const request = { tokens: cases[0].tokens.slice(0, 32) };
    // each fixture: a prompt's first two blocks under PYTHONHASHSEED=0 by one algorithm
    const fixtures = {
      sha256: 'vllm-sha256-pickle-first-blocks',
      sha256_cbor: 'vllm-seed0-first-blocks',
      xxhash: 'vllm-xxhash-first-blocks',
      xxhash_cbor: 'vllm-xxhash-cbor-first-blocks',
    } as const;
    for (const algo of Object.keys(fixtures) as (keyof typeof fixtures)[]) {
      for (const [engineAlgo, name] of Object.entries(fixtures)) {
        const router = new KVAwareRouter({
          blockSize: 16,
          indexMode: 'precise',
          blockHash: 'vllm',
          pythonHashSeed: '0',
          prefixCachingHashAlgo: algo,
        });
        router.registerWorker('w0');
        const c = new KvEventApplier(router).apply('w0', decodeEventBatch(fixture(name)));
        const what = `router ${algo}, engine ${engineAlgo}`;
        if (engineAlgo === algo) {
          assert.equal(c.hashMismatches, 0, what);
          assert.equal(c.storedBlocks, 2, what);
          assert.equal(router.route(request, { dryRun: true }).cachedTokens, 32, what);
        } else {
          assert.deepEqual(c.skipped, { hash_mismatch: 1 }, what);
          assert.equal(router.getStats().index.entries, 0, what);
        }
      }
    }
  });

  test('vllm hash mode: a late-joining router matches requests to blocks whose chain it never saw', () => {
    const cases = JSON.parse(
      readFileSync(new URL('../fixtures/kv-events/vllm-block-hash.json', import.meta.url), 'utf8'),
    ).cases as Array<{ tokens: number[]; pythonHashSeed: string }>;
    const router = router16();
    const applier = new KvEventApplier(router, new Map(), { hashMode: 'vllm' });
    // blocks 2-3 of the prompt, parent block 1: blocks 0 and 1 were stored before the router joined
    const c = applier.apply('w0', decodeEventBatch(fixture('vllm-seed0-late-join')));
    assert.equal(c.storedBlocks, 2);
    assert.equal(c.parentsProven, 1);
    const hasher = new VllmBlockHasher(cases[0].pythonHashSeed);
    const keys = hasher.hashBlocks(cases[0].tokens, 16, {}, new BlockHashes());
    // the index holds blocks 1, 2, 3 by the engine's own keys (block 0 was evicted or is unknown)
    const held = [0, 1, 2, 3].map((i) => router.index.holder(0, keys.hi[i], keys.lo[i]));
    assert.deepEqual(held, [null, 'gpu', 'gpu', 'gpu']);
    assert.equal(applier.trackedEngineHashes('w0').length, 3);
  });
});
