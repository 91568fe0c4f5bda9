import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createRng } from '../../src/core/rng.js';
import { createPolicy } from '../../src/core/policies/index.js';
import type { Candidate, RouteFeatures } from '../../src/core/policies/types.js';
import { SGLANG_CHARS_PER_TOKEN, type SglangPolicy } from '../../src/core/policies/sglang.js';
import { WorkerState } from '../../src/core/worker-registry.js';

const BLOCK = 16;
const CHARS_PER_BLOCK = BLOCK * SGLANG_CHARS_PER_TOKEN;

function candidate(slot: number): Candidate {
  return {
    worker: new WorkerState(`w${slot}`, {}, slot),
    holdsAnchor: false,
    overlapBlocks: 0,
    offloadBlocks: 0,
    predictedBlocks: 0,
    anchorTokens: 0,
    cachedTokens: 0,
    cachedFraction: 0,
    servesCla: false,
    continuity: false,
    indexEntries: 0,
  };
}

/** A request over the given block hashes (high half 0), as the router passes them. */
const request = (ids: number[], blockSize = BLOCK): RouteFeatures => ({
  claGroup: null,
  promptTokens: ids.length * blockSize,
  requestBlocks: ids.length,
  blockSize,
  routingKey: 0,
  blocks: { hi: new Uint32Array(ids.length), lo: Uint32Array.from(ids), length: ids.length },
});
const range = (first: number, n: number) => Array.from({ length: n }, (_, i) => first + i);

function sglang(maxTreeBlocks: number): SglangPolicy {
  return createPolicy(
    'sglang',
    { sglang: { maxTreeSize: maxTreeBlocks * CHARS_PER_BLOCK, evictionIntervalSecs: 120 } },
    { random: createRng(1) },
  ) as SglangPolicy;
}

/** Leading blocks of `ids` the worker's tree holds. */
const matched = (p: SglangPolicy, c: Candidate, ids: number[]) =>
  Math.round(Number(p.scoreTerms(c, request(ids)).matchRate) * ids.length);

