import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { WorkerHealth } from '../../src/engines/health.js';
import { CircuitBreaker } from '../../src/server/circuit-breaker.js';

test('a failure of a removed worker starts no streak: the worker added again under its id starts afresh', (t) => {
  const router = new KVAwareRouter();
  const health = new WorkerHealth(router);
  const known = new Set<string>();
  const breaker = new CircuitBreaker({ failures: 2, cooldownMs: 60_000 }, health, (id) => known.has(id));
  t.after(() => breaker.close());
  // a request that was under way on `w` when it was removed fails afterwards
  breaker.failed('w');
  router.registerWorker('w', { url: 'http://127.0.0.1:1' });
  known.add('w');
  breaker.failed('w');
  assert.deepEqual(health.reasons('w'), [], 'one failure of the worker added again does not open its circuit');
  breaker.failed('w');
  assert.deepEqual(health.reasons('w'), ['breaker'], 'two in a row do');
});
