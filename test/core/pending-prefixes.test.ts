import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { keptPosition, nextKept, PendingPrefixes } from '../../src/core/policies/pending-prefixes.js';
import type { Candidate, RequestBlocks } from '../../src/core/policies/types.js';
import type { WorkerState } from '../../src/core/worker-registry.js';

/** A chained prompt: block i's key is (seed, i), so prompts with the same seed share every prefix. */
function prompt(n: number, seed: number, from = 0, fork = 0): RequestBlocks {
  const hi = new Uint32Array(n);
  const lo = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    hi[i] = i < from ? fork : seed;
    lo[i] = i + 1;
  }
  return { hi, lo, length: n };
}

const candidates = (slots: number[]): Candidate[] =>
  slots.map((slot) => ({ worker: { slot } as WorkerState }) as unknown as Candidate);

describe('pending prefixes', () => {
  test('kept positions: every block of the first 64, then 32 per doubling', () => {
    const kept: number[] = [];
    for (let i = 0; i < 1 << 20; i++) if (keptPosition(i)) kept.push(i);
    // nextKept() walks exactly the kept positions
    let k = 0;
    for (let i = 0; i < 1 << 20; i = nextKept(i)) assert.equal(i, kept[k++]);
    assert.equal(k, kept.length);
    assert.deepEqual(
      kept.slice(0, 64),
      Array.from({ length: 64 }, (_, i) => i),
    );
    assert.deepEqual(kept.slice(64, 67), [65, 67, 69]);
    assert.equal(kept.filter((i) => i >= 4095 && i < 8191).length, 32);
    // a prefix of any length is understated by under 1/32 of it
    for (let n = 1, j = 0; n <= 1 << 20; n++) {
      while (j + 1 < kept.length && kept[j + 1] < n) j++;
      assert.ok(n - (kept[j] + 1) < Math.max(1, n / 32), `prefix of ${n} blocks found as ${kept[j] + 1}`);
    }
  });

  test('a follow-up finds the deepest kept block of the prefix it shares, until release', () => {
    const p = new PendingPrefixes();
    const cs = candidates([0, 1]);
    p.record(1, 7, prompt(300, 5));
    p.lookup(cs, prompt(400, 5), 0);
    assert.equal(p.blocksOn(cs[1]), 296); // every 8th block of 256–512 is kept
    assert.equal(p.blocksOn(cs[0]), 0);
    assert.equal(p.deepest, 296);
    // a prompt that leaves the shared prefix after block 100 finds it that deep (a kept block)
    p.lookup(cs, prompt(400, 6, 100, 5), 0);
    assert.equal(p.blocksOn(cs[1]), 100);
    p.lookup(cs, prompt(400, 6, 99, 5), 0);
    assert.equal(p.blocksOn(cs[1]), 98); // every 2nd block of 64–128 is kept
    p.lookup(cs, prompt(400, 5, 0), 0);
    assert.equal(p.blocksOn(cs[1]), 296);
    p.lookup(cs, prompt(400, 6), 0);
    assert.equal(p.blocksOn(cs[1]), 0);
    p.release(7);
    p.lookup(cs, prompt(400, 5), 0);
    assert.equal(p.blocksOn(cs[1]), 0);
  });

  test('the holder on a worker is the request that recorded the deepest pending block there', () => {
    const p = new PendingPrefixes();
    const cs = candidates([0, 1]);
    // a shared 100-block prefix pending on worker 0 (ticket 3), a longer prompt sharing it on worker 1 (ticket 4)
    p.record(0, 3, prompt(100, 5));
    p.record(1, 4, prompt(300, 5));
    p.lookup(cs, prompt(400, 5), 0);
    assert.equal(p.holderOn(cs[1]), 4);
    assert.equal(p.blocksOn(cs[1]), 296);
    // the blocks ticket 4 recorded over ticket 3's are ticket 4's: worker 0 holds none of them now
    assert.equal(p.holderOn(cs[0]), 0);
    assert.equal(p.blocksOn(cs[0]), 0);
    // a prompt of the short prefix alone finds ticket 4 there too
    p.lookup(cs, prompt(100, 5), 0);
    assert.equal(p.holderOn(cs[1]), 4);
    p.release(4);
    p.lookup(cs, prompt(400, 5), 0);
    assert.equal(p.holderOn(cs[1]), 0);
    assert.equal(p.holderOn(candidates([9])[0]), 0, 'a slot never looked up has none');
  });

  test('within the indexed prefix every kept block is read; past it a run of misses ends the lookup', () => {
    const p = new PendingPrefixes();
    const cs = candidates([0, 1, 2]);
    // worker 2 has a 200-block prompt pending
    p.record(2, 3, prompt(200, 9));
    // worker 1's prompt, its first 40 blocks, was routed later and has finished: its entries
    // replaced worker 2's in those 40 slots and are no longer live
    p.record(1, 4, prompt(40, 9));
    p.release(4);
    p.lookup(cs, prompt(200, 9), 0);
    // the first 40 kept positions miss (worker 1's dead entries overwrote worker 2's), and
    // with nothing indexed the lookup stops after MISSES_BEFORE_STOP of them
    assert.equal(p.blocksOn(cs[2]), 0);
    // the index holds 40 blocks of this prompt somewhere: those are read whole, and worker 2's
    // pending blocks past them are found
    p.lookup(cs, prompt(200, 9), 40);
    assert.equal(p.blocksOn(cs[2]), 200); // block 200 is kept (every 4th of 128–256)
  });
});
