/**
 * Values a careless or hostile caller may pass the library: times before 0 or on another
 * clock, ids of megabytes, numbers of the wrong kind. Each is refused with a TypeError or
 * RangeError naming the argument, and the router decides afterwards as a fresh one would.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { BlockIndex } from '../../src/core/block-index.js';
import { MAX_TIME_LEAD_MS } from '../../src/core/router/kv-aware-router.js';
import { KVAwareRouter, type KVAwareRouterOptions } from '../../src/index.js';

const T0 = 1_000_000;
const prompt = (base: number) => Array.from({ length: 64 }, (_, i) => base + i);
const SYS = prompt(1);
const OTHER = prompt(1000);

/** A router on a clock the test sets, with two workers. */
function make(options: KVAwareRouterOptions = {}): { router: KVAwareRouter; clock: { t: number } } {
  const clock = { t: T0 };
  const router = new KVAwareRouter({ blockSize: 4, instanceId: 'hi', clock: () => clock.t, ...options });
  router.registerWorker('w0');
  router.registerWorker('w1');
  return { router, clock };
}

/** What the router decides for a few requests: equal for two routers in the same state. */
function decisions(router: KVAwareRouter): string {
  return JSON.stringify([
    router.route({ tokens: OTHER }).workerId,
    router.route({ tokens: SYS }).workerId,
    router.route({ tokens: SYS }, { track: false }).cachedTokens,
    router.getStats().index,
    router.getStats().inFlightRequests,
    router.getStats().workflowsTracked,
  ]);
}

/** `call` throws a `kind` whose message matches `message`, and the router then decides as a fresh one. */
function refused(
  call: (router: KVAwareRouter) => unknown,
  kind: typeof TypeError,
  message: RegExp,
  options: KVAwareRouterOptions = {},
): void {
  const { router } = make(options);
  assert.throws(
    () => call(router),
    (err: unknown) => {
      assert.ok(err instanceof kind, `${String(err)} is not a ${kind.name}`);
      assert.match((err as Error).message, message);
      return true;
    },
  );
  assert.equal(decisions(router), decisions(make(options).router), `a refused call (${message.source}) left state`);
}

describe('a time before 0', () => {
  test('is refused as route(), routeOrThrow() and applySharedDecision() take it, and as a clock reading', () => {
    for (const indexMode of ['approximate', 'precise'] as const) {
      for (const now of [-1, -1e9, -Number.MIN_VALUE]) {
        refused((r) => r.route({ tokens: SYS }, { now }), RangeError, /^now must be a finite number of ms >= 0/, {
          indexMode,
        });
        refused((r) => r.routeOrThrow({ tokens: SYS }, { now }), RangeError, /^now must be/, { indexMode });
        refused((r) => r.route({ tokens: SYS }, { now, dryRun: true, track: false }), RangeError, /^now must be/, {
          indexMode,
        });
      }
    }
    const { router: source } = make();
    const shared = source.route({ tokens: SYS, workflowId: 'wf' }, { share: true }).shared!;
    refused((r) => r.applySharedDecision(shared, -1), RangeError, /^now must be a finite number of ms >= 0/);
    refused((r) => r.updateWorkerMetrics('w0', { sampledAt: -1 }), RangeError, /^sampledAt must be/);
    const router = new KVAwareRouter({ clock: () => -5 });
    router.registerWorker('a');
    assert.throws(
      () => router.route({ tokens: SYS }),
      /^RangeError: clock must be a finite number of ms >= 0, got -5$/,
    );
  });

  test('is read as the first generation by the block index itself', () => {
    const index = new BlockIndex({ predictedTtlMs: 1000 });
    index.advanceTime(-1);
    assert.equal(index.recordPredicted(0, [1, 2], [3, 4], 0, 2, -1e9), 2);
    assert.equal(index.stats().entries, 2);
    // recorded in generation 0: gone once the lifetime has passed from 0
    index.advanceTime(1600);
    index.flushExpiry();
    assert.equal(index.stats().entries, 0);
  });
});

