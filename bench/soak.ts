/**
 * bench:soak — the gateway under a long run of requests while its engines fail at random:
 * 100,000 requests (streamed and not, with shared prefixes, workflows and client aborts)
 * through `contextforge-router serve` (its own process, the real CLI) in front of three
 * `mock-engine` processes that are killed (SIGKILL) and restarted on the same port (empty
 * cache), and a fourth engine
 * that answers 500 or hangs on a fraction of its requests. Reports the requests that failed
 * (non-streamed ones must not: a failure before the first byte is retried elsewhere; a stream
 * cut by an engine's death ends with an SSE error event and is counted apart), the router's
 * resident memory after warm-up and at the end (it must stay flat: within 10%), and the block
 * index's size. A benchmark, not a test: it takes minutes.
 *
 *   npm run bench:soak -- --json [--requests 100000] [--concurrency 32] [--seed 1]
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, mkdtempSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { benchFlags, intFlag, round } from './stats.js';

const flags = benchFlags(process.argv.slice(2), {
  json: 'switch',
  requests: 'value',
  concurrency: 'value',
  seed: 'value',
  log: 'value',
});
const REQUESTS = intFlag(flags, 'requests', 100_000);
const CONCURRENCY = intFlag(flags, 'concurrency', 32);
const WARMUP = Math.min(5_000, Math.floor(REQUESTS / 10));
/** --log FILE: the router's own log lines (health changes, event-stream notes) go there. */
const LOG = typeof flags.get('log') === 'string' ? (flags.get('log') as string) : undefined;
let seed = intFlag(flags, 'seed', 1) >>> 0 || 1;
/** xorshift32: the same faults and requests for the same --seed. */
const random = () => {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 2 ** 32;
};

function startCli(args: string[], pattern: RegExp): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  return new Promise((resolve, reject) => {
    child.stderr!.on('data', (d: Buffer) => {
      if (LOG) appendFileSync(LOG, d);
      stderr += d.toString();
      const m = pattern.exec(stderr);
      if (m) resolve({ child, url: m[1] });
      if (stderr.length > 1 << 16) stderr = stderr.slice(-4096);
    });
    child.once('exit', (code) => reject(new Error(`${args[0]} exited ${code}: ${stderr}`)));
  });
}

/** Resident memory of a process in MB (Linux /proc). */
function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

/** A mock engine in its own process on a fixed port, which the fault schedule kills (SIGKILL) and restarts. */
class Engine {
  child: ChildProcess | undefined;
  port = 0;
  async start() {
    const { child, url } = await startCli(
      ['mock-engine', '--port', String(this.port), '--prefill-tok-s', '2000000', '--decode-tok-s', '20000'],
      /on (http:\/\/[\d.]+:\d+)/,
    );
    this.child = child;
    this.port = Number(new URL(url).port);
    return this;
  }
  async kill() {
    const child = this.child;
    if (!child) return;
    this.child = undefined;
    child.removeAllListeners('exit');
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGKILL');
    await exited;
  }
}

/** An engine that answers like an OpenAI server, except for 500s and hangs on a fraction of requests. */
async function flakyEngine(
  failRate: number,
  hangRate: number,
): Promise<{ url: string; server: Server; failed: number; hung: number }> {
  const out = { url: '', server: undefined as unknown as Server, failed: 0, hung: 0 };
  out.server = createServer((req, res) => {
    if (req.url === '/health') return void res.writeHead(200).end();
    if (req.url === '/metrics')
      return void res
        .writeHead(200, { 'content-type': 'text/plain' })
        .end('vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n');
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      const r = random();
      if (r < hangRate) return void out.hung++;
      if (r < hangRate + failRate) {
        out.failed++;
        return void res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"flaky"}}');
      }
      const stream = body.includes('"stream":true');
      if (stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {"id":"f","object":"text_completion","choices":[{"index":0,"text":"ok"}]}\n\n');
        res.end('data: [DONE]\n\n');
      } else
        res
          .writeHead(200, { 'content-type': 'application/json' })
          .end(
            '{"id":"f","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}',
          );
    });
  });
  await new Promise<void>((r) => out.server.listen(0, '127.0.0.1', r));
  out.url = `http://127.0.0.1:${(out.server.address() as AddressInfo).port}`;
  return out;
}

const prefixes = Array.from({ length: 50 }, (_, i) => `System prompt ${i}: ` + `rule ${i} `.repeat(40));

interface Tally {
  done: number;
  ok: number;
  failedNonStreamed: number;
  failedStreamsBeforeFirstByte: number;
  streamsEndedWithError: number;
  aborted: number;
  statuses: Record<string, number>;
}

