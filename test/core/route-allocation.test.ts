import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { GCProfiler, getHeapStatistics } from 'node:v8';
import { CostPolicy } from '../../src/core/policies/cost.js';
import type { Candidate, RouteFeatures } from '../../src/core/policies/types.js';
import { WorkerState } from '../../src/core/worker-registry.js';
import { hashTokenBlocks, BlockHashes } from '../../src/core/hashing.js';

/**
 * What the route path allocates, counted in bytes of JS heap (garbage included): the used
 * heap's growth over the calls plus what every collection during them freed. Counts, not
 * times: the same code allocates the same whatever the machine's speed.
 */
function bytesPerCall(calls: number, fn: (i: number) => void): number {
  const profiler = new GCProfiler();
  profiler.start();
  const before = getHeapStatistics().used_heap_size;
  for (let i = 0; i < calls; i++) fn(i);
  const after = getHeapStatistics().used_heap_size;
  let freed = 0;
  for (const gc of profiler.stop().statistics)
    freed += gc.beforeGC.heapStatistics.usedHeapSize - gc.afterGC.heapStatistics.usedHeapSize;
  return (after - before + freed) / calls;
}

/**
 * The fewest bytes per call over `rounds` rounds: the first rounds run while the JIT is still
 * optimising the code (unoptimised code boxes every fractional number it computes), the
 * steady state is what a busy router runs.
 */
function steadyBytesPerCall(rounds: number, calls: number, fn: (i: number) => void): number {
  let least = Infinity;
  for (let r = 0; r < rounds; r++) least = Math.min(least, bytesPerCall(calls, fn));
  return least;
}

const WORKERS = 32;
const BLOCK = 16;
const PROMPT = 8192;

describe('route path allocation', () => {
  test("the cost policy's choose() allocates nothing per candidate", () => {
    // 32 workers holding different prefixes of the prompt, with queues, decode and KV usage:
    // every candidate's terms are worked out (a follow-up) or bounded first (a new session)
    const tokens = Uint32Array.from({ length: PROMPT }, (_, i) => (i * 2654435761) >>> 0);
    const blocks = hashTokenBlocks(tokens, BLOCK, undefined, new BlockHashes(PROMPT / BLOCK));
    const candidates: Candidate[] = Array.from({ length: WORKERS }, (_, i) => {
      const w = new WorkerState(`w${i}`, {}, i);
      w.queuedPrefillTokens = (i * 7919) % 20_000;
      w.activeDecodeTokens = (i * 104_729) % 300_000;
      w.inFlightRequests = i % 5;
      w.load = (i % 10) / 10.5;
      const cached = ((i * 37) % 64) * 64;
      return {
        worker: w,
        holdsAnchor: false,
        overlapBlocks: cached / BLOCK,
        offloadBlocks: 0,
        predictedBlocks: 0,
        anchorTokens: 0,
        cachedTokens: cached,
        cachedFraction: cached / PROMPT,
        servesCla: false,
        continuity: false,
        indexEntries: 1000 + i * 333,
      };
    });
    const followUp: RouteFeatures = {
      claGroup: null,
      promptTokens: PROMPT,
      requestBlocks: blocks.length,
      blockSize: BLOCK,
      routingKey: blocks.lo[3],
      blocks,
      sharedPrefixKey: blocks.lo[40],
      now: 1000.5,
    };
    const newSession = candidates.map((c) => ({ ...c, overlapBlocks: 0, cachedTokens: 0, cachedFraction: 0 }));
    const p = new CostPolicy();
    // learn a mean work and hit rate, so that saturation and reuse are not zero
    for (let i = 0; i < 64; i++) {
      const choice = p.choose(candidates, followUp);
      p.onRouted(candidates[choice.index].worker, followUp, i + 1, 1000 + i);
    }
    for (const [what, cs] of [
      ['a follow-up', candidates],
      ['a new session', newSession],
    ] as const) {
      const bytes = steadyBytesPerCall(6, 2000, () => p.choose(cs, followUp));
      // the choice it returns at most; a number boxed per candidate would be 16 bytes each
      assert.ok(bytes < 4 * WORKERS, `${what}: ${bytes.toFixed(1)} bytes per choose() over ${WORKERS} candidates`);
    }
  });
});