describe('time going back', () => {
  test('a now earlier than the latest taken is read as it: a content anchor recorded then lives its lifetime', () => {
    const { router, clock } = make({ contentAnchorTtlMs: 10_000 });
    router.route({ tokens: OTHER }); // at T0, from the clock
    const anchored = { tokens: prompt(5000), contentAnchors: [{ id: 'doc', tokens: 40 }] };
    const home = router.route(anchored, { now: 0 }).workerId; // a caller on another clock, behind
    assert.equal(router.time, T0);
    clock.t = T0 + 9_000;
    const again = router.route({ tokens: prompt(9000), contentAnchors: [{ id: 'doc', tokens: 40 }] }, { dryRun: true });
    assert.equal(again.workerId, home);
    assert.equal(again.cachedTokens, 40, 'the anchor recorded at an earlier now is held until T0 + its lifetime');
    clock.t = T0 + 10_001;
    const later = router.route({ tokens: prompt(9000), contentAnchors: [{ id: 'doc', tokens: 40 }] }, { dryRun: true });
    assert.equal(later.cachedTokens, 0);
  });

  test('predictions recorded at an earlier now expire a lifetime after the latest time, not before or never', () => {
    const ttl = 10_000;
    const { router, clock } = make({ predictionTtlMs: ttl });
    router.route({ tokens: OTHER });
    router.route({ tokens: SYS }, { now: 5 });
    clock.t = T0 + ttl - 1;
    assert.equal(router.route({ tokens: SYS }, { dryRun: true }).cachedTokens, 64);
    clock.t = T0 + 1.5 * ttl + 1;
    assert.equal(router.route({ tokens: SYS }, { dryRun: true }).cachedTokens, 0);
  });
});

describe('a now far ahead of the router (another clock)', () => {
  test('is refused past the bound, and what was recorded before still expires on the router clock', () => {
    for (const now of [1e15, 1e308, T0 + MAX_TIME_LEAD_MS + 120_001]) {
      refused(
        (r) => r.route({ tokens: SYS }, { now }),
        RangeError,
        /^now must be at most 120000 ms past the router's time/,
      );
      refused((r) => r.updateWorkerMetrics('w0', { sampledAt: now }), RangeError, /^sampledAt must be at most/);
    }
    // precise mode (a 5 s lifetime): the bound is MAX_TIME_LEAD_MS
    refused(
      (r) => r.route({ tokens: SYS }, { now: T0 + MAX_TIME_LEAD_MS + 1 }),
      RangeError,
      new RegExp(`^now must be at most ${MAX_TIME_LEAD_MS} ms past`),
      { indexMode: 'precise' },
    );
    const { router: source } = make();
    const shared = source.route({ tokens: SYS }, { share: true }).shared!;
    refused((r) => r.applySharedDecision(shared, 1e15), RangeError, /^now must be at most/);
  });

  test('within the bound it is taken, and the router time follows it', () => {
    const { router, clock } = make({ predictionTtlMs: 10_000 });
    const ahead = T0 + MAX_TIME_LEAD_MS;
    router.route({ tokens: SYS }, { now: ahead, track: false });
    assert.equal(router.time, ahead);
    // the clock catches up; the prediction lives its lifetime from the time it was recorded at
    clock.t = ahead + 9_999;
    assert.equal(router.route({ tokens: SYS }, { dryRun: true }).cachedTokens, 64);
    clock.t = ahead + 15_001;
    assert.equal(router.route({ tokens: SYS }, { dryRun: true }).cachedTokens, 0);
  });
});

