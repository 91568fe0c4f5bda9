/**
 * bench:sim:readme — turns the committed sweep (bench/results/sim-sweep.json, written by
 * `npm run bench:sim`) into the README's markdown tables: per trace and load point, `cost`
 * against the best peer, with 95% confidence intervals.
 *
 *   npm run bench:sim:readme            # print the tables
 *   npm run bench:sim:readme -- --write # replace them in README.md (between the sim-sweep markers)
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { compareWithBestPeer, type SweepReport } from '../src/sim/sweep.js';

const SUBJECT = 'cost';
const START = '<!-- sim-sweep:start (npm run bench:sim:readme -- --write) -->';
const END = '<!-- sim-sweep:end -->';

const s = (x: number) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));
const pm = (v: number, half: number) => `${s(v)} ± ${s(half)}`;
const pct = (v: number, half: number) => `${(v * 100).toFixed(1)}% ± ${(half * 100).toFixed(1)}`;

/** Markdown: one table per trace, one row per load point. */
export function renderSweepTables(report: SweepReport): string {
  const out: string[] = [];
  for (const t of report.traces) {
    const peers = t.points[0]?.policies.map((p) => p.policy).filter((p) => p !== SUBJECT) ?? [];
    out.push(
      `**${t.trace}** (mean TTFT and p99 TTFT in seconds, mean ± 95% CI over the samples; best peer by mean TTFT among ${peers.join(', ')})`,
      '',
    );
    out.push(
      '| speed | cost TTFT mean | best peer | its TTFT mean | cost TTFT p99 | best p99 | cost hit rate | best hit rate | cost meets the bar |',
    );
    out.push('|---:|---:|---|---:|---:|---:|---:|---:|---|');
    for (const point of t.points) {
      const c = compareWithBestPeer(point, SUBJECT, peers);
      if (!c) continue;
      // more rejections than a peer: figures over fewer requests, which cannot meet the bar
      const misses = [
        c.meanOk ? '' : 'mean',
        c.p99Ok ? '' : 'p99',
        c.hitOk ? '' : 'hit rate',
        c.rejectedOk ? '' : `rejected ${c.own.rejected} vs ${c.fewestPeerRejected}`,
      ].filter(Boolean);
      out.push(
        `| ×${point.speed} | ${pm(c.own.ttftMean, c.own.ci95.ttftMean)} | ${c.best.policy} | ${pm(c.best.ttftMean, c.best.ci95.ttftMean)} | ` +
          `${pm(c.own.ttftP99, c.own.ci95.ttftP99)} | ${s(c.bestP99)} | ${pct(c.own.hitRate, c.own.ci95.hitRate)} | ${(c.bestHit * 100).toFixed(1)}% | ` +
          `${misses.length === 0 ? 'yes' : `no (${misses.join(', ')})`} |`,
      );
    }
    out.push('');
  }
  return out.join('\n');
}

async function main(): Promise<void> {
  const report = JSON.parse(readFileSync('bench/results/sim-sweep.json', 'utf8')) as SweepReport;
  const tables = renderSweepTables(report);
  if (!process.argv.includes('--write')) {
    process.stdout.write(tables);
    return;
  }
  const readme = readFileSync('README.md', 'utf8');
  const a = readme.indexOf(START);
  const b = readme.indexOf(END);
  if (a < 0 || b < a) throw new Error(`README.md has no ${START} … ${END} section`);
  writeFileSync('README.md', `${readme.slice(0, a + START.length)}\n\n${tables}\n${readme.slice(b)}`);
  process.stdout.write('README.md tables updated from bench/results/sim-sweep.json\n');
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) await main();
