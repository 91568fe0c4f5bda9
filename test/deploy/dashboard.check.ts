import assert from 'node:assert/strict';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { startPicker, type RunningPicker } from '../../src/epp/run-picker.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { startLoopbackEnvoy, type LoopbackEnvoy } from '../epp/loopback-envoy.js';
import { freePort } from '../helpers/workflow-replay.js';
import { until } from '../helpers/wait.js';

// Every query of the Grafana dashboard, run by a real Prometheus against the router's own
// /metrics: a gateway with the endpoint picker beside it, engines publishing KV events, one
// worker that fails, one whose streams break off after their first event, traffic through both the OpenAI API and a loopback Envoy. Prometheus
// (Debian's package) scrapes it every second; promtool runs each panel's expression with the
// dashboard's variables filled in, and each must return series. Run by
// scripts/ci-deploy-checks.sh (it needs prometheus and promtool).

const exec = promisify(execFile);
const root = new URL('../../', import.meta.url).pathname;
const dashboard = JSON.parse(readFileSync(`${root}deploy/grafana/contextforge-router.json`, 'utf8')) as {
  uid: string;
  panels: Array<{ id: number; type: string; title: string; gridPos: { x: number; w: number }; targets?: Array<{ refId: string; expr: string }> }>;
  templating: { list: Array<{ name: string }> };
};

const engines: MockEngine[] = [];
let gateway: Gateway;
let picker: RunningPicker;
let envoy: LoopbackEnvoy;
let gatewayUrl = '';
let prometheus: ChildProcess | undefined;
let promUrl = '';
let dataDir = '';
let traffic: NodeJS.Timeout | undefined;
/** An engine that answers a streamed completion with its first event, then breaks the connection. */
let cutEngine: Server | undefined;


let n = 0;
async function sendTraffic(): Promise<void> {
  n++;
  const prompt = `Shared instructions for the dashboard check. `.repeat(20) + `request ${n % 7}`;
  await Promise.all([
    fetch(`${gatewayUrl}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'mock', prompt, max_tokens: 4 }) }).then((r) => r.arrayBuffer()),
    fetch(`${envoy.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'mock', messages: [{ role: 'user', content: prompt }], max_tokens: 4, stream: true }) }).then((r) => r.arrayBuffer()),
    // a malformed request: the picker answers 400 (an outcome series)
    fetch(`${envoy.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{' }).then((r) => r.arrayBuffer()),
  ]).catch(() => undefined);
}

before(async () => {
  for (let i = 0; i < 2; i++) engines.push(await new MockEngine({ decodeTokS: 4000, events: 'tcp://127.0.0.1:*', replay: 'tcp://127.0.0.1:*' }).start());
  const deadPorts = [await freePort(), await freePort()];
  cutEngine = createServer((req, res) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"index":0,"text":"a"}]}\n\n', () => setImmediate(() => res.socket?.destroy()));
    });
  });
  await new Promise<void>((r) => cutEngine!.listen(0, '127.0.0.1', r));
  const cutPort = (cutEngine.address() as AddressInfo).port;
  gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16, indexMode: 'precise' }),
    workers: [
      ...engines.map((e, i) => ({ id: `engine-${i}`, url: `http://127.0.0.1:${e.port}`, events: e.eventsEndpoint, replay: e.replayEndpoint })),
      // nothing serves requests on these two (their load metrics come from live engines):
      // upstream failures, retries and the circuit breaker have something to show
      ...deadPorts.map((port, i) => ({
        id: `engine-down-${i}`,
        url: `http://127.0.0.1:${port}`,
        metrics: `http://127.0.0.1:${engines[i].port}/metrics`,
      })),
      // a stream on this one fails after its first event (a failure after the first byte)
      { id: 'engine-cut', url: `http://127.0.0.1:${cutPort}`, metrics: `http://127.0.0.1:${engines[0].port}/metrics` },
    ],
    tokenize: 'engine', kvEvents: true, metricsIntervalMs: 250, healthCheckIntervalMs: 0, breakerFailures: 1, breakerCooldownMs: 600_000,
  });
  gatewayUrl = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  picker = await startPicker(gateway, { shedQueueDepth: 5, shedKvUsage: 0.8, eppFallbacks: 2, bodyLimit: 1 << 20 }, { host: '127.0.0.1', port: 0, log: () => {} });
  envoy = await startLoopbackEnvoy({ extProc: `127.0.0.1:${String(picker.eppPort)}` });
  // one request that can only go to the failing workers: it fails on one, is retried on the
  // other (a retry counts once another worker takes it), fails again, and opens both circuits
  for (const e of ['engine-0', 'engine-1', 'engine-cut']) gateway.router.drainWorker(e);
  await fetch(`${gatewayUrl}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'mock', prompt: 'x', max_tokens: 1 }) }).then((r) => r.arrayBuffer());
  // then one stream that only the breaking worker can take: it fails mid-stream and opens its circuit
  gateway.router.resumeWorker('engine-cut');
  await fetch(`${gatewayUrl}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'mock', prompt: 'x', max_tokens: 1, stream: true }) }).then((r) => r.arrayBuffer());
  for (const e of ['engine-0', 'engine-1']) gateway.router.resumeWorker(e);
  for (let i = 0; i < 5; i++) await sendTraffic();
  traffic = setInterval(() => void sendTraffic(), 200);

  const promPort = await freePort();
  promUrl = `http://127.0.0.1:${promPort}`;
  dataDir = mkdtempSync(`${tmpdir()}/cf-prometheus-`);
  const target = new URL(gatewayUrl).host;
  writeFileSync(`${dataDir}/prometheus.yml`, `global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: contextforge-router\n    static_configs:\n      - targets: ['${target}']\n`);
  prometheus = spawn('prometheus', [`--config.file=${dataDir}/prometheus.yml`, `--storage.tsdb.path=${dataDir}/data`, `--web.listen-address=127.0.0.1:${promPort}`], { stdio: 'ignore' });
  // a handful of scrapes, so rates over the dashboard's range have points
  // until Prometheus listens, promtool's query fails: that is "not yet", not an error
  await until(async () => {
    try {
      const { stdout } = await exec('promtool', ['query', 'instant', '-o', 'json', promUrl, 'count_over_time(contextforge_index_entries[1m])']);
      const r = JSON.parse(stdout) as Array<{ value: [number, string] }>;
      return r.length > 0 && Number(r[0].value[1]) >= 6;
    } catch {
      return false;
    }
  }, 'Prometheus to scrape the router six times', { timeoutMs: 30_000, intervalMs: 100 });
});

