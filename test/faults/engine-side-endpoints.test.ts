/**
 * Engines whose side endpoints (/v1/models, /tokenize, /metrics, /health) answer without end
 * or far too much: a body that trickles forever, never stops coming or is enormous. The router
 * reads each within a bound of time and size, and a client request never waits on one for long.
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { HealthChecker, WorkerHealth } from '../../src/engines/health.js';
import { MetricsScraper } from '../../src/engines/metrics/scraper.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { post } from './harness.js';
import { until } from '../helpers/wait.js';

const MiB = 1024 * 1024;
const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0, adminToken: 'fault-suite-admin' };

/**
 * Worker `w` at `url`: its /metrics scraped once, then its /health probed once, each with a
 * 30 s deadline and one failure enough to take it out of rotation.
 */
async function scrapedAndProbed(url: string) {
  const router = new KVAwareRouter();
  router.registerWorker('w');
  const health = new WorkerHealth(router);
  const scraper = new MetricsScraper(router, [{ workerId: 'w', url: `${url}/metrics` }], {
    timeoutMs: 30_000,
    failuresToUnhealthy: 1,
    health,
  });
  await scraper.scrapeAll();
  const checker = new HealthChecker(health, { timeoutMs: 30_000, failuresToUnhealthy: 1 });
  checker.add('w', url);
  await checker.probeAll();
  return { router, health, scraper, checker };
}

/** Writes `opening` then spaces as fast as the reader takes them, until the connection closes; resolves to the bytes written. */
function endless(res: ServerResponse, opening: string): Promise<number> {
  return new Promise((resolve) => {
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    let written = 0;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write(opening);
    const pump = () => {
      while (!res.destroyed) {
        written += chunk.length;
        if (!res.write(chunk)) return void res.once('drain', pump);
      }
    };
    res.on('close', () => resolve(written));
    pump();
  });
}

/** An engine whose `path` answers without end; every other path 404. */
async function endlessEngine(path: string) {
  let closed: Promise<number> | undefined;
  const server = createServer((req, res) => {
    req.resume();
    if (req.url !== path) return void res.writeHead(404).end();
    closed = endless(res, '{"data":[');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    /** Bytes written to the first request on `path` once the router dropped it (Infinity: not within 10 s). */
    dropped: async () => {
      await until(() => closed !== undefined, `a request on ${path}`);
      return Promise.race([closed!, new Promise<number>((r) => setTimeout(() => r(Infinity), 10_000).unref())]);
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

test('an endless /v1/models answer is dropped after a few MiB', async () => {
  const engine = await endlessEngine('/v1/models');
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'w', url: engine.url }],
    ...quiet,
  });
  const written = await engine.dropped();
  assert.ok(written < 32 * MiB, `the router stopped reading at its bound (${(written / MiB).toFixed(0)} MiB written)`);
  await gateway.close();
  await engine.close();
});

