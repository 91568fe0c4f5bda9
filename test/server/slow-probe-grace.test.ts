/**
 * A worker held out only by probes that timed out keeps its unanswered requests for a grace
 * period (slowProbeGraceMs) before they may move: each outage has a whole one. setTimeout is a
 * fake clock the test advances by hand, so the grace period is seen as the clock it needs,
 * never as wall time.
 */
import assert from 'node:assert/strict';
import { mock, test, type TestContext } from 'node:test';
import { slowProbeGraceMs } from '../../src/server/worker-connections.js';
import { keptRequest, quietConnections } from '../helpers/worker-connections.js';

/**
 * Two workers, a and b, with no health check, scrape or model listing of their own (the test
 * gives the verdicts), a request kept on a, and setTimeout faked until the test ends.
 */
function twoWorkers(t: TestContext) {
  mock.timers.enable({ apis: ['setTimeout'] });
  const { health, connections } = quietConnections();
  t.after(async () => {
    mock.timers.reset();
    await connections.close();
  });
  // nothing listens there: the model listing read at the start finds nothing
  connections.add({ id: 'a', url: 'http://127.0.0.1:9' });
  connections.add({ id: 'b', url: 'http://127.0.0.1:9' });
  return { health, moved: keptRequest(connections, 'a', undefined), grace: slowProbeGraceMs(0) };
}

const TIMED_OUT = 'The operation was aborted due to timeout';

test('a worker out by slow probes, back, then out again within the grace period keeps its request a whole grace period from the second outage', async (t) => {
  const w = twoWorkers(t);
  const grace = w.grace;
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
  const w = twoWorkers(t);
  const grace = w.grace;
  w.health.set('a', 'health-check', false, TIMED_OUT);
  mock.timers.tick(grace / 2);
  w.health.set('a', 'health-check', true);
  mock.timers.tick(grace);
  assert.equal(w.moved(), 0, 'back in rotation: nothing to move');
});
