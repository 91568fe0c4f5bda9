import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import type { PickerStream } from './envoy-role.js';
import { pickerFleetWithEnvoy } from './harness.js';
import { until } from '../helpers/wait.js';

// Two engines of one model started with different context lengths: the picker sends a prompt
// too long for one to the other, as the gateway does (test/server/engine-context-lengths.test.ts).

const picker = pickerFleetWithEnvoy({
  workers: [
    { engine: { maxModelLen: 64 }, worker: { id: 'short' } },
    { engine: { maxModelLen: 4096 }, worker: { id: 'long' } },
  ],
  gateway: { router: new KVAwareRouter({ policy: 'round-robin', blockSize: 16 }) },
});

const finish = async (stream: PickerStream) => {
  await stream.respondBody(['{"choices":[]}']);
  await stream.end();
};
const prompt = (tokens: number, family: number) => Array.from({ length: tokens }, (_, i) => family * 100_000 + i);

test('a prompt too long for one engine is picked on the engine with the longer context', async () => {
  const [shortAt, longAt] = picker.fleet.endpoints;
  const { connections } = picker.fleet.gateways[0];
  await until(
    () =>
      (connections.get('short')?.contextLengths.size ?? 0) > 0 &&
      (connections.get('long')?.contextLengths.size ?? 0) > 0,
    'the context lengths read',
  );
  const picked = new Set<string>();
  for (let i = 0; i < 6; i++) {
    const body = JSON.stringify({ model: 'mock', prompt: prompt(100, i + 1), max_tokens: 1 });
    const out = await picker.envoy.request({ headers: { ':path': '/v1/completions' }, body });
    assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
    if (out.kind !== 'routed') return;
    assert.equal(out.endpoints[0], longAt, `request ${i}`);
    await out.stream.respondHeaders({ served: out.endpoints[0] }, true);
    await finish(out.stream);
  }
  for (let i = 0; i < 4; i++) {
    const body = JSON.stringify({ model: 'mock', prompt: prompt(10, 50 + i), max_tokens: 1 });
    const out = await picker.envoy.request({ headers: { ':path': '/v1/completions' }, body });
    assert.equal(out.kind, 'routed');
    if (out.kind !== 'routed') return;
    picked.add(out.endpoints[0]);
    await out.stream.respondHeaders({ served: out.endpoints[0] }, true);
    await finish(out.stream);
  }
  assert.deepEqual([...picked].sort(), [shortAt, longAt].sort(), 'short prompts are picked on both');
});

test("a completion's default output length counts, and a batch by its longest prompt", async () => {
  const [, longAt] = picker.fleet.endpoints;
  // 50 prompt tokens and a completion's default 16 do not fit in 64; nor a batch whose second
  // prompt is the long one
  const requests: Array<[string, Record<string, unknown>]> = [];
  for (let i = 0; i < 3; i++) {
    requests.push(['/v1/completions', { model: 'mock', prompt: prompt(50, 20 + i) }]);
    requests.push([
      '/v1/completions',
      { model: 'mock', prompt: [prompt(5, 40 + i), prompt(100, 45 + i)], max_tokens: 1 },
    ]);
  }
  for (const [path, request] of requests) {
    const out = await picker.envoy.request({ headers: { ':path': path }, body: JSON.stringify(request) });
    assert.equal(out.kind, 'routed', out.kind === 'immediate' ? out.body : '');
    if (out.kind !== 'routed') return;
    assert.equal(out.endpoints[0], longAt, `${path} ${JSON.stringify(request).slice(0, 60)}`);
    await out.stream.respondHeaders({ served: out.endpoints[0] }, true);
    await finish(out.stream);
  }
});
