import assert from 'node:assert/strict';
import { test } from 'node:test';
import { pickerFleetWithEnvoy } from './harness.js';

// A worker added while the picker runs (the admin API, another replica's shared state) may name
// its engine by host name: the picker still routes to it, and says once that Envoy is sent a
// name where the protocol wants ip:port.

const picker = pickerFleetWithEnvoy({ engines: 1 });

test('a worker named by host name is logged once, when the picker first sees it', async () => {
  const port = picker.fleet.engines[0].port;
  picker.fleet.gateways[0].addWorker({ id: 'named', url: `http://localhost:${port}` });
  for (let i = 0; i < 3; i++) {
    const out = await picker.envoy.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: `hi ${i}` }) });
    assert.equal(out.kind, 'routed');
    if (out.kind === 'routed') await out.stream.end();
  }
  const warnings = picker.fleet.logs.filter((l) => l.includes("'localhost'"));
  assert.deepEqual(warnings, [
    `endpoint picker: worker named's URL names the host 'localhost', no IP address: Envoy is sent localhost:${port}, where the protocol wants ip:port (give the engine's IP address, or find engines with --discover)`,
  ]);
  assert.equal(
    picker.fleet.logs.filter((l) => l.includes('no IP address')).length,
    1,
    'the workers given by IP address are not named',
  );
});
