import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { EnvoyRole } from './envoy-role.js';
import { startPickerFleet, type PickerFleet } from './harness.js';

// A worker added while the picker runs (the admin API, another replica's shared state) may name
// its engine by host name: the picker still routes to it, and says once that Envoy is sent a
// name where the protocol wants ip:port.

let fleet: PickerFleet;
let envoy: EnvoyRole;
before(async () => {
  fleet = await startPickerFleet({ engines: 1 });
  envoy = new EnvoyRole(fleet.addresses[0]);
});
after(async () => {
  envoy.close();
  await fleet.close();
});

test('a worker named by host name is logged once, when the picker first sees it', async () => {
  const port = fleet.engines[0].port;
  fleet.gateways[0].addWorker({ id: 'named', url: `http://localhost:${port}` });
  for (let i = 0; i < 3; i++) {
    const out = await envoy.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: `hi ${i}` }) });
    assert.equal(out.kind, 'routed');
    if (out.kind === 'routed') await out.stream.end();
  }
  const warnings = fleet.logs.filter((l) => l.includes("'localhost'"));
  assert.deepEqual(warnings, [
    `endpoint picker: worker named's URL names the host 'localhost', no IP address: Envoy is sent localhost:${port}, where the protocol wants ip:port (give the engine's IP address, or find engines with --discover)`,
  ]);
  assert.equal(
    fleet.logs.filter((l) => l.includes('no IP address')).length,
    1,
    'the workers given by IP address are not named',
  );
});
