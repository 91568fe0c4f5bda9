/**
 * The library API at its edges, as a caller outside the gateway reaches it: ids that are
 * Object.prototype's own names, lengths past any prompt, options of the wrong type or with a
 * misspelt key, arrays where objects belong, and the exported constants.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { AnchorTable } from '../../src/core/anchor-table.js';
import * as api from '../../src/index.js';
import {
  createPolicy,
  KVAwareRouter,
  NoEndpointsError,
  POLICY_NAMES,
  PromptTooLongError,
  type RoutingPolicy,
} from '../../src/index.js';

/** What a refused call must leave as it was. */
function snapshot(router: KVAwareRouter) {
  return JSON.stringify({
    workers: router.listWorkers().map((w) => ({
      id: w.id,
      load: w.load,
      inFlight: w.inFlightRequests,
      queued: w.queuedPrefillTokens,
      decode: w.activeDecodeTokens,
    })),
    stats: router.getStats(),
  });
}

function refuses(router: KVAwareRouter, call: () => unknown, error: typeof TypeError, message: RegExp): void {
  const before = snapshot(router);
  assert.throws(call, (err: unknown) => {
    assert.ok(err instanceof error, `${String(err)} is not a ${error.name}`);
    assert.match((err as Error).message, message);
    return true;
  });
  assert.equal(snapshot(router), before, `state changed by a refused call (${message.source})`);
}

function throwsNaming(call: () => unknown, error: typeof TypeError, message: RegExp): void {
  assert.throws(call, (err: unknown) => {
    assert.ok(err instanceof error, `${String(err)} is not a ${error.name}`);
    assert.match((err as Error).message, message);
    return true;
  });
}

describe('ids that are names of Object.prototype', () => {
  test('a worker named __proto__ is a key of getStats().workerLoads like any other', () => {
    const router = new KVAwareRouter({ policy: 'seed' });
    for (const id of ['a', '__proto__', 'constructor', 'toString']) router.registerWorker(id);
    void router.updateWorkerState('__proto__', 0.5);
    const loads = router.getStats().workerLoads;
    assert.deepEqual(Object.keys(loads), ['a', '__proto__', 'constructor', 'toString']);
    assert.ok(Object.hasOwn(loads, '__proto__'));
    assert.equal(Object.getOwnPropertyDescriptor(loads, '__proto__')?.value.load, 0.5);
    assert.equal(Object.getPrototypeOf(loads), Object.prototype);
    assert.deepEqual(Object.keys(JSON.parse(JSON.stringify(loads))), ['a', '__proto__', 'constructor', 'toString']);
  });

  test("a policy's reason named __proto__ is counted in decisionsByReason", () => {
    const policy: RoutingPolicy = {
      name: 'mine',
      choose: () => ({ index: 0, confidence: 1, reason: '__proto__' as never }),
    };
    const router = new KVAwareRouter({ policy });
    router.registerWorker('a');
    router.route({ tokens: [1, 2, 3] });
    router.route({ tokens: [1, 2, 3] });
    const byReason = router.getStats().decisionsByReason;
    assert.equal(Object.getOwnPropertyDescriptor(byReason, '__proto__')?.value, 2);
    assert.equal(Object.getPrototypeOf(byReason), Object.prototype);
  });
});

describe('a prompt length past maxPromptTokens', () => {
  test('is refused whether or not the request gives blocks, naming promptTokens', () => {
    const router = new KVAwareRouter({ policy: 'dynamo', maxPromptTokens: 1024 });
    router.registerWorker('w0');
    router.registerWorker('w1');
    for (const promptTokens of [1e308, 2 ** 60, 1025])
      for (const options of [{}, { servedBy: 'w0' }, { dryRun: true }])
        refuses(
          router,
          () => router.route({ promptTokens }, options),
          RangeError,
          new RegExp(
            `^promptTokens must be at most 1024 \\(maxPromptTokens\\), got ${String(promptTokens).replace('+', '\\+')}$`,
          ),
        );
    assert.throws(() => router.route({ promptTokens: 2 ** 60 }), PromptTooLongError);
    // with precomputed blocks, as before
    refuses(router, () => router.route({ blockHashes: [1, 2], promptTokens: 5000 }), RangeError, /promptTokens/);
    // at the bound it routes, and the counters stay numbers
    const r = router.route({ promptTokens: 1024 });
    assert.equal(router.localLoad(r.workerId).queuedPrefillTokens, 1024);
    router.release(r.ticket);
    assert.equal(router.localLoad(r.workerId).queuedPrefillTokens, 0);
  });

  test("the seed API's tokenLength too, naming tokenLength", async () => {
    const router = new KVAwareRouter({ policy: 'seed', maxPromptTokens: 1024 });
    router.registerWorker('w0');
    await assert.rejects(router.selectWorker('a', { tokenLength: 2 ** 60 }), {
      name: 'PromptTooLongError',
      message: /^tokenLength must be at most 1024 \(maxPromptTokens\), got 1152921504606847000$/,
    });
    assert.equal(router.getWorkerForAnchor('a'), undefined);
    assert.equal((await router.selectWorker('a', { tokenLength: 1024 })).targetWorkerId, 'w0');
  });
});

describe("broadcastNewBlocks' block ids", () => {
  test('are not kept when blocks are not counted (policy seed)', async () => {
    const table = new AnchorTable(10, 0);
    table.recordBlocks('a', ['b1', 'b2', 'b3'], 'w0');
    assert.equal(table.peek('a')?.workerId, 'w0');
    assert.equal(table.peek('a')?.blocks, null);
    assert.equal(table.blocksOn('w0'), 0);
    const router = new KVAwareRouter({ policy: 'seed' });
    router.registerWorker('w0');
    await router.broadcastNewBlocks('one-anchor', ['x', 'y'], 'w0');
    assert.equal(router.getWorkerForAnchor('one-anchor'), 'w0');
    assert.equal(router.getStats().workerLoads.w0.activeBlocks, 0);
  });

  test('are kept up to a bound over all anchors when counted; ids past it are counted no more', () => {
    const table = new AnchorTable(10, 5);
    table.recordBlocks('a', ['b1', 'b2', 'b3'], 'w0');
    table.recordBlocks('b', ['c1', 'c2', 'c3', 'c4'], 'w1');
    assert.equal(table.blocksOn('w0'), 3);
    assert.equal(table.blocksOn('w1'), 2);
    assert.equal(table.keptBlockIds, 5);
    table.recordBlocks('a', ['b1', 'b9'], 'w0'); // b1 is kept already; b9 is past the bound
    assert.equal(table.blocksOn('w0'), 3);
    // moving an anchor frees what it kept
    table.recordBlocks('b', ['d1'], 'w0');
    assert.equal(table.blocksOn('w1'), 0);
    assert.equal(table.blocksOn('w0'), 4);
    assert.equal(table.keptBlockIds, 4);
    table.dropWorker('w0');
    assert.equal(table.keptBlockIds, 0);
  });
});
