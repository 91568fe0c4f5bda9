import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { KVAwareRouter } from '../../src/index.js';
import { BS, fleet, prompt, tiers } from '../helpers/prompts.js';

// markRefused(): a request its engine refused (nothing computed) withdraws the blocks its
// decision alone added to the index on its worker, and nothing else.

const times = <T>(n: number, v: T): T[] => Array.from({ length: n }, () => v);
/** Everything but `id`: to send a request to one worker. */
const only = (r: KVAwareRouter, id: string) => new Set(r.listWorkers().flatMap((w) => (w.id === id ? [] : [w.id])));

describe('markRefused()', () => {
  test('withdraws the blocks the refused request added; a prefix a served request predicted stays', () => {
    const r = fleet(2);
    const served = r.route({ tokens: prompt(1, 4) });
    r.markPrefillDone(served.ticket);
    r.release(served.ticket);
    const entries = r.index.entryCount;
    // the same four blocks and six more, refused by the engine (say, longer than its context)
    const long = prompt(1, 4, prompt(2, 6));
    const refused = r.route({ tokens: long });
    assert.equal(refused.workerId, served.workerId);
    assert.equal(r.index.entryCount, entries + 6);
    assert.equal(r.markRefused(refused.ticket), 6);
    r.release(refused.ticket);
    assert.deepEqual(tiers(r, refused.workerId, long), [...times(4, 'predicted'), ...times(6, null)]);
    assert.equal(r.index.entryCount, entries);
    assert.equal(r.route({ tokens: long }, { dryRun: true }).cachedTokens, 4 * BS);
    assert.equal(r.route({ tokens: prompt(1, 4) }, { dryRun: true }).cachedTokens, 4 * BS);
    assert.equal(r.markRefused(refused.ticket), 0, 'once');
  });

  test('blocks a later request on the same worker predicts too stay, whichever is refused', () => {
    const r = fleet(2);
    const first = r.route({ tokens: prompt(3, 8) }, { exclude: only(r, 'w0') });
    // shares the first five blocks of the first, on the same worker, then goes its own way
    const second = r.route({ tokens: prompt(3, 5, prompt(4, 2)) }, { exclude: only(r, 'w0') });
    // the same prompt on the other worker claims nothing on w0
    r.route({ tokens: prompt(3, 8) }, { exclude: only(r, 'w1') });
    assert.equal(r.markRefused(first.ticket), 3, 'the three blocks the second does not have');
    assert.deepEqual(tiers(r, 'w0', prompt(3, 8)), [...times(5, 'predicted'), ...times(3, null)]);
    assert.equal(r.markRefused(second.ticket), 2, 'its own two');
    assert.deepEqual(tiers(r, 'w0', prompt(3, 5, prompt(4, 2))), [...times(5, 'predicted'), ...times(2, null)]);
    assert.deepEqual(tiers(r, 'w1', prompt(3, 8)), times(8, 'predicted'));
  });

  test("another replica's decision for the same blocks keeps them", () => {
    const r = fleet(1);
    const tokens = prompt(5, 6);
    const d = r.route({ tokens });
    const keys = r.hashTokens(tokens);
    r.applySharedDecision({
      workerId: 'w0',
      hi: keys.hi.slice(0, 6),
      lo: keys.lo.slice(0, 6),
      workflowStep: null,
      claGroup: null,
    });
    assert.equal(r.markRefused(d.ticket), 0);
    assert.deepEqual(tiers(r, 'w0', tokens), times(6, 'predicted'));
  });

  test('past its first token or its release, a request withdraws nothing', () => {
    const r = fleet(1);
    const a = r.route({ tokens: prompt(6, 3) });
    r.markPrefillDone(a.ticket);
    assert.equal(r.markRefused(a.ticket), 0);
    const b = r.route({ tokens: prompt(7, 3) });
    r.release(b.ticket);
    assert.equal(r.markRefused(b.ticket), 0);
    const c = r.route({ tokens: prompt(8, 3) }, { track: false });
    assert.equal(c.ticket, 0);
    assert.equal(r.markRefused(c.ticket), 0);
    assert.deepEqual(tiers(r, 'w0', prompt(6, 3)), times(3, 'predicted'));
    assert.deepEqual(tiers(r, 'w0', prompt(7, 3)), times(3, 'predicted'));
  });

  test('precise mode: what the engine reported stays, the speculative stretch goes', () => {
    const r = fleet(1, { indexMode: 'precise', speculativeBlocks: 4, policy: 'least-loaded' });
    r.applyStored('w0', r.hashTokens(prompt(9, 3)));
    const d = r.route({ tokens: prompt(9, 10) });
    assert.deepEqual(tiers(r, 'w0', prompt(9, 10)), [...times(3, 'gpu'), ...times(4, 'predicted'), ...times(3, null)]);
    assert.equal(r.markRefused(d.ticket), 4);
    assert.deepEqual(tiers(r, 'w0', prompt(9, 10)), [...times(3, 'gpu'), ...times(7, null)]);
  });

  test('a worker removed meanwhile: nothing is withdrawn from the worker that took its slot', () => {
    const r = fleet(1);
    const d = r.route({ tokens: prompt(10, 4) });
    r.removeWorker('w0');
    r.registerWorker('w9');
    r.route({ tokens: prompt(10, 4) });
    assert.equal(r.markRefused(d.ticket), 0);
    assert.deepEqual(tiers(r, 'w9', prompt(10, 4)), times(4, 'predicted'));
  });
});