describe('ids past maxIdBytes', () => {
  const long = 'x'.repeat(1025);
  // 342 characters of 3 bytes: 1026 bytes
  const wide = '€'.repeat(342);
  test('are refused naming the field, in UTF-8 bytes', () => {
    const cases: [string, (r: KVAwareRouter, id: string) => unknown][] = [
      ['workflowId', (r, id) => r.route({ tokens: SYS, workflowId: id })],
      ['agentRole', (r, id) => r.route({ tokens: SYS, agentRole: id })],
      ['anchor', (r, id) => r.route({ tokens: SYS, anchor: id })],
      ['contentAnchors\\[0\\]\\.id', (r, id) => r.route({ tokens: SYS, contentAnchors: [{ id, tokens: 4 }] })],
      ['cacheSalt', (r, id) => r.route({ tokens: SYS, cacheSalt: id })],
      ['lora', (r, id) => r.route({ tokens: SYS, lora: id })],
      ['workflowId', (r, id) => r.setWorkflowAffinity(id, 'w0')],
    ];
    for (const [field, call] of cases) {
      for (const id of [long, wide])
        refused((r) => call(r, id), RangeError, new RegExp(`^${field} must be at most 1024 bytes of UTF-8`));
      // at the bound it is taken
      const { router } = make();
      call(router, 'y'.repeat(1024));
      call(router, '€'.repeat(341));
    }
    const { router: source } = make({ maxIdBytes: 4096 });
    const shared = source.route({ tokens: SYS, workflowId: long }, { share: true }).shared!;
    refused((r) => r.applySharedDecision(shared), RangeError, /^workflowId must be at most 1024 bytes/);
  });

  test("the seed API's anchors too (its methods answer with a rejected promise)", async () => {
    const { router } = make();
    await assert.rejects(router.selectWorker(long), /^RangeError: anchorHash must be at most 1024 bytes/);
    await assert.rejects(router.selectWorker(wide), /^RangeError: anchorHash must be at most 1024 bytes/);
    await assert.rejects(router.broadcastNewBlocks(long, ['b'], 'w0'), /^RangeError: anchorHash must be at most/);
    assert.equal(router.getStats().anchorsTracked, 0);
    assert.equal((await router.selectWorker('y'.repeat(1024))).anchorHash.length, 1024);
  });

  test('the bound is an option, checked as the others', () => {
    const { router } = make({ maxIdBytes: 1 << 20 });
    router.route({ tokens: SYS, workflowId: 'w'.repeat(1 << 20) });
    assert.equal(router.maxIdBytes, 1 << 20);
    assert.throws(() => new KVAwareRouter({ maxIdBytes: 0 }), /^RangeError: maxIdBytes/);
    assert.throws(() => new KVAwareRouter({ maxIdBytes: 1.5 }), /maxIdBytes/);
    assert.equal(new KVAwareRouter().maxIdBytes, 1024);
  });

  test('memory stays bounded: 300 workflows of 4 MB ids are refused, none is kept', () => {
    const { router } = make();
    const huge = 'w'.repeat(4_000_000);
    for (let i = 0; i < 300; i++)
      assert.throws(() => router.route({ tokens: [1, 2, 3], workflowId: `${i}${huge}`, workflowStep: 0 }), RangeError);
    assert.equal(router.getStats().workflowsTracked, 0);
  });
});

