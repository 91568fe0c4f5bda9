import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { EnvoyRole } from './envoy-role.js';
import { startPickerFleet, type PickerFleet } from './harness.js';
import { tiers } from '../helpers/prompts.js';
import { RecordingStateStore } from '../helpers/recording-state-store.js';
import { until } from '../helpers/wait.js';

// An engine's error answer, as Envoy reports it in the response phase (its :status), means the
// serving worker holds none of the request: the blocks the router predicted there are withdrawn,
// as the HTTP gateway withdraws them (docs/routing.md §6). The router is in approximate mode, so
// a routed request's blocks read 'predicted' on its worker until then.

let fleet: PickerFleet;
let envoy: EnvoyRole;
/** What the gateway tells the other replicas: it shares its decisions, as on Redis. */
const state = new RecordingStateStore();
before(async () => {
  fleet = await startPickerFleet({
    engines: 3,
    state: () => state,
    gateway: { router: new KVAwareRouter({ blockSize: 16, indexMode: 'approximate' }) },
  });
  envoy = new EnvoyRole(fleet.addresses[0]);
});
after(async () => {
  envoy.close();
  await fleet.close();
});

const router = () => fleet.gateways[0].router;
const inFlight = () => router().getStats().inFlightRequests;
const BLOCKS = 4;
/** Token prompts of whole blocks, distinct per family. */
const promptOf = (family: number) => Array.from({ length: BLOCKS * router().blockSize }, (_, i) => family * 1000 + i);
const predicted = Array<string>(BLOCKS).fill('predicted');
const withdrawn = Array<null>(BLOCKS).fill(null);

/** Routes a completion of `prompt`; resolves to the routed stream and its endpoints. */
async function routed(prompt: number[]) {
  const out = await envoy.request({
    headers: { ':path': '/v1/completions' },
    body: JSON.stringify({ model: 'mock', prompt, max_tokens: 1 }),
  });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') throw new Error('not routed');
  return out;
}

test('an error status in the response headers withdraws the predictions of the serving worker; a 200 keeps them', async () => {
  let family = 1;
  for (const status of [400, 500, 200]) {
    const prompt = promptOf(family++);
    const out = await routed(prompt);
    const worker = fleet.workerAt.get(out.endpoints[0])!;
    assert.deepEqual(tiers(router(), worker, prompt), predicted, `${status}: predicted on ${worker} once routed`);
    await out.stream.respondHeaders(
      { served: out.endpoints[0], headers: { ':status': String(status), 'content-type': 'application/json' } },
      true,
    );
    const kept = status < 400 ? predicted : withdrawn;
    assert.deepEqual(tiers(router(), worker, prompt), kept, `${status}: after the response headers`);
    await out.stream.respondBody([status < 400 ? '{"choices":[]}' : `{"error":{"code":${status}}}`]);
    await out.stream.end();
    await until(() => inFlight() === 0, 'the request to be released');
    assert.deepEqual(tiers(router(), worker, prompt), kept, `${status}: after the body and the release`);
  }
});

test('a fallback answering 503: the serving worker’s predictions are withdrawn, the first choice’s stay', async () => {
  const prompt = promptOf(10);
  const out = await routed(prompt);
  assert.ok(out.endpoints.length >= 2, 'a fallback endpoint');
  const [first, second] = out.endpoints.map((e) => fleet.workerAt.get(e)!);
  await out.stream.respondHeaders(
    { served: out.endpoints[1], headers: { ':status': '503', 'content-type': 'text/plain' } },
    false,
  );
  assert.deepEqual(tiers(router(), second, prompt), withdrawn, `nothing stays on ${second}, which answered`);
  assert.deepEqual(tiers(router(), first, prompt), predicted, `${first} did not answer: its decision is not refused`);
  await out.stream.end();
  await until(() => inFlight() === 0, 'the request to be released');
});

test('an error status: the other replicas are told of the refusal, between the decision and its end', async () => {
  for (const status of [400, 200]) {
    state.told.length = 0;
    const out = await routed(promptOf(20 + status));
    await out.stream.respondHeaders(
      { served: out.endpoints[0], headers: { ':status': String(status), 'content-type': 'application/json' } },
      true,
    );
    await out.stream.respondBody([status < 400 ? '{"choices":[]}' : `{"error":{"code":${status}}}`]);
    await out.stream.end();
    await until(() => inFlight() === 0, 'the request to be released');
    const told = state.told.filter((m) => m !== 'prefilled');
    assert.deepEqual(told, status < 400 ? ['made', 'ended'] : ['made', 'refused', 'ended'], `${status}`);
  }
});

test("an error answer's first byte is not a time to first byte; an answer's is", async () => {
  const count = async () => {
    const text = await fleet.gateways[0].metrics.metrics();
    const line = text.split('\n').find((l) => l.startsWith('contextforge_time_to_first_byte_seconds_count '));
    return line === undefined ? 0 : Number(line.split(' ')[1]);
  };
  for (const status of [400, 503, 200]) {
    const before = await count();
    const out = await routed(promptOf(40 + status));
    await out.stream.respondHeaders(
      { served: out.endpoints[0], headers: { ':status': String(status), 'content-type': 'application/json' } },
      true,
    );
    await out.stream.respondBody([status < 400 ? '{"choices":[]}' : `{"error":{"code":${status}}}`]);
    await out.stream.end();
    await until(() => inFlight() === 0, 'the request to be released');
    assert.equal(await count(), before + (status < 400 ? 1 : 0), `${status}`);
  }
});
