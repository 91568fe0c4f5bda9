/**
 * bench:clears — AllBlocksCleared on a loaded block index. An engine reports AllBlocksCleared
 * when it resets its prefix cache, and the admin API and the KV-event subscribers apply one per
 * event, so a burst of them must cost each worker's own entries, not the index's. The index
 * holds --chains × 64 predicted entries spread over 8 workers (what routed requests leave
 * before their engines report them) and one worker with 64 stored blocks only; each case
 * applies --clears clears to a freshly built index, --repeat times, and reports the median,
 * min and max milliseconds.
 *
 *   npm run bench:clears -- [--json] [--chains 1400] [--clears 3000] [--repeat 5]
 */
import { performance } from 'node:perf_hooks';
import { BlockIndex } from '../src/core/block-index.js';
import { benchFlags, intFlag, round, spread } from './stats.js';

const flags = benchFlags(process.argv.slice(2), { json: 'switch', chains: 'value', clears: 'value', repeat: 'value' });
const WORKERS = 8;
const CHAIN = 64;
const CHAINS = intFlag(flags, 'chains', 1400);
const CLEARS = intFlag(flags, 'clears', 3000);
const REPEAT = Math.max(1, intFlag(flags, 'repeat', 5));

function build(): BlockIndex {
  const index = new BlockIndex({ predictedTtlMs: 120_000 });
  const hi = new Uint32Array(CHAIN);
  const lo = new Uint32Array(CHAIN);
  let id = 1;
  const fill = () => {
    for (let i = 0; i < CHAIN; i++, id++) {
      hi[i] = Math.imul(id, 0x9e3779b1) >>> 0;
      lo[i] = Math.imul(id + 7, 0x85ebca6b) >>> 0;
    }
  };
  for (let c = 0; c < CHAINS; c++) {
    fill();
    index.recordPredicted(c % WORKERS, hi, lo, 0, CHAIN, 1000);
  }
  fill();
  index.applyStored(WORKERS, hi, lo, 0, CHAIN);
  return index;
}

const cases: Array<{ name: string; clear: (i: number) => number }> = [
  { name: 'one worker with predictions, again and again', clear: () => 0 },
  { name: 'every worker in turn', clear: (i) => i % (WORKERS + 1) },
  { name: 'a worker with stored blocks only, again and again', clear: () => WORKERS },
];

let entries = 0;
const results = cases.map(({ name, clear }) => {
  const ms: number[] = [];
  for (let r = 0; r < REPEAT; r++) {
    const index = build();
    entries = index.entryCount;
    const t0 = performance.now();
    for (let i = 0; i < CLEARS; i++) index.applyCleared(clear(i));
    ms.push(performance.now() - t0);
  }
  const s = spread(ms);
  return { case: name, medianMs: round(s.median), minMs: round(s.min), maxMs: round(s.max) };
});

const out = { entries, clears: CLEARS, repeat: REPEAT, results };
if (flags.has('json')) console.log(JSON.stringify(out, null, 2));
else {
  console.log(`${CLEARS} clears on an index of ${entries} entries, ${REPEAT} runs each`);
  for (const r of results) console.log(`  ${r.case}: median ${r.medianMs} ms (${r.minMs} – ${r.maxMs})`);
}
