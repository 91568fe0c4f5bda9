import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { WorkerHealth } from '../../src/engines/health.js';
import { CircuitBreaker } from '../../src/server/circuit-breaker.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { freePort } from '../faults/harness.js';

/**
 * A breaker opening a circuit after `failures` counted in a row, on a router with `workers`
 * registered (every one of them known to the breaker), closed after the test.
 */
function breakerOn(t: TestContext, failures: number, workers: string[]) {
  const router = new KVAwareRouter();
  const health = new WorkerHealth(router);
  workers.forEach((id, i) => router.registerWorker(id, { url: `http://127.0.0.1:${i + 1}` }));
  const breaker = new CircuitBreaker({ failures, cooldownMs: 60_000 }, health, () => true);
  t.after(() => breaker.close());
  return { health, breaker };
}

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

test('a server error answer no other worker was asked about counts once another worker answered since its previous one', (t) => {
  const { health, breaker } = breakerOn(t, 3, ['w', 'v']);
  // nothing answered anywhere in between: a request every engine fails, or a fleet that is down
  for (let i = 0; i < 5; i++) breaker.serverErrorAnswerAlone('w');
  assert.deepEqual(health.reasons('w'), [], 'server error answers with no answer between them count for nothing');
  // another worker answers: the previous server error answer and this one count
  breaker.answered('v', true);
  breaker.serverErrorAnswerAlone('w');
  assert.deepEqual(health.reasons('w'), []);
  // a client's error is no answer that shows the fleet serves
  breaker.answered('v', false);
  breaker.serverErrorAnswerAlone('w');
  assert.deepEqual(health.reasons('w'), [], 'a 4xx between them shows nothing');
  breaker.answered('v', true);
  breaker.serverErrorAnswerAlone('w');
  assert.deepEqual(health.reasons('w'), ['breaker'], 'the third counted opens the circuit');
});

test("a worker's own answer ends the run of its server error answers", (t) => {
  const { health, breaker } = breakerOn(t, 2, ['w']);
  breaker.serverErrorAnswerAlone('w');
  breaker.answered('w', true);
  breaker.answered('v', true);
  breaker.serverErrorAnswerAlone('w');
  assert.deepEqual(health.reasons('w'), [], 'its answer came between: the earlier one is not counted');
  breaker.answered('v', true);
  breaker.serverErrorAnswerAlone('w');
  assert.deepEqual(health.reasons('w'), ['breaker']);
});

test('a first byte overdue counts only when the fleet served since the previous one: timeouts that hit every worker alike count against none', (t) => {
  const { health, breaker } = breakerOn(t, 3, ['w', 'v']);
  // a slow fleet: every worker's deadline passes, nothing is answered anywhere
  for (let i = 0; i < 5; i++) {
    assert.equal(breaker.firstByteOverdue('w'), false, 'not the worker: the fleet is slow');
    assert.equal(breaker.firstByteOverdue('v'), false);
  }
  assert.deepEqual(health.reasons('w'), []);
  assert.deepEqual(health.reasons('v'), []);
  // `v` serves, `w` keeps missing its deadline: `w` is stuck, and its overdue first bytes count
  breaker.answered('v', true);
  assert.equal(breaker.firstByteOverdue('w'), true, 'the fleet served since: the worker is stuck');
  assert.deepEqual(health.reasons('w'), [], 'two counted so far (the held-back one with it)');
  breaker.answered('v', true);
  assert.equal(breaker.firstByteOverdue('w'), true);
  assert.deepEqual(health.reasons('w'), ['breaker']);
  // a worker's own answer ends its run: its next overdue first byte is the first of a new one
  breaker.answered('v', true);
  assert.equal(breaker.firstByteOverdue('v'), false);
});

test("removing a worker with data-parallel ranks drops each rank's streak", async () => {
  // a refused connection counts at once (a server error answer only once another worker answers)
  const url = `http://127.0.0.1:${await freePort()}`;
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers: [{ id: 'w', url, dpSize: 2 }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    breakerFailures: 2,
    maxRetries: 1,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const complete = async () => {
    const r = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'p', max_tokens: 1 }),
      signal: AbortSignal.timeout(10_000),
    });
    assert.equal(r.status, 502);
    await r.text();
  };
  try {
    // one failure on each rank
    await complete();
    assert.deepEqual([health(gateway, 'w#0'), health(gateway, 'w#1')], [[], []]);
    assert.ok(gateway.removeWorker('w'));
    gateway.addWorker({ id: 'w', url, dpSize: 2 });
    // the worker added again: one failure on each rank, the first of a new streak
    await complete();
    assert.deepEqual([health(gateway, 'w#0'), health(gateway, 'w#1')], [[], []], 'no circuit opened');
  } finally {
    await gateway.close(0);
  }
});

function health(gateway: Gateway, id: string): string[] {
  return gateway.health.reasons(id);
}

test('connections lost by attempts already under way when a counted one was lost count once; later attempts count again', (t) => {
  const { health, breaker } = breakerOn(t, 3, ['w']);
  // a burst of attempts sent on connections the engine broke together (it restarted)
  const burst = Array.from({ length: 8 }, () => breaker.attemptStarted());
  const counted = burst.map((startedAt) => breaker.connectionLost('w', startedAt));
  assert.deepEqual(counted, [true, false, false, false, false, false, false, false]);
  assert.deepEqual(health.reasons('w'), [], 'the burst counts once');
  // an engine that breaks every connection: each round of retries starts after the last counted one
  assert.equal(breaker.connectionLost('w', breaker.attemptStarted()), true);
  assert.deepEqual(health.reasons('w'), []);
  assert.equal(breaker.connectionLost('w', breaker.attemptStarted()), true);
  assert.deepEqual(health.reasons('w'), ['breaker'], 'three rounds open the circuit');
});

test('an engine that breaks most connections while many attempts are under way still opens its circuit', (t) => {
  const { health, breaker } = breakerOn(t, 3, ['w']);
  // 16 attempts at a time, each ending in the order they started: 9 of 10 break, 1 is answered
  const window = Array.from({ length: 16 }, () => breaker.attemptStarted());
  let ended = 0;
  while (ended < 1000 && !health.reasons('w').includes('breaker')) {
    const startedAt = window.shift()!;
    if (ended++ % 10 === 9) breaker.answered('w', true, startedAt);
    else breaker.connectionLost('w', startedAt);
    window.push(breaker.attemptStarted());
  }
  assert.deepEqual(health.reasons('w'), ['breaker'], `still closed after ${ended} attempts ended`);
  assert.ok(ended <= 64, `opened after ${ended} attempts ended`);
});
