/**
 * A replica cut off from Redis cannot publish the releases of its requests that end meanwhile;
 * the other replicas, which stayed connected, kept counting them on its workers. When it comes
 * back it says what it holds, and they replace their tally of it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { withReplicaCutOff } from '../helpers/redis-routers.js';
import { until } from '../helpers/wait.js';

test("a request that ended while its replica was cut off from Redis leaves the others' view when it is back", () =>
  withReplicaCutOff(async ({ a, b, cutOff, reconnect }) => {
    const inFlightAtB = () => b.router.listWorkers()[0].inFlightRequests;
    const ended = a.router.route({ text: 'x'.repeat(4000), promptTokens: 1000 }, { share: true });
    const running = a.router.route({ text: 'y'.repeat(4000), promptTokens: 500 }, { share: true });
    a.store.decisionMade(ended.shared!);
    a.store.decisionMade(running.shared!);
    await until(() => inFlightAtB() === 2, "B to count A's two requests");

    // A is cut off (B is not) while one of its requests ends
    await cutOff();
    a.router.release(ended.ticket);
    a.store.decisionEnded(ended.shared!);
    a.store.decisionEnded(ended.shared!);
    await reconnect();

    await until(() => inFlightAtB() === 1, "B to count only A's request still running", { timeoutMs: 5000 });
    assert.equal(b.router.listWorkers()[0].queuedPrefillTokens, a.router.localLoad('e0').queuedPrefillTokens);
  }));