async function oneRequest(base: string, i: number, t: Tally): Promise<void> {
  const stream = random() < 0.2;
  const abort = random() < 0.02;
  const prefix = prefixes[Math.floor(random() * prefixes.length)];
  const body = JSON.stringify({
    model: 'mock',
    prompt: `${prefix} question ${i}`,
    max_tokens: 4,
    stream,
    contextforge: { workflowId: `wf-${i % 500}`, workflowStep: i % 4 },
  });
  const ac = new AbortController();
  if (abort) setTimeout(() => ac.abort(), Math.floor(random() * 20));
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
      signal: ac.signal,
    });
    const text = await res.text();
    t.statuses[res.status] = (t.statuses[res.status] ?? 0) + 1;
    if (res.status !== 200) {
      if (stream) t.failedStreamsBeforeFirstByte++;
      else t.failedNonStreamed++;
    } else if (stream && /"error"/.test(text)) t.streamsEndedWithError++;
    else t.ok++;
  } catch (err) {
    if (abort && ac.signal.aborted) t.aborted++;
    else if (stream) t.streamsEndedWithError++;
    else {
      t.failedNonStreamed++;
      // no HTTP answer at all: name the cause (e.g. UND_ERR_SOCKET, ECONNRESET)
      const cause = (err as Error & { cause?: { code?: string; message?: string } }).cause;
      const key = `${(err as Error).name}: ${cause?.code ?? cause?.message ?? (err as Error).message}`;
      t.statuses[key] = (t.statuses[key] ?? 0) + 1;
    }
  }
  t.done++;
}

async function indexEntries(base: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  return Number(/^contextforge_index_entries (\d+)/m.exec(text)?.[1] ?? NaN);
}

async function main() {
  const engines = await Promise.all([0, 1, 2].map(() => new Engine().start()));
  const flaky = await flakyEngine(0.05, 0.01);
  const dir = mkdtempSync(join(tmpdir(), 'cf-soak-'));
  const workers = [...engines.map((e, i) => `id=e${i},url=http://127.0.0.1:${e.port}`), `id=flaky,url=${flaky.url}`];
  const gateway = await startCli(
    [
      'serve',
      '--port',
      '0',
      '--admin-token-file',
      join(dir, 'admin-token'),
      '--health-interval-ms',
      '1000',
      '--metrics-interval-ms',
      '1000',
      '--first-byte-timeout-ms',
      '2000',
      '--upstream-timeout-ms',
      '5000',
      '--breaker-cooldown-ms',
      '2000',
      ...workers.flatMap((w) => ['--worker', w]),
    ],
    /serving on (http:\/\/[\d.]+:\d+)/,
  );
  const pid = gateway.child.pid!;
  const t: Tally = {
    done: 0,
    ok: 0,
    failedNonStreamed: 0,
    failedStreamsBeforeFirstByte: 0,
    streamsEndedWithError: 0,
    aborted: 0,
    statuses: {},
  };
  let next = 0;
  let rssStart = NaN;
  const kills = { engineKills: 0 };
  // the fault schedule: every 0.5-2 s one engine is killed, and comes back (empty) 0.3-1.3 s later
  let running = true;
  const faults = (async () => {
    while (running) {
      await new Promise((r) => setTimeout(r, 500 + random() * 1500));
      if (!running) break;
      const e = engines[Math.floor(random() * engines.length)];
      if (!e.child) continue;
      await e.kill();
      kills.engineKills++;
      await new Promise((r) => setTimeout(r, 300 + random() * 1000));
      await e.start();
    }
  })();
  const started = performance.now();
  const loop = async () => {
    while (next < REQUESTS) {
      const i = next++;
      await oneRequest(gateway.url, i, t);
      if (t.done === WARMUP && Number.isNaN(rssStart)) rssStart = rssMb(pid);
      if (t.done % 10_000 === 0) process.stderr.write(`${t.done} requests, rss ${round(rssMb(pid), 1)} MB\n`);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, loop));
  const seconds = (performance.now() - started) / 1000;
  running = false;
  await faults;
  const rssEnd = rssMb(pid);
  const entries = await indexEntries(gateway.url);
  const result = {
    requests: t.done,
    seconds: round(seconds, 1),
    failedRequests: t.failedNonStreamed + t.failedStreamsBeforeFirstByte,
    failedNonStreamed: t.failedNonStreamed,
    failedStreamsBeforeFirstByte: t.failedStreamsBeforeFirstByte,
    streamsEndedWithError: t.streamsEndedWithError,
    clientAborts: t.aborted,
    statuses: t.statuses,
    rssStartMb: round(rssStart, 1),
    rssEndMb: round(rssEnd, 1),
    rssGrowth: round(rssEnd / rssStart - 1, 3),
    rssFlatWithin10Percent: rssEnd <= rssStart * 1.1,
    indexEntries: entries,
    faults: { engineKills: kills.engineKills, flaky500s: flaky.failed, flakyHangs: flaky.hung },
    settings: {
      requests: REQUESTS,
      concurrency: CONCURRENCY,
      warmup: WARMUP,
      streamedShare: 0.2,
      clientAbortShare: 0.02,
      engines: 3,
      flakyEngine: { failRate: 0.05, hangRate: 0.01 },
    },
  };
  gateway.child.kill('SIGTERM');
  for (const e of engines) await e.kill();
  flaky.server.closeAllConnections();
  flaky.server.close();
  if (flags.has('json')) process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
  else for (const [k, v] of Object.entries(result)) process.stdout.write(`${k}: ${JSON.stringify(v)}\n`);
}

main().catch((err) => {
  process.stderr.write(`${(err as Error).stack}\n`);
  process.exit(1);
});
