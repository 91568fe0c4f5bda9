/**
 * Panic routing in the endpoint picker: when the picker's own probes of every engine time out
 * (its process overloaded, or every engine busy past the probe timeout) while the engines
 * serve, it picks among the workers held out only by those timeouts instead of answering 503,
 * as the gateway's proxy does (test/faults/panic-routing.test.ts): the same PanicRouting, the
 * same metric and /readyz. A worker whose /health answers an error status stays out, and
 * `panicRouting: false` keeps the 503. The gateways here run as `epp` runs them: without the
 * OpenAI routes.
 */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { startPicker, type RunningPicker } from '../../src/epp/run-picker.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { OK_COMPLETION, PANIC_ROUTED, sample } from '../faults/harness.js';
import { until } from '../helpers/wait.js';
import { EnvoyRole } from './envoy-role.js';
import { startLoopbackEnvoy } from './loopback-envoy.js';

interface TestEngine {
  url: string;
  endpoint: string;
  /** Completion requests it received. */
  completions: number;
  close: () => Promise<void>;
}

/**
 * A fake engine whose /health and /metrics answer `probe` (a status, or 'hang': no answer until
 * it closes, so the probe times out) and whose completions answer 200.
 */
async function engine(probe: number | 'hang'): Promise<TestEngine> {
  const e: TestEngine = { url: '', endpoint: '', completions: 0, close: async () => {} };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    if (req.url === '/health' || req.url === '/metrics') {
      if (probe !== 'hang') res.writeHead(probe).end();
      return;
    }
    if (!req.url?.endsWith('/completions')) return void res.writeHead(404).end();
    e.completions++;
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(OK_COMPLETION));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  e.url = `http://127.0.0.1:${port}`;
  e.endpoint = `127.0.0.1:${port}`;
  e.close = () =>
    new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    });
  return e;
}

interface Setup {
  gateway: Gateway;
  picker: RunningPicker;
  address: string;
  logs: string[];
  /** Whether the worker is out of rotation. */
  out: (id: string) => boolean;
  close: () => Promise<void>;
}

/** A gateway as `epp` runs it (no OpenAI routes) over the engines, probing them every 20 ms, and its picker. */
async function pickerOver(
  engines: Record<string, TestEngine>,
  options: Partial<GatewayOptions> = {},
  /** Awaited before the picker starts (its readiness is evaluated as it starts). */
  beforePicker?: (gateway: Gateway, out: (id: string) => boolean) => Promise<void>,
): Promise<Setup> {
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const logs: string[] = [];
  const gateway = await createGateway({
    router,
    workers: Object.entries(engines).map(([id, e]) => ({ id, url: e.url })),
    openAiRoutes: false,
    metricsIntervalMs: 20,
    healthCheckIntervalMs: 20,
    // a hung probe gives up soon (the default waits for SGLang's slow /health)
    healthCheckTimeoutMs: 500,
    log: (m) => logs.push(m),
    ...options,
  });
  const out = (id: string) => !router.listWorkers().find((w) => w.id === id)!.available;
  await beforePicker?.(gateway, out);
  const picker = await startPicker(
    gateway,
    { shedQueueDepth: 5, shedKvUsage: 0.8, eppFallbacks: 2, bodyLimit: 1024 * 1024 },
    { host: '127.0.0.1', port: 0, log: (m) => logs.push(m), readinessIntervalMs: 50 },
  );
  return {
    gateway,
    picker,
    address: `127.0.0.1:${String(picker.eppPort)}`,
    logs,
    out,
    close: async () => {
      await picker.close();
      await gateway.close();
    },
  };
}

/** Waits until the worker is out of rotation, held out only by probes that timed out. */
async function timedOut(gateway: Gateway, out: (id: string) => boolean, id: string): Promise<void> {
  await until(() => out(id) && gateway.health.heldOutBySlowProbesOnly(id), `${id} held out by probes that timed out`, {
    timeoutMs: 20_000,
  });
}

const completion = (prompt: string) => ({
  headers: { ':path': '/v1/completions', ':method': 'POST', 'content-type': 'application/json' },
  body: JSON.stringify({ model: 'm', prompt, max_tokens: 1 }),
});

