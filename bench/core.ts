/**
 * bench:core — route() and event application on the workload of the block-index issue:
 * 32 workers, block size 16, 1,000,000 (block, worker) entries loaded from random prefix
 * trees, requests of 8,192 tokens sharing prefixes of random depth. Times route() from token
 * ids (hashing included, precise mode: the cost policy keeps each request's prefix as
 * pending until release, in place of speculative entries), event application (BlockStored hashed from token ids, as the KV-event path does,
 * then BlockRemoved), and heap + ArrayBuffer bytes per index entry after a full GC.
 *
 * The timed route phase runs --repeat times (default 5) on the same loaded index; the
 * top-level figures are the medians of the runs, `repeat` has each figure's median, min and
 * max. In those runs each request is released before the next is routed; `routeWithInFlight`
 * times as many runs with --in-flight requests (default 256, 0: skip) kept in flight, so the
 * pending prefixes the cost policy reads hold live entries, as under load. --profile [FILE] records a CPU profile of one further route phase (untimed) and
 * writes it to FILE (default bench/results/core-route.cpuprofile).
 *
 * `routeBytesPerDecision` is the JS heap one route() and its release() allocate, garbage
 * included (the used heap's growth plus what each collection freed), the median of --repeat
 * untimed route phases: the result object route() returns is part of it.
 *
 *   npm run bench:core -- --json [--entries 1000000] [--requests 20000] [--repeat 5] [--in-flight 256]
 *                                [--profile [FILE]]
 */
import { KVAwareRouter } from '../src/index.js';
import { KvEventApplier } from '../src/engines/kv-events/applier.js';
import type { KvEvent } from '../src/engines/kv-events/decode.js';
import { createRng } from '../src/core/rng.js';
import { GCProfiler, getHeapStatistics } from 'node:v8';
import { CpuProfiler, type HotFunction } from './profile.js';
import { benchFlags, intFlag, memoryAfterGc, percentile, round, spread } from './stats.js';

const flags = benchFlags(process.argv.slice(2), {
  json: 'switch',
  entries: 'value',
  requests: 'value',
  docs: 'value',
  repeat: 'value',
  'in-flight': 'value',
  seed: 'value',
  profile: 'optional',
});
const WORKERS = 32;
const BLOCK = 16;
const REQUEST_TOKENS = 8192;
const TARGET_ENTRIES = intFlag(flags, 'entries', 1_000_000);
const REQUESTS = intFlag(flags, 'requests', 20_000);
const DOCS = intFlag(flags, 'docs', 3000);
const REPEAT = Math.max(1, intFlag(flags, 'repeat', 5));
const IN_FLIGHT = intFlag(flags, 'in-flight', 256);
const profileFlag = flags.get('profile');
const PROFILE_FILE =
  profileFlag === undefined ? undefined : profileFlag === true ? 'bench/results/core-route.cpuprofile' : profileFlag;
const rng = createRng(intFlag(flags, 'seed', 1));

// Random prefix trees: each document extends a random earlier one from a random depth.
const BLOCKS_PER_DOC = REQUEST_TOKENS / BLOCK;
const docs: Uint32Array[] = [];
for (let d = 0; d < DOCS; d++) {
  const doc = new Uint32Array(REQUEST_TOKENS);
  const parent = d > 0 && rng() < 0.8 ? docs[Math.floor(rng() * d)] : undefined;
  const shared = parent ? Math.floor(rng() * BLOCKS_PER_DOC) * BLOCK : 0;
  if (parent) doc.set(parent.subarray(0, shared));
  for (let i = shared; i < REQUEST_TOKENS; i++) doc[i] = Math.floor(rng() * 150_000);
  docs.push(doc);
}

const before = memoryAfterGc();
const router = new KVAwareRouter({
  policy: 'cost',
  indexMode: 'precise',
  blockSize: BLOCK,
  maxIndexEntries: 4_000_000,
  clock: () => now,
});
let now = 0;
for (let w = 0; w < WORKERS; w++) router.registerWorker(`w${w}`);

// Load: each worker stores random prefixes of random documents until the index holds the target.
let storedBlocks = 0;
let loadMs = 0;
while (router.index.entryCount < TARGET_ENTRIES) {
  const w = Math.floor(rng() * WORKERS);
  const doc = docs[Math.floor(rng() * DOCS)];
  const depth = 1 + Math.floor(rng() * BLOCKS_PER_DOC);
  const tokens = doc.subarray(0, depth * BLOCK);
  const t0 = performance.now();
  router.applyStored(`w${w}`, router.hashTokens(tokens));
  loadMs += performance.now() - t0;
  storedBlocks += depth;
}
const entries = router.index.entryCount;
const blocksAfterLoad = router.index.blockCount;
const after = memoryAfterGc();

