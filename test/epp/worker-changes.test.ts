/**
 * Workers added, removed or moved to another URL (the admin API, DNS discovery) while the picker
 * waits during a pick — for the prompt's tokens, or for what the shared state must learn before
 * routing: the request is routed with endpoints the picker knows as the router does, and its
 * in-flight count ends with it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Registry } from 'prom-client';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { RouterPicker } from '../../src/epp/router-picker.js';
import type { Gateway } from '../../src/server/gateway.js';
import { MemoryStateStore, type StateStore } from '../../src/state/state-store.js';
import { until } from '../helpers/wait.js';
import { EnvoyRole } from './envoy-role.js';
import { startPickerFleet, type PickerFleet } from './harness.js';

const PROMPT_TOKENS = Array.from({ length: 64 }, (_, i) => i + 1);

interface Setup {
  fleet: PickerFleet;
  envoy: EnvoyRole;
  /** An engine that is no worker yet. */
  extra: MockEngine;
  extraEndpoint: string;
  close(): Promise<void>;
}

/**
 * Two workers behind a picker; `change` runs once, while the first pick waits where `wait`
 * says: in the tokenizer, or before routing (the shared state learning).
 */
async function setup(wait: 'tokenize' | 'beforeRoute', change: (g: Gateway, extraUrl: string) => void): Promise<Setup> {
  const extra = await new MockEngine({ kvBlocks: 4096, prefillTokS: 200_000, decodeTokS: 4000 }).start();
  const extraUrl = `http://127.0.0.1:${extra.port}`;
  const started: { gateway?: Gateway } = {};
  let pending = true;
  const changeOnce = async () => {
    // let the event loop turn, as a real lookup or tokenizer does
    await new Promise((r) => setImmediate(r));
    if (!pending || started.gateway === undefined) return;
    pending = false;
    change(started.gateway, extraUrl);
  };
  const fleet = await startPickerFleet({
    engines: 2,
    state: () => {
      const state: StateStore = new MemoryStateStore();
      if (wait === 'beforeRoute') state.beforeRoute = () => changeOnce();
      return state;
    },
    gateway:
      wait === 'tokenize'
        ? {
            tokenize: 'tokenizer',
            promptTokenizer: {
              async: true,
              tokenize: async () => {
                await changeOnce();
                return PROMPT_TOKENS;
              },
            },
          }
        : {},
  });
  started.gateway = fleet.gateways[0];
  const envoy = new EnvoyRole(fleet.addresses[0]);
  return {
    fleet,
    envoy,
    extra,
    extraEndpoint: `127.0.0.1:${extra.port}`,
    close: async () => {
      envoy.close();
      await fleet.close();
      await extra.close();
    },
  };
}

const inFlight = (g: Gateway) => g.router.listWorkers().reduce((n, w) => n + w.inFlightRequests, 0);

/** Routes one completion and checks its endpoints against `expected` (worker id by endpoint); ends it. */
async function routeAndEnd(s: Setup, expected: ReadonlyMap<string, string>): Promise<string[]> {
  const g = s.fleet.gateways[0];
  const out = await s.envoy.request({
    headers: { ':path': '/v1/completions' },
    body: JSON.stringify({ model: 'mock', prompt: 'workers change meanwhile' }),
  });
  assert.equal(out.kind, 'routed', out.kind === 'immediate' ? `${out.status} ${out.body}` : '');
  if (out.kind !== 'routed') return [];
  for (const e of out.endpoints) assert.ok(expected.has(e), `${e} is a worker's endpoint now (${out.headerValue})`);
  const chosen = g.router.listWorkers().find((w) => w.inFlightRequests === 1);
  assert.equal(chosen?.id, expected.get(out.endpoints[0]), 'counted on the worker at the chosen endpoint');
  const resp = await out.stream.respond({ served: out.endpoints[0], chunks: ['{"choices":[]}'] });
  assert.equal(resp.setHeaders.get('x-contextforge-worker'), expected.get(out.endpoints[0]));
  await out.stream.end();
  await until(() => inFlight(g) === 0, 'the request to leave the in-flight count');
  return out.endpoints;
}

for (const wait of ['tokenize', 'beforeRoute'] as const) {
  test(`a worker added while the pick waits (${wait}) is routed to as the router knows it`, async () => {
    const s = await setup(wait, (g, url) => g.addWorker({ id: 'late', url }));
    try {
      const expected = new Map([...s.fleet.workerAt, [s.extraEndpoint, 'late']]);
      const endpoints = await routeAndEnd(s, expected);
      assert.equal(endpoints.length, 3, 'the chosen endpoint and both fallbacks, the new worker among them');
    } finally {
      await s.close();
    }
  });

  test(`every worker replaced while the pick waits (${wait}): the request goes to the new one`, async () => {
    const s = await setup(wait, (g, url) => {
      g.addWorker({ id: 'late', url });
      g.removeWorker('engine-0');
      g.removeWorker('engine-1');
    });
    try {
      const endpoints = await routeAndEnd(s, new Map([[s.extraEndpoint, 'late']]));
      assert.deepEqual(endpoints, [s.extraEndpoint]);
    } finally {
      await s.close();
    }
  });

  test(`a worker re-added at another URL while the pick waits (${wait}) is named at its new endpoint`, async () => {
    const s = await setup(wait, (g, url) => {
      g.removeWorker('engine-0');
      g.addWorker({ id: 'engine-0', url });
    });
    try {
      const expected = new Map([
        [s.extraEndpoint, 'engine-0'],
        [s.fleet.endpoints[1], 'engine-1'],
      ]);
      const endpoints = await routeAndEnd(s, expected);
      assert.ok(!endpoints.includes(s.fleet.endpoints[0]), 'the old endpoint is not named');
    } finally {
      await s.close();
    }
  });
}

test('a pick that fails after the router decided gives the decision back', async () => {
  // a worker the router routes to but the backend lists no URL for: the pick cannot name it
  const router = new KVAwareRouter({ blockSize: 16 });
  router.registerWorker('listed');
  router.registerWorker('unlisted');
  router.drainWorker('listed');
  const picker = new RouterPicker({
    router,
    state: new MemoryStateStore(),
    metrics: new Registry(),
    workers: () => [{ id: 'listed', url: 'http://10.0.0.1:8000' }],
    workersWithoutModel: () => new Set(),
    prepare: () => Promise.reject(new Error('no body is read')),
  });
  await assert.rejects(
    Promise.resolve(
      picker.pick({
        headers: new Map([
          [':method', 'GET'],
          [':path', '/v1/models'],
        ]),
        body: undefined,
        headersOnly: true,
        subset: undefined,
        requestId: 'r',
      }),
    ),
    /'unlisted' has no endpoint/,
  );
  assert.deepEqual(
    router.listWorkers().map((w) => [w.id, w.inFlightRequests]),
    [
      ['listed', 0],
      ['unlisted', 0],
    ],
  );
});
