import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { KVAwareRouter, PromptTooLongError } from '../../src/index.js';

const r = new KVAwareRouter();
r.registerWorker('w0');

describe('bad input is rejected with an error naming the argument', () => {
  const cases: Array<[string, () => unknown, ErrorConstructor, RegExp]> = [
    ['registerWorker: empty id', () => r.registerWorker(''), RangeError, /workerId/],
    ['registerWorker: non-string id', () => r.registerWorker(42 as never), TypeError, /workerId/],
    [
      'registerWorker: bad claGroups',
      () => r.registerWorker('x', { claGroups: [1.5] }),
      RangeError,
      /info.claGroups\[0\]/,
    ],
    ['registerWorker: info not an object', () => r.registerWorker('x', 'info' as never), TypeError, /info/],
    ['removeWorker: empty id', () => r.removeWorker(''), RangeError, /workerId/],
    ['getWorkerForAnchor: empty anchor', () => r.getWorkerForAnchor(''), RangeError, /anchorHash/],
    ['constructor: unknown policy', () => new KVAwareRouter({ policy: 'nope' }), RangeError, /policy must be one of/],
    ['constructor: anchorCapacity 0', () => new KVAwareRouter({ anchorCapacity: 0 }), RangeError, /anchorCapacity/],
    ['constructor: numWorkers -1', () => new KVAwareRouter({ numWorkers: -1 }), RangeError, /numWorkers/],
    [
      'constructor: flag not boolean',
      () => new KVAwareRouter({ enableClaAffinity: 'yes' as never }),
      TypeError,
      /enableClaAffinity/,
    ],
  ];
  for (const [name, fn, type, message] of cases) {
    test(name, () => assert.throws(fn, (e: unknown) => e instanceof type && message.test((e as Error).message)));
  }

  const asyncCases: Array<[string, () => Promise<unknown>, ErrorConstructor, RegExp]> = [
    ['updateWorkerState: NaN load', () => r.updateWorkerState('w0', NaN), RangeError, /load must not be NaN/],
    ['updateWorkerState: negative load', () => r.updateWorkerState('w0', -0.1), RangeError, /load must be >= 0/],
    ['updateWorkerState: load not a number', () => r.updateWorkerState('w0', '0.5' as never), TypeError, /load/],
    ['updateWorkerState: empty worker id', () => r.updateWorkerState('', 0.5), RangeError, /workerId/],
    [
      'updateWorkerState: non-integer CLA group',
      () => r.updateWorkerState('w0', 0.5, { claGroup: 1.5 }),
      RangeError,
      /claGroup/,
    ],
    [
      'updateWorkerState: negative step',
      () => r.updateWorkerState('w0', 0.5, { workflowStep: -1 }),
      RangeError,
      /workflowStep/,
    ],
    ['selectWorker: empty anchor', () => r.selectWorker(''), RangeError, /anchorHash/],
    ['selectWorker: anchor not a string', () => r.selectWorker(undefined as never), TypeError, /anchorHash/],
    ['selectWorker: non-integer CLA group', () => r.selectWorker('a', { claGroup: 0.5 }), RangeError, /claGroup/],
    ['selectWorker: string CLA group', () => r.selectWorker('a', { claGroup: '1' as never }), TypeError, /claGroup/],
    ['selectWorker: NaN tokenLength', () => r.selectWorker('a', { tokenLength: NaN }), RangeError, /tokenLength/],
    ['selectWorker: empty workflowId', () => r.selectWorker('a', { workflowId: '' }), RangeError, /workflowId/],
    [
      'broadcastNewBlocks: blockIds not an array',
      () => r.broadcastNewBlocks('a', 'b1' as never, 'w0'),
      TypeError,
      /blockIds/,
    ],
    [
      'broadcastNewBlocks: non-string block id',
      () => r.broadcastNewBlocks('a', ['b', 3 as never], 'w0'),
      TypeError,
      /blockIds\[1\]/,
    ],
    ['broadcastNewBlocks: empty target', () => r.broadcastNewBlocks('a', [], ''), RangeError, /targetWorkerId/],
  ];
  for (const [name, fn, type, message] of asyncCases) {
    test(name, () => assert.rejects(fn, (e: unknown) => e instanceof type && message.test((e as Error).message)));
  }

  test('rejected calls change nothing', async () => {
    const before = JSON.stringify(r.getStats());
    await assert.rejects(r.updateWorkerState('w0', NaN));
    await assert.rejects(r.broadcastNewBlocks('a', ['b', 3 as never], 'w0'));
    await assert.rejects(r.selectWorker('a', { claGroup: -2 }));
    assert.equal(JSON.stringify(r.getStats()), before);
  });
});

test('a prompt over maxPromptTokens throws PromptTooLongError and leaves nothing behind', () => {
  const router = new KVAwareRouter({ blockSize: 16, maxPromptTokens: 1024 });
  router.registerWorker('w0');
  for (const request of [
    { tokens: Array.from({ length: 1025 }, (_, i) => i) },
    { text: 'z'.repeat(4 * 1100) },
    { messages: [{ role: 'user', content: 'z'.repeat(4 * 1100) }] },
  ]) {
    assert.throws(
      () => router.route(request),
      (err: unknown) => err instanceof PromptTooLongError && err instanceof RangeError && err.maxPromptTokens === 1024,
    );
  }
  assert.equal(router.index.entryCount, 0);
  assert.equal(router.localLoad('w0').inFlightRequests, 0);
  assert.deepEqual(router.getStats().decisionsByReason, {});
  // at the limit it routes; a length alone (the seed API's tokenLength) records no blocks and is not refused
  assert.equal(router.route({ tokens: Array.from({ length: 1024 }, (_, i) => i) }).workerId, 'w0');
  assert.equal(router.route({ promptTokens: 5000 }).workerId, 'w0');
  assert.throws(() => new KVAwareRouter({ maxPromptTokens: 0 }), /maxPromptTokens/);
});
