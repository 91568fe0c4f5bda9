/**
 * Panic routing: when no worker is in rotation but some are out only because their health check
 * or metrics scrape timed out (a loaded machine makes a serving engine's probes time out), the
 * gateway routes over those instead of answering 503, as Envoy does below its panic threshold.
 * Workers whose probes got an error status or were refused, out for an open circuit or draining
 * stay out. `panicRouting: false` keeps the 503.
 */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import type { Registry } from 'prom-client';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayOptions } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';
import { PANIC_ROUTED, post, sample, OK_COMPLETION } from './harness.js';

/** A fake engine: what its /health answers (a status, or 'hang': no answer until it closes) and its answer to completions. */
interface TestEngine {
  url: string;
  /** Completion requests it received (not /health, /metrics nor /v1/models). */
  completions: number;
  /** Health probes it received. */
  probes: number;
  /** Completion requests whose connection closed before their answer was sent. */
  abandoned: number;
  /** With `hold`, answers the completions held so far. */
  release: () => void;
  close: () => Promise<void>;
}

async function engine(
  health: () => number | 'hang',
  status = 200,
  body = OK_COMPLETION,
  hold = false,
): Promise<TestEngine> {
  const hung: ServerResponse[] = [];
  const waiting: Array<() => void> = [];
  const e: TestEngine = {
    url: '',
    completions: 0,
    probes: 0,
    abandoned: 0,
    release: () => {
      for (const answer of waiting.splice(0)) answer();
    },
    close: async () => {},
  };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    if (req.url === '/health') {
      e.probes++;
      const h = health();
      return void (h === 'hang' ? hung.push(res) : res.writeHead(h).end());
    }
    if (!req.url?.endsWith('/completions')) return void res.writeHead(404).end();
    e.completions++;
    req.resume();
    res.on('close', () => {
      if (!res.writableFinished) e.abandoned++;
    });
    const answer = () => res.writeHead(status, { 'content-type': 'application/json' }).end(body);
    req.on('end', () => (hold ? waiting.push(answer) : answer()));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  e.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  e.close = () =>
    new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    });
  return e;
}

/** What a probe's timeout reads as (AbortSignal.timeout's error), from the health check and the metrics scrape. */
const PROBE_TIMEOUT = 'The operation was aborted due to timeout';

