/**
 * Lists of KV events posted for one worker wait for the ones before it, at most
 * MAX_WAITING_LISTS of them: one more is refused at once, and applies nothing.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { readJsonEvents } from '../../src/engines/kv-events/decode.js';
import { KVAwareRouter } from '../../src/index.js';
import { MAX_WAITING_LISTS, PostedEvents } from '../../src/server/posted-events.js';

const stores = (from: number, n: number) =>
  readJsonEvents(
    Array.from({ length: n }, (_, i) => ({
      type: 'BlockStored',
      block_hashes: [from + i + 1],
      parent_block_hash: null,
      token_ids: [0, 1, 2, 3].map((k) => 4 * (from + i) + k),
      block_size: 4,
    })),
  );

test('one list more than may wait for a worker is refused at once; another worker is not held up by it', async () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
  router.registerWorker('b');
  router.registerWorker('c');
  const applier = new KvEventApplier(router);
  const posted = new PostedEvents(applier);
  const always = () => true;
  const runs = Array.from({ length: MAX_WAITING_LISTS }, (_, i) => posted.apply('b', stores(i * 10, 10), always));
  assert.deepEqual(await posted.apply('b', stores(1000, 10), always), { refusedWaiting: MAX_WAITING_LISTS });
  const other = await posted.apply('c', stores(2000, 10), always);
  assert.ok('applied' in other && other.applied.storedBlocks === 10, 'worker c has a queue of its own');
  for (const out of await Promise.all(runs)) assert.ok('applied' in out && out.applied.storedBlocks === 10);
  assert.equal(applier.trackedBlocks('b'), MAX_WAITING_LISTS * 10, 'the refused list applied nothing');
  // once they have applied, the worker takes lists again
  const again = await posted.apply('b', stores(3000, 10), always);
  assert.ok('applied' in again && again.applied.storedBlocks === 10);
});
