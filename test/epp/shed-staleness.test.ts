import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Registry } from 'prom-client';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { RouterPicker, type RoutingBackend } from '../../src/epp/router-picker.js';
import { EnvoyRole } from './envoy-role.js';
import { startPickerFleet, type PickerFleet } from './harness.js';

// Shedding reads each worker's last metrics reading: one older than the staleness threshold (or
// none yet) counts the worker as saturated, as the Inference Extension's utilization detector
// does, so a pool whose scrapes stopped answering sheds its sheddable requests.

const STALE_MS = 3000;
/** The router's clock: the test moves it forward. */
let clockMs = 1_000_000;
let fleet: PickerFleet;
let envoy: EnvoyRole;
before(async () => {
  fleet = await startPickerFleet({
    engines: 3,
    gateway: { router: new KVAwareRouter({ blockSize: 16, clock: () => clockMs }) },
    picker: { objectives: new Map([['batch', -1]]), shedMetricsStaleMs: STALE_MS },
  });
  envoy = new EnvoyRole(fleet.addresses[0]);
});
after(async () => {
  envoy.close();
  await fleet.close();
});

const router = () => fleet.gateways[0].router;
const ids = () =>
  router()
    .listWorkers()
    .map((w) => w.id);
const read = (id: string, kvUsage = 0.1) => router().updateWorkerMetrics(id, { kvUsage, waitingRequests: 0 });

async function batch(): Promise<number | 'routed'> {
  const out = await envoy.request({
    headers: { 'x-gateway-inference-objective': 'batch' },
    body: JSON.stringify({ model: 'mock', prompt: 'bulk job' }),
  });
  if (out.kind === 'routed') {
    await out.stream.end();
    return 'routed';
  }
  assert.equal(out.kind, 'immediate');
  return out.kind === 'immediate' ? out.status : -1;
}

test('workers never read count as saturated: a sheddable request is shed', async () => {
  assert.equal(await batch(), 429);
});

test('fresh readings under the thresholds let a sheddable request through', async () => {
  for (const id of ids()) read(id);
  assert.equal(await batch(), 'routed');
  clockMs += STALE_MS; // exactly at the threshold: still fresh
  assert.equal(await batch(), 'routed');
});

test('readings older than the threshold count as saturated', async () => {
  for (const id of ids()) read(id);
  clockMs += STALE_MS + 1;
  assert.equal(await batch(), 429, 'every worker stale: the pool counts as saturated');
  // one stale worker of three, two idle: the mean stays under 1
  const [first, ...rest] = ids();
  for (const id of rest) read(id);
  assert.equal(
    router()
      .listWorkers()
      .find((w) => w.id === first)?.metricsAt,
    clockMs - STALE_MS - 1,
  );
  assert.equal(await batch(), 'routed');
  // two stale, one at 0.8 KV usage (saturation 1): the mean reaches 1
  clockMs += STALE_MS + 1;
  read(rest[0], 0.8);
  assert.equal(await batch(), 429);
  for (const id of ids()) read(id);
  assert.equal(await batch(), 'routed', 'fresh readings again');
});

test('the staleness threshold must be positive', () => {
  const backend = {
    router: new KVAwareRouter({ blockSize: 16 }),
    metrics: new Registry(),
  } as unknown as RoutingBackend;
  for (const bad of [0, -1, Number.NaN])
    assert.throws(() => new RouterPicker(backend, { shedMetricsStaleMs: bad }), /shedMetricsStaleMs must be positive/);
});