after(async () => {
  if (traffic) clearInterval(traffic);
  prometheus?.kill('SIGTERM');
  await envoy?.close();
  await picker?.close();
  await gateway?.close();
  for (const e of engines) await e.close();
  if (cutEngine) {
    cutEngine.closeAllConnections();
    await new Promise<void>((r) => cutEngine!.close(() => r()));
  }
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

/** The panel queries, with the dashboard's variables as Grafana fills them for "All" over a short range. */
const queries = () => dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => ({
  panel: p.title,
  ref: t.refId,
  expr: t.expr.replaceAll('$__rate_interval', '15s').replaceAll('$__interval', '1s').replaceAll('$instance', '.*'),
})));

test('the dashboard is well formed: unique ids, a 24-column grid, a Prometheus data source variable', () => {
  const ids = dashboard.panels.map((p) => p.id);
  assert.equal(new Set(ids).size, ids.length);
  for (const p of dashboard.panels) assert.ok(p.gridPos.x + p.gridPos.w <= 24, `${p.title} fits the grid`);
  assert.ok(dashboard.templating.list.some((v) => v.name === 'datasource'));
  assert.ok(queries().length >= 15);
  const titles = dashboard.panels.map((p) => p.title.toLowerCase()).join(' | ');
  for (const need of ['hit rate', 'first byte', 'decisions by reason', 'kv-cache usage', 'in-flight', 'availability', 'lag', 'breaker']) assert.ok(titles.includes(need), `a panel for ${need}`);
});

test('promtool check metrics: the router\'s /metrics passes the linter', async () => {
  const text = await (await fetch(`${gatewayUrl}/metrics`)).text();
  const child = spawn('promtool', ['check', 'metrics'], { stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  child.stdin.end(text);
  const code = await new Promise<number>((r) => child.on('close', (c) => r(c ?? 1)));
  assert.equal(code, 0, out);
});

test('every metric a panel reads is in the router\'s /metrics output', async () => {
  const text = await (await fetch(`${gatewayUrl}/metrics`)).text();
  const exposed = new Set([...text.matchAll(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)/gm)].map((m) => m[1]));
  for (const q of queries()) {
    for (const m of q.expr.matchAll(/\b(contextforge_[a-z0-9_]+)/g)) assert.ok(exposed.has(m[1]), `${q.panel} (${q.ref}) reads ${m[1]}, which /metrics does not expose`);
  }
});

test('every panel query returns series from Prometheus scraping the router', async () => {
  // as a panel shows it: over a time range (the last minute, 1 s steps), so one scrape that a
  // busy machine made miss its deadline does not blank an instant
  const end = Math.floor(Date.now() / 1000);
  const empty: string[] = [];
  for (const q of queries()) {
    const { stdout } = await exec('promtool', ['query', 'range', '-o', 'json', `--start=${end - 60}`, `--end=${end}`, '--step=1s', promUrl, q.expr]).catch((err: Error & { stderr?: string }) => {
      throw new Error(`${q.panel} (${q.ref}): promtool rejected ${q.expr}: ${err.stderr ?? err.message}`);
    });
    const result = JSON.parse(stdout) as Array<{ metric: Record<string, string>; values: Array<[number, string]> }>;
    if (!result.some((series) => series.values.length > 0)) empty.push(`${q.panel} (${q.ref}): ${q.expr}`);
  }
  assert.deepEqual(empty, [], 'queries without series');
});
