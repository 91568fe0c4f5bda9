/**
 * The seed's broadcastNewBlocks(anchor, blockIds, worker) names the anchor's home; its block
 * ids are opaque labels (the seed scores the home 1.0 whatever they are). Under the default
 * policy the home keeps the whole prompt's credit after a broadcast, as it does without one.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';

/** The seed's flow: select, (broadcast,) set the home's load, some other work, select again. */
async function seedFlow(load: number, broadcast: string[] | undefined) {
  const router = new KVAwareRouter();
  router.registerWorker('gpu-0');
  router.registerWorker('gpu-1');
  const first = await router.selectWorker('doc', { tokenLength: 8192 });
  if (broadcast) await router.broadcastNewBlocks('doc', broadcast, first.targetWorkerId);
  await router.updateWorkerState(first.targetWorkerId, load);
  for (let i = 0; i < 6; i++) router.route({ promptTokens: 4000 });
  const next = await router.selectWorker('doc', { tokenLength: 8192 });
  return { router, first, next };
}

describe('broadcastNewBlocks under the default policy', () => {
  for (const load of [0, 0.3, 0.6, 0.8, 0.9, 0.94]) {
    test(`the anchor's home keeps it at load ${load}, as without the broadcast`, async () => {
      const without = await seedFlow(load, undefined);
      for (const ids of [['b1', 'b2'], ['b1'], Array.from({ length: 600 }, (_, i) => `b${i}`)]) {
        const { router, first, next } = await seedFlow(load, ids);
        assert.equal(next.targetWorkerId, first.targetWorkerId, `${ids.length} block ids`);
        assert.equal(next.targetWorkerId, without.next.targetWorkerId);
        assert.equal(next.confidence, without.next.confidence);
        // the ids are still counted as the home's blocks
        assert.equal(router.getStats().workerLoads[first.targetWorkerId].activeBlocks, ids.length);
      }
    });
  }

  test("the home's credit is the whole prompt's, whatever the number of ids", async () => {
    const router = new KVAwareRouter();
    router.registerWorker('gpu-0');
    router.registerWorker('gpu-1');
    await router.broadcastNewBlocks('doc', ['b1', 'b2'], 'gpu-1');
    const d = router.route({ anchor: 'doc', promptTokens: 8192 }, { dryRun: true, explain: true });
    assert.equal(d.workerId, 'gpu-1');
    assert.equal(d.cachedTokens, 8192);
    assert.equal(d.explain!.find((e) => e.worker === 'gpu-1')!.cachedTokens, 8192);
  });

  test("a request's own blocks the index credits to the home say how much it holds", () => {
    const router = new KVAwareRouter({ blockSize: 16 });
    router.registerWorker('gpu-0');
    router.registerWorker('gpu-1');
    const tokens = Array.from({ length: 64 }, (_, i) => i);
    const first = router.route({ tokens, anchor: 'doc' }, { track: false });
    // the same anchor, a prompt sharing the first 64 tokens of 256
    const longer = [...tokens, ...Array.from({ length: 192 }, (_, i) => 10_000 + i)];
    const d = router.route({ tokens: longer, anchor: 'doc' }, { dryRun: true });
    assert.equal(d.workerId, first.workerId);
    assert.equal(d.cachedTokens, 64);
  });
});
