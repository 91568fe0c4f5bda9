/**
 * A worker held out only by probes that timed out keeps its unanswered requests for a grace
 * period (slowProbeGraceMs) before they may move: each outage has a whole one. setTimeout is a
 * fake clock the test advances by hand, so the grace period is seen as the clock it needs,
 * never as wall time.
 */
import assert from 'node:assert/strict';
import { mock, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { WorkerHealth } from '../../src/engines/health.js';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { slowProbeGraceMs, WorkerConnections } from '../../src/server/worker-connections.js';

/** Two workers, a and b, with no health check, scrape or model listing of their own: the test gives the verdicts. */
function twoWorkers() {
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const health = new WorkerHealth(router);
  const connections = new WorkerConnections({
    router,
    applier: new KvEventApplier(router),
    health,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    modelsIntervalMs: 0,
    log: () => {},
    env: {},
  });
  // nothing listens there: the model listing read at the start finds nothing
  connections.add({ id: 'a', url: 'http://127.0.0.1:9' });
  connections.add({ id: 'b', url: 'http://127.0.0.1:9' });
  let moved = 0;
  connections.get('a')!.unanswered.add({
    model: undefined,
    excluded: new Set(),
    lastAttempt: false,
    workerOut: () => moved++,
  });
  return { health, connections, moved: () => moved };
}

const TIMED_OUT = 'The operation was aborted due to timeout';

test('a worker out by slow probes, back, then out again within the grace period keeps its request a whole grace period from the second outage', async (t) => {
  mock.timers.enable({ apis: ['setTimeout'] });
  const w = twoWorkers();
  t.after(async () => {
    mock.timers.reset();
    await w.connections.close();
  });
  const grace = slowProbeGraceMs(0);
  w.health.set('a', 'health-check', false, TIMED_OUT);
  mock.timers.tick(grace / 2);
  w.health.set('a', 'health-check', true);
  w.health.set('a', 'health-check', false, TIMED_OUT);
  mock.timers.tick(grace / 2);
  assert.equal(w.moved(), 0, "the first outage's grace period does not decide for the second");
  mock.timers.tick(grace / 2);
  assert.equal(w.moved(), 1, "moved at the end of the second outage's grace period");
});

test('a worker out by slow probes and back within the grace period keeps its request', async (t) => {
  mock.timers.enable({ apis: ['setTimeout'] });
  const w = twoWorkers();
  t.after(async () => {
    mock.timers.reset();
    await w.connections.close();
  });
  const grace = slowProbeGraceMs(0);
  w.health.set('a', 'health-check', false, TIMED_OUT);
  mock.timers.tick(grace / 2);
  w.health.set('a', 'health-check', true);
  mock.timers.tick(grace);
  assert.equal(w.moved(), 0, 'back in rotation: nothing to move');
});