// Requests: a document's prefix of random depth, then fresh tokens up to 8,192.
const requests: Uint32Array[] = [];
for (let i = 0; i < Math.min(REQUESTS, 4000); i++) {
  const doc = docs[Math.floor(rng() * DOCS)];
  const depth = Math.floor(rng() * BLOCKS_PER_DOC) * BLOCK;
  const t = new Uint32Array(REQUEST_TOKENS);
  t.set(doc.subarray(0, depth));
  for (let k = depth; k < REQUEST_TOKENS; k++) t[k] = Math.floor(rng() * 150_000);
  requests.push(t);
}

// Warm-up past 1.5 × the speculative TTL, so the index has grown to its steady size and
// expiry is running; then timed routes. Each request is released so loads stay bounded.
for (let i = 0; i < 10_000; i++) {
  now += 1;
  router.release(router.route({ tokens: requests[i % requests.length] }).ticket);
}
/** Tickets of the requests in flight during a route phase (a FIFO; the oldest is released first). */
const inFlightTickets: number[] = [];
/**
 * One timed route phase: REQUESTS decisions, each timed alone too. With `inFlight` > 0 that
 * many requests stay in flight (each released `inFlight` decisions after it was routed), so
 * the cost policy's pending prefixes hold live entries as under load; with 0 each request is
 * released before the next.
 */
function routePhase(inFlight = 0): {
  decisionsPerSec: number;
  decisionsPerCpuSec: number;
  p50Us: number;
  p90Us: number;
  p99Us: number;
  maxUs: number;
} {
  const samples = new Float64Array(REQUESTS);
  const cpu0 = process.cpuUsage();
  const tRoute0 = performance.now();
  for (let i = 0; i < REQUESTS; i++) {
    now += 1; // 1 ms per decision: speculative entries (5 s TTL) expire as in production
    const t0 = performance.now();
    const r = router.route({ tokens: requests[i % requests.length] });
    samples[i] = performance.now() - t0;
    if (inFlight === 0) router.release(r.ticket);
    else {
      inFlightTickets.push(r.ticket);
      if (inFlightTickets.length > inFlight) router.release(inFlightTickets.shift()!);
    }
  }
  while (inFlightTickets.length > 0) router.release(inFlightTickets.shift()!);
  const routeMs = performance.now() - tRoute0;
  const cpu = process.cpuUsage(cpu0);
  samples.sort();
  return {
    decisionsPerSec: Math.round(REQUESTS / (routeMs / 1000)),
    decisionsPerCpuSec: Math.round(REQUESTS / ((cpu.user + cpu.system) / 1e6)),
    p50Us: round(percentile(samples, 50) * 1000, 2),
    p90Us: round(percentile(samples, 90) * 1000, 2),
    p99Us: round(percentile(samples, 99) * 1000, 2),
    maxUs: round(samples[samples.length - 1] * 1000, 2),
  };
}
const runs = Array.from({ length: REPEAT }, () => routePhase());
const median = (pick: (r: (typeof runs)[number]) => number) => spread(runs.map(pick)).median;
// the same decisions with IN_FLIGHT requests in flight (their prefixes pending), as many runs
const inFlightRuns = IN_FLIGHT > 0 ? Array.from({ length: REPEAT }, () => routePhase(IN_FLIGHT)) : [];
const inFlightMedian = (pick: (r: (typeof runs)[number]) => number) => spread(inFlightRuns.map(pick)).median;

/**
 * Bytes of JS heap a decision allocates, garbage included, over one untimed route phase: the
 * used heap's growth plus what each collection during it freed. One request object whose
 * tokens change, so that only route() and release() are counted.
 */
function routeBytesPerDecision(): number {
  const request = { tokens: requests[0] };
  const profiler = new GCProfiler();
  profiler.start();
  const before = getHeapStatistics().used_heap_size;
  for (let i = 0; i < REQUESTS; i++) {
    now += 1;
    request.tokens = requests[i % requests.length];
    router.release(router.route(request).ticket);
  }
  const after = getHeapStatistics().used_heap_size;
  let freed = 0;
  for (const gc of profiler.stop().statistics)
    freed += gc.beforeGC.heapStatistics.usedHeapSize - gc.afterGC.heapStatistics.usedHeapSize;
  return round((after - before + freed) / REQUESTS, 1);
}
const allocationRuns = Array.from({ length: REPEAT }, routeBytesPerDecision);

let hottest: HotFunction[] | undefined;
if (PROFILE_FILE) {
  const profiler = new CpuProfiler();
  await profiler.start();
  routePhase();
  hottest = await profiler.stop(PROFILE_FILE);
}

