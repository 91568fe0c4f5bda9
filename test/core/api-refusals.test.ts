/**
 * The library's refusals at its edge: a refused call throws a TypeError or RangeError naming the
 * argument (and the key), and leaves the router as it was.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createRng } from '../../src/core/rng.js';
import { KVAwareRouter, type RouteRequest } from '../../src/index.js';

/** What a refused call must leave as it was. */
function snapshot(router: KVAwareRouter) {
  return JSON.stringify({
    workers: router.listWorkers().map((w) => ({
      id: w.id,
      info: w.info,
      load: w.load,
      inFlight: w.inFlightRequests,
      queued: w.queuedPrefillTokens,
      waiting: w.waitingRequests,
    })),
    stats: router.getStats(),
  });
}

function refuses(router: KVAwareRouter, call: () => unknown, error: typeof TypeError, message: RegExp): void {
  const before = snapshot(router);
  assert.throws(call, (err: unknown) => {
    assert.ok(err instanceof error, `${String(err)} is not a ${error.name}`);
    assert.match(err.message, message);
    return true;
  });
  assert.equal(snapshot(router), before, `state changed by a refused call (${message.source})`);
}

describe('registering a known worker again', () => {
  test('checks its info as for a new one', () => {
    const router = new KVAwareRouter();
    router.registerWorker('a', { blockSize: 32 });
    refuses(router, () => router.registerWorker('a', { blockSize: 0 }), RangeError, /info\.blockSize/);
    refuses(router, () => router.registerWorker('a', 'junk' as never), TypeError, /info must be an object/);
    refuses(router, () => router.registerWorker('a', { claGroups: [-1] }), RangeError, /info\.claGroups\[0\]/);
    // a valid info for a known id still changes nothing
    router.registerWorker('a', { blockSize: 64 });
    assert.equal(router.blockSizeOf('a'), 32);
  });
});

describe("a worker's claGroups and models", () => {
  test('with a hole are refused, naming the element, as a new worker and as a known one', () => {
    const router = new KVAwareRouter();
    const sparse: number[] = [];
    sparse[1] = 1; // [, 1]
    const msg = /^info\.claGroups\[0\] must be a non-negative integer, got undefined$/;
    refuses(router, () => router.registerWorker('n', { claGroups: sparse }), TypeError, msg);
    assert.equal(router.listWorkers().length, 0);
    router.registerWorker('a');
    refuses(router, () => router.registerWorker('a', { claGroups: sparse }), TypeError, msg);
    const models = ['x'];
    models[2] = 'y'; // ['x', , 'y']
    refuses(
      router,
      () => router.registerWorker('m', { models }),
      TypeError,
      /^info\.models\[1\] must be a string, got undefined$/,
    );
    refuses(router, () => router.registerWorker('h', { claGroups: new Array<number>(1e9) }), TypeError, msg);
  });

  test("are copied: a later change to the caller's lists does not show", () => {
    const router = new KVAwareRouter();
    const claGroups = [1, 2];
    const models = ['m'];
    router.registerWorker('a', { claGroups, models });
    claGroups.push(3);
    claGroups[0] = 7;
    models.length = 0;
    const [a] = router.listWorkers();
    assert.deepEqual(a.info.claGroups, [1, 2]);
    assert.deepEqual(a.info.models, ['m']);
    assert.deepEqual([...a.claGroups], [1, 2]);
    assert.notEqual(a.info.claGroups, claGroups);
  });
});

