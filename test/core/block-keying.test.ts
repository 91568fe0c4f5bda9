import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BlockHashes } from '../../src/core/hashing.js';
import { VllmBlockHasher } from '../../src/core/vllm-block-hash.js';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import type { KvEvent } from '../../src/engines/kv-events/decode.js';
import { KVAwareRouter } from '../../src/index.js';

const tokens = (n: number, from = 100) => Array.from({ length: n }, (_, i) => from + i);

test("blockHash 'vllm': requests are keyed by vLLM's hash, so the engine's reported hashes match directly", () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise', blockHash: 'vllm', pythonHashSeed: '1234' });
  router.registerWorker('w0');
  router.registerWorker('w1');
  const prompt = tokens(20);
  const engine = new VllmBlockHasher('1234').hashBlocks(prompt, 4, { cacheSalt: 'tenant' }, new BlockHashes());
  router.applyStored('w1', engine);
  assert.equal(router.route({ tokens: prompt, cacheSalt: 'tenant' }, { dryRun: true }).workerId, 'w1');
  assert.equal(router.route({ tokens: prompt, cacheSalt: 'tenant' }, { dryRun: true }).cachedTokens, 20);
  assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 0, 'unsalted keys differ, as in vLLM');
  // a late-joining router saw only the store of blocks 3-4: the engine caches prefixes, so
  // blocks 0-2 are held too (the router's own hash could not match them at all)
  const late = new KVAwareRouter({ blockSize: 4, indexMode: 'precise', blockHash: 'vllm', pythonHashSeed: '1234' });
  late.registerWorker('w0');
  late.registerWorker('w1');
  late.applyStored('w1', { hi: engine.hi.subarray(3, 5), lo: engine.lo.subarray(3, 5), length: 2 });
  const d = late.route({ tokens: prompt, cacheSalt: 'tenant' }, { dryRun: true, explain: true });
  assert.equal(d.workerId, 'w1');
  assert.equal(d.cachedTokens, 20);
  assert.equal(d.explain!.find((e) => e.worker === 'w0')!.cachedTokens, 0);
  assert.throws(() => new KVAwareRouter({ blockHash: 'vllm' }), /pythonHashSeed/);
  assert.throws(() => new KVAwareRouter({ blockHash: 'md5' as never }), /'router' or 'vllm'/);
});

test('a worker with its own block size (SGLang page size 1) is looked up in its size; cached tokens count its blocks', () => {
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise', speculativeBlocks: 0 });
  router.registerWorker('vllm');
  router.registerWorker('sglang', { blockSize: 1 });
  assert.equal(router.blockSizeOf('sglang'), 1);
  assert.equal(router.blockSizeOf('vllm'), 16);
  const applier = new KvEventApplier(router, new Map([['sglang', { blockSize: 1 }]]));
  // SGLang: one event per page (one token), chained by parent
  const events: KvEvent[] = [];
  const prompt = tokens(37);
  prompt.forEach((t, i) =>
    events.push({
      type: 'BlockStored',
      blockHashes: [BigInt(i + 1)],
      parentBlockHash: i === 0 ? null : BigInt(i),
      tokenIds: [t],
      blockSize: 1,
      loraId: null,
      medium: null,
      loraName: null,
      groupIdx: null,
    }),
  );
  const c = applier.apply('sglang', { ts: 0, events, dataParallelRank: null });
  assert.equal(c.storedBlocks, 37);
  // vLLM worker holds the first 16-token block
  applier.apply('vllm', {
    ts: 0,
    events: [
      {
        type: 'BlockStored',
        blockHashes: [900n],
        parentBlockHash: null,
        tokenIds: prompt.slice(0, 16),
        blockSize: 16,
        loraId: null,
        medium: 'GPU',
        loraName: null,
        groupIdx: null,
      },
    ],
    dataParallelRank: null,
  });
  const d = router.route({ tokens: prompt }, { dryRun: true, explain: true });
  const byWorker = Object.fromEntries(d.explain!.map((e) => [e.worker, e.cachedTokens]));
  assert.deepEqual(byWorker, { vllm: 16, sglang: 37 });
  assert.equal(d.workerId, 'sglang');
  // the decision records its speculative entries in the chosen worker's size
  const r = router.route({ tokens: [...prompt, 1, 2, 3] });
  router.release(r.ticket);
  assert.throws(() => router.registerWorker('bad', { blockSize: 0 }), /blockSize must be an integer/);
});
