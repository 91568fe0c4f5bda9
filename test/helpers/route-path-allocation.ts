/**
 * What the route path allocates, counted in bytes of JS heap, and the two measurements of
 * test/core/route-allocation.test.ts made in a process of their own: the cost policy's choose()
 * and a whole decision (route() and release()). Run directly with `choose` or `route`, this file
 * prints that measurement as JSON.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { GCProfiler, getHeapStatistics } from 'node:v8';
import { BlockHashes, hashTokenBlocks } from '../../src/core/hashing.js';
import { createRng } from '../../src/core/rng.js';
import { KVAwareRouter } from '../../src/index.js';
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

/** One measurement: bytes per call, the bound they must stay under, and the rounds seen on the way. */
export interface AllocationMeasure {
  what: string;
  bytes: number;
  bound: number;
  rounds?: string;
}

/** choose() over 32 candidates, for a follow-up and a new session, in this process. */
export function measureChooseAllocation(): AllocationMeasure[] {
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
  const out: AllocationMeasure[] = [];
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

/**
 * route() and release() on a fleet and its prompts, and on one with twice the workers and twice
 * the blocks per prompt: bytes per decision over 32 workers, and how many more the doubled one
 * takes. Decisions of both alternate in rounds until both are in bounds (or the deadline: see
 * STEADY_DEADLINE_MS); code that allocates per candidate or per block stays over in every round.
 */
export function measureRouteAllocation(): AllocationMeasure[] {
  // each worker holds prefixes of some documents; requests share prefixes of random depth
  const rig = (workers: number, promptTokens: number) => {
    let now = 0;
    const router = new KVAwareRouter({ policy: 'cost', indexMode: 'precise', blockSize: BLOCK, clock: () => now });
    for (let w = 0; w < workers; w++) router.registerWorker(`w${w}`);
    const rng = createRng(3);
    const docs = Array.from({ length: 40 }, () =>
      Uint32Array.from({ length: promptTokens }, () => Math.floor(rng() * 150_000)),
    );
    for (let i = 0; i < 400; i++) {
      const doc = docs[Math.floor(rng() * docs.length)];
      const depth = (1 + Math.floor(rng() * (promptTokens / BLOCK))) * BLOCK;
      router.applyStored(`w${Math.floor(rng() * workers)}`, router.hashTokens(doc.subarray(0, depth)));
    }
    const requests = Array.from({ length: 64 }, () => {
      const tokens = Uint32Array.from({ length: promptTokens }, () => Math.floor(rng() * 150_000));
      tokens.set(docs[Math.floor(rng() * docs.length)].subarray(0, Math.floor(rng() * (promptTokens / BLOCK)) * BLOCK));
      return tokens;
    });
    const request = { tokens: requests[0] };
    return () =>
      bytesPerCall(2000, (i) => {
        now += 1;
        request.tokens = requests[i % requests.length];
        router.release(router.route(request).ticket);
      });
  };
  const base = rig(WORKERS, PROMPT);
  const doubled = rig(2 * WORKERS, 2 * PROMPT);
  // what a decision must allocate is its result and the views the prompt's keys are copied
  // through out of wasm memory, about 400 bytes here; a number boxed per candidate would be 512
  // bytes more over the 32 more workers, and anything per block thousands over the 512 more
  const baseBound = 512;
  const moreBound = 64;
  let baseLeast = Infinity;
  let doubledLeast = Infinity;
  const seen: string[] = [];
  roundsUntil(
    () => {
      const b = base();
      const d = doubled();
      // the first rounds and the last: what a failure shows
      if (seen.length === 60) seen.splice(10, 1);
      seen.push(`${b.toFixed(0)}/${d.toFixed(0)}`);
      baseLeast = Math.min(baseLeast, b);
      doubledLeast = Math.min(doubledLeast, d);
    },
    () => baseLeast < baseBound && doubledLeast - baseLeast < moreBound,
  );
  const rounds = `rounds (bytes per decision, ${WORKERS} workers/${2 * WORKERS}): ${seen.join(' ')}`;
  return [
    { what: `a decision over ${WORKERS} workers`, bytes: baseLeast, bound: baseBound, rounds },
    {
      what: `more per decision with twice the workers and blocks`,
      bytes: doubledLeast - baseLeast,
      bound: moreBound,
      rounds,
    },
  ];
}

const self = fileURLToPath(import.meta.url);

/** What a process of its own measured of `which`. */
export async function allocationInProcess(which: 'choose' | 'route'): Promise<AllocationMeasure[]> {
  const child = spawn(process.execPath, ['--import', 'tsx', self, which], { stdio: ['ignore', 'pipe', 'inherit'] });
  let text = '';
  child.stdout.on('data', (d: Buffer) => (text += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  if (code !== 0) throw new Error(`the measuring process exited ${code}: ${text}`);
  return JSON.parse(text) as AllocationMeasure[];
}

/**
 * `which` measured in up to `processes` processes of its own, stopping at the first within every
 * bound; what each measured when none is. V8 now and then settles into code for the route path
 * that boxes a number per candidate and keeps it for the process's life (seen in a few runs in
 * many: 592 bytes a choose() for a minute; route() over its bound in every round of a run). Code that allocates per candidate does
 * so in every process; one process within the bounds shows the code does not.
 */
export async function allocationWithinBounds(
  which: 'choose' | 'route',
  processes = 3,
): Promise<{ ok: true } | { ok: false; seen: string }> {
  const seen: string[] = [];
  for (let run = 0; run < processes; run++) {
    const out = await allocationInProcess(which);
    if (out.every((m) => m.bytes < m.bound)) return { ok: true };
    const rounds = out.find((m) => m.rounds !== undefined)?.rounds;
    seen.push(
      out.map((m) => `${m.what}: ${m.bytes.toFixed(1)} (bound ${m.bound})`).join(', ') + (rounds ? `; ${rounds}` : ''),
    );
  }
  return { ok: false, seen: `in each of ${processes} processes: ${seen.join(' | ')}` };
}

const which = process.argv[2];
if (process.argv[1] === self)
  process.stdout.write(JSON.stringify(which === 'route' ? measureRouteAllocation() : measureChooseAllocation()));