describe('unknown keys', () => {
  test("route()'s options: a misspelt dryRun is refused, not routed for real", () => {
    const router = new KVAwareRouter();
    router.registerWorker('a');
    refuses(
      router,
      () => router.route({ tokens: [1, 2, 3] }, { dryrun: true } as never),
      TypeError,
      /^options\.dryrun is not a known key \(did you mean dryRun\?\)$/,
    );
    assert.equal(router.listWorkers()[0].inFlightRequests, 0);
    refuses(
      router,
      () => router.route({ tokens: [1] }, { zzzzzzz: 1 } as never),
      TypeError,
      /^options\.zzzzzzz is not a known key \(known: explain, track, dryRun, now, exclude, panicCandidates, servedBy, replaces, share, firstTokenReported\)$/,
    );
    // a key given as undefined is not given, as with the constructor's options
    router.route({ tokens: [1] }, { dryRun: true, dryrun: undefined } as never);
  });

  test("registerWorker()'s info: a misspelt blockSize is refused", () => {
    const router = new KVAwareRouter();
    refuses(
      router,
      () => router.registerWorker('b', { blocksize: 32 } as never),
      TypeError,
      /^info\.blocksize is not a known key \(did you mean blockSize\?\)$/,
    );
    assert.equal(router.listWorkers().length, 0);
    router.registerWorker('b');
    refuses(router, () => router.registerWorker('b', { blocksize: 32 } as never), TypeError, /info\.blocksize/);
  });

  test("updateWorkerMetrics()'s metrics: a misspelt kvUsage is refused", () => {
    const router = new KVAwareRouter();
    router.registerWorker('a');
    refuses(
      router,
      () => router.updateWorkerMetrics('a', { kvusage: 0.99 } as never),
      TypeError,
      /^metrics\.kvusage is not a known key \(did you mean kvUsage\?\)$/,
    );
    refuses(
      router,
      () => router.updateWorkerMetrics('a', { kvUsage: 0.5, waiting: 3 } as never),
      TypeError,
      /^metrics\.waiting is not a known key/,
    );
    assert.equal(router.listWorkers()[0].load, 0);
  });

  test("the seed API's opts", async () => {
    const router = new KVAwareRouter();
    router.registerWorker('a');
    await assert.rejects(router.selectWorker('x', { claGroups: 1 } as never), /opts\.claGroups is not a known key/);
    await assert.rejects(router.updateWorkerState('a', 0.5, { step: 1 } as never), /opts\.step is not a known key/);
    assert.equal(router.listWorkers()[0].load, 0);
  });
});

describe('worker ids', () => {
  test('are at most 256 characters', async () => {
    const router = new KVAwareRouter();
    router.registerWorker('w'.repeat(256));
    refuses(
      router,
      () => router.registerWorker('w'.repeat(100_000)),
      RangeError,
      /^workerId must be at most 256 characters, got 100000$/,
    );
    await assert.rejects(router.updateWorkerState('w'.repeat(257), 0.5), {
      name: 'RangeError',
      message: /^workerId must be at most 256/,
    });
    assert.equal(router.listWorkers().length, 1);
  });

  test('are well-formed UTF-16: a lone surrogate is refused', async () => {
    const router = new KVAwareRouter();
    router.registerWorker('gpu-\u{1F680}'); // a surrogate pair is a character
    for (const id of ['a\uD800', '\uDC00b', 'a\uDC00\uD800b'])
      refuses(router, () => router.registerWorker(id), RangeError, /^workerId must be well-formed UTF-16/);
    await assert.rejects(router.broadcastNewBlocks('anchor', ['b'], 'x\uD83D'), /targetWorkerId must be well-formed/);
    assert.deepEqual(
      router.listWorkers().map((w) => w.id),
      ['gpu-\u{1F680}'],
    );
  });
});

describe('precomputed block hashes', () => {
  test('bigints outside [0, 2^64) are refused, not wrapped', () => {
    const router = new KVAwareRouter({ indexMode: 'approximate' });
    router.registerWorker('a');
    for (const [hash, shown] of [
      [-1n, '-1'],
      [1n << 64n, '18446744073709551616'],
      [1n << 200n, 'one of more than 128 bits'],
    ] as const)
      refuses(
        router,
        () => router.route({ blockHashes: [5n, hash], blockTokens: 16 }),
        RangeError,
        new RegExp(`^blockHashes\\[1\\] must be a bigint in \\[0, 2\\^64\\), got ${shown}$`),
      );
    // the bounds themselves are ids
    const low = router.route({ blockHashes: [0n, (1n << 64n) - 1n], blockTokens: 16 }, { dryRun: true });
    assert.equal(low.blocks, 2);
  });
});

describe('random seeds', () => {
  test('are integers from 0 to 2^32 - 1: a larger one would repeat a smaller one', () => {
    assert.throws(() => createRng(4294967296), {
      name: 'RangeError',
      message: /^seed must be an integer from 0 to 4294967295, got 4294967296$/,
    });
    assert.throws(() => createRng(-1), { name: 'RangeError', message: /^seed must be/ });
    assert.throws(() => createRng(1.5), { name: 'RangeError', message: /^seed must be/ });
    assert.notEqual(createRng(4294967295)(), createRng(0)());
    assert.throws(() => new KVAwareRouter({ randomSeed: 4294967296 }), {
      name: 'RangeError',
      message: /^randomSeed must be <= 4294967295/,
    });
  });
});

describe('a request', () => {
  test('has no outputTokens: nothing in the router reads an expected output length', () => {
    // @ts-expect-error outputTokens is not a field of a request
    const request: RouteRequest = { tokens: [1, 2, 3], outputTokens: 5 };
    // and, as any key a request does not have, it is refused rather than silently ignored
    assert.throws(() => new KVAwareRouter().route(request), {
      name: 'TypeError',
      message: /^request\.outputTokens is not a known key/,
    });
  });
});
