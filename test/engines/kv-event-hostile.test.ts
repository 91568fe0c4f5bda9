import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { encode } from '@msgpack/msgpack';
import { KvEventApplier, MAX_OFFLOAD_SPAN } from '../../src/engines/kv-events/applier.js';
import { decodeEventBatch, decodeJsonEvents, type KvEvent } from '../../src/engines/kv-events/decode.js';
import { KVAwareRouter } from '../../src/index.js';
import { storedTokens, tokenRange } from '../helpers/kv-event-builders.js';

const BS = 4;
const tokens = tokenRange;
const stored = (hashes: bigint[], parent: bigint | null, toks: number[], extra: Partial<KvEvent> = {}): KvEvent =>
  storedTokens(hashes, parent, toks, BS, extra);
const removed = (hashes: bigint[], medium = 'GPU'): KvEvent => ({
  type: 'BlockRemoved',
  blockHashes: hashes,
  medium,
  groupIdx: null,
});
const batch = (...events: KvEvent[]) => ({ ts: 1, events, dataParallelRank: null });

function setup() {
  const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
  router.registerWorker('w0');
  return { router, applier: new KvEventApplier(router) };
}

/** What the worker holds, as the applier and the index see it. */
function state(s: ReturnType<typeof setup>, hashes: bigint[]) {
  return {
    tracked: s.applier.trackedHashes('w0').sort(),
    copies: hashes.map((h) => s.applier.copies('w0', h)),
    cached: s.router.route({ tokens: tokens(0, 13) }, { dryRun: true }).cachedTokens,
  };
}

describe('KV events from a hostile publisher', () => {
  const chain = [stored([1n, 2n], null, tokens(0, 8)), stored([3n], 2n, tokens(8, 4))];

  test('an offload copy spanning an absurd number of blocks is skipped, not walked or allocated for', () => {
    for (const blockSize of [BS * 2 ** 40, BS * (MAX_OFFLOAD_SPAN + 1)]) {
      for (const medium of ['CPU', null]) {
        const hostile = setup();
        const counts = hostile.applier.apply(
          'w0',
          batch(chain[0], stored([2n], null, [], { medium, blockSize }), chain[1]),
        );
        assert.deepEqual(counts.skipped, { block_size: 1 });
        const fresh = setup();
        fresh.applier.apply('w0', batch(...chain));
        assert.deepEqual(state(hostile, [1n, 2n, 3n]), state(fresh, [1n, 2n, 3n]));
      }
    }
  });

  test('parents made to loop by repeated hashes: refused by router keying; under vLLM keying an offload walk visits each block once', () => {
    // hash 1 stored twice in one event: its second copy names itself as parent, a hash that
    // names no position; the worker is refused, and no loop forms
    const s = setup();
    const refused = s.applier.apply('w0', batch(stored([1n, 1n], null, tokens(0, 8))));
    assert.equal(refused.positionFreeHashes, 1);
    assert.equal(s.applier.trackedBlocks('w0'), 0);
    // --block-hash vllm records a parent proven by a store, so stores can make 1 → 2 → 1
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise', blockHash: 'vllm', pythonHashSeed: '0' });
    router.registerWorker('w0');
    const applier = new KvEventApplier(router);
    applier.apply('w0', batch(stored([1n], 2n, tokens(0, 4)), stored([2n], 1n, tokens(4, 4))));
    const c = applier.apply('w0', batch(stored([1n], null, [], { medium: 'CPU', blockSize: BS * 1000 })));
    assert.equal(c.offloadBlocks, 2);
    assert.deepEqual(applier.copies('w0', 1n), { gpu: 1, offload: 1 });
    assert.deepEqual(applier.copies('w0', 2n), { gpu: 2, offload: 1 });
    // the CPU copy's removal takes it back out: nothing left offloaded
    applier.apply('w0', batch(removed([1n], 'CPU')));
    assert.deepEqual(applier.copies('w0', 1n), { gpu: 1, offload: 0 });
    assert.deepEqual(applier.copies('w0', 2n), { gpu: 2, offload: 0 });
  });

  test('a JSON hash of 2^64 or more skips its event, not wrapped to another block', () => {
    for (const h of ['18446744073709551616', '99999999999999999999']) {
      const b = decodeJsonEvents([
        { type: 'BlockStored', block_hashes: [h], token_ids: tokens(0, 4), block_size: 4 },
        { type: 'AllBlocksCleared' },
      ]);
      assert.deepEqual(b.events, [{ type: 'AllBlocksCleared' }]);
      assert.equal(b.skipped?.length, 1);
      assert.equal(b.skipped![0].reason, 'bad_field');
      assert.match(b.skipped![0].message, /block_hashes\[0\].*below 2\^64/);
    }
    const ok = decodeJsonEvents([
      { type: 'BlockStored', block_hashes: ['18446744073709551615'], token_ids: tokens(0, 4), block_size: 4 },
    ]);
    assert.deepEqual((ok.events[0] as { blockHashes: unknown }).blockHashes, [2n ** 64n - 1n]);
  });

  test('a hash sent as a float past 2^53 skips its event, not silently truncated', () => {
    const b = decodeEventBatch(
      encode([
        1,
        [
          ['BlockStored', [2 ** 64], null, tokens(0, 4), 4],
          ['BlockStored', [5], null, tokens(0, 4), 4],
        ],
      ]),
    );
    assert.equal(b.events.length, 1);
    assert.equal(b.skipped?.length, 1);
    assert.match(b.skipped![0].message, /block_hashes\[0\] is a number past 2\^53/);
  });
});
