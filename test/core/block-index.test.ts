import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import fc from 'fast-check';
import { BlockIndex, OverlapResult, Tier } from '../../src/core/block-index.js';

/** Keys of a request: (hi, lo) pairs; tests build them from small ints. */
function keys(ids: number[]): { hi: Uint32Array; lo: Uint32Array; n: number } {
  const hi = new Uint32Array(ids.length);
  const lo = new Uint32Array(ids.length);
  ids.forEach((id, i) => {
    hi[i] = Math.imul(id + 1, 0x9e3779b1) >>> 0;
    lo[i] = Math.imul(id + 7, 0x85ebca6b) >>> 0;
  });
  return { hi, lo, n: ids.length };
}

function stored(index: BlockIndex, slot: number, ids: number[], tier = Tier.Gpu) {
  const k = keys(ids);
  index.applyStored(slot, k.hi, k.lo, 0, k.n, tier);
}
function removed(index: BlockIndex, slot: number, ids: number[], tier?: Tier) {
  const k = keys(ids);
  index.applyRemoved(slot, k.hi, k.lo, 0, k.n, tier);
}
function predicted(index: BlockIndex, slot: number, ids: number[], now: number) {
  const k = keys(ids);
  index.recordPredicted(slot, k.hi, k.lo, 0, k.n, now);
}
function holderOf(index: BlockIndex, slot: number, id: number) {
  const k = keys([id]);
  return index.holder(slot, k.hi[0], k.lo[0]);
}
/** Counts the nodes clears drop a worker from (a private step of applyCleared). */
function countClearVisits(index: BlockIndex): { count: number } {
  const visits = { count: 0 };
  const inner = index as unknown as { dropWorkerFromNode(node: number, slot: number): void };
  const drop = inner.dropWorkerFromNode;
  inner.dropWorkerFromNode = function (node, slot) {
    visits.count++;
    drop.call(this, node, slot);
  };
  return visits;
}
function overlap(index: BlockIndex, ids: number[], now?: number): OverlapResult {
  const k = keys(ids);
  // 160 slots: slots the index has never seen read as 0
  return index.overlaps(k.hi, k.lo, k.n, new OverlapResult(160), now);
}

