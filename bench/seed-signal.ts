/**
 * bench:seed-signal — what the seed's load signal sees, and how much the seed's results
 * depend on it. The seed keeps an anchor's home worker while its `load` < 0.95; its caller
 * decides what `load` is. Two readings, on the same requests:
 * - `kv-usage` (the default): the engine's KV-cache usage;
 * - `queue-inclusive`: 1 while the engine has requests waiting, else its KV usage.
 * For each, over the Mooncake conversation trace's evaluation windows (8 workers), the hit
 * rate and TTFT, and a probe of the scrapes: how often a worker had a queue, and in how many
 * of those scrapes its KV usage was at or above 0.95.
 *
 *   npm run bench:seed-signal [-- --json] [--speed 1] [--samples 5]
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { loadTrace } from '../src/sim/load-trace.js';
import { simulate } from '../src/sim/simulator.js';
import { meanCi95, splitTrace, windows } from '../src/sim/sweep.js';
import { benchFlags, intFlag, round } from './stats.js';

const flags = benchFlags(process.argv.slice(2), { json: 'switch', speed: 'value', samples: 'value', workers: 'value' });
const SPEED = Number(flags.get('speed') ?? 1);
const SAMPLES = intFlag(flags, 'samples', 5);
const WORKERS = intFlag(flags, 'workers', 8);

const { requests } = await loadTrace('bench/traces/conversation_trace.jsonl.gz');
const samples = windows(splitTrace(requests).evaluation, SAMPLES);
const out: Record<string, unknown> = {
  trace: 'mooncake-conversation (evaluation windows)',
  workers: WORKERS,
  speed: SPEED,
  samples: SAMPLES,
};
for (const loadSignal of ['kv-usage', 'queue-inclusive'] as const) {
  const hit: number[] = [];
  const mean: number[] = [];
  const p99: number[] = [];
  let scrapes = 0;
  let queued = 0;
  let queuedFull = 0;
  for (const trace of samples) {
    const r = simulate(trace, {
      workers: WORKERS,
      policy: 'seed',
      speed: SPEED,
      router: { policyOptions: { seed: { loadSignal } } },
      onScrape: (_t, _w, m) => {
        scrapes++;
        if (m.waitingRequests > 0) {
          queued++;
          if (m.kvUsage >= 0.95) queuedFull++;
        }
      },
    });
    hit.push(r.hitRate);
    mean.push(r.ttft.mean);
    p99.push(r.ttft.p99);
  }
  const ci = (v: number[]) => {
    const m = meanCi95(v);
    return { mean: round(m.mean, 4), ci95: round(m.half, 4) };
  };
  out[loadSignal] = {
    hitRate: ci(hit),
    ttftMean: ci(mean),
    ttftP99: ci(p99),
    scrapesWithQueue: round(queued / Math.max(1, scrapes), 4),
    kvUsageAtLeast095WhenQueued: round(queuedFull / Math.max(1, queued), 4),
  };
}
mkdirSync('bench/results', { recursive: true });
writeFileSync('bench/results/seed-load-signal.json', JSON.stringify(out, null, 1) + '\n');
process.stdout.write(flags.has('json') ? `${JSON.stringify(out)}\n` : `${JSON.stringify(out, null, 1)}\n`);
