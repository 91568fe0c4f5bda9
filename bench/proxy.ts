/**
 * bench:proxy — the router's overhead: the same load (autocannon, non-streaming completions
 * of a short prompt with max_tokens 1) against one mock engine directly and through the
 * router, side by side in one run, then time to first token for streaming both ways.
 * Two engines, each measured both ways in the same run:
 * - the top-level figures use a mock engine made fast (1,000,000 prefill tok/s, 100,000 decode
 *   tok/s): it answers in well under a millisecond, so what is measured is HTTP and routing
 *   alone — the worst case for a proxy, since its CPU competes with the engine's and the load
 *   generator's on the same cores;
 * - `modelTimeEngine` uses the mock engine's default speeds (a Qwen3-32B-on-H100-like 20,000
 *   prefill tok/s, 200 decode tok/s: ~10 ms per request here), closer to what a router fronts.
 * Engine and router run as their own processes (the real CLI commands), the load generator in
 * this one. The router's CPU time per request is read from /proc (Linux).
 *
 *   npm run bench:proxy -- --json [--connections 16] [--seconds 10]
 */
import autocannon from 'autocannon';
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
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

const body = JSON.stringify({ model: 'mock', prompt: 'The quick brown fox jumps over the lazy dog. '.repeat(8), max_tokens: 1 });

/** CPU time (user + system) a process has used, in ms; undefined off Linux. */
function cpuMs(pid: number | undefined): number | undefined {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // clock ticks at USER_HZ = 100
  } catch {
    return undefined;
  }
}

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

async function ttftOnce(base: string, i: number): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'mock', prompt: `stream ${i}`, max_tokens: 4, stream: true }) });
  const reader = res.body!.getReader();
  await reader.read();
  const ms = performance.now() - t0;
  while (!(await reader.read()).done);
  return ms;
}

/** Streaming time to first byte, direct and through the router alternately (so drift hits both). */
async function ttftPairs(directBase: string, routerBase: string, n: number): Promise<{ direct: number[]; viaRouter: number[] }> {
  const direct: number[] = [];
  const viaRouter: number[] = [];
  for (let i = 0; i < n; i++) {
    direct.push(await ttftOnce(directBase, i));
    viaRouter.push(await ttftOnce(routerBase, i));
  }
  return { direct: direct.sort((a, b) => a - b), viaRouter: viaRouter.sort((a, b) => a - b) };
}

async function compare(engineArgs: string[], withTtft: boolean) {
  const engine = await startCli(['mock-engine', '--port', '0', ...engineArgs], /on (http:\/\/[\d.]+:\d+)/);
  const gateway = await startCli(['serve', '--port', '0', '--worker', `id=e0,url=${engine.url}`], /serving on (http:\/\/[\d.]+:\d+)/);
  try {
    // warm both paths, then measure them one after the other
    await load(engine.url);
    await load(gateway.url);
    const direct = await load(engine.url);
    const cpu0 = cpuMs(gateway.child.pid);
    const viaRouter = await load(gateway.url);
    const cpu1 = cpuMs(gateway.child.pid);
    const out = {
      direct,
      viaRouter,
      throughputRatio: round(viaRouter.rps / direct.rps, 3),
      overheadP50Ms: round(viaRouter.p50Ms - direct.p50Ms, 3),
      routerCpuUsPerRequest: cpu0 === undefined || cpu1 === undefined ? null : Math.round(((cpu1 - cpu0) * 1000) / (viaRouter.rps * SECONDS)),
    };
    if (!withTtft) return out;
    const { direct: ttftDirect, viaRouter: ttftRouter } = await ttftPairs(engine.url, gateway.url, 300);
    return {
      ...out,
      streamingTtftP50Ms: { direct: round(percentile(ttftDirect, 50), 3), viaRouter: round(percentile(ttftRouter, 50), 3) },
      streamingTtftOverheadP50Ms: round(percentile(ttftRouter, 50) - percentile(ttftDirect, 50), 3),
    };
  } finally {
    gateway.child.kill('SIGTERM');
    engine.child.kill('SIGTERM');
  }
}

const fast = await compare(['--prefill-tok-s', '1000000', '--decode-tok-s', '100000'], true);
const modelTime = await compare([], false);
const result = {
  ...fast,
  modelTimeEngine: modelTime,
  settings: {
    connections: CONNECTIONS, seconds: SECONDS, request: 'POST /v1/completions, 80-word prompt, max_tokens 1', node: process.version,
    engines: 'top level: mock engine at 1,000,000 prefill / 100,000 decode tok/s (HTTP only); modelTimeEngine: default 20,000 / 200 tok/s',
    processes: 'engine, router and load generator in three processes sharing the machine',
    latencyResolution: 'autocannon records whole milliseconds',
  },
};
if (flags.has('json')) process.stdout.write(`${JSON.stringify(result)}\n`);
else console.log(result);
