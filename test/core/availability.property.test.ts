import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { KVAwareRouter } from '../../src/index.js';

// Random operation sequences over a small id space, so that removals, drains,
// re-registrations and broadcasts to unknown workers collide often.
const workerId = fc.constantFrom('w0', 'w1', 'w2', 'w3', 'w4');
const anchor = fc.constantFrom('a0', 'a1', 'a2', 'a3');
const operation = fc.oneof(
  fc.record({ op: fc.constant('register' as const), worker: workerId }),
  fc.record({ op: fc.constant('remove' as const), worker: workerId }),
  fc.record({ op: fc.constant('drain' as const), worker: workerId }),
  fc.record({ op: fc.constant('resume' as const), worker: workerId }),
  fc.record({
    op: fc.constant('update' as const),
    worker: workerId,
    load: fc.double({ min: 0, max: 1.5, noNaN: true }),
    cla: fc.option(fc.nat(3)),
  }),
  fc.record({ op: fc.constant('broadcast' as const), worker: workerId, anchor }),
  fc.record({
    op: fc.constant('select' as const),
    anchor,
    cla: fc.option(fc.nat(3)),
    workflowId: fc.option(fc.constantFrom('wf0', 'wf1')),
    step: fc.option(fc.nat(5)),
  }),
);

for (const policy of ['seed', 'cost']) {
  test(`${policy}: never returns an unregistered, removed or draining worker while another is available`, async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(operation, { maxLength: 60 }), async (ops) => {
        const router = new KVAwareRouter({ policy });
        const registered = new Set<string>();
        const draining = new Set<string>();
        for (const o of ops) {
          switch (o.op) {
            case 'register':
              router.registerWorker(o.worker);
              registered.add(o.worker);
              break;
            case 'remove':
              router.removeWorker(o.worker);
              registered.delete(o.worker);
              draining.delete(o.worker);
              break;
            case 'drain':
            case 'resume':
              if (!registered.has(o.worker)) {
                assert.throws(() => router.drainWorker(o.worker), RangeError);
                break;
              }
              if (o.op === 'drain') {
                router.drainWorker(o.worker);
                draining.add(o.worker);
              } else {
                router.resumeWorker(o.worker);
                draining.delete(o.worker);
              }
              break;
            case 'update':
              await router.updateWorkerState(o.worker, o.load, { claGroup: o.cla });
              registered.add(o.worker);
              break;
            case 'broadcast':
              await router.broadcastNewBlocks(o.anchor, ['b'], o.worker);
              break;
            case 'select': {
              const d = await router.selectWorker(o.anchor, {
                claGroup: o.cla,
                workflowId: o.workflowId ?? undefined,
                workflowStep: o.step,
              });
              const available = [...registered].filter((w) => !draining.has(w));
              if (available.length === 0) {
                assert.equal(d.targetWorkerId, '');
              } else {
                assert.ok(available.includes(d.targetWorkerId), `${d.targetWorkerId} not in ${available}`);
              }
              assert.ok(d.confidence >= 0 && d.confidence <= 1);
              assert.equal(d.preRope, true);
              break;
            }
          }
        }
      }),
      { numRuns: 300 },
    );
  });
}
