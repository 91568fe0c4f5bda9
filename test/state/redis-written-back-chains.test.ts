/**
 * A replica cut off from Redis keeps routing, and writes its decisions' block entries back when
 * it is back. The replicas that stayed connected load no entries then: unless the entries
 * written back are announced, they never learn of those decisions. Real Redis behind a TCP
 * proxy that cuts one replica off.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { withReplicaCutOff } from '../helpers/redis-routers.js';
import { until } from '../helpers/wait.js';

test('the block entries a replica writes back after an outage reach the replicas that stayed connected', () =>
  withReplicaCutOff(async ({ a, b, cutOff, reconnect }) => {
    assert.equal(b.router.getStats().index.entries, 0);

    await cutOff();
    const d = a.router.route({ text: 'outage prompt '.repeat(100), promptTokens: 400 }, { share: true });
    a.store.decisionMade(d.shared!);
    a.router.release(d.ticket);
    a.store.decisionEnded(d.shared!);
    await reconnect();

    await until(() => b.router.getStats().index.entries > 0, "B to learn the blocks of A's decision");
    assert.equal(b.router.getStats().index.entries, a.router.getStats().index.entries);
    // the announcement is no request in flight
    assert.equal(b.router.listWorkers()[0].inFlightRequests, 0);
  }));
