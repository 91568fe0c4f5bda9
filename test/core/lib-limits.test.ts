/**
 * Limits on what a library caller controls: every argument has a bound, a value past it is
 * refused with a RangeError or TypeError naming the argument, and a refused call changes
 * nothing.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';

/** What a refused call must leave as it was. */
function snapshot(router: KVAwareRouter): string {
  return JSON.stringify({ workers: router.listWorkers(), stats: router.getStats() });
}

async function refuses(
  router: KVAwareRouter,
  call: () => unknown,
  error: typeof TypeError,
  message: RegExp,
): Promise<void> {
  const before = snapshot(router);
  await assert.rejects(
    async () => call(),
    (err: unknown) => {
      assert.ok(err instanceof error, `${String(err)} is not a ${error.name}`);
      assert.match((err as Error).message, message);
      return true;
    },
  );
  assert.equal(snapshot(router), before, `state changed by a refused call (${message.source})`);
}

describe("broadcastNewBlocks()' block ids", () => {
  test('are held to maxIdBytes each, as its anchorHash is, naming the id', async () => {
    const router = new KVAwareRouter({ policy: 'cost', maxIdBytes: 64 });
    router.registerWorker('w0');
    await router.broadcastNewBlocks('doc', ['b'.repeat(64)], 'w0');
    assert.equal(router.getStats().workerLoads.w0.activeBlocks, 1);
    // 65 bytes, and 22 characters of 3 bytes each (66 bytes)
    await refuses(
      router,
      () => router.broadcastNewBlocks('other', ['b1', 'b'.repeat(65)], 'w0'),
      RangeError,
      /^blockIds\[1\] must be at most 64 bytes/,
    );
    await refuses(
      router,
      () => router.broadcastNewBlocks('doc', ['\u20ac'.repeat(22)], 'w0'),
      RangeError,
      /^blockIds\[0\] must be at most 64 bytes/,
    );
    // the default bound (1 KiB): a megabyte id is refused
    const byDefault = new KVAwareRouter();
    byDefault.registerWorker('w0');
    await refuses(
      byDefault,
      () => byDefault.broadcastNewBlocks('doc', ['x'.repeat(1 << 20)], 'w0'),
      RangeError,
      /^blockIds\[0\] must be at most 1024 bytes/,
    );
  });

  test('are not empty, as the README says of every id', async () => {
    const router = new KVAwareRouter({ policy: 'cost' });
    router.registerWorker('w0');
    await refuses(
      router,
      () => router.broadcastNewBlocks('doc', ['b1', '', 'b3'], 'w0'),
      RangeError,
      /^blockIds\[1\] must be a non-empty string/,
    );
    assert.equal(router.getWorkerForAnchor('doc'), undefined);
  });
});