test('a /tokenize answer that trickles forever does not hold the client: another engine tokenizes', async () => {
  const trickling = createServer((req, res) => {
    req.resume();
    // its completions fail (so they move to the good engine); its /tokenize trickles
    if (req.url === '/v1/completions') return void res.writeHead(500).end();
    if (req.url !== '/tokenize') return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"tokens":[1');
    // a byte well within undici's body timeout each time: only a deadline on the whole body ends it
    const timer = setInterval(() => res.write(',1'), 200);
    res.on('close', () => clearInterval(timer));
  });
  await new Promise<void>((r) => trickling.listen(0, '127.0.0.1', r));
  const good = await new MockEngine().start();
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    tokenize: 'engine',
    workers: [
      { id: 'trickle', url: `http://127.0.0.1:${(trickling.address() as AddressInfo).port}` },
      { id: 'good', url: `http://127.0.0.1:${good.port}` },
    ],
    ...quiet,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const answer = await Promise.race([
    post(base, '/v1/completions', { prompt: 'hello there', max_tokens: 1 }),
    new Promise<undefined>((r) => setTimeout(() => r(undefined), 15_000).unref()),
  ]);
  assert.ok(answer, 'the request was answered within 15 s');
  assert.equal(answer.status, 200);
  await gateway.close();
  trickling.closeAllConnections();
  await new Promise<void>((r) => trickling.close(() => r()));
  await good.close();
});

test('a /metrics page over 16 MiB is not read as load, and a /health answer over 64 KiB fails the check', async () => {
  // whole answers, quickly sent: the page's last line would set the waiting queue
  const padding = `# ${'x'.repeat(1022)}\n`.repeat(20 * 1024);
  const server = createServer((req, res) => {
    req.resume();
    if (req.url === '/metrics') return void res.end(`${padding}vllm:num_requests_waiting 7\n`);
    if (req.url === '/health') return void res.end(Buffer.alloc(MiB, 0x20));
    res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  // deadlines far longer than reading the answers takes: only their size can fail them
  const { router, health, scraper, checker } = await scrapedAndProbed(url);
  assert.match(scraper.state('w')!.lastError ?? '', /larger than 16777216 bytes/);
  assert.equal(router.listWorkers()[0].waitingRequests, 0, 'nothing of the oversized page was taken');
  assert.match(checker.state('w')!.lastError ?? '', /larger than 65536 bytes/);
  assert.deepEqual(health.reasons('w').sort(), ['health-check', 'metrics']);
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

test("a client's /v1/models: an endless answer does not hold it, and malformed entries are left out", async () => {
  const endlessModels = await endlessEngine('/v1/models');
  const odd = createServer((req, res) => {
    req.resume();
    if (req.url !== '/v1/models') return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({
        object: 'list',
        data: [
          null,
          'a-string',
          7,
          [],
          {},
          { id: 3 },
          { id: '' },
          { id: 'x'.repeat(2000) },
          { id: 'odd-model', object: 'model' },
        ],
      }),
    );
  });
  await new Promise<void>((r) => odd.listen(0, '127.0.0.1', r));
  const listless = createServer((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ data: 'not a list' }));
  });
  await new Promise<void>((r) => listless.listen(0, '127.0.0.1', r));
  const good = await new MockEngine().start();
  const url = (s: ReturnType<typeof createServer>) => `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [
      { id: 'endless', url: endlessModels.url },
      { id: 'odd', url: url(odd) },
      { id: 'listless', url: url(listless) },
      { id: 'good', url: `http://127.0.0.1:${good.port}` },
    ],
    ...quiet,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const answer = await Promise.race([
    fetch(`${base}/v1/models`),
    new Promise<undefined>((r) => setTimeout(() => r(undefined), 15_000).unref()),
  ]);
  assert.ok(answer, 'answered within 15 s');
  assert.equal(answer.status, 200);
  const ids = ((await answer.json()) as { data: Array<{ id: unknown }> }).data.map((m) => m.id);
  assert.deepEqual(ids.filter((id) => id !== good.model).sort(), ['odd-model']);
  assert.ok(ids.includes(good.model), "the good engine's model is listed");
  await gateway.close();
  for (const s of [odd, listless]) {
    s.closeAllConnections();
    await new Promise<void>((r) => s.close(() => r()));
  }
  await endlessModels.close();
  await good.close();
});

test('a /health or /metrics answering with a redirect fails the check, as the redirect fails a proxied request', async () => {
  // a worker URL that is not the engine's own (http behind an ingress that wants https, say):
  // the gateway follows no redirect of a proxied request, so the checks must not call it healthy
  const target = createServer((req, res) => {
    req.resume();
    if (req.url === '/metrics') return void res.end('vllm:num_requests_waiting 7\n');
    res.end();
  });
  await new Promise<void>((r) => target.listen(0, '127.0.0.1', r));
  const targetUrl = `http://127.0.0.1:${(target.address() as AddressInfo).port}`;
  const redirecting = createServer((req, res) => {
    req.resume();
    res.writeHead(301, { location: `${targetUrl}${req.url}` }).end();
  });
  await new Promise<void>((r) => redirecting.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(redirecting.address() as AddressInfo).port}`;
  const { router, health, scraper, checker } = await scrapedAndProbed(url);
  assert.equal(scraper.state('w')!.lastError, 'HTTP 301');
  assert.equal(router.listWorkers()[0].waitingRequests, 0, 'nothing of the page redirected to was taken');
  assert.equal(checker.state('w')!.lastError, 'HTTP 301');
  assert.deepEqual(health.reasons('w').sort(), ['health-check', 'metrics']);
  for (const server of [target, redirecting]) {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});

test('a /metrics answering with an error leaves no connection open behind it, even when the error body never ends', async () => {
  // SGLang without --enable-metrics answers /metrics 404; a proxy's error page may stream without end
  let open = 0;
  const server = createServer((req, res) => {
    req.resume();
    res.writeHead(404, { 'content-type': 'text/plain' });
    const chunk = Buffer.alloc(64 * 1024, 0x78);
    const pump = () => {
      while (!res.destroyed) if (!res.write(chunk)) return void res.once('drain', pump);
    };
    pump();
  });
  server.on('connection', (socket) => {
    open++;
    socket.on('close', () => open--);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const router = new KVAwareRouter();
  router.registerWorker('w');
  // a scrape's deadline far longer than the test waits: only letting go of the answer closes its connection
  const scraper = new MetricsScraper(router, [{ workerId: 'w', url: `${url}/metrics` }], { timeoutMs: 60_000 });
  try {
    for (let i = 0; i < 5; i++) await scraper.scrapeAll();
    assert.equal(scraper.state('w')!.lastError, 'HTTP 404');
    await until(() => open === 0, `the scrapes' connections to close (${open} open)`);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