describe('BlockIndex', () => {
  test('overlap is the longest held prefix per worker', () => {
    const index = new BlockIndex();
    stored(index, 0, [1, 2, 3, 4]);
    stored(index, 1, [1, 2]);
    stored(index, 2, [2, 3, 4]); // holds blocks but not the first: no prefix
    const o = overlap(index, [1, 2, 3, 4, 5]);
    assert.equal(o.blocks[0], 4);
    assert.equal(o.blocks[1], 2);
    assert.equal(o.blocks[2], 0);
    assert.equal(o.maxBlocks, 4);
    assert.equal(index.entryCount, 9);
    assert.equal(index.blockCount, 4);
  });

  test('offloaded blocks are counted apart from GPU blocks; GPU wins when both', () => {
    const index = new BlockIndex();
    stored(index, 0, [1, 2]);
    stored(index, 0, [3], Tier.Offload);
    stored(index, 0, [2], Tier.Offload);
    const o = overlap(index, [1, 2, 3]);
    assert.equal(o.blocks[0], 3);
    assert.equal(o.offloadBlocks[0], 1);
    assert.equal(o.gpuBlocks(0), 2);
    assert.equal(index.entryCount, 3); // one entry per (block, worker), whatever the tiers
  });

  test('removal of a middle block cuts the prefix there', () => {
    const index = new BlockIndex();
    stored(index, 3, [1, 2, 3, 4]);
    removed(index, 3, [3]);
    assert.equal(overlap(index, [1, 2, 3, 4]).blocks[3], 2);
    assert.equal(index.entriesFor(3), 3);
    removed(index, 3, [99]); // unknown: ignored
    assert.equal(index.entriesFor(3), 3);
  });

  test('a tier-specific removal keeps the other tier', () => {
    const index = new BlockIndex();
    stored(index, 0, [1]);
    stored(index, 0, [1], Tier.Offload);
    removed(index, 0, [1], Tier.Gpu); // moved to CPU
    const o = overlap(index, [1]);
    assert.equal(o.blocks[0], 1);
    assert.equal(o.offloadBlocks[0], 1);
  });

  test('AllBlocksCleared drops one worker only, and frees blocks nobody holds', () => {
    const index = new BlockIndex();
    stored(index, 0, [1, 2, 3]);
    stored(index, 1, [1, 2]);
    index.applyCleared(0);
    const o = overlap(index, [1, 2, 3]);
    assert.equal(o.blocks[0], 0);
    assert.equal(o.blocks[1], 2);
    assert.equal(index.entryCount, 2);
    assert.equal(index.blockCount, 2);
    stored(index, 0, [1, 2, 3]); // rebuilt from new events
    assert.equal(overlap(index, [1, 2, 3]).blocks[0], 3);
  });

  test('a clear that keeps the offload tier drops GPU and predicted entries, and the offload ones stay listed', () => {
    const index = new BlockIndex({ predictedTtlMs: 1000 });
    stored(index, 0, [1, 2, 3]);
    stored(index, 0, [2, 4], Tier.Offload);
    predicted(index, 0, [5], 0);
    stored(index, 1, [1]);
    index.applyCleared(0, true);
    assert.equal(index.entriesFor(0), 2);
    assert.equal(index.entriesFor(1), 1);
    assert.equal(index.entryCount, 3);
    assert.equal(index.blockCount, 3); // 1 (worker 1), 2 and 4 (offload); 3 and 5 freed
    const o = overlap(index, [1, 2]);
    assert.equal(o.blocks[0], 0); // block 1 is gone: the prefix breaks there
    for (const id of [2, 4]) {
      const held = overlap(index, [id]);
      assert.equal(held.blocks[0], 1, `block ${id}`);
      assert.equal(held.offloadBlocks[0], 1, `block ${id}`);
    }
    assert.equal(overlap(index, [3]).blocks[0], 0);
    assert.equal(overlap(index, [5], 0).blocks[0], 0); // the prediction went too
    // what stayed goes with a full clear, through the worker's reverse list
    index.applyCleared(0);
    assert.equal(index.entriesFor(0), 0);
    assert.equal(index.entryCount, 1);
    assert.equal(index.blockCount, 1);
  });

  test("AllBlocksCleared with predictions present drops that worker's stored and predicted entries only", () => {
    const index = new BlockIndex({ predictedTtlMs: 1000 });
    stored(index, 0, [1, 2, 3]);
    stored(index, 0, [3], Tier.Offload);
    predicted(index, 0, [1, 2, 3, 4, 5], 0); // 4, 5 only predicted
    predicted(index, 0, [6, 7], 600); // a later generation
    predicted(index, 1, [1, 2, 3, 4, 5], 600);
    stored(index, 1, [8]);
    stored(index, 2, [1, 2]);
    predicted(index, 2, [4], 0);
    const before = { one: index.entriesFor(1), two: index.entriesFor(2) };
    index.applyCleared(0);
    const check = () => {
      assert.equal(index.entriesFor(0), 0);
      assert.equal(index.entriesFor(1), before.one);
      assert.equal(index.entriesFor(2), before.two);
      assert.equal(index.entryCount, before.one + before.two);
      const o = overlap(index, [1, 2, 3, 4, 5, 6, 7], 600);
      assert.equal(o.blocks[0], 0);
      assert.equal(o.blocks[1], 5);
      assert.equal(o.predictedBlocks[1], 5);
      assert.equal(o.blocks[2], 2);
      for (const id of [6, 7]) assert.equal(holderOf(index, 0, id), null, `id ${id}`);
      assert.equal(holderOf(index, 1, 8), 'gpu');
      assert.equal(holderOf(index, 2, 4), 'predicted');
    };
    check();
    index.applyCleared(0); // a repeated clear changes nothing
    index.applyCleared(0);
    check();
    // recorded again after the clear, and cleared again
    predicted(index, 0, [1, 2], 700);
    assert.equal(overlap(index, [1, 2], 700).predictedBlocks[0], 2);
    index.applyCleared(0);
    check();
  });

  test('clearing a worker drops its predictions in the generation being swept, counted once', () => {
    const index = new BlockIndex({ predictedTtlMs: 1000 });
    predicted(index, 0, range(0, 3000), 0); // generation 0
    predicted(index, 1, range(0, 10), 0);
    predicted(index, 0, [5000], 1100); // generation 2
    overlap(index, [5000], 1600); // generation 3: generation 0 expires and starts being swept
    index.applyCleared(0); // before the sweep has reached most of it
    assert.equal(index.entriesFor(0), 0);
    index.flushExpiry();
    assert.equal(index.entriesFor(0), 0);
    assert.equal(index.entriesFor(1), 0, 'worker 1 expired');
    assert.equal(index.entryCount, 0);
    assert.equal(index.blockCount, 0);
    index.applyCleared(0);
    assert.equal(index.entryCount, 0);
  });

  test("a clear visits the worker's own blocks, not every worker's predictions", () => {
    // white-box on purpose: counts the nodes a clear drops the worker from
    const index = new BlockIndex({ predictedTtlMs: 1000 });
    const visits = countClearVisits(index);
    predicted(index, 0, range(0, 500), 0);
    stored(index, 1, range(1000, 1005));
    index.applyCleared(1); // holds 5 stored blocks and no prediction
    assert.equal(visits.count, 5);
    visits.count = 0;
    index.applyCleared(1); // empty now
    assert.equal(visits.count, 0);
    index.applyCleared(7); // never seen
    assert.equal(visits.count, 0);
    index.applyCleared(0);
    assert.equal(index.entriesFor(0), 0);
    visits.count = 0;
    index.applyCleared(0); // its predictions went with the first clear
    assert.equal(visits.count, 0);

    // predictions that left otherwise are not looked for either: withdrawn, removed, expired
    const k = keys(range(0, 100));
    predicted(index, 2, range(0, 100), 0);
    assert.equal(index.withdrawPredicted(2, k.hi, k.lo, 0, k.n), 100);
    predicted(index, 3, range(0, 100), 0);
    removed(index, 3, range(0, 100));
    predicted(index, 4, range(0, 100), 0);
    predicted(index, 5, range(200, 300), 1600); // generation 3: generation 0 expires
    index.flushExpiry();
    assert.equal(index.entriesFor(4), 0);
    visits.count = 0;
    for (const slot of [2, 3, 4]) index.applyCleared(slot);
    assert.equal(visits.count, 0);
  });

  test('a clear does not look for predictions the entry budget evicted', () => {
    const index = new BlockIndex({ maxEntries: 100 });
    const visits = countClearVisits(index);
    predicted(index, 0, range(0, 100), 0);
    stored(index, 1, range(1000, 1100)); // beyond the budget: the cold predicted blocks go
    assert.equal(index.entriesFor(0), 0);
    assert.equal(index.entriesFor(1), 100);
    index.applyCleared(0);
    assert.equal(visits.count, 0);
  });

  test('predicted entries live at least the TTL and less than 1.5 × TTL', () => {
    const index = new BlockIndex({ predictedTtlMs: 1000 });
    predicted(index, 0, [1, 2], 100);
    assert.equal(overlap(index, [1, 2], 100).predictedBlocks[0], 2);
    assert.equal(overlap(index, [1, 2], 1099).blocks[0], 2); // 999 ms later: alive
    assert.equal(overlap(index, [1, 2], 1600).blocks[0], 0); // gone by 1.5 × TTL
    index.flushExpiry(); // expired entries are swept a little per operation; finish now
    assert.equal(index.entryCount, 0);
    assert.equal(index.blockCount, 0);
    assert.equal(index.stats().expired, 2);
  });

  test('recording again refreshes a prediction', () => {
    const index = new BlockIndex({ predictedTtlMs: 1000 });
    predicted(index, 0, [1], 0);
    predicted(index, 0, [1], 900);
    assert.equal(overlap(index, [1], 1800).blocks[0], 1);
    assert.equal(overlap(index, [1], 2500).blocks[0], 0);
  });

  test('expiry is swept incrementally, and reads ignore what is not swept yet', () => {
    const index = new BlockIndex({ predictedTtlMs: 1000 });
    predicted(index, 0, range(0, 5000), 0);
    predicted(index, 1, [7], 1100); // generation 2
    overlap(index, [7], 1600); // generation 3: generation 0 expires and starts being swept
    assert.ok(index.entryCount > 1, 'not all swept at once');
    assert.equal(overlap(index, range(0, 10), 1600).blocks[0], 0, 'expired entries do not count');
    for (let t = 0; t < 400; t++) overlap(index, [7], 1600);
    assert.equal(index.entryCount, 1, 'later operations finish the sweep');
    assert.equal(overlap(index, [7], 1600).blocks[1], 1);
  });

  test('an expired prediction does not remove a stored block', () => {
    const index = new BlockIndex({ predictedTtlMs: 1000 });
    predicted(index, 0, [1], 0);
    stored(index, 0, [1]);
    assert.equal(overlap(index, [1], 5000).blocks[0], 1);
    assert.equal(index.entryCount, 1);
  });

  test('workers beyond 32 slots widen the masks without losing anything', () => {
    const index = new BlockIndex();
    stored(index, 3, [1, 2, 3]);
    stored(index, 40, [1, 2]);
    stored(index, 70, [1]);
    const o = overlap(index, [1, 2, 3]);
    assert.equal(o.blocks[3], 3);
    assert.equal(o.blocks[40], 2);
    assert.equal(o.blocks[70], 1);
    index.applyCleared(40);
    assert.equal(overlap(index, [1, 2, 3]).blocks[40], 0);
    assert.equal(index.entryCount, 4);
  });

  test('the entry budget evicts cold blocks first and counts evictions', () => {
    const index = new BlockIndex({ maxEntries: 100 });
    stored(index, 0, range(0, 100));
    overlap(index, range(0, 50)); // the first 50 are reused
    stored(index, 0, range(1000, 1030)); // 30 more than the budget
    assert.ok(index.entryCount <= 100);
    assert.equal(index.stats().evictions, 30);
    assert.equal(overlap(index, range(0, 50)).blocks[0], 50, 'recently used blocks survive');
  });

  test('the hash table survives heavy churn (backward-shift deletion)', () => {
    const index = new BlockIndex({ initialCapacity: 64 });
    for (let round = 0; round < 20; round++) {
      stored(index, round % 3, range(round * 1000, round * 1000 + 200));
      removed(index, round % 3, range(round * 1000, round * 1000 + 150));
    }
    assert.equal(index.entryCount, 20 * 50);
    // everything stored and not removed is still found
    for (let round = 0; round < 20; round++) {
      const tail = range(round * 1000 + 150, round * 1000 + 200);
      const k = keys(tail);
      for (let i = 0; i < k.n; i++) assert.notEqual(index.holder(round % 3, k.hi[i], k.lo[i]), null);
    }
  });

  test('random inserts and removals keep every key findable (table wrap-around, resizes)', () => {
    const index = new BlockIndex({ initialCapacity: 64 });
    const live = new Set<number>();
    let x = 12345;
    const next = () => (x = (Math.imul(x, 1103515245) + 12345) >>> 0);
    for (let step = 0; step < 20_000; step++) {
      const id = next() % 3000;
      if (next() % 3 === 0) {
        removed(index, 0, [id]);
        live.delete(id);
      } else {
        stored(index, 0, [id]);
        live.add(id);
      }
    }
    assert.equal(index.entryCount, live.size);
    for (let id = 0; id < 3000; id++) {
      const k = keys([id]);
      assert.equal(index.holder(0, k.hi[0], k.lo[0]) !== null, live.has(id), `id ${id}`);
    }
  });

  test('blocks created by predictions, stored by an engine or both stay findable (resizes, expiry)', () => {
    const index = new BlockIndex({ initialCapacity: 64, predictedTtlMs: 1000 });
    const held = new Map<number, 'gpu' | 'predicted'>();
    let x = 777;
    const next = () => (x = (Math.imul(x, 1103515245) + 12345) >>> 0);
    for (let step = 0; step < 20_000; step++) {
      const id = next() % 3000;
      const op = next() % 3;
      if (op === 0) {
        predicted(index, 0, [id], 0);
        if (held.get(id) !== 'gpu') held.set(id, 'predicted');
      } else if (op === 1) {
        stored(index, 0, [id]);
        held.set(id, 'gpu');
      } else {
        removed(index, 0, [id]);
        held.delete(id);
      }
    }
    assert.equal(index.entryCount, held.size);
    const holderOf = (id: number) => {
      const k = keys([id]);
      return index.holder(0, k.hi[0], k.lo[0]);
    };
    for (let id = 0; id < 3000; id++) assert.equal(holderOf(id), held.get(id) ?? null, `id ${id}`);
    // once the predictions expire, only what the engine stored is left, and still found
    index.advanceTime(5000);
    index.flushExpiry();
    for (let id = 0; id < 3000; id++)
      assert.equal(holderOf(id), held.get(id) === 'gpu' ? 'gpu' : null, `id ${id} after expiry`);
    assert.equal(index.blockCount, [...held.values()].filter((h) => h === 'gpu').length);
  });

  test('deleting from probe chains that wrap around the end of the table', () => {
    // table of 128 buckets (initialCapacity 64); pick keys whose home buckets sit at the end
    // and the start, so chains wrap, then delete every subset order that matters
    const home = (id: number) => {
      const k = keys([id]);
      // mirrors BlockIndex.bucketOf for a 128-bucket table (white-box on purpose)
      return Math.imul(k.lo[0] ^ Math.imul(k.hi[0], 0x85ebca6b), 0x9e3779b1) >>> 25;
    };
    const pick = (bucket: number, count: number) => {
      const out: number[] = [];
      for (let id = 0; out.length < count; id++) if (home(id) === bucket) out.push(id);
      return out;
    };
    const layouts = [
      [...pick(126, 1), ...pick(127, 1), ...pick(0, 2), ...pick(1, 1)], // entries at home across the end
      [...pick(126, 2), ...pick(127, 2), ...pick(0, 2), ...pick(1, 1)], // entries displaced across the end
    ];
    for (const ids of layouts)
      for (let victim = 0; victim < ids.length; victim++) {
        const index = new BlockIndex({ initialCapacity: 64 });
        for (const id of ids) stored(index, 0, [id]);
        removed(index, 0, [ids[victim]]);
        for (const id of ids) {
          const k = keys([id]);
          assert.equal(index.holder(0, k.hi[0], k.lo[0]) !== null, id !== ids[victim], `victim ${victim}, id ${id}`);
        }
      }
  });

  test("a walk narrowed to one worker keeps that worker's exact depth and tiers", () => {
    for (const slots of [8, 100]) {
      const index = new BlockIndex();
      const lone = slots - 3; // in the last mask word when wide
      for (let s = 0; s < slots; s++) stored(index, s, [1, 2]);
      stored(index, lone, range(3, 40));
      stored(index, lone, [20, 21], Tier.Offload);
      removed(index, lone, [20, 21], Tier.Gpu);
      predicted(index, lone, [40, 41], 0);
      const got = overlap(index, range(1, 60), 0);
      assert.equal(got.maxBlocks, 41);
      assert.equal(got.blocks[lone], 41);
      assert.equal(got.offloadBlocks[lone], 2);
      assert.equal(got.predictedBlocks[lone], 2);
      for (let s = 0; s < slots; s++) if (s !== lone) assert.equal(got.blocks[s], 2, `slot ${s}`);
    }
  });

  test('the walk ends where no worker holds the next block, even if later blocks are held', () => {
    for (const slots of [3, 70]) {
      const index = new BlockIndex();
      for (let s = 0; s < slots; s++) stored(index, s, s % 2 === 0 ? [1, 2, 3] : [1, 2]);
      for (let s = 0; s < slots; s++) stored(index, s, [5, 6]);
      const got = overlap(index, [1, 2, 3, 4, 5, 6]);
      assert.equal(got.maxBlocks, 3);
      for (let s = 0; s < slots; s++) assert.equal(got.blocks[s], s % 2 === 0 ? 3 : 2, `slot ${s}`);
      // a walk whose first block nobody holds matches nothing
      const none = overlap(index, [4, 5, 6]);
      assert.equal(none.maxBlocks, 0);
      for (let s = 0; s < slots; s++) assert.equal(none.blocks[s], 0);
    }
  });

  for (const slots of [24, 40, 130]) {
    test(`matches a brute-force reference on random prefix trees, ${slots} worker slots (property)`, () =>
      checkAgainstReference(slots));
  }
});

