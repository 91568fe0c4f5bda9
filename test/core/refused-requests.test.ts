import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { KVAwareRouter, KVAwareRouterOptions } from '../../src/index.js';
import { BS, fleet as fleetAnyTime, prompt, tiers } from '../helpers/prompts.js';

/** Routers on a clock that stands still: predictions never age during a test. */
const fleet = (n: number, opts: KVAwareRouterOptions = {}) => fleetAnyTime(n, { clock: () => 1000, ...opts });

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