// refuseSharedDecision(): another replica's decision applied here, refused by its engine,
// withdraws what it alone added here, as markRefused() does on the replica that made it.

describe('refuseSharedDecision()', () => {
  /** Replica `a` routes to w0 with `share`; replica `b` applies the decision. */
  const sharedOn = (a: KVAwareRouter, b: KVAwareRouter, tokens: number[]) => {
    const d = a.route({ tokens }, { share: true, exclude: only(a, 'w0') });
    assert.ok(d.shared?.id, 'a tracked shared decision has an id');
    assert.ok(b.applySharedDecision(d.shared));
    return d;
  };

  test('withdraws the blocks the refused decision added on the replica that applied it; a prefix it held stays', () => {
    const a = fleet(2, { instanceId: 'a' });
    const b = fleet(2, { instanceId: 'b' });
    const served = b.route({ tokens: prompt(11, 3) }, { exclude: only(b, 'w0') });
    b.release(served.ticket);
    const long = prompt(11, 3, prompt(12, 5));
    const d = sharedOn(a, b, long);
    assert.deepEqual(tiers(b, 'w0', long), times(8, 'predicted'));
    assert.equal(a.markRefused(d.ticket), 8);
    assert.equal(b.refuseSharedDecision(d.shared!), 5);
    assert.deepEqual(tiers(b, 'w0', long), [...times(3, 'predicted'), ...times(5, null)]);
    assert.equal(b.refuseSharedDecision(d.shared!), 0, 'once');
    assert.equal(b.refuseSharedDecision({ id: 'unknown.1' }), 0);
  });

  test('a decision made here since on the same worker keeps the blocks it predicts too', () => {
    const a = fleet(2, { instanceId: 'a' });
    const b = fleet(2, { instanceId: 'b' });
    const d = sharedOn(a, b, prompt(13, 8));
    // shares the first five blocks, on the same worker, then goes its own way
    const local = b.route({ tokens: prompt(13, 5, prompt(14, 2)) }, { exclude: only(b, 'w0') });
    assert.equal(local.workerId, 'w0');
    assert.equal(b.refuseSharedDecision(d.shared!), 3, 'the three blocks the local decision does not have');
    assert.deepEqual(tiers(b, 'w0', prompt(13, 8)), [...times(5, 'predicted'), ...times(3, null)]);
    // and the other way round: the local decision refused leaves the applied one's blocks
    sharedOn(a, b, prompt(15, 6));
    const refused = b.route({ tokens: prompt(15, 6, prompt(16, 2)) }, { exclude: only(b, 'w0') });
    assert.equal(b.markRefused(refused.ticket), 2);
    assert.deepEqual(tiers(b, 'w0', prompt(15, 6, prompt(16, 2))), [...times(6, 'predicted'), ...times(2, null)]);
  });

  test('past its prefill or its end, the decision applied here withdraws nothing', () => {
    const a = fleet(2, { instanceId: 'a' });
    const b = fleet(2, { instanceId: 'b' });
    const prefilled = sharedOn(a, b, prompt(17, 4));
    b.settleSharedDecision(prefilled.shared!);
    assert.equal(b.refuseSharedDecision(prefilled.shared!), 0);
    assert.deepEqual(tiers(b, 'w0', prompt(17, 4)), times(4, 'predicted'));
    // a decision without an id (from a replica of an earlier version) is not kept
    const old = a.route({ tokens: prompt(18, 4) }, { share: true, exclude: only(a, 'w0') });
    const { id: _, ...withoutId } = old.shared!;
    b.applySharedDecision(withoutId);
    assert.equal(b.refuseSharedDecision(old.shared!), 0);
    assert.deepEqual(tiers(b, 'w0', prompt(18, 4)), times(4, 'predicted'));
  });

  test('kept for the prediction lifetime at most', () => {
    let now = 1000;
    const a = fleet(2, { instanceId: 'a', clock: () => now });
    const b = fleet(2, { instanceId: 'b', clock: () => now, predictionTtlMs: 1000 });
    const d = sharedOn(a, b, prompt(19, 4));
    now += 1000;
    sharedOn(a, b, prompt(20, 4)); // applying lets the first go
    assert.equal(b.refuseSharedDecision(d.shared!), 0);
    assert.equal(b.refuseSharedDecision({ id: 'a.2' }), 4);
  });
});
