import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { startLoopbackEnvoy, type LoopbackEnvoy } from './loopback-envoy.js';
import { startPickerFleet, type PickerFleet } from './harness.js';
import { until } from '../helpers/wait.js';

// End to end through a loopback proxy that does Envoy's job (ext_proc call, forwarding to the
// chosen endpoint, walking the fallback list) in front of mock engines: an OpenAI client sees
// an ordinary OpenAI API, the picker decides where each request runs.

let fleet: PickerFleet;
let envoy: LoopbackEnvoy;
let client: OpenAI;
before(async () => {
  fleet = await startPickerFleet({ engines: 3 });
  envoy = await startLoopbackEnvoy({ extProc: fleet.addresses[0] });
  client = new OpenAI({ baseURL: `${envoy.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  await envoy.close();
  await fleet.close();
});

const router = () => fleet.gateways[0].router;
const inFlight = () =>
  router()
    .listWorkers()
    .reduce((n, w) => n + w.inFlightRequests, 0);

test('an OpenAI client streams a chat completion through the gateway and the picker', async () => {
  const { data: stream, response } = await client.chat.completions
    .create({
      model: 'mock',
      messages: [{ role: 'user', content: 'stream me a few tokens please' }],
      max_tokens: 12,
      stream: true,
    })
    .withResponse();
  let text = '';
  let chunks = 0;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    chunks++;
  }
  assert.ok(chunks >= 2, `${chunks} SSE chunks`);
  assert.equal(text, Array.from({ length: 12 }, (_, k) => `tok${k} `).join(''), 'the 12 tokens the engine produced');
  const worker = response.headers.get('x-contextforge-worker');
  assert.ok(worker && [...fleet.workerAt.values()].includes(worker), `served by ${worker}`);
  await until(() => inFlight() === 0, 'the in-flight count to return to 0');
});

test('a completion: the usage the engine reports shows the cache the picker aimed for', async () => {
  const prompt = 'The quarterly report covers revenue, costs and the outlook for each region. '.repeat(30);
  const first = await client.completions.create({ model: 'mock', prompt: `${prompt} First question?`, max_tokens: 4 });
  const second = await client.completions.create({
    model: 'mock',
    prompt: `${prompt} Second question?`,
    max_tokens: 4,
  });
  const cached =
    (second.usage as { prompt_tokens_details?: { cached_tokens?: number } } | undefined)?.prompt_tokens_details
      ?.cached_tokens ?? 0;
  assert.ok(first.usage && first.usage.prompt_tokens > 100);
  assert.ok(
    cached > first.usage.prompt_tokens / 2,
    `the second request found ${cached} of ${second.usage?.prompt_tokens} prompt tokens cached on its engine`,
  );
});

test('the chosen engine is down: the gateway walks the fallback list and the picker accounts on the one that served', async () => {
  const prompt = 'A long shared system prompt for the fallback test. '.repeat(40);
  const warm = await client.completions
    .create({ model: 'mock', prompt: `${prompt} warm`, max_tokens: 2 })
    .withResponse();
  const home = warm.response.headers.get('x-contextforge-worker')!;
  const homeIndex = [...fleet.workerAt.values()].indexOf(home);
  // the engine goes away without the picker knowing (no health checks in this fleet)
  await fleet.engines[homeIndex].close();
  const before = envoy.fallbacks;
  const again = await client.completions
    .create({ model: 'mock', prompt: `${prompt} again`, max_tokens: 2 })
    .withResponse();
  const served = again.response.headers.get('x-contextforge-worker');
  assert.ok(served && served !== home, `served by ${served}, not the stopped ${home}`);
  assert.equal(envoy.fallbacks, before + 1, 'the proxy needed the fallback list');
  assert.equal(again.data.choices[0].text, 'tok0 tok1 ');
  await until(() => inFlight() === 0, 'nothing left in flight on either engine');
  router().drainWorker(home);
});

test('errors come back as OpenAI errors: bad JSON 400, a missing field 400 naming it', async () => {
  const bad = await fetch(`${envoy.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: '{"model":',
  });
  assert.equal(bad.status, 400);
  assert.match(((await bad.json()) as { error: { message: string } }).error.message, /not valid JSON/);
  await assert.rejects(
    client.chat.completions.create({ model: 'mock' } as never),
    (err: { status?: number; param?: string }) => err.status === 400 && err.param === 'messages',
  );
});

test('a subset hint from the gateway pins every request to the endpoints it names', async () => {
  const live = fleet.endpoints.filter(
    (e) =>
      router()
        .listWorkers()
        .find((w) => w.id === fleet.workerAt.get(e))!.available,
  );
  const pinned = await startLoopbackEnvoy({ extProc: fleet.addresses[0], subset: [live[0]] });
  try {
    const c = new OpenAI({ baseURL: `${pinned.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    for (let i = 0; i < 4; i++) {
      const r = await c.completions
        .create({ model: 'mock', prompt: `pinned ${i} `.repeat(20), max_tokens: 2 })
        .withResponse();
      assert.equal(r.response.headers.get('x-contextforge-worker'), fleet.workerAt.get(live[0]));
    }
  } finally {
    await pinned.close();
  }
});
