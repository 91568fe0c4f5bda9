/**
 * A removed worker's series leave /metrics: its counters (failures, retries, connection waits)
 * as well as its gauges, for each of its data-parallel ranks. Workers that come and go (DNS
 * discovery, the admin API) must not grow the page, and the scrape's cardinality, for good.
 */
import assert from 'node:assert/strict';
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
  const gateway = await createGateway({
    adminToken,
    router: new KVAwareRouter({ blockSize: 16 }),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    breakerFailures: 1000,
    workers: [{ id: 'good', url: `http://127.0.0.1:${engine.port}` }],
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
      const del = await fetch(`${base}/admin/workers/gone`, { method: 'DELETE', headers: admin });
      assert.equal(del.status, 200, await del.text());
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