test('a worker whose /health and /metrics time out but whose completions answer: the picker picks it, counted, and the request is served', async () => {
  const e = await engine('hang');
  const s = await pickerOver({ slow: e });
  const envoy = new EnvoyRole(s.address);
  const loopback = await startLoopbackEnvoy({ extProc: s.address });
  try {
    await until(
      () => s.out('slow') && s.gateway.health.reasons('slow').length === 2,
      'the worker out of rotation after its health check and metrics scrape timed out',
      { timeoutMs: 20_000 },
    );
    assert.ok(s.gateway.health.heldOutBySlowProbesOnly('slow'));
    const out = await envoy.request(completion('panic'));
    assert.equal(out.kind, 'routed', out.kind === 'immediate' ? `${out.status} ${out.body}` : '');
    if (out.kind === 'routed') {
      assert.deepEqual(out.endpoints, [e.endpoint]);
      await out.stream.end();
    }
    assert.equal(await sample(s.gateway.metrics, PANIC_ROUTED), 1, 'the panic-routed pick is counted');
    assert.equal(s.logs.filter((l) => /panic routing starts/.test(l)).length, 1, s.logs.join('\n'));

    // through a gateway doing Envoy's job: the engine answers the request the picker routed
    const r = await fetch(`${loopback.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'served', max_tokens: 1 }),
    });
    assert.equal(r.status, 200, await r.clone().text());
    assert.deepEqual(await r.json(), JSON.parse(OK_COMPLETION));
    assert.equal(e.completions, 1);
    assert.equal(await sample(s.gateway.metrics, PANIC_ROUTED), 2);
    // /readyz says it as it does for the proxy's panic routing: one instance, one state
    const ready = await s.gateway.app.inject({ method: 'GET', url: '/readyz' });
    assert.equal(ready.statusCode, 200, ready.body);
    assert.equal(ready.json().panic, true);
  } finally {
    envoy.close();
    await loopback.close();
    await s.close();
    await e.close();
  }
});

test("the picker's gRPC readiness says what /readyz says: serving while requests can be panic-routed, not with panicRouting false", async () => {
  for (const panicRouting of [true, false]) {
    const e = await engine('hang');
    // started once the worker is out: its readiness is evaluated as it starts
    const s = await pickerOver({ slow: e }, { panicRouting }, (g, out) => timedOut(g, out, 'slow'));
    const envoy = new EnvoyRole(s.address);
    try {
      const expected = panicRouting ? 'SERVING' : 'NOT_SERVING';
      assert.equal(await envoy.healthStatus('readiness'), expected, `panicRouting ${panicRouting}`);
      assert.equal(await envoy.healthStatus('envoy.service.ext_proc.v3.ExternalProcessor'), expected);
      const ready = await s.gateway.app.inject({ method: 'GET', url: '/readyz' });
      assert.equal(ready.statusCode, panicRouting ? 200 : 503, ready.body);
    } finally {
      envoy.close();
      await s.close();
      await e.close();
    }
  }
});

test('while panicking, the fallback endpoints are panic candidates too, and a request Envoy serves on a fallback stays tracked there', async () => {
  const a = await engine('hang');
  const b = await engine('hang');
  const s = await pickerOver({ a, b });
  const envoy = new EnvoyRole(s.address);
  try {
    await until(() => s.out('a') && s.out('b'), 'both workers out of rotation', { timeoutMs: 20_000 });
    await until(
      () => s.gateway.health.heldOutBySlowProbesOnly('a') && s.gateway.health.heldOutBySlowProbesOnly('b'),
      'both held out by probes that timed out only',
    );
    const out = await envoy.request(completion('fallbacks'));
    assert.equal(out.kind, 'routed', out.kind === 'immediate' ? `${out.status} ${out.body}` : '');
    if (out.kind !== 'routed') return;
    assert.deepEqual(
      [...out.endpoints].sort(),
      [a.endpoint, b.endpoint].sort(),
      'the other slow worker is the fallback',
    );
    const router = s.gateway.router;
    assert.equal(router.getStats().inFlightRequests, 1);
    // Envoy served it on the fallback: the request moves there, in flight on it until it ends
    await out.stream.respondHeaders({ served: out.endpoints[1], headers: { ':status': '200' } }, true);
    const fallbackId = out.endpoints[1] === a.endpoint ? 'a' : 'b';
    const onFallback = () => router.listWorkers().find((w) => w.id === fallbackId)!.inFlightRequests;
    assert.equal(router.getStats().inFlightRequests, 1, 'still tracked after the move');
    assert.equal(onFallback(), 1, 'tracked on the worker that served it');
    await out.stream.respondBody(['{"choices":[]}']);
    await out.stream.end();
    await until(() => router.getStats().inFlightRequests === 0, 'the request released');
  } finally {
    envoy.close();
    await s.close();
    await a.close();
    await b.close();
  }
});

test('a worker whose /health answers 500 is not panic-routed: the picker answers 503', async () => {
  const e = await engine(500);
  const s = await pickerOver({ failing: e });
  const envoy = new EnvoyRole(s.address);
  try {
    await until(() => s.out('failing'), 'the worker out of rotation after its probes failed');
    assert.equal(s.gateway.health.heldOutBySlowProbesOnly('failing'), false);
    const out = await envoy.request(completion('error status'));
    assert.equal(out.kind, 'immediate');
    if (out.kind === 'immediate') {
      assert.equal(out.status, 503, out.body);
      // the gateway's code for the same refusal
      assert.equal((JSON.parse(out.body) as { error: { code: string } }).error.code, 'no_worker_available');
    }
    assert.equal(await sample(s.gateway.metrics, PANIC_ROUTED), 0);
    assert.equal(e.completions, 0);
  } finally {
    envoy.close();
    await s.close();
    await e.close();
  }
});

test('with panicRouting false the picker answers 503 when every worker is held out by probes that timed out', async () => {
  const e = await engine('hang');
  const s = await pickerOver({ slow: e }, { panicRouting: false });
  const envoy = new EnvoyRole(s.address);
  try {
    await until(() => s.out('slow'), 'the worker out of rotation after its probes timed out', { timeoutMs: 20_000 });
    assert.ok(s.gateway.health.heldOutBySlowProbesOnly('slow'));
    const out = await envoy.request(completion('off'));
    assert.equal(out.kind, 'immediate');
    if (out.kind === 'immediate') assert.equal(out.status, 503, out.body);
    assert.equal(await sample(s.gateway.metrics, PANIC_ROUTED), 0);
  } finally {
    envoy.close();
    await s.close();
    await e.close();
  }
});