// Event application in steady state: store a new prefix, remove an old one, both from token ids.
const EVENT_BATCHES = 2000;
let eventBlocks = 0;
let eventMs = 0;
for (let i = 0; i < EVENT_BATCHES; i++) {
  const w = `w${i % WORKERS}`;
  const doc = docs[Math.floor(rng() * DOCS)];
  const depth = 1 + Math.floor(rng() * BLOCKS_PER_DOC);
  const tokens = doc.subarray(0, depth * BLOCK);
  const t0 = performance.now();
  const hashes = router.hashTokens(tokens);
  router.applyStored(w, hashes);
  router.applyRemoved(w, hashes);
  eventMs += performance.now() - t0;
  eventBlocks += 2 * depth;
}

// The KV-event path as the subscriber runs it: decoded BlockStored events (engine hashes,
// token ids, chained by parent hash) through KvEventApplier, which hashes the token ids from
// the parent's own hash, then the BlockRemoved of the same blocks.
const applier = new KvEventApplier(router);
let pathBlocks = 0;
let pathMs = 0;
let engineHash = 1n;
for (let i = 0; i < EVENT_BATCHES; i++) {
  const w = `w${i % WORKERS}`;
  const doc = docs[Math.floor(rng() * DOCS)];
  const depth = 1 + Math.floor(rng() * BLOCKS_PER_DOC);
  const hashes = Array.from({ length: depth }, () => engineHash++);
  const store: KvEvent = {
    type: 'BlockStored',
    blockHashes: hashes,
    parentBlockHash: null,
    tokenIds: Array.from(doc.subarray(0, depth * BLOCK)),
    blockSize: BLOCK,
    loraId: null,
    medium: 'GPU',
    loraName: null,
    groupIdx: null,
  };
  const remove: KvEvent = { type: 'BlockRemoved', blockHashes: hashes, medium: 'GPU', groupIdx: null };
  const t0 = performance.now();
  applier.apply(w, { ts: 0, events: [store], dataParallelRank: null });
  applier.apply(w, { ts: 0, events: [remove], dataParallelRank: null });
  pathMs += performance.now() - t0;
  pathBlocks += 2 * depth;
}

const result = {
  routeDecisionsPerSec: median((r) => r.decisionsPerSec),
  // decisions per second of this process's CPU time: what a core sustains, whatever else runs
  routeDecisionsPerCpuSec: median((r) => r.decisionsPerCpuSec),
  routeP50Us: median((r) => r.p50Us),
  routeP99Us: median((r) => r.p99Us),
  routeP90Us: median((r) => r.p90Us),
  routeMaxUs: median((r) => r.maxUs),
  routeBytesPerDecision: spread(allocationRuns).median,
  ...(IN_FLIGHT > 0
    ? {
        routeWithInFlight: {
          inFlight: IN_FLIGHT,
          decisionsPerSec: inFlightMedian((r) => r.decisionsPerSec),
          decisionsPerCpuSec: inFlightMedian((r) => r.decisionsPerCpuSec),
          p50Us: inFlightMedian((r) => r.p50Us),
          p99Us: inFlightMedian((r) => r.p99Us),
          decisionsPerSecSpread: spread(inFlightRuns.map((r) => r.decisionsPerSec)),
        },
      }
    : {}),
  eventsPerSec: Math.round(eventBlocks / (eventMs / 1000)),
  kvEventPathEventsPerSec: Math.round(pathBlocks / (pathMs / 1000)),
  bytesPerIndexEntry: round((after - before) / entries, 1),
  workload: {
    workers: WORKERS,
    blockSize: BLOCK,
    requestTokens: REQUEST_TOKENS,
    indexEntries: entries,
    indexBlocks: blocksAfterLoad,
    documents: DOCS,
    requests: REQUESTS,
    routeRuns: REPEAT,
    policy: 'cost',
    indexMode: 'precise',
    loadEventsPerSec: Math.round(storedBlocks / (loadMs / 1000)),
    eventsCountedAs: 'blocks in BlockStored + BlockRemoved, hashed from token ids',
    kvEventPathCountedAs:
      'the same, as decoded events through KvEventApplier (engine hash map, own hashes from the parent)',
    bytesCountedAs: 'heapUsed + arrayBuffers after full GC, router and index only, after the load phase',
    node: process.version,
  },
  repeat: {
    runs: REPEAT,
    routeDecisionsPerSec: spread(runs.map((r) => r.decisionsPerSec)),
    routeDecisionsPerCpuSec: spread(runs.map((r) => r.decisionsPerCpuSec)),
    routeP50Us: spread(runs.map((r) => r.p50Us)),
    routeP99Us: spread(runs.map((r) => r.p99Us)),
    routeBytesPerDecision: spread(allocationRuns),
  },
  ...(PROFILE_FILE ? { profile: { file: PROFILE_FILE, hottest } } : {}),
};
if (flags.has('json')) process.stdout.write(`${JSON.stringify(result)}\n`);
else console.log(result);
