import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { WithdrawablePredictions } from '../../src/core/router/withdrawable.js';
import type { WorkerState } from '../../src/core/worker-registry.js';

// The arena behind markRefused() (test/core/refused-requests.test.ts pins its rules through
// the router with prompts of a few blocks): here decisions of up to a few hundred blocks,
// whose blocks span chunks and whose chunks, records and table entries are reused.

const worker = (slot: number) => ({ slot }) as WorkerState;

/** The rules as the simplest structure keeps them: per ticket, its worker and its own blocks' keys and positions. */
class Model {
  private readonly pending = new Map<number, { slot: number; keys: [number, number, number][]; from: number }>();

  get size(): number {
    return this.pending.size;
  }

  open(ticket: number, slot: number, hi: Uint32Array, lo: Uint32Array, at: Int32Array, count: number): void {
    if (count <= 0) return;
    const keys = Array.from(at.subarray(0, count), (p): [number, number, number] => [hi[p], lo[p], p]);
    this.pending.set(ticket, { slot, keys, from: 0 });
  }

  claim(slot: number, hi: Uint32Array, lo: Uint32Array, n: number): void {
    for (const [ticket, a] of this.pending) {
      if (a.slot !== slot) continue;
      while (a.from < a.keys.length) {
        const [h, l, p] = a.keys[a.from];
        if (p >= n || hi[p] !== h || lo[p] !== l) break;
        a.from++;
      }
      if (a.from === a.keys.length) this.pending.delete(ticket);
    }
  }

  take(ticket: number): { slot: number; from: number; keys: number[][] } | undefined {
    const a = this.pending.get(ticket);
    if (!a) return undefined;
    this.pending.delete(ticket);
    return { slot: a.slot, from: a.from, keys: a.keys.slice(a.from).map(([h, l]) => [h, l]) };
  }

  drop(ticket: number): void {
    this.pending.delete(ticket);
  }

  dropWorker(slot: number): void {
    for (const [ticket, a] of this.pending) if (a.slot === slot) this.pending.delete(ticket);
  }
}

describe('WithdrawablePredictions', () => {
  test('keeps, claims, takes and drops as the rules say, across chunks and reused slots', () => {
    let seed = 12345;
    const rand = (n: number) => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % n) | 0;
    const arena = new WithdrawablePredictions();
    const model = new Model();
    /** The workers by slot; one removed is followed by another in its slot. */
    const workers = [0, 1, 2].map(worker);
    const open: number[] = [];
    let ticket = 0;
    let taken = 0;
    let partlyClaimed = 0;
    let pastTwoChunks = 0;
    let mostPending = 0;
    /** A request's keys: family `f`'s blocks up to `fork`, then one of 50 tails (prefix-chained, as engines key them). */
    const request = (f: number, fork: number, own: number, n: number) => {
      const hi = new Uint32Array(n);
      const lo = new Uint32Array(n);
      for (let i = 0; i < n; i++) {
        hi[i] = i < fork ? f : 1000 + (f * 301 + fork) * 50 + own;
        lo[i] = i;
      }
      return { hi, lo };
    };
    for (let step = 0; step < 20_000; step++) {
      const op = rand(100);
      const slot = rand(3);
      const n = 1 + rand(300);
      const { hi, lo } = request(rand(4), rand(n + 1), rand(50), n);
      if (op < 45) {
        // a tracked decision: the first `n − start` blocks past `start`, some skipped, are its own
        const at = new Int32Array(n);
        let count = 0;
        for (let p = rand(n); p < n; p++) if (rand(8) > 0) at[count++] = p;
        arena.claim(workers[slot], hi, lo, n);
        model.claim(slot, hi, lo, n);
        ticket++;
        arena.open(ticket, workers[slot], hi, lo, at, count);
        model.open(ticket, slot, hi, lo, at, count);
        open.push(ticket);
      } else if (op < 65) {
        const claimed = rand(n + 1);
        arena.claim(workers[slot], hi, lo, claimed);
        model.claim(slot, hi, lo, claimed);
      } else if (op < 80 && open.length > 0) {
        const t = open.splice(rand(open.length), 1)[0];
        const got = arena.take(t);
        const want = model.take(t);
        if (want === undefined) assert.equal(got, undefined, `ticket ${t}`);
        else {
          taken++;
          if (want.from > 0) partlyClaimed++;
          if (want.from + want.keys.length > 64) pastTwoChunks++;
          assert.ok(got, `ticket ${t}`);
          assert.equal(got.slot, want.slot);
          const keys = Array.from({ length: got.end - got.start }, (_, k) => [
            got.hi[got.start + k],
            got.lo[got.start + k],
          ]);
          assert.deepEqual(keys, want.keys, `ticket ${t}`);
          assert.equal(arena.take(t), undefined, 'once');
        }
      } else if (op < 98 && open.length > 0) {
        const t = open.splice(rand(open.length), 1)[0];
        arena.drop(t);
        model.drop(t);
      } else {
        arena.dropWorker(workers[slot]);
        model.dropWorker(slot);
        workers[slot] = worker(slot);
      }
      assert.equal(arena.size, model.size, `step ${step}`);
      mostPending = Math.max(mostPending, arena.size);
    }
    // what the run went through: refusals with blocks to withdraw, some of them claimed in
    // part, blocks past a 32-block chunk, and more decisions pending at once than the
    // arena starts with room for
    assert.ok(taken > 200 && partlyClaimed > 50 && pastTwoChunks > 50, `${taken}, ${partlyClaimed}, ${pastTwoChunks}`);
    assert.ok(mostPending > 64, `${mostPending} pending at most`);
  });

  test('keeps no more blocks than its bound: a decision past it is not kept', () => {
    const arena = new WithdrawablePredictions(64);
    const keys = new Uint32Array(100).map((_, i) => i + 1);
    const at = new Int32Array(100).map((_, i) => i);
    arena.open(1, worker(0), keys, keys, at, 40);
    arena.open(2, worker(0), keys, keys, at, 20);
    assert.equal(arena.take(2), undefined, 'no room left for it');
    assert.equal(arena.take(1)?.end, 40);
    arena.open(3, worker(0), keys, keys, at, 64);
    assert.equal(arena.take(3)?.end, 64, 'room again');
    arena.open(4, worker(0), keys, keys, at, 65);
    assert.equal(arena.size, 0, 'more than the bound, even alone');
  });
});
