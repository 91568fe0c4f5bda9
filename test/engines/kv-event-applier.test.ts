import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { BlockHashes, hashTokenBlocks, hashTokenBlocksFrom } from '../../src/core/hashing.js';
import type { KvEvent } from '../../src/engines/kv-events/decode.js';
import { KvEventApplier, emptyCounts } from '../../src/engines/kv-events/applier.js';
import { KVAwareRouter } from '../../src/index.js';

const BS = 4;
const tokens = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
const stored = (hashes: bigint[], parent: bigint | null, toks: number[], extra: Partial<KvEvent> = {}): KvEvent => ({
  type: 'BlockStored', blockHashes: hashes, parentBlockHash: parent, tokenIds: toks, blockSize: BS,
  loraId: null, medium: 'GPU', loraName: null, groupIdx: null, ...extra,
}) as KvEvent;
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

  test('removed events are applied through the engine-hash map; unknown ones are counted', () => {
    const { router, applier } = setup();
    applier.apply('w0', batch(stored([10n, 11n, 12n], null, tokens(0, 12))));
    const c = applier.apply('w0', batch({ type: 'BlockRemoved', blockHashes: [12n, 99n], medium: null, groupIdx: null }));
    assert.equal(c.removedBlocks, 1);
    assert.equal(c.unknownRemovals, 1);
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

  test('a block whose parent was never seen is counted, not guessed', () => {
    const { router, applier } = setup();
    const c = applier.apply('w0', batch(stored([12n], 11n, tokens(8, 4))));
    assert.equal(c.orphanEvents, 1);
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
  });
});
