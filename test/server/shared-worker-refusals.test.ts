/**
 * A worker another replica adds that this one cannot take is logged once per worker id, within
 * a bound on the ids remembered; every refusal is counted in
 * contextforge_state_workers_not_added_total: a peer sending thousands of bad `worker added`
 * messages costs a few log lines, not one a message. No Redis: a state store that hands the
 * gateway's callbacks to the test.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, MAX_REFUSED_WORKERS_LOGGED, type Gateway } from '../../src/server/gateway.js';
import type { StateStoreHost, WorkerRecord } from '../../src/state/state-store.js';
import { RecordingStateStore } from '../helpers/recording-state-store.js';

/** A state store whose attach() keeps the gateway's callbacks. */
const store = new RecordingStateStore();
let host: StateStoreHost | undefined;
(store as unknown as { attach: (h: StateStoreHost) => Promise<void> }).attach = async (h) => {
  host = h;
};
const logs: string[] = [];
let gateway: Gateway;

before(async () => {
  gateway = await createGateway({
    router: new KVAwareRouter(),
    state: store,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    log: (m) => logs.push(m),
  });
});
after(() => gateway.close(0));

const refusals = async () => {
  const text = await gateway.metrics.getSingleMetricAsString('contextforge_state_workers_not_added_total');
  return Number(/^contextforge_state_workers_not_added_total (\d+)$/m.exec(text)?.[1]);
};

test("a peer's bad worker messages are logged once per worker id, within a bound, and all counted", async () => {
  const bad = (id: string) => ({ id, url: 'not a url' }) as WorkerRecord;
  const before = logs.length;
  for (let i = 0; i < 2000; i++) host!.addWorkerFromState(bad('garbage'));
  const sameId = logs.slice(before).filter((m) => m.includes('not added here'));
  assert.equal(sameId.length, 1, 'one line for one worker id');
  for (let i = 0; i < 2000; i++) host!.addWorkerFromState(bad(`garbage-${i}`));
  const lines = logs.slice(before).filter((m) => m.includes('not added here'));
  assert.ok(lines.length <= MAX_REFUSED_WORKERS_LOGGED + 1, `${lines.length} lines`);
  assert.equal(await refusals(), 4000);
  assert.deepEqual(
    gateway.router.listWorkers().map((w) => w.id),
    [],
  );
});
