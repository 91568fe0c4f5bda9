/**
 * The README's Performance table from the committed runs: reads bench/results/{core,index,proxy}-run*.json
 * (each the --json output of one `npm run bench:core|bench:index|bench:proxy`) and prints, per
 * figure, the median, min and max over the runs, with the runs' files.
 *
 *   npm run bench:summary [-- --json]   (writes nothing; redirect to bench/results/performance-summary.json)
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { benchFlags, spread } from './stats.js';

const flags = benchFlags(process.argv.slice(2), { json: 'switch' });
const dir = 'bench/results';
type Json = Record<string, unknown>;

function runs(kind: string): { files: string[]; data: Json[] } {
  const files: string[] = [];
  const data: Json[] = [];
  for (const f of readdirSync(dir)
    .filter((name) => new RegExp(`^${kind}-run\\d+\\.json$`).test(name))
    .sort()) {
    try {
      data.push(JSON.parse(readFileSync(join(dir, f), 'utf8')) as Json);
      files.push(f);
    } catch {
      process.stderr.write(`skipped ${f}: not one JSON object (a run that failed or is still running)\n`);
    }
  }
  return { files, data };
}

/** A value at a dotted path (`realistic.text.rps`), or undefined. */
function at(o: Json, path: string): number | undefined {
  let v: unknown = o;
  for (const k of path.split('.')) v = v !== null && typeof v === 'object' ? (v as Json)[k] : undefined;
  return typeof v === 'number' ? v : undefined;
}

const figures: Record<
  string,
  { command: string; files: string[]; figures: Record<string, ReturnType<typeof spread>> }
> = {};
const table: Array<[string, string[]]> = [
  [
    'core',
    [
      'routeDecisionsPerSec',
      'routeDecisionsPerCpuSec',
      'routeP50Us',
      'routeP99Us',
      'routeWithInFlight.decisionsPerSec',
      'routeWithInFlight.p99Us',
      'eventsPerSec',
      'bytesPerIndexEntry',
    ],
  ],
  ['index', ['lookupP50Us', 'lookupP99Us', 'lookupP999Us', 'blockOpsPerSec', 'blockOpsPerCpuSec']],
  [
    'proxy',
    [
      'throughputRatio',
      'overheadP50Ms',
      'direct.rps',
      'viaRouter.rps',
      'routerCpuUsPerRequest',
      // the same load through bench/reference-proxy.ts in the same run (runs since it exists)
      'referenceProxy.rps',
      'referenceProxy.throughputRatio',
      'referenceProxy.cpuUsPerRequest',
      'throughputVsReference',
      'streamingTtftOverheadP50Ms',
      'realistic.direct.rps',
      ...['text', 'tokenizer', 'engine', 'tokenizerOnEventLoop'].flatMap((m) =>
        [
          'rps',
          'addedP50Ms',
          'addedP99Ms',
          'cpuUsPerRequest',
          'engineCpuUsPerRequest',
          'rpsPerRouterCore',
          'healthzP99Ms',
        ].map((k) => `realistic.${m}.${k}`),
      ),
      'realistic.engineDirect.rps',
      'realistic.settings.meanPromptTokensQwen3',
      'realistic.settings.meanBodyBytes',
      'processes.1.rps',
      'processes.2.rps',
    ],
  ],
];
for (const [kind, keys] of table) {
  const { files, data } = runs(kind);
  if (files.length === 0) continue;
  const out: Record<string, ReturnType<typeof spread>> = {};
  for (const key of keys) {
    const values = data.map((d) => at(d, key)).filter((v): v is number => v !== undefined);
    if (values.length > 0) out[key] = spread(values);
  }
  // the flags the runs were made with, where they differ from the defaults
  const seconds = at(data[0], 'settings.seconds');
  const extra = kind === 'proxy' && seconds !== undefined && seconds !== 10 ? ` --seconds ${seconds}` : '';
  figures[kind] = { command: `npm run bench:${kind} -- --json${extra}`, files, figures: out };
}
if (flags.has('json')) process.stdout.write(`${JSON.stringify(figures, null, 1)}\n`);
else {
  for (const [kind, f] of Object.entries(figures)) {
    console.log(`${f.command}  (${f.files.join(', ')})`);
    for (const [key, s] of Object.entries(f.figures)) {
      // a figure newer than some runs: say how many runs it comes from
      const some = s.values.length < f.files.length ? `, ${s.values.length} of ${f.files.length} runs` : '';
      console.log(`  ${key}: ${s.median}  (${s.min} – ${s.max}${some})`);
    }
    void kind;
  }
}
