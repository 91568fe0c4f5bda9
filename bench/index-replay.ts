/**
 * bench:index — replays the Mooncake conversation trace against the BlockIndex the way
 * Dynamo's `mooncake_bench` does (ai-dynamo/dynamo lib/bench/kv_router/INDEXER_BENCH.md):
 * each 512-token trace block is re-chunked into index blocks of 128 tokens; the trace is
 * duplicated (each copy with its own hashes, as independent tenants) and its requests are
 * spread over the workers; every worker runs a mock engine with an LRU cache of blocks that
 * turns each request into the BlockStored / BlockRemoved events a real engine would send.
 *
 * Outside timing: parsing, re-chunking, the mock engines and event generation. Inside timing:
 * every request's lookup (each also timed alone for the service-time percentiles) and every
 * event's application, in trace order, on one Node.js thread. Block operations count the
 * request's lookup blocks plus the blocks of Stored and Removed events, as Dynamo counts them.
 *
 *   npm run bench:index -- --json [--trace FILE] [--workers 128] [--duplication 20]
 *                                 [--block-size 128] [--cache-blocks 16384]
 */
import { createReadStream, existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { createGunzip } from 'node:zlib';
import { BlockIndex, OverlapResult } from '../src/core/block-index.js';
import { fmix32 } from '../src/core/hashing.js';
import { LruSet } from '../src/sim/lru.js';
import { benchFlags, intFlag, percentile, round } from './stats.js';

const flags = benchFlags(process.argv.slice(2), {
  json: 'switch',
  trace: 'value',
  workers: 'value',
  duplication: 'value',
  'block-size': 'value',
  'cache-blocks': 'value',
});
const TRACE_BLOCK = 512;
const BLOCK = intFlag(flags, 'block-size', 128);
const WORKERS = intFlag(flags, 'workers', 128);
const DUP = intFlag(flags, 'duplication', 20);
const CACHE_BLOCKS = intFlag(flags, 'cache-blocks', 16_384);
const SUB = TRACE_BLOCK / BLOCK;
const defaultTrace = 'bench/traces/conversation_trace.jsonl.gz';
const tracePath = typeof flags.get('trace') === 'string' ? (flags.get('trace') as string) : defaultTrace;
if (!tracePath || !existsSync(tracePath)) {
  process.stderr.write('error: no trace found; pass --trace FILE (Mooncake JSONL, optionally .gz)\n');
  process.exit(2);
}
if (TRACE_BLOCK % BLOCK !== 0) {
  process.stderr.write(`error: --block-size must divide ${TRACE_BLOCK}\n`);
  process.exit(2);
}

interface TraceRequest {
  inputLength: number;
  hashIds: number[];
}
const trace: TraceRequest[] = [];
const input = tracePath.endsWith('.gz')
  ? createReadStream(tracePath).pipe(createGunzip())
  : createReadStream(tracePath);
for await (const line of createInterface({ input, crlfDelay: Infinity })) {
  if (!line.trim()) continue;
  const r = JSON.parse(line) as { input_length: number; hash_ids: number[] };
  trace.push({ inputLength: r.input_length, hashIds: r.hash_ids });
}

// ---- preparation (untimed): keys, mock engines, events ----
/** A 64-bit key per (trace hash id, sub-block, copy); the id doubles as the mock's key. */
const keyId = (hashId: number, sub: number, copy: number) => (hashId * SUB + sub) * DUP + copy;

const OP_LOOKUP = 0;
const OP_STORED = 1;
const OP_REMOVED = 2;
let keyCap = 1 << 20;
let keysHi = new Uint32Array(keyCap);
let keysLo = new Uint32Array(keyCap);
let keyLen = 0;
const ops: number[] = []; // (kind, worker, start, end) quadruples
function pushKey(id: number): void {
  if (keyLen === keyCap) {
    keyCap *= 2;
    const h = new Uint32Array(keyCap);
    const l = new Uint32Array(keyCap);
    h.set(keysHi);
    l.set(keysLo);
    keysHi = h;
    keysLo = l;
  }
  const lo = id >>> 0;
  const hi = Math.floor(id / 4294967296);
  keysHi[keyLen] = fmix32(hi ^ Math.imul(lo, 0x9e3779b1));
  keysLo[keyLen] = fmix32(lo ^ 0x85ebca6b ^ Math.imul(keysHi[keyLen], 0xcc9e2d51));
  keyLen++;
}
// each worker's mock engine: a block cache, least recently used first out
const caches = Array.from({ length: WORKERS }, () => new LruSet(CACHE_BLOCKS));
let requestIndex = 0;
let lookupBlocks = 0;
let storedBlocks = 0;
let removedBlocks = 0;
const prepStart = performance.now();
for (const req of trace) {
  const blocks = Math.min(Math.floor(req.inputLength / BLOCK), req.hashIds.length * SUB);
  for (let copy = 0; copy < DUP; copy++) {
    const worker = requestIndex++ % WORKERS;
    const ids: number[] = [];
    for (let b = 0; b < blocks; b++) ids.push(keyId(req.hashIds[Math.floor(b / SUB)], b % SUB, copy));
    // the router's lookup comes first
    let start = keyLen;
    for (const id of ids) pushKey(id);
    ops.push(OP_LOOKUP, worker, start, keyLen);
    lookupBlocks += ids.length;
    // the engine reuses what it holds, stores the rest and evicts its least recently used
    const cache = caches[worker];
    const evicted: number[] = [];
    start = keyLen;
    for (const id of ids) if (!cache.touch(id, (old) => evicted.push(old))) pushKey(id);
    if (keyLen > start) ops.push(OP_STORED, worker, start, keyLen);
    storedBlocks += keyLen - start;
    start = keyLen;
    for (const id of evicted) pushKey(id);
    if (keyLen > start) ops.push(OP_REMOVED, worker, start, keyLen);
    removedBlocks += keyLen - start;
  }
}
const prepMs = performance.now() - prepStart;
caches.length = 0;

// ---- timed replay ----
const index = new BlockIndex({ maxEntries: 1 << 30 });
const out = new OverlapResult(WORKERS);
const lookups = new Float64Array(requestIndex);
const depths = new Float64Array(requestIndex);
let li = 0;
const gc = (globalThis as { gc?: () => void }).gc;
gc?.();
const cpu0 = process.cpuUsage();
const t0 = performance.now();
for (let i = 0; i < ops.length; i += 4) {
  const kind = ops[i];
  const worker = ops[i + 1];
  const start = ops[i + 2];
  const end = ops[i + 3];
  if (kind === OP_LOOKUP) {
    // the views are made before the clock starts: a collection their allocation may set off
    // belongs to the harness, not to the lookup (which allocates nothing)
    const hi = keysHi.subarray(start, end);
    const lo = keysLo.subarray(start, end);
    const q0 = performance.now();
    index.overlaps(hi, lo, end - start, out);
    lookups[li] = performance.now() - q0;
    depths[li++] = out.maxBlocks;
  } else if (kind === OP_STORED) {
    index.applyStored(worker, keysHi, keysLo, start, end);
  } else {
    index.applyRemoved(worker, keysHi, keysLo, start, end);
  }
}
const totalMs = performance.now() - t0;
const cpu = process.cpuUsage(cpu0);
// how deep the slowest lookups walked (the tail is the long shared prefixes)
const order = Array.from(lookups.keys()).sort((a, b) => lookups[a] - lookups[b]);
const slowest = order.slice(Math.floor(order.length * 0.99));
const meanDepthP99 = slowest.reduce((s, k) => s + depths[k], 0) / slowest.length;
const meanDepth = depths.reduce((s, d) => s + d, 0) / depths.length;
lookups.sort();

const totalBlockOps = lookupBlocks + storedBlocks + removedBlocks;
const result = {
  lookupP50Us: round(percentile(lookups, 50) * 1000, 2),
  lookupP99Us: round(percentile(lookups, 99) * 1000, 2),
  lookupP999Us: round(percentile(lookups, 99.9) * 1000, 2),
  blockOpsPerSec: Math.round(totalBlockOps / (totalMs / 1000)),
  // per second of this process's CPU time: what a core sustains, whatever else runs
  blockOpsPerCpuSec: Math.round(totalBlockOps / ((cpu.user + cpu.system) / 1e6)),
  settings: {
    trace: tracePath.split('/').pop(),
    traceBlockSize: TRACE_BLOCK,
    blockSize: BLOCK,
    workers: WORKERS,
    duplication: DUP,
    cacheBlocksPerWorker: CACHE_BLOCKS,
    workerAssignment: 'round-robin over the duplicated trace',
    requests: requestIndex,
    lookupBlocks,
    storedBlocks,
    removedBlocks,
    totalBlockOps,
    replayMs: Math.round(totalMs),
    preparationMs: Math.round(prepMs),
    finalIndexEntries: index.entryCount,
    meanBlocksMatched: round(meanDepth, 1),
    meanBlocksMatchedSlowest1Pct: round(meanDepthP99, 1),
    timing: 'one thread; lookups timed alone with performance.now(); throughput = all block ops / replay wall time',
    node: process.version,
  },
};
if (flags.has('json')) process.stdout.write(`${JSON.stringify(result)}\n`);
else console.log(result);
