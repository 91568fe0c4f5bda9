/**
 * What WorkerHealth keeps of a worker: a verdict that comes after the worker was removed (a probe
 * or a metrics scrape under way then, failing afterwards) is not kept, so the worker added again
 * under its id starts afresh: held out until its first health check, and out again when it fails.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { WorkerHealth } from '../../src/engines/health.js';
import { KVAwareRouter } from '../../src/index.js';

test('a verdict on a removed worker is not kept for the worker added again under its id', () => {
  const router = new KVAwareRouter();
  const health = new WorkerHealth(router);
  const available = () => router.listWorkers().find((w) => w.id === 'w')?.available;
  router.registerWorker('w', { url: 'http://127.0.0.1:1' });
  health.set('w', 'metrics', true);
  // removed as WorkerConnections.remove() removes it; a scrape under way fails afterwards
  health.forget('w');
  router.removeWorker('w');
  health.set('w', 'metrics', false, 'connection reset');
  health.set('w', 'breaker', false);
  assert.deepEqual(health.reasons('w'), []);
  // added again while the gateway runs: held out until its first health check answers
  router.registerWorker('w', { url: 'http://127.0.0.1:1' });
  health.holdUntilChecked('w');
  assert.equal(available(), false);
  assert.equal(typeof health.outFor('w'), 'number');
  health.set('w', 'health-check', true);
  assert.equal(available(), true);
  assert.equal(health.outFor('w'), undefined);
  health.set('w', 'health-check', false, 'HTTP 500');
  assert.equal(available(), false);
  assert.deepEqual(health.reasons('w'), ['health-check']);
});
