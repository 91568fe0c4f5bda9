/**
 * What the route path allocates, counted in bytes of JS heap, and the cost policy's choose()
 * measured in a process of its own (test/core/route-allocation.test.ts). Run directly, this file
 * prints that measurement as JSON.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { GCProfiler, getHeapStatistics } from 'node:v8';
import { BlockHashes, hashTokenBlocks } from '../../src/core/hashing.js';
import { CostPolicy } from '../../src/core/policies/cost.js';
import type { Candidate, RouteFeatures } from '../../src/core/policies/types.js';
import { WorkerState } from '../../src/core/worker-registry.js';

/**
 * What the route path allocates, counted in bytes of JS heap (garbage included): the used
 * heap's growth over the calls plus what every collection during them freed. Counts, not
 * times: the same code allocates the same whatever the machine's speed.
 */
export function bytesPerCall(calls: number, fn: (i: number) => void): number {
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
 * How long the rounds below go on for a bound not met yet. The first rounds run while the JIT
 * is still optimising the code (unoptimised code boxes every fractional number it computes), and
 * V8 optimises on a background thread, which on a busy machine may get no core for seconds: a
 * fixed number of rounds can all run before it does. The steady state is what a busy router
 * runs; code that allocates in its steady state stays over the bound in every round, so a
 * failing bound takes this long to fail, and a passing one stops at the first round it holds.
 */
const STEADY_DEADLINE_MS = 20_000;

/** Runs `round` until `done()` or the deadline. */
export function roundsUntil(round: () => void, done: () => boolean): void {
  const deadline = Date.now() + STEADY_DEADLINE_MS;
  while (!done() && Date.now() < deadline) round();
}

/** The fewest bytes per call over rounds of `calls`, stopping at the first round under `enough` (or the deadline). */
export function steadyBytesPerCall(calls: number, fn: (i: number) => void, enough = 0): number {
  let least = Infinity;
  roundsUntil(
    () => (least = Math.min(least, bytesPerCall(calls, fn))),
    () => least < enough,
  );
  return least;
}

/** The fleet and prompt the route path is measured with, here and in the test. */
export const WORKERS = 32;
export const BLOCK = 16;
export const PROMPT = 8192;

/** One measurement of choose(): bytes per call for a follow-up and for a new session, and the bound. */
export interface ChooseAllocation {
  what: string;
  bytes: number;
  bound: number;
}

/** choose() over 32 candidates, for a follow-up and a new session, in this process. */
export function measureChooseAllocation(): ChooseAllocation[] {
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
  const out: ChooseAllocation[] = [];
  for (const [what, cs] of [
    ['a follow-up', candidates],
    ['a new session', newSession],
  ] as const) {
    // the choice it returns (64 bytes) and little else; a number boxed per candidate would
    // be 16 bytes each, 512 over the 32
    out.push({ what, bytes: steadyBytesPerCall(2000, () => p.choose(cs, followUp), 8 * WORKERS), bound: 8 * WORKERS });
  }
  return out;
}

const self = fileURLToPath(import.meta.url);

/** measureChooseAllocation() in a new process. */
export async function chooseAllocationInProcess(): Promise<ChooseAllocation[]> {
  const child = spawn(process.execPath, ['--import', 'tsx', self], { stdio: ['ignore', 'pipe', 'inherit'] });
  let text = '';
  child.stdout.on('data', (d: Buffer) => (text += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  if (code !== 0) throw new Error(`the measuring process exited ${code}: ${text}`);
  return JSON.parse(text) as ChooseAllocation[];
}

if (process.argv[1] === self) process.stdout.write(JSON.stringify(measureChooseAllocation()));
