/**
 * A gateway as another gateway's worker (tiers of routers): the front gateway's active health
 * check polls `/health`, as it does on vLLM and SGLang, and the gateway behind answers it by its
 * own readiness: 200 while one of its workers can take requests, 503 when none can.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { HealthChecker, WorkerHealth } from '../../src/engines/health.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';

test("a gateway passes another gateway's health check while it can serve, and fails it when it cannot", async () => {
  const engine = await new MockEngine().start();
  const behind = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url: `http://127.0.0.1:${engine.port}` }],
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  const base = await behind.app.listen({ host: '127.0.0.1', port: 0 });
  const front = new KVAwareRouter();
  front.registerWorker('behind');
  const checker = new HealthChecker(new WorkerHealth(front), { intervalMs: 1000 });
  checker.add('behind', base);

  await checker.probeAll();
  assert.equal(checker.state('behind')!.failures, 0, checker.state('behind')!.lastError);
  assert.equal(front.listWorkers().find((w) => w.id === 'behind')?.available, true);

  // its only worker leaves: it can serve nothing, and says so
  assert.ok(behind.removeWorker('e'));
  await checker.probeAll();
  await checker.probeAll();
  assert.equal(checker.state('behind')!.lastError, 'HTTP 503');
  assert.equal(front.listWorkers().find((w) => w.id === 'behind')?.available, false);

  checker.stop();
  await behind.close();
  await engine.close();
});