describe('numbers and values of the wrong kind', () => {
  test("a worker's CLA groups are non-negative integers up to 2^53 - 1, null not among them", () => {
    for (const g of [null, 1e308, 2 ** 53 + 2, -1, 0.5])
      refused(
        (r) => r.registerWorker('w9', { claGroups: [g as number] }),
        g === null ? TypeError : RangeError,
        /^info\.claGroups\[0\] must be a non-negative integer/,
      );
    refused((r) => r.route({ tokens: SYS, claGroup: 2 ** 53 }), RangeError, /^claGroup must be/);
    refused((r) => r.route({ tokens: SYS, workflowStep: 1e308 }), RangeError, /^workflowStep must be/);
  });

  test('a prompt field route() does not read is still of its type', () => {
    refused(
      (r) => r.route({ tokens: SYS, text: Symbol('x') as never }),
      TypeError,
      /^text must be a string, got symbol$/,
    );
    for (const v of [NaN, Infinity, -1, 'abc'])
      refused((r) => r.route({ tokens: SYS, messages: v as never }), TypeError, /^messages must be an array$/);
    refused((r) => r.route({ tokens: SYS, blockHashes: 7 as never }), TypeError, /^blockHashes must be an array/);
    refused((r) => r.route({ tokens: SYS, blockTokens: NaN }), RangeError, /^blockTokens must be/);
    refused((r) => r.route({ tokens: SYS, blockTokens: 0 }), RangeError, /^blockTokens must be at least 1/);
    for (const v of [NaN, Infinity, -1, 0.5])
      refused(
        (r) => r.route({ tokens: SYS, promptTokens: v }),
        RangeError,
        /^promptTokens must be a non-negative integer/,
      );
    refused((r) => r.route({ text: 'hello', promptTokens: -5 }), RangeError, /^promptTokens must be/);
  });

  test("a content anchor's tokens are an integer up to 2^53 - 1", () => {
    for (const tokens of [1e308, 2 ** 53, 0.5, -1, NaN])
      refused(
        (r) => r.route({ tokens: SYS, contentAnchors: [{ id: 'a', tokens }] }),
        RangeError,
        /^contentAnchors\[0\]\.tokens must be a non-negative integer \(at most 2\^53 - 1\)/,
      );
    refused(
      (r) => r.route({ tokens: SYS, contentAnchors: [{ id: 'a', tokens: null as never }] }),
      TypeError,
      /^contentAnchors\[0\]\.tokens must be a non-negative integer, got null$/,
    );
    const { router } = make();
    router.route({ tokens: SYS, contentAnchors: [{ id: 'a', tokens: Number.MAX_SAFE_INTEGER }] });
    // an anchor whose tokens are left out counts none: it does not make the score NaN (no worker)
    router.route({ tokens: SYS, contentAnchors: [{ id: 'b' } as never] });
    const again = router.route({ tokens: [9, 9, 9, 9], contentAnchors: [{ id: 'b' } as never] }, { dryRun: true });
    assert.notEqual(again.workerId, '');
    assert.equal(again.cachedTokens, 0);
  });

  test("applyCleared()'s keep is 'offload' or left out", () => {
    refused((r) => r.applyCleared('w1', NaN as never), TypeError, /^keep must be 'offload' or left out, got number$/);
    refused((r) => r.applyCleared('w1', 'gpu' as never), RangeError, /^keep must be 'offload' or left out, got 'gpu'$/);
    const { router } = make();
    router.applyCleared('w1');
    router.applyCleared('w1', 'offload');
  });

  test("a shared decision's id, when given, is a non-empty string; one without changes nothing", () => {
    refused((r) => r.refuseSharedDecision({ id: NaN as never }), TypeError, /^decision\.id must be a string/);
    refused((r) => r.settleSharedDecision({ id: 5 as never }), TypeError, /^decision\.id must be a string/);
    refused((r) => r.settleSharedDecision({ id: '' }), RangeError, /^decision\.id must be a non-empty string/);
    refused((r) => r.settleSharedDecision(Symbol() as never), TypeError, /^decision must be an object/);
    const { router } = make();
    router.settleSharedDecision({});
    assert.equal(router.refuseSharedDecision({}), 0);
  });

  test('a remote count of requests is whole; token amounts may be fractions', () => {
    refused(
      (r) => r.setRemoteLoad('w1', { inFlightRequests: 0.5, queuedPrefillTokens: 0, activeDecodeTokens: 0 }),
      RangeError,
      /^load\.inFlightRequests must be a whole number of requests, got 0\.5$/,
    );
    const { router } = make();
    router.setRemoteLoad('w1', { inFlightRequests: 1, queuedPrefillTokens: 0.5, activeDecodeTokens: 0.5 });
  });

  test("a worker's KV capacity is a whole number of tokens", () => {
    refused(
      (r) => r.updateWorkerMetrics('w1', { kvCapacityTokens: 0.5 }),
      RangeError,
      /^kvCapacityTokens must be a non-negative integer/,
    );
    refused((r) => r.updateWorkerMetrics('w1', { kvCapacityTokens: 1e308 }), RangeError, /^kvCapacityTokens/);
  });
});

describe('an empty prompt', () => {
  test('routes on load and metadata alone, as selectWorker() routes an anchor of no length', () => {
    const { router } = make();
    const r = router.routeOrThrow({});
    assert.equal(r.promptTokens, 0);
    assert.equal(r.blocks, 0);
    assert.ok(r.ticket > 0);
    assert.equal(router.getStats().inFlightRequests, 1);
    router.release(r.ticket);
    assert.equal(router.getStats().inFlightRequests, 0);
    assert.equal(router.getStats().index.entries, 0);
  });
});
