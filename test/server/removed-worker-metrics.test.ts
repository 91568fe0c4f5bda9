/**
 * A removed worker's series leave /metrics: its counters (failures, retries, connection waits)
 * as well as its gauges, for each of its data-parallel ranks. Workers that come and go (DNS
 * discovery, the admin API) must not grow the page, and the scrape's cardinality, for good.
 */
import assert from 'node:assert/strict';
import { createServer as createHttpServer } from 'node:http';
import { createServer, type AddressInfo } from 'node:net';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { settled } from '../helpers/wait.js';

/** A port nothing listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

test("a removed worker's counters leave /metrics with its gauges, for every rank", async () => {
  const engine = await new MockEngine().start();
  const adminToken = 'removed-worker-metrics-admin';
  // what `serve --processes N` tells the primary, which keeps stopped processes' counts
  const forgotten: string[] = [];
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 16 }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    breakerFailures: 1000,
    workers: [{ id: 'good', url: `http://127.0.0.1:${engine.port}` }],
    workerMetricsForgotten: (id) => forgotten.push(id),
  });
  const admin = { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` };
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const scrape = async () => (await (await fetch(`${base}/metrics`)).text()).split('\n');
    const deadPort = await closedPort();
    for (let cycle = 0; cycle < 3; cycle++) {
      const add = await fetch(`${base}/admin/workers`, {
        method: 'POST',
        headers: admin,
        body: JSON.stringify({ id: 'gone', url: `http://127.0.0.1:${deadPort}`, dpSize: 2 }),
      });
      assert.equal(add.status, 201, await add.text());
      // its ranks fail each request, the good worker answers it on a retry
      const lines = await settled(
        async () => {
          const r = await fetch(`${base}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ prompt: `cycle ${cycle} ${Math.random()}`, max_tokens: 1 }),
          });
          await r.text();
          return scrape();
        },
        (page) =>
          page.some((l) => l.startsWith('contextforge_upstream_failures_total{worker="gone#')) &&
          page.some((l) => l.startsWith('contextforge_upstream_retries_total{worker="gone#')),
      );
      assert.ok(
        lines.some((l) => l.startsWith('contextforge_upstream_failures_total{worker="gone#')),
        'the failures were counted',
      );
      forgotten.length = 0;
      const del = await fetch(`${base}/admin/workers/gone`, { method: 'DELETE', headers: admin });
      assert.equal(del.status, 200, await del.text());
      assert.deepEqual(forgotten.sort(), ['gone#0', 'gone#1'], 'every rank is said to be forgotten');
      const after = await scrape();
      assert.deepEqual(
        after.filter((l) => l.includes('worker="gone')),
        [],
        'no series of the removed worker stays',
      );
      assert.ok(
        after.some((l) => l.includes('worker="good"')),
        "the other worker's series stay",
      );
    }
  } finally {
    await gateway.close();
    await engine.close();
  }
});

test('a worker removed and added again under its id starts from the first-byte allowance, not from what it taught', async () => {
  // an engine that sends a stream's first event 300 ms after the request, and then ends it
  const engine = createHttpServer((req, res) => {
    req.resume();
    if (req.method !== 'POST') return void res.writeHead(404).end();
    req.on('end', () =>
      setTimeout(() => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end('data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"a"}]}\n\ndata: [DONE]\n\n');
      }, 300),
    );
  });
  await new Promise<void>((resolve) => engine.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
  const adminToken = 'first-byte-forgotten-admin';
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 16 }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    timeouts: { firstByteTimeoutMs: 1000, interChunkTimeoutMs: 60_000 },
    workers: [{ id: 'w', url }],
  });
  const admin = { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` };
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const deadline = async () => {
      const listed = (await (await fetch(`${base}/admin/workers`, { headers: admin })).json()) as {
        workers: Array<{ id: string; firstByteDeadlineMs: number }>;
      };
      return listed.workers.find((w) => w.id === 'w')?.firstByteDeadlineMs;
    };
    assert.equal(await deadline(), 1000, 'a worker not yet heard: the allowance');
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'slow first byte', max_tokens: 2, stream: true }),
    });
    assert.equal(res.status, 200);
    await res.text();
    // twice a mean of at least 300 ms, plus the allowance
    assert.ok((await deadline())! >= 1600, `learned: ${await deadline()}`);
    assert.equal((await fetch(`${base}/admin/workers/w`, { method: 'DELETE', headers: admin })).status, 200);
    const added = await fetch(`${base}/admin/workers`, {
      method: 'POST',
      headers: admin,
      body: JSON.stringify({ id: 'w', url }),
    });
    assert.equal(added.status, 201);
    assert.equal(await deadline(), 1000, 'added again: the allowance');
  } finally {
    await gateway.close();
    engine.closeAllConnections();
    await new Promise<void>((resolve) => engine.close(() => resolve()));
  }
});
