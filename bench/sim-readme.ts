/**
 * bench:sim:readme — turns the committed sweep (bench/results/sim-sweep.json, written by
 * `npm run bench:sim`) into the README's markdown tables: per trace and load point, `cost`
 * against the best peer, with 95% confidence intervals.
 *
 *   npm run bench:sim:readme            # print the tables
 *   npm run bench:sim:readme -- --write # replace them in README.md (between the sim-sweep markers)
 *   npm run bench:sim:readme -- --in DIR/sim-sweep-train.json [--peers OTHER.json]
 *                                       # the tables of another sweep (a split, a candidate's run of
 *                                       # `cost` alone with --peers the peers' run), not written
 *
 * Printed tables end with how many load points `cost` meets the bar at.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { compareWithBestPeer, type SweepReport } from '../src/sim/sweep.js';
import { benchFlags } from './stats.js';

const SUBJECT = 'cost';
const START = '<!-- sim-sweep:start (npm run bench:sim:readme -- --write) -->';
const END = '<!-- sim-sweep:end -->';

const s = (x: number) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));
const pm = (v: number, half: number) => `${s(v)} ± ${s(half)}`;
const pct = (v: number, half: number) => `${(v * 100).toFixed(1)}% ± ${(half * 100).toFixed(1)}`;

/** Markdown: one table per trace, one row per load point. */
export function renderSweepTables(report: SweepReport): string {
  return sweepTables(report).text;
}

/** The tables, and the load points `cost` meets the bar at, of the points compared. */
export function sweepTables(report: SweepReport): { text: string; met: number; points: number } {
  const out: string[] = [];
  let met = 0;
  let points = 0;
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
      points++;
      if (misses.length === 0) met++;
      out.push(
        `| ×${point.speed} | ${pm(c.own.ttftMean, c.own.ci95.ttftMean)} | ${c.best.policy} | ${pm(c.best.ttftMean, c.best.ci95.ttftMean)} | ` +
          `${pm(c.own.ttftP99, c.own.ci95.ttftP99)} | ${s(c.bestP99)} | ${pct(c.own.hitRate, c.own.ci95.hitRate)} | ${(c.bestHit * 100).toFixed(1)}% | ` +
          `${misses.length === 0 ? 'yes' : `no (${misses.join(', ')})`} |`,
      );
    }
    out.push('');
  }
  return { text: out.join('\n'), met, points };
}

/** `report` with each load point's policies from `peers` added (same traces and speeds; `cost` kept from `report`). */
export function withPeers(report: SweepReport, peers: SweepReport): SweepReport {
  return {
    ...report,
    traces: report.traces.map((t) => {
      const other = peers.traces.find((p) => p.trace === t.trace);
      if (!other) throw new RangeError(`--peers: no trace '${t.trace}' in the peers' sweep`);
      return {
        ...t,
        points: t.points.map((point) => {
          const same = other.points.find((p) => p.speed === point.speed);
          if (!same) throw new RangeError(`--peers: no load point ×${point.speed} of '${t.trace}' in the peers' sweep`);
          const own = new Set(point.policies.map((p) => p.policy));
          return { ...point, policies: [...point.policies, ...same.policies.filter((p) => !own.has(p.policy))] };
        }),
      };
    }),
  };
}

function readSweep(file: string, flag: string): SweepReport {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as SweepReport;
  } catch (err) {
    process.stderr.write(`error: ${flag} ${file}: ${(err as Error).message}\n`);
    process.exit(2);
  }
}

async function main(): Promise<void> {
  const flags = benchFlags(process.argv.slice(2), { in: 'value', peers: 'value', write: 'switch' });
  // a value flag has its value (benchFlags refuses one without)
  const input = flags.get('in') as string | undefined;
  const peersFile = flags.get('peers') as string | undefined;
  let report = readSweep(input ?? 'bench/results/sim-sweep.json', input === undefined ? 'the sweep' : '--in');
  if (peersFile !== undefined) report = withPeers(report, readSweep(peersFile, '--peers'));
  const tables = sweepTables(report);
  if (!flags.has('write') || input !== undefined || peersFile !== undefined) {
    if (flags.has('write')) {
      process.stderr.write('error: --write writes the committed sweep only; leave out --in and --peers\n');
      process.exit(2);
    }
    process.stdout.write(`${tables.text}\ncost meets the bar at ${tables.met} of ${tables.points} load points\n`);
    return;
  }
  const text = tables.text;
  const readme = readFileSync('README.md', 'utf8');
  const a = readme.indexOf(START);
  const b = readme.indexOf(END);
  if (a < 0 || b < a) throw new Error(`README.md has no ${START} … ${END} section`);
  writeFileSync('README.md', `${readme.slice(0, a + START.length)}\n\n${text}\n${readme.slice(b)}`);
  process.stdout.write('README.md tables updated from bench/results/sim-sweep.json\n');
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) await main();
