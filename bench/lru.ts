/**
 * bench:lru — the project's least-recently-used structures against `lru-cache` on the access
 * patterns they serve, to decide where a hand-written one is worth keeping:
 *
 * - `blocks`: numeric block keys touched in prompt order, as the simulator's pooled-LRU
 *   reference does for every block of every request (src/sim/bounds.ts): LruSet (typed-array
 *   links) against LRUCache<number, true>.
 * - `workflows`: string ids recorded once per routed request, as the router's workflow and
 *   anchor tables are: a Map re-inserted on each use against LRUCache<string, …>.
 *
 *   npm run bench:lru -- --json [--ops 2000000] [--repeat 5]
 */
import { LRUCache } from 'lru-cache';
import { createRng } from '../src/core/rng.js';
import { LruSet } from '../src/sim/lru.js';
import { benchFlags, intFlag } from './stats.js';

const flags = benchFlags(process.argv.slice(2), { json: 'switch', ops: 'value', repeat: 'value' });
const OPS = intFlag(flags, 'ops', 2_000_000);
const REPEAT = Math.max(1, intFlag(flags, 'repeat', 5));

/** Block keys: prefixes of 2,000 documents of 64–512 blocks, Zipf-ish popularity, 1/8 fresh blocks. */
function blockStream(n: number): Float64Array {
  const rng = createRng(3);
  const keys = new Float64Array(n);
  let fresh = 1e9;
  for (let i = 0; i < n;) {
    const doc = Math.floor(2000 * rng() ** 3);
    const len = 64 + Math.floor(448 * rng());
    for (let b = 0; b < len && i < n; b++, i++) keys[i] = rng() < 0.125 ? fresh++ : doc * 1024 + b;
  }
  return keys;
}

/** Workflow ids: 30,000 workflows, each touched a few times, recent ones more often. */
function idStream(n: number): string[] {
  const rng = createRng(5);
  const ids = Array.from({ length: 30_000 }, (_, i) => `wf-${i.toString(36)}-${Math.floor(rng() * 1e9).toString(36)}`);
  const out: string[] = new Array<string>(n);
  for (let i = 0; i < n; i++) {
    const head = Math.floor((i / n) * ids.length);
    out[i] = ids[Math.max(0, head - Math.floor(2000 * rng() ** 2))];
  }
  return out;
}

function time(run: () => number): { opsPerSec: number; check: number } {
  const rates: number[] = [];
  let check = 0;
  for (let r = 0; r < REPEAT; r++) {
    const t0 = performance.now();
    check = run();
    rates.push(OPS / ((performance.now() - t0) / 1000));
  }
  rates.sort((a, b) => a - b);
  return { opsPerSec: Math.round(rates[Math.floor(rates.length / 2)]), check };
}

const blocks = blockStream(OPS);
const BLOCK_CAPACITY = 200_000;
const lruSet = time(() => {
  const lru = new LruSet(BLOCK_CAPACITY);
  let hits = 0;
  for (let i = 0; i < blocks.length; i++) if (lru.touch(blocks[i])) hits++;
  return hits;
});
const lruCacheBlocks = time(() => {
  const lru = new LRUCache<number, true>({ max: BLOCK_CAPACITY });
  let hits = 0;
  for (let i = 0; i < blocks.length; i++) {
    if (lru.get(blocks[i]) !== undefined) hits++;
    else lru.set(blocks[i], true);
  }
  return hits;
});
if (lruSet.check !== lruCacheBlocks.check) throw new Error('blocks: the two caches disagree on hits');

const ids = idStream(OPS);
const ID_CAPACITY = 10_000;
const mapTable = time(() => {
  const m = new Map<string, { workerId: string }>();
  let hits = 0;
  for (const id of ids) {
    const e = m.get(id);
    if (e) {
      hits++;
      m.delete(id);
      m.set(id, e);
    } else {
      m.set(id, { workerId: 'w' });
      if (m.size > ID_CAPACITY) m.delete(m.keys().next().value!);
    }
  }
  return hits;
});
const lruCacheIds = time(() => {
  const m = new LRUCache<string, { workerId: string }>({ max: ID_CAPACITY });
  let hits = 0;
  for (const id of ids) {
    if (m.get(id)) hits++;
    else m.set(id, { workerId: 'w' });
  }
  return hits;
});
if (mapTable.check !== lruCacheIds.check) throw new Error('workflows: the two caches disagree on hits');

const result = {
  blocks: {
    capacity: BLOCK_CAPACITY,
    hitRate: Math.round((lruSet.check / OPS) * 1000) / 1000,
    lruSetOpsPerSec: lruSet.opsPerSec,
    lruCacheOpsPerSec: lruCacheBlocks.opsPerSec,
  },
  workflows: {
    capacity: ID_CAPACITY,
    hitRate: Math.round((mapTable.check / OPS) * 1000) / 1000,
    mapOpsPerSec: mapTable.opsPerSec,
    lruCacheOpsPerSec: lruCacheIds.opsPerSec,
  },
  ops: OPS,
  repeat: REPEAT,
};
if (flags.has('json')) process.stdout.write(`${JSON.stringify(result)}\n`);
else {
  const f = (n: number) => `${(n / 1e6).toFixed(2)} M/s`;
  process.stdout.write(
    `blocks    (capacity ${BLOCK_CAPACITY}, hit rate ${result.blocks.hitRate}): LruSet ${f(lruSet.opsPerSec)}, lru-cache ${f(lruCacheBlocks.opsPerSec)}\n` +
      `workflows (capacity ${ID_CAPACITY}, hit rate ${result.workflows.hitRate}): Map ${f(mapTable.opsPerSec)}, lru-cache ${f(lruCacheIds.opsPerSec)}\n`,
  );
}