async function gatewayOver(urls: Record<string, string>, options: Partial<GatewayOptions> = {}) {
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const logs: string[] = [];
  const gateway = await createGateway({
    router,
    workers: Object.entries(urls).map(([id, url]) => ({ id, url })),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    // a hung probe gives up soon (the default waits for SGLang's slow /health)
    healthCheckTimeoutMs: 500,
    breakerFailures: 3,
    breakerCooldownMs: 60_000,
    log: (m) => logs.push(m),
    ...options,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const out = (id: string) => !router.listWorkers().find((w) => w.id === id)!.available;
  return { router, gateway, base, logs, out };
}

/** A gateway over engine `x`, serving model X, and engine `y`, serving model Y. */
function overTwoModels(x: TestEngine, y: TestEngine, options: Partial<GatewayOptions> = {}) {
  return gatewayOver(
    {},
    {
      ...options,
      workers: [
        { id: 'x', url: x.url, models: ['X'] },
        { id: 'y', url: y.url, models: ['Y'] },
      ],
    },
  );
}

test('engines that serve but whose health check times out: requests get 200 through panic routing, counted, logged once at its start and once at its end', async () => {
  let healthy = false;
  const a = await engine(() => (healthy ? 200 : 'hang'));
  const b = await engine(() => 'hang');
  const g = await gatewayOver({ a: a.url, b: b.url }, { healthCheckIntervalMs: 20 });
  try {
    await until(() => g.out('a') && g.out('b'), 'both workers out of rotation');
    assert.deepEqual(g.gateway.health.reasons('a'), ['health-check']);
    for (let i = 0; i < 4; i++) {
      const r = await post(g.base, '/v1/completions', { prompt: `panic ${i}`, max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
      assert.match(r.headers.get('x-contextforge-worker') ?? '', /^[ab]$/);
    }
    assert.equal(await sample(g.gateway.metrics, PANIC_ROUTED), 4, 'each request routed in panic is counted');
    assert.equal(a.completions + b.completions, 4);
    const starts = g.logs.filter((l) => /panic routing starts/.test(l));
    assert.equal(starts.length, 1, g.logs.join('\n'));
    assert.match(starts[0], /^warning: /);
    healthy = true;
    await until(() => !g.out('a'), 'a back in rotation');
    await until(() => g.logs.some((l) => /panic routing ends/.test(l)), 'the end of panic routing logged');
    const r = await post(g.base, '/v1/completions', { prompt: 'in rotation', max_tokens: 1 });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-contextforge-worker'), 'a', 'only the worker in rotation is used again');
    assert.equal(await sample(g.gateway.metrics, PANIC_ROUTED), 4, 'a request routed in rotation is not counted');
    assert.equal(g.logs.filter((l) => /panic routing (starts|ends)/.test(l)).length, 2, g.logs.join('\n'));
  } finally {
    await g.gateway.close();
    await a.close();
    await b.close();
  }
});

test('an engine whose health check hangs past its timeout still gets requests when no worker is in rotation', async () => {
  const e = await engine(() => 'hang');
  const g = await gatewayOver({ slow: e.url }, { healthCheckIntervalMs: 20 });
  try {
    await until(() => g.out('slow'), 'the worker out of rotation after its probes timed out');
    const whole = await post(g.base, '/v1/completions', { prompt: 'whole', max_tokens: 1 });
    assert.equal(whole.status, 200, whole.text);
    assert.equal(whole.headers.get('x-contextforge-worker'), 'slow');
    assert.ok((await sample(g.gateway.metrics, PANIC_ROUTED)) >= 1);
  } finally {
    await g.gateway.close();
    await e.close();
  }
});

test('a request panic-routed to a worker whose probes time out is not taken off it when the grace period for slow probes ends', async () => {
  const e = await engine(() => 'hang', 200, OK_COMPLETION, true);
  const g = await gatewayOver({ slow: e.url }, { healthCheckIntervalMs: 20 });
  try {
    await until(() => g.out('slow'), 'the worker out of rotation after its probes timed out');
    const left = e.probes;
    const pending = post(g.base, '/v1/completions', { prompt: 'long answer', max_tokens: 1 });
    await until(() => e.completions === 1, 'the request on the engine');
    // each probe waits its 500 ms timeout before the next: four more outlast the 1 s grace period
    await until(() => e.probes >= left + 4, 'the grace period for slow probes over', { timeoutMs: 20_000 });
    e.release();
    const r = await pending;
    assert.equal(r.status, 200, r.text);
    assert.equal(e.abandoned, 0, 'the engine kept the request');
    assert.equal(e.completions, 1, 'sent once');
  } finally {
    await g.gateway.close();
    await e.close();
  }
});

test('workers out only because their metrics scrape timed out are panic-routed too, not once it answers an error status', async () => {
  const e = await engine(() => 200);
  const g = await gatewayOver({ m: e.url });
  try {
    g.gateway.health.set('m', 'metrics', false, `metrics: ${PROBE_TIMEOUT}`);
    const r = await post(g.base, '/v1/completions', { prompt: 'scrape', max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
    assert.equal(await sample(g.gateway.metrics, PANIC_ROUTED), 1);
    // the next scrape got an error status: the engine says it cannot serve
    g.gateway.health.set('m', 'metrics', false, 'metrics: HTTP 500');
    const refused = await post(g.base, '/v1/completions', { prompt: 'scrape failed', max_tokens: 1 });
    assert.equal(refused.status, 503, refused.text);
    assert.equal(e.completions, 1);
  } finally {
    await g.gateway.close();
    await e.close();
  }
});

test('with panic routing off, no worker in rotation is a 503 as before', async () => {
  const e = await engine(() => 'hang');
  const g = await gatewayOver({ a: e.url }, { healthCheckIntervalMs: 20, panicRouting: false });
  try {
    await until(() => g.out('a'), 'the worker out of rotation');
    const r = await post(g.base, '/v1/completions', { prompt: 'off', max_tokens: 1 });
    assert.equal(r.status, 503, r.text);
    assert.equal(r.headers.get('retry-after'), '1');
    assert.match(r.text, /no worker can take the request now/);
    assert.equal(e.completions, 0, 'the engine got nothing');
    assert.equal(await sample(g.gateway.metrics, PANIC_ROUTED), 0);
  } finally {
    await g.gateway.close();
    await e.close();
  }
});

test('a worker with an open circuit, or draining, is not used in panic; with only such workers the answer stays 503', async () => {
  const probed = await engine(() => 200);
  const tripped = await engine(() => 200);
  const draining = await engine(() => 200);
  const g = await gatewayOver({ probed: probed.url, tripped: tripped.url, draining: draining.url });
  try {
    g.gateway.health.set('probed', 'health-check', false, PROBE_TIMEOUT);
    // the circuit is open and the health check fails: the breaker's own half-open try decides
    g.gateway.health.set('tripped', 'health-check', false, PROBE_TIMEOUT);
    g.gateway.health.set('tripped', 'breaker', false, '3 consecutive failures');
    g.gateway.health.set('draining', 'health-check', false, PROBE_TIMEOUT);
    g.router.drainWorker('draining');
    for (let i = 0; i < 6; i++) {
      const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'probed');
    }
    assert.equal(
      tripped.completions + draining.completions,
      0,
      'neither the open circuit nor the draining worker was used',
    );
    // the worker held out only by its health check leaves: none is left for panic routing
    g.gateway.removeWorker('probed');
    const none = await post(g.base, '/v1/completions', { prompt: 'none', max_tokens: 1 });
    assert.equal(none.status, 503, none.text);
    assert.match(none.text, /no worker can take the request now/);
    assert.equal(tripped.completions + draining.completions, 0);
  } finally {
    await g.gateway.close();
    await probed.close();
    await tripped.close();
    await draining.close();
  }
});

test('a request that fails on a panic-routed worker is retried on the next one and ends in the usual 502 when all fail', async () => {
  const failing = await engine(() => 200, 500, '{"error":{"message":"engine exploded"}}');
  const serving = await engine(() => 200);
  const g = await gatewayOver({ failing: failing.url, serving: serving.url }, { maxRetries: 2 });
  try {
    g.gateway.health.set('failing', 'health-check', false, PROBE_TIMEOUT);
    g.gateway.health.set('serving', 'health-check', false, PROBE_TIMEOUT);
    const r = await post(g.base, '/v1/completions', { prompt: 'first goes to failing', max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'serving');
    assert.equal(failing.completions, 1, 'the first attempt went to the failing worker');
    g.gateway.removeWorker('serving');
    const failed = await post(g.base, '/v1/completions', { prompt: 'only failing', max_tokens: 1 });
    assert.equal(failed.status, 502, failed.text);
    assert.equal(failed.headers.get('retry-after'), '1');
  } finally {
    await g.gateway.close();
    await failing.close();
    await serving.close();
  }
});

test('engines whose health check answers an error status are not panic-routed: 503 and no engine reached, as without panic routing', async () => {
  const engines = [
    await engine(() => 500, 500, '{"error":{"message":"boom"}}'),
    await engine(() => 500, 500, '{"error":{"message":"boom"}}'),
    await engine(() => 500, 500, '{"error":{"message":"boom"}}'),
  ];
  const g = await gatewayOver(Object.fromEntries(engines.map((e, i) => [`e${i}`, e.url])), {
    healthCheckIntervalMs: 20,
  });
  try {
    await until(() => g.out('e0') && g.out('e1') && g.out('e2'), 'every worker out of rotation');
    for (let i = 0; i < 3; i++) {
      const r = await post(g.base, '/v1/completions', { prompt: `sick ${i}`, max_tokens: 1 });
      assert.equal(r.status, 503, r.text);
      assert.match(r.text, /no worker can take the request now/);
    }
    assert.equal(
      engines.reduce((n, e) => n + e.completions, 0),
      0,
      'no engine got a request',
    );
    assert.equal(await sample(g.gateway.metrics, PANIC_ROUTED), 0);
    assert.equal(g.logs.filter((l) => /panic routing starts/.test(l)).length, 0, g.logs.join('\n'));
  } finally {
    await g.gateway.close();
    for (const e of engines) await e.close();
  }
});

test('an engine refusing connections to its health check is not panic-routed', async () => {
  const e = await engine(() => 200);
  const g = await gatewayOver({ gone: e.url });
  try {
    g.gateway.health.set('gone', 'health-check', false, 'fetch failed');
    const r = await post(g.base, '/v1/completions', { prompt: 'gone', max_tokens: 1 });
    assert.equal(r.status, 503, r.text);
    assert.equal(e.completions, 0);
  } finally {
    await g.gateway.close();
    await e.close();
  }
});

test('a worker whose health check timed out and then answers an error status leaves panic routing', async () => {
  let health: number | 'hang' = 'hang';
  const e = await engine(() => health);
  const g = await gatewayOver({ w: e.url }, { healthCheckIntervalMs: 20 });
  try {
    await until(() => g.out('w'), 'the worker out of rotation after its probes timed out');
    const slow = await post(g.base, '/v1/completions', { prompt: 'slow', max_tokens: 1 });
    assert.equal(slow.status, 200, slow.text);
    health = 500;
    const before = e.completions;
    await until(
      async () => (await post(g.base, '/v1/completions', { prompt: 'sick', max_tokens: 1 })).status === 503,
      'a 503 once the health check answers 500',
    );
    // the probes after the first 500 decide: requests sent meanwhile reached it, none after
    const reached = e.completions;
    assert.ok(reached >= before);
    const r = await post(g.base, '/v1/completions', { prompt: 'still sick', max_tokens: 1 });
    assert.equal(r.status, 503, r.text);
    assert.equal(e.completions, reached, 'the engine got nothing once it answered an error status');
  } finally {
    await g.gateway.close();
    await e.close();
  }
});

test('a request panic-routed to a worker whose probes time out stays on it past the grace period while a worker of another model is in rotation', async () => {
  const x = await engine(() => 'hang', 200, OK_COMPLETION, true);
  const y = await engine(() => 200);
  const g = await overTwoModels(x, y, { healthCheckIntervalMs: 20 });
  try {
    await until(() => g.out('x'), 'x out of rotation after its probes timed out');
    assert.equal(g.out('y'), false);
    const left = x.probes;
    const pending = post(g.base, '/v1/completions', { model: 'X', prompt: 'long answer', max_tokens: 1 });
    await until(() => x.completions === 1, 'the request on x');
    // each probe waits its 500 ms timeout before the next: four more outlast the 1 s grace period
    await until(() => x.probes >= left + 4, 'the grace period for slow probes over', { timeoutMs: 20_000 });
    x.release();
    const r = await pending;
    assert.equal(r.status, 200, r.text);
    assert.equal(x.abandoned, 0, 'x kept the request');
    assert.equal(x.completions, 1, 'sent once');
    assert.equal(y.completions, 0);
  } finally {
    await g.gateway.close();
    await x.close();
    await y.close();
  }
});

test('a slow worker gives up its requests past the grace period when a worker serving its model is in rotation', async () => {
  let hang = false;
  const x = await engine(() => (hang ? 'hang' : 200), 200, OK_COMPLETION, true);
  const y = await engine(() => 200);
  const g = await gatewayOver(
    {},
    {
      healthCheckIntervalMs: 20,
      workers: [
        { id: 'x', url: x.url, models: ['X'] },
        { id: 'y', url: y.url, models: ['X'] },
      ],
    },
  );
  try {
    // round robin: one of the two goes to x, held there while its probes time out
    const pending = [0, 1].map((i) => post(g.base, '/v1/completions', { model: 'X', prompt: `p${i}`, max_tokens: 1 }));
    await until(() => x.completions === 1 && y.completions === 1, 'a request on each engine');
    hang = true;
    const answers = await Promise.all(pending);
    for (const r of answers) {
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'y');
    }
    assert.equal(y.completions, 2, 'the request held on x moved to y');
    await until(() => x.abandoned === 1, 'x let go of the request');
  } finally {
    await g.gateway.close();
    await x.close();
    await y.close();
  }
});

test('requests in flight when the health checks of every worker start timing out stay on their workers', async () => {
  let hang = false;
  const engines = [
    await engine(() => (hang ? 'hang' : 200), 200, OK_COMPLETION, true),
    await engine(() => (hang ? 'hang' : 200), 200, OK_COMPLETION, true),
  ];
  const g = await gatewayOver(Object.fromEntries(engines.map((e, i) => [`w${i}`, e.url])), {
    healthCheckIntervalMs: 20,
  });
  try {
    const pending = Array.from({ length: 4 }, (_, i) =>
      post(g.base, '/v1/completions', { prompt: `in flight ${i}`, max_tokens: 1 }),
    );
    await until(() => engines[0].completions + engines[1].completions === 4, 'the requests on the engines');
    const left = engines.map((e) => e.probes);
    hang = true;
    await until(() => g.out('w0') && g.out('w1'), 'both out of rotation');
    // four more probes each outlast the 1 s grace period
    await until(() => engines.every((e, i) => e.probes >= left[i] + 4), 'the grace period over', {
      timeoutMs: 20_000,
    });
    for (const e of engines) e.release();
    for (const r of await Promise.all(pending)) assert.equal(r.status, 200, r.text);
    assert.equal(engines[0].abandoned + engines[1].abandoned, 0, 'no request was taken off its engine');
    assert.equal(engines[0].completions + engines[1].completions, 4, 'each sent once');
  } finally {
    await g.gateway.close();
    for (const e of engines) await e.close();
  }
});

test('/readyz is ready while requests can be panic-routed, and says so; not for workers that answer an error status nor with panic routing off', async () => {
  const readyz = async (base: string) => {
    const r = await fetch(`${base}/readyz`);
    return { status: r.status, body: (await r.json()) as Record<string, unknown> };
  };
  const e = await engine(() => 200);
  const g = await gatewayOver({ a: e.url, b: e.url });
  const off = await gatewayOver({ a: e.url }, { panicRouting: false });
  try {
    assert.deepEqual(await readyz(g.base), { status: 200, body: { status: 'ready', availableWorkers: 2 } });
    g.gateway.health.set('a', 'health-check', false, PROBE_TIMEOUT);
    g.gateway.health.set('b', 'metrics', false, `metrics: ${PROBE_TIMEOUT}`);
    assert.deepEqual(await readyz(g.base), {
      status: 200,
      body: { status: 'ready', availableWorkers: 0, panic: true, panicWorkers: 2 },
    });
    assert.equal((await fetch(`${g.base}/health`)).status, 503, '/health says whether a worker is in rotation');
    // an open circuit, a draining worker and an error status are not panic-eligible
    g.gateway.health.set('a', 'breaker', false, '3 consecutive failures');
    g.router.drainWorker('b');
    assert.deepEqual(await readyz(g.base), {
      status: 503,
      body: { status: 'no available worker', availableWorkers: 0 },
    });
    g.router.resumeWorker('b');
    assert.equal((await readyz(g.base)).status, 200);
    g.gateway.health.set('b', 'metrics', false, 'metrics: HTTP 500');
    assert.equal((await readyz(g.base)).status, 503);
    off.gateway.health.set('a', 'health-check', false, PROBE_TIMEOUT);
    assert.deepEqual(await readyz(off.base), {
      status: 503,
      body: { status: 'no available worker', availableWorkers: 0 },
    });
  } finally {
    await g.gateway.close();
    await off.gateway.close();
    await e.close();
  }
});

test('while one model is panic-routed, requests of another model routed in rotation do not list the workers', async () => {
  const x = await engine(() => 200);
  const y = await engine(() => 200);
  const g = await overTwoModels(x, y);
  try {
    g.gateway.health.set('x', 'health-check', false, PROBE_TIMEOUT);
    const panicked = await post(g.base, '/v1/completions', { model: 'X', prompt: 'x', max_tokens: 1 });
    assert.equal(panicked.status, 200, panicked.text);
    assert.equal(await sample(g.gateway.metrics, PANIC_ROUTED), 1);
    // the first in-rotation request may look once; the next ones must not
    const warm = await post(g.base, '/v1/completions', { model: 'Y', prompt: 'y', max_tokens: 1 });
    assert.equal(warm.headers.get('x-contextforge-worker'), 'y');
    let listed = 0;
    const listWorkers = g.router.listWorkers.bind(g.router);
    g.router.listWorkers = () => {
      listed++;
      return listWorkers();
    };
    for (let i = 0; i < 10; i++) {
      const r = await post(g.base, '/v1/completions', { model: 'Y', prompt: `y${i}`, max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
    }
    assert.equal(listed, 0, 'the workers were listed for requests routed in rotation');
    // the worker of the other model back in rotation still ends it
    g.router.listWorkers = listWorkers;
    g.gateway.health.set('x', 'health-check', true);
    await until(() => g.logs.some((l) => /panic routing ends/.test(l)), 'the end of panic routing logged');
  } finally {
    await g.gateway.close();
    await x.close();
    await y.close();
  }
});

test('panic routing ends at the next request in rotation once the last worker held out by slow probes drains', async () => {
  const x = await engine(() => 200);
  const y = await engine(() => 200);
  const g = await overTwoModels(x, y);
  try {
    g.gateway.health.set('x', 'health-check', false, PROBE_TIMEOUT);
    assert.equal((await post(g.base, '/v1/completions', { model: 'X', prompt: 'x', max_tokens: 1 })).status, 200);
    assert.equal((await post(g.base, '/v1/completions', { model: 'Y', prompt: 'y', max_tokens: 1 })).status, 200);
    assert.equal(g.logs.filter((l) => /panic routing ends/.test(l)).length, 0, g.logs.join('\n'));
    g.router.drainWorker('x');
    assert.equal((await post(g.base, '/v1/completions', { model: 'Y', prompt: 'y', max_tokens: 1 })).status, 200);
    assert.equal(g.logs.filter((l) => /panic routing ends/.test(l)).length, 1, g.logs.join('\n'));
  } finally {
    await g.gateway.close();
    await x.close();
    await y.close();
  }
});

const DECISIONS = 'contextforge_route_decisions_total';

/** The samples of the routing decisions counter, by reason (labels as prom-client writes them). */
async function decisionsByReason(registry: Registry): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const line of (await registry.metrics()).split('\n')) {
    if (!line.startsWith(`${DECISIONS}{`)) continue;
    const reason = /reason="([^"]*)"/.exec(line)?.[1];
    if (reason !== undefined) out[reason] = (out[reason] ?? 0) + Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return out;
}

test('a panic-routed request counts one decision, the one taken, in the router stats and the metrics: no no-worker decision beside it', async () => {
  const x = await engine(() => 200);
  const y = await engine(() => 200);
  const g = await overTwoModels(x, y);
  try {
    g.gateway.health.set('x', 'health-check', false, PROBE_TIMEOUT);
    const n = 3;
    for (let i = 0; i < n; i++) {
      const r = await post(g.base, '/v1/completions', { model: 'X', prompt: `x${i}`, max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'x');
    }
    assert.equal(await sample(g.gateway.metrics, PANIC_ROUTED), n);
    const stats = g.router.getStats().decisionsByReason;
    assert.equal(stats.rotation, n, JSON.stringify(stats));
    assert.equal(stats.none ?? 0, 0, `a panic-routed request counted as unroutable too: ${JSON.stringify(stats)}`);
    assert.deepEqual(await decisionsByReason(g.gateway.metrics), { rotation: n });
    // a request no worker can take, even in panic, still counts once as such
    g.router.drainWorker('x');
    const none = await post(g.base, '/v1/completions', { model: 'X', prompt: 'drained', max_tokens: 1 });
    assert.equal(none.status, 503, none.text);
    const after = g.router.getStats().decisionsByReason;
    assert.equal(after.none, 1, JSON.stringify(after));
    assert.equal(after.rotation, n, JSON.stringify(after));
  } finally {
    await g.gateway.close();
    await x.close();
    await y.close();
  }
});

test('/v1/route answers the worker a completion is panic-routed to, with panic: true; with panic routing off, noWorker as before', async () => {
  const x = await engine(() => 200);
  const y = await engine(() => 200);
  const g = await overTwoModels(x, y, { publicRouteApi: true });
  const off = await overTwoModels(x, y, { publicRouteApi: true, panicRouting: false });
  const route = async (base: string, model: string) => {
    const r = await post(base, '/v1/route', { model, prompt: 'dry run' });
    assert.equal(r.status, 200, r.text);
    return JSON.parse(r.text) as Record<string, unknown>;
  };
  try {
    const inRotation = await route(g.base, 'X');
    assert.equal(inRotation.worker, 'x');
    assert.equal('panic' in inRotation, false, 'no panic key while a worker is in rotation');
    g.gateway.health.set('x', 'health-check', false, PROBE_TIMEOUT);
    off.gateway.health.set('x', 'health-check', false, PROBE_TIMEOUT);

    const panicked = await route(g.base, 'X');
    assert.equal(panicked.worker, 'x', JSON.stringify(panicked));
    assert.equal(panicked.panic, true, JSON.stringify(panicked));
    assert.equal(panicked.reason, 'rotation');
    assert.equal(panicked.policy, 'round-robin');
    assert.equal('noWorker' in panicked, false, JSON.stringify(panicked));
    for (const key of ['cachedTokens', 'confidence', 'promptTokens', 'explain'])
      assert.ok(key in panicked, `${key} kept: ${JSON.stringify(panicked)}`);
    // a dry run routes nothing: no panic-routed attempt, no decision counted
    assert.equal(await sample(g.gateway.metrics, PANIC_ROUTED), 0);
    assert.deepEqual(g.router.getStats().decisionsByReason, {});
    // what a completion does
    const r = await post(g.base, '/v1/completions', { model: 'X', prompt: 'dry run', max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), panicked.worker);
    // the other model is in rotation: no panic there
    const other = await route(g.base, 'Y');
    assert.equal(other.worker, 'y');
    assert.equal('panic' in other, false);

    const refused = await route(off.base, 'X');
    assert.equal(refused.worker, '', JSON.stringify(refused));
    assert.equal(refused.reason, 'none');
    assert.equal(typeof refused.noWorker, 'object', JSON.stringify(refused));
    assert.equal('panic' in refused, false, JSON.stringify(refused));
  } finally {
    await g.gateway.close();
    await off.gateway.close();
    await x.close();
    await y.close();
  }
});