describe('sglang approximate tree: bounded size and LRU eviction', () => {
  test('distinct long prompts within one eviction interval never take a tree past the hard cap', () => {
    const p = sglang(256);
    const c = candidate(0);
    assert.equal(p.hardMaxTreeSize, 2 * p.maxTreeSize);
    let largest = 0;
    // 1,000 prompts of 200 blocks each (781× max_tree_size in all), all inside the first 120 s
    for (let i = 0; i < 1000; i++) {
      p.onRouted(c.worker, request(range(1 + i * 1000, 200)), 0, i);
      largest = Math.max(largest, p.treeSize(0));
      assert.ok(p.treeSize(0) <= p.hardMaxTreeSize, `request ${i}: ${p.treeSize(0)} > ${p.hardMaxTreeSize}`);
    }
    assert.ok(largest > p.maxTreeSize, 'the tree may grow past max_tree_size between passes');
    // the latest prompt is whole: eviction at insert time takes the least recently used first
    assert.equal(matched(p, c, range(1 + 999 * 1000, 200)), 200);
    assert.equal(matched(p, c, range(1, 200)), 0);
  });

  test('a prompt larger than the cap keeps its leading blocks, as many as the cap holds', () => {
    const p = sglang(8);
    const c = candidate(0);
    p.onRouted(c.worker, request(range(1, 40)), 0, 0);
    assert.equal(p.treeSize(0), p.hardMaxTreeSize);
    assert.equal(matched(p, c, range(1, 40)), 16);
  });

  test('the cap at insert time evicts least recently used prompts first; recently matched ones survive', () => {
    const p = sglang(8); // cap 16 blocks
    const c = candidate(0);
    const [a, b, cc, d, e] = [100, 200, 300, 400, 500].map((first) => range(first, 4));
    for (const [t, ids] of [a, b, cc, d].entries()) p.onRouted(c.worker, request(ids), 0, t);
    assert.equal(p.treeSize(0), 16 * CHARS_PER_BLOCK, 'at the cap, not past it: nothing evicted');
    p.onRouted(c.worker, request(a), 0, 4); // a matched again: nothing new, nothing evicted
    assert.equal(p.treeSize(0), 16 * CHARS_PER_BLOCK);
    p.onRouted(c.worker, request(e), 0, 5); // 4 new blocks: the 4 least recently used make room
    assert.equal(p.treeSize(0), 16 * CHARS_PER_BLOCK);
    assert.deepEqual(
      [a, b, cc, d, e].map((ids) => matched(p, c, ids)),
      [4, 0, 4, 4, 4],
    );
    // c's first half and 6 new blocks: c (the oldest), then d, make room; c's half comes back
    p.onRouted(c.worker, request([...range(300, 2), ...range(600, 6)]), 0, 6);
    assert.equal(p.treeSize(0), 16 * CHARS_PER_BLOCK);
    assert.deepEqual(
      [a, b, cc, d, e].map((ids) => matched(p, c, ids)),
      [4, 0, 2, 0, 4],
    );
  });

  test('the interval pass evicts leaves first: a shared prefix touched recently stays, its old branch goes', () => {
    const p = sglang(6);
    const c = candidate(0);
    const old = [1, 2, 3, 4, 5, 6];
    const recent = [1, 2, 3, 40, 50, 60]; // shares old's first three blocks
    p.onRouted(c.worker, request(old), 0, 0);
    p.onRouted(c.worker, request(recent), 0, 1);
    assert.equal(p.treeSize(0), 9 * CHARS_PER_BLOCK);
    // the first decision after 120 s runs the pass before inserting its own block
    p.onRouted(c.worker, request([999]), 0, 120_000);
    assert.equal(p.treeSize(0), 7 * CHARS_PER_BLOCK);
    assert.equal(matched(p, c, recent), 6);
    assert.equal(matched(p, c, old), 3, 'old keeps the prefix it shares, loses its own tail');
    // every later pass keeps trimming in the same order, the newest block last
    p.onRouted(c.worker, request(recent), 0, 120_001);
    p.onRouted(c.worker, request([7, 8, 9, 10, 11, 12]), 0, 240_000);
    assert.equal(p.treeSize(0), 12 * CHARS_PER_BLOCK, '999 went, [7..12] came: at the cap, not past it');
    assert.equal(matched(p, c, recent), 6);
    assert.equal(matched(p, c, [999]), 0);
  });

  test('eviction keeps a tree prefix-closed: no block stays without the blocks before it', () => {
    const p = sglang(32);
    const c = candidate(0);
    const rng = createRng(7);
    const prompts: number[][] = [];
    for (let i = 0; i < 400; i++) {
      const parent = prompts.length > 0 && rng() < 0.7 ? prompts[Math.floor(rng() * prompts.length)] : [];
      const keep = Math.floor(rng() * (parent.length + 1));
      const ids = [...parent.slice(0, keep), ...range(10_000 + i * 100, 1 + Math.floor(rng() * 20))];
      prompts.push(ids);
      p.onRouted(c.worker, request(ids), 0, i * 1000);
      assert.ok(p.treeSize(0) <= p.hardMaxTreeSize);
    }
    for (const ids of prompts) {
      const m = matched(p, c, ids);
      // each block alone: present up to the match, absent past it
      ids.forEach((id, k) => assert.equal(matched(p, c, [id]), k < m ? 1 : 0, `${ids} at ${k}`));
    }
  });

  test('requests of different block sizes: the size counts what the tree holds and stays within the cap', () => {
    // token ids hashed 64 to a block, text 16 (--tokenize engine falling back), callers' own sizes
    const p = createPolicy(
      'sglang',
      { sglang: { maxTreeSize: 4000, evictionIntervalSecs: 1 } },
      { random: createRng(1) },
    ) as SglangPolicy;
    const c = candidate(0);
    const rng = createRng(3);
    const sizes = [16, 32, 64, 1024];
    const prompts: Array<{ ids: number[]; chars: number }> = [];
    for (let i = 0; i < 600; i++) {
      const blockSize = sizes[Math.floor(rng() * sizes.length)];
      const ids = range(1 + i * 100, 1 + Math.floor(rng() * 30));
      prompts.push({ ids, chars: blockSize * SGLANG_CHARS_PER_TOKEN });
      p.onRouted(c.worker, request(ids, blockSize), 0, i * 250);
      // distinct prompts, the tree prefix-closed: each holds its leading `matched` blocks
      const held = prompts.reduce((sum, q) => sum + matched(p, c, q.ids) * q.chars, 0);
      assert.equal(p.treeSize(0), held, `request ${i}`);
      assert.ok(p.treeSize(0) <= p.hardMaxTreeSize, `request ${i}: ${p.treeSize(0)} > ${p.hardMaxTreeSize}`);
    }
  });

  test('a block keeps the size it was inserted with when a request of another block size matches it', () => {
    const p = sglang(64);
    const c = candidate(0);
    p.onRouted(c.worker, request([1, 2, 3], 64), 0, 0);
    assert.equal(p.treeSize(0), 3 * 64 * SGLANG_CHARS_PER_TOKEN);
    p.onRouted(c.worker, request([1, 2, 3, 4], 16), 0, 1); // one new block of 16 tokens
    assert.equal(p.treeSize(0), (3 * 64 + 16) * SGLANG_CHARS_PER_TOKEN);
    // the interval pass, run by a request of 1,024-token blocks, gives back what each block took
    const trim = createPolicy(
      'sglang',
      { sglang: { maxTreeSize: 64 * SGLANG_CHARS_PER_TOKEN, evictionIntervalSecs: 1 } },
      { random: createRng(1) },
    ) as SglangPolicy;
    for (let t = 0; t < 4; t++) trim.onRouted(c.worker, request(range(10 * (t + 1), 2), 16), 0, t);
    assert.equal(trim.treeSize(0), 8 * 16 * SGLANG_CHARS_PER_TOKEN);
    trim.onRouted(c.worker, request([], 1024), 0, 1000);
    assert.equal(trim.treeSize(0), 4 * 16 * SGLANG_CHARS_PER_TOKEN, 'the two oldest prompts went, the size with them');
    assert.deepEqual(
      [10, 20, 30, 40].map((first) => matched(trim, c, range(first, 2))),
      [0, 0, 2, 2],
    );
  });
});
