/**
 * Limits on what a library caller controls: every argument has a bound, a value past it is
 * refused with a RangeError or TypeError naming the argument, and a refused call changes
 * nothing.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  MAX_MODEL_NAME_LENGTH,
  MAX_WORKER_CLA_GROUPS,
  MAX_WORKER_MODELS,
  MAX_WORKER_URL_LENGTH,
} from '../../src/core/worker-registry.js';
import { KVAwareRouter, type WorkerInfo } from '../../src/index.js';

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

describe("registerWorker()'s info", () => {
  test("takes at most as many CLA groups and models, and as long a url and model names, as the gateway's workers", () => {
    const router = new KVAwareRouter();
    const most = Array.from({ length: MAX_WORKER_CLA_GROUPS }, (_, i) => i);
    router.registerWorker('w0', {
      claGroups: most,
      models: Array.from({ length: MAX_WORKER_MODELS }, (_, i) => `m${i}`.padEnd(MAX_MODEL_NAME_LENGTH, 'x')),
      url: `http://h/${'p'.repeat(MAX_WORKER_URL_LENGTH - 9)}`,
    });
    assert.equal(router.getStats().workerLoads.w0.claGroups, MAX_WORKER_CLA_GROUPS);
    // the gateway's worker records take the same bounds: one schema of them
    assert.equal(MAX_WORKER_CLA_GROUPS, 1024);
    assert.equal(MAX_WORKER_MODELS, 1024);
    assert.equal(MAX_MODEL_NAME_LENGTH, 512);
    assert.equal(MAX_WORKER_URL_LENGTH, 2048);
    const millions = [...most, 1024];
    millions.length = 17_000_000;
    const cases: Array<[WorkerInfo, RegExp]> = [
      [{ claGroups: [...most, 1024] }, /^info\.claGroups must list at most 1024 CLA groups, got 1025/],
      // a length of millions is refused by the length, not by the engine's bound on a Set, and
      // without reading the elements past the bound
      [{ claGroups: millions }, /^info\.claGroups must list at most 1024 CLA groups, got 17000000$/],
      [
        { models: Array.from({ length: MAX_WORKER_MODELS + 1 }, (_, i) => `m${i}`) },
        /^info\.models must list at most 1024 models, got 1025/,
      ],
      [{ models: ['m', 'x'.repeat(513)] }, /^info\.models\[1\] must be at most 512 characters, got 513/],
      [{ url: `http://h/${'p'.repeat(MAX_WORKER_URL_LENGTH)}` }, /^info\.url must be at most 2048 characters/],
    ];
    for (const [info, message] of cases) {
      const before = snapshot(router);
      assert.throws(
        () => router.registerWorker('w1', info),
        (err: unknown) => err instanceof RangeError && message.test(err.message),
        message.source,
      );
      assert.equal(snapshot(router), before, `a worker registered by a refused call (${message.source})`);
      // a known worker's info is checked as a new one's
      assert.throws(() => router.registerWorker('w0', info), RangeError);
    }
    assert.deepEqual(
      router.listWorkers().map((w) => w.id),
      ['w0'],
    );
  });

  test('bounds the CLA groups updateWorkerState() adds too, naming claGroup, and changes nothing', async () => {
    const router = new KVAwareRouter();
    router.registerWorker('w0', { claGroups: Array.from({ length: MAX_WORKER_CLA_GROUPS }, (_, i) => i) });
    await router.updateWorkerState('w0', 0.25, { claGroup: 7 }); // a group it serves
    await refuses(router, () => router.updateWorkerState('w0', 0.5, { claGroup: 5000 }), RangeError, /^claGroup 5000/);
    assert.equal(router.getStats().workerLoads.w0.load, 0.25);
  });
});