/**
 * Random operations on the index and on a brute-force model of it; every query's per-slot
 * depth and tiers must agree. Few slots use the one-word walk, more use the wide walk, and
 * deep paths held by one worker exercise the single-slot tail of both.
 */
function checkAgainstReference(slots: number): void {
  {
    const ttl = 1000;
    const gen = ttl / 2;
    const op = fc.oneof(
      fc.record({
        kind: fc.constant('stored' as const),
        slot: fc.nat(slots - 1),
        path: fc.nat(400),
        depth: fc.integer({ min: 1, max: 12 }),
        offload: fc.boolean(),
      }),
      fc.record({
        kind: fc.constant('removed' as const),
        slot: fc.nat(slots - 1),
        path: fc.nat(400),
        depth: fc.integer({ min: 1, max: 12 }),
      }),
      fc.record({ kind: fc.constant('cleared' as const), slot: fc.nat(slots - 1) }),
      fc.record({
        kind: fc.constant('withdrawn' as const),
        slot: fc.nat(slots - 1),
        path: fc.nat(400),
        depth: fc.integer({ min: 1, max: 12 }),
      }),
      fc.record({
        kind: fc.constant('predicted' as const),
        slot: fc.nat(slots - 1),
        path: fc.nat(400),
        depth: fc.integer({ min: 1, max: 12 }),
      }),
      fc.record({ kind: fc.constant('tick' as const), ms: fc.integer({ min: 0, max: 700 }) }),
      fc.record({ kind: fc.constant('query' as const), path: fc.nat(400), depth: fc.integer({ min: 1, max: 14 }) }),
    );
    // a path id picks a root-to-leaf walk in a tree of fan-out 3: prefixes are shared often
    const walk = (path: number, depth: number) => {
      const ids: number[] = [];
      let node = 0;
      for (let d = 0; d < depth; d++) {
        node = node * 3 + 1 + ((path >> (d % 9)) % 3);
        ids.push(node);
      }
      return ids;
    };
    fc.assert(
      fc.property(fc.array(op, { minLength: 10, maxLength: 150 }), (ops) => {
        const index = new BlockIndex({ predictedTtlMs: ttl });
        const visits = countClearVisits(index);
        const gpu = new Map<number, Set<number>>();
        const off = new Map<number, Set<number>>();
        const pred = new Map<number, Map<number, number>>(); // id -> slot -> generation
        let now = 0;
        const set = (m: Map<number, Set<number>>, id: number) => m.get(id) ?? m.set(id, new Set()).get(id)!;
        const predValid = (id: number, slot: number) => {
          const g = pred.get(id)?.get(slot);
          return g !== undefined && Math.floor(now / gen) - g <= 2;
        };
        for (const o of ops) {
          if (o.kind === 'stored') {
            const ids = walk(o.path, o.depth);
            stored(index, o.slot, ids, o.offload ? Tier.Offload : Tier.Gpu);
            for (const id of ids) set(o.offload ? off : gpu, id).add(o.slot);
          } else if (o.kind === 'removed') {
            const ids = walk(o.path, o.depth);
            removed(index, o.slot, ids);
            for (const id of ids) {
              gpu.get(id)?.delete(o.slot);
              off.get(id)?.delete(o.slot);
              pred.get(id)?.delete(o.slot);
            }
          } else if (o.kind === 'cleared') {
            index.applyCleared(o.slot);
            for (const m of [gpu, off]) for (const s of m.values()) s.delete(o.slot);
            for (const m of pred.values()) m.delete(o.slot);
          } else if (o.kind === 'withdrawn') {
            const k = keys(walk(o.path, o.depth));
            index.withdrawPredicted(o.slot, k.hi, k.lo, 0, k.n);
            for (const id of walk(o.path, o.depth)) pred.get(id)?.delete(o.slot);
          } else if (o.kind === 'predicted') {
            const ids = walk(o.path, o.depth);
            predicted(index, o.slot, ids, now);
            for (const id of ids) (pred.get(id) ?? pred.set(id, new Map()).get(id)!).set(o.slot, Math.floor(now / gen));
          } else if (o.kind === 'tick') {
            now += o.ms;
          } else {
            const ids = walk(o.path, o.depth);
            const got = overlap(index, ids, now);
            for (let slot = 0; slot < slots; slot++) {
              let depth = 0,
                offOnly = 0,
                predOnly = 0;
              for (const id of ids) {
                const g = gpu.get(id)?.has(slot) ?? false;
                const c = off.get(id)?.has(slot) ?? false;
                const p = predValid(id, slot);
                if (!g && !c && !p) break;
                depth++;
                if (!g && c) offOnly++;
                if (!g && !c && p) predOnly++;
              }
              assert.equal(got.blocks[slot], depth, `slot ${slot} blocks`);
              assert.equal(got.offloadBlocks[slot], offOnly, `slot ${slot} offload`);
              assert.equal(got.predictedBlocks[slot], predOnly, `slot ${slot} predicted`);
            }
          }
        }
        // entry counts agree with the reference once expiry has run
        index.advanceTime(now);
        index.flushExpiry();
        let expected = 0;
        const ids = new Set([...gpu.keys(), ...off.keys(), ...pred.keys()]);
        for (const id of ids) {
          for (let slot = 0; slot < slots; slot++) {
            if (gpu.get(id)?.has(slot) || off.get(id)?.has(slot) || predValid(id, slot)) expected++;
          }
        }
        assert.equal(index.entryCount, expected);
        // clearing every worker leaves nothing (no prediction missed), and clearing them
        // again walks nothing (no prediction counted that is not there)
        for (let slot = 0; slot < slots; slot++) index.applyCleared(slot);
        assert.equal(index.entryCount, 0);
        assert.equal(index.blockCount, 0);
        visits.count = 0;
        for (let slot = 0; slot < slots; slot++) index.applyCleared(slot);
        assert.equal(visits.count, 0);
      }),
      { numRuns: Number(process.env.PROPERTY_RUNS ?? 300) },
    );
  }
}

