/**
 * bench:proxy — the router's overhead: the same load (autocannon, non-streaming completions
 * of a short prompt with max_tokens 1) against one mock engine directly and through the
 * router, side by side in one run, then time to first token for streaming both ways.
 * The mock engine is made fast (1,000,000 prefill tok/s, 100,000 decode tok/s) so that what
 * is measured is HTTP and routing, not the simulated GPU. Engine and router run as their own
 * processes (the real CLI commands), the load generator in this one.
 *
 *   npm run bench:proxy -- --json [--connections 16] [--seconds 10]
 */
import autocannon from 'autocannon';
import { spawn, type ChildProcess } from 'node:child_process';
import { intFlag, parseFlags, percentile, round } from './stats.js';

const flags = parseFlags(process.argv.slice(2));
const CONNECTIONS = intFlag(flags, 'connections', 16);
const SECONDS = intFlag(flags, 'seconds', 10);

/** Starts a CLI command and resolves with the URL it prints on stderr. */
function startCli(args: string[], pattern: RegExp): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  return new Promise((resolve, reject) => {
    child.stderr!.on('data', (d: Buffer) => {
      stderr += d.toString();
      const m = pattern.exec(stderr);
      if (m) resolve({ child, url: m[1] });
    });
    child.once('exit', (code) => reject(new Error(`${args[0]} exited ${code}: ${stderr}`)));
  });
}

const engine = await startCli(['mock-engine', '--port', '0', '--prefill-tok-s', '1000000', '--decode-tok-s', '100000'], /on (http:\/\/[\d.]+:\d+)/);
const engineBase = engine.url;
const gateway = await startCli(['serve', '--port', '0', '--worker', `id=e0,url=${engineBase}`], /serving on (http:\/\/[\d.]+:\d+)/);
const routerBase = gateway.url;
const body = JSON.stringify({ model: 'mock', prompt: 'The quick brown fox jumps over the lazy dog. '.repeat(8), max_tokens: 1 });

async function load(base: string) {
  const r = await autocannon({
    url: `${base}/v1/completions`,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
    connections: CONNECTIONS,
    duration: SECONDS,
  });
  if (r.non2xx > 0 || r.errors > 0) throw new Error(`${base}: ${r.non2xx} non-2xx, ${r.errors} errors`);
  return { rps: Math.round(r.requests.average), p50Ms: r.latency.p50, p99Ms: r.latency.p99 };
}

async function ttftMs(base: string, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const res = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'mock', prompt: `stream ${i}`, max_tokens: 4, stream: true }) });
    const reader = res.body!.getReader();
    await reader.read();
    out.push(performance.now() - t0);
    while (!(await reader.read()).done);
  }
  return out.sort((a, b) => a - b);
}

// warm both paths, then measure them one after the other in the same process
await load(engineBase);
await load(routerBase);
const direct = await load(engineBase);
const viaRouter = await load(routerBase);
const ttftDirect = await ttftMs(engineBase, 200);
const ttftRouter = await ttftMs(routerBase, 200);
const result = {
  direct,
  viaRouter,
  throughputRatio: round(viaRouter.rps / direct.rps, 3),
  overheadP50Ms: round(viaRouter.p50Ms - direct.p50Ms, 3),
  streamingTtftP50Ms: { direct: round(percentile(ttftDirect, 50), 3), viaRouter: round(percentile(ttftRouter, 50), 3) },
  streamingTtftOverheadP50Ms: round(percentile(ttftRouter, 50) - percentile(ttftDirect, 50), 3),
  settings: { connections: CONNECTIONS, seconds: SECONDS, request: 'POST /v1/completions, 80-word prompt, max_tokens 1', node: process.version, processes: 'engine, router and load generator in three processes sharing the machine' },
};
gateway.child.kill('SIGTERM');
engine.child.kill('SIGTERM');
if (flags.has('json')) process.stdout.write(`${JSON.stringify(result)}\n`);
else console.log(result);
