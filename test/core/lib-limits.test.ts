/**
 * Limits on what a library caller controls: every argument has a bound, a value past it is
 * refused with a RangeError or TypeError naming the argument, and a refused call changes
 * nothing.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import {
  MAX_PREDICTION_TTL_MS,
  MAX_PROMPT_TOKENS,
  MAX_SPECULATIVE_BLOCKS,
} from '../../src/core/router/options-schema.js';
import {
  MAX_MODEL_NAME_LENGTH,
  MAX_WORKER_CLA_GROUPS,
  MAX_WORKER_MODELS,
  MAX_WORKER_URL_LENGTH,
} from '../../src/core/worker-registry.js';
import { KVAwareRouter, type KVAwareRouterOptions, type RouteRequest, type WorkerInfo } from '../../src/index.js';
import { resolveServe } from '../helpers/serve-config.js';

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

describe("the router's options", () => {
  const refusedOptions: Array<[KVAwareRouterOptions, typeof TypeError, RegExp]> = [
    [{ costWeights: { kvCapacityTokens: 0.5 } }, RangeError, /^costWeights\.kvCapacityTokens must be a whole number/],
    [
      { costWeights: { kvCapacityTokens: 1e9 + 1 } },
      RangeError,
      /^costWeights\.kvCapacityTokens must be <= 1000000000/,
    ],
    [{ contentAnchorTtlMs: 1e300 }, RangeError, /^contentAnchorTtlMs must be <= 2147483647/],
    [{ contentAnchorTtlMs: MAX_PREDICTION_TTL_MS + 1 }, RangeError, /^contentAnchorTtlMs must be <= 2147483647/],
    [{ contentAnchorTtlMs: 1.5 }, TypeError, /^contentAnchorTtlMs must be an integer/],
    [{ speculativeBlocks: 1e9 }, RangeError, /^speculativeBlocks must be <= 134217728/],
    [{ speculativeBlocks: MAX_SPECULATIVE_BLOCKS + 1 }, RangeError, /^speculativeBlocks must be <= 134217728/],
  ];

  test('bound a TTL as predictionTtlMs, speculativeBlocks by the most blocks a prompt has, kvCapacityTokens to whole tokens', () => {
    assert.equal(MAX_SPECULATIVE_BLOCKS, MAX_PROMPT_TOKENS);
    for (const [options, error, message] of refusedOptions)
      assert.throws(
        () => new KVAwareRouter(options),
        (err: unknown) => err instanceof error && message.test(err.message),
        JSON.stringify(options),
      );
    // the bounds themselves are taken
    new KVAwareRouter({
      costWeights: { kvCapacityTokens: 1e9 },
      contentAnchorTtlMs: MAX_PREDICTION_TTL_MS,
      predictionTtlMs: MAX_PREDICTION_TTL_MS,
      speculativeBlocks: MAX_SPECULATIVE_BLOCKS,
    });
    new KVAwareRouter({ contentAnchorTtlMs: 0, speculativeBlocks: 0 });
  });

  test('are bounded the same way by serve: its flags, variables and config file read the one schema', () => {
    for (const [args, message] of [
      [['--content-anchor-ttl-ms', '1e300'], /--content-anchor-ttl-ms must be <= 2147483647/],
      [['--speculative-blocks', '1000000000'], /--speculative-blocks must be <= 134217728/],
      [['--cost-weights', '{kvCapacityTokens: 0.5}'], /costWeights\.kvCapacityTokens must be a whole number/],
    ] as const)
      assert.throws(() => resolveServe([...args]), message, args.join(' '));
    assert.throws(
      () => resolveServe([], { CONTEXTFORGE_CONTENT_ANCHOR_TTL_MS: '2147483648' }),
      /--content-anchor-ttl-ms must be <= 2147483647/,
    );
    const dir = mkdtempSync(join(tmpdir(), 'cfr-lib-limits-'));
    try {
      const file = join(dir, 'router.yaml');
      writeFileSync(file, 'router:\n  speculativeBlocks: 1000000000\n');
      assert.throws(() => resolveServe(['--config', file]), /router\.speculativeBlocks must be <= 134217728/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    const { config } = resolveServe([
      '--content-anchor-ttl-ms',
      String(MAX_PREDICTION_TTL_MS),
      '--speculative-blocks',
      String(MAX_SPECULATIVE_BLOCKS),
    ]);
    assert.equal(config.contentAnchorTtlMs, MAX_PREDICTION_TTL_MS);
    assert.equal(config.speculativeBlocks, MAX_SPECULATIVE_BLOCKS);
  });
});

describe("route()'s prompt", () => {
  test('is named one way: two ways given are refused with a TypeError naming both, and nothing is recorded', async () => {
    const router = new KVAwareRouter({ policy: 'cost' });
    router.registerWorker('w0');
    router.registerWorker('w1');
    const tokens = Array.from({ length: 64 }, (_, i) => i);
    const ways: Record<string, Partial<RouteRequest>> = {
      tokens: { tokens },
      blockHashes: { blockHashes: [1, 2, 3] },
      messages: { messages: [{ role: 'user', content: 'hello there' }] },
      text: { text: 'hello there, a prompt' },
    };
    const names = Object.keys(ways);
    for (let i = 0; i < names.length; i++)
      for (let j = i + 1; j < names.length; j++) {
        const request = { ...ways[names[i]], ...ways[names[j]], workflowId: 'wf' };
        await refuses(
          router,
          () => router.route(request),
          TypeError,
          new RegExp(`^${names[i]} and ${names[j]} both given: a request names its prompt one way`),
        );
      }
    // the same refused with the dry run, and as explained
    await refuses(
      router,
      () => router.route({ text: 'x', tokens }, { dryRun: true, explain: true }),
      TypeError,
      /^tokens and text both given/,
    );
    // one way, or none (the seed API routes without a prompt), is routed as before; a way given
    // as undefined is not given
    for (const request of [...Object.values(ways), {}, { promptTokens: 10 }, { tokens, text: undefined }]) {
      const r = router.route(request, { track: false });
      assert.ok(r.workerId !== '', JSON.stringify(request));
    }
  });
});