function range(a: number, b: number): number[] {
  return Array.from({ length: b - a }, (_, i) => a + i);
}

test('extendToDeepestHeld reads each worker word of the masks: workers past the 32nd slot, predictions not held', () => {
  const index = new BlockIndex();
  const ids = [1, 2, 3, 4];
  const hi = Uint32Array.from(ids, (id) => Math.imul(id + 1, 0x9e3779b1) >>> 0);
  const lo = Uint32Array.from(ids, (id) => Math.imul(id + 7, 0x85ebca6b) >>> 0);
  // slot 33 (the second word) stores block 3 only, slot 40 offloaded it; slot 0 only predicts it
  index.applyStored(33, hi, lo, 3, 4, Tier.Gpu);
  index.applyStored(40, hi, lo, 3, 4, Tier.Offload);
  index.recordPredicted(0, hi, lo, 3, 4, 0);
  const out = new OverlapResult(64);
  index.overlaps(hi, lo, ids.length, out, 0);
  index.extendToDeepestHeld(hi, lo, ids.length, out);
  assert.deepEqual(
    [out.blocks[33], out.offloadBlocks[33], out.blocks[40], out.offloadBlocks[40], out.blocks[0]],
    [4, 0, 4, 4, 0],
    'slots 33 and 40 hold blocks 0..3 (on GPU, offloaded); a prediction is not held',
  );
});
