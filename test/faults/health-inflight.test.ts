/**
 * Requests in flight on a worker whose health check fails (its /health answers 500: vLLM's engine
 * core died, SGLang busy or starting a drain). The engine may still answer them, so they move
 * only to a worker in rotation serving their model; with none, they stay, bounded by the usual
 * timeouts, and move once such a worker comes into rotation. An answer the engine has begun (a
 * whole answer's body arriving, a server error's status) stays where it is.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayOptions, type GatewayWorker } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';
import {
  failingEngine,
  fakeEngine,
  holdingEngine,
  post,
  sample,
  type FakeEngine,
  type HealthAnswer,
  type HoldingEngine,
} from './harness.js';

/** A round-robin gateway probing its workers' /health every 20 ms (unless `options` says otherwise), no metrics scrape. */
async function gatewayOver(workers: GatewayWorker[], options: Partial<GatewayOptions> = {}) {
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 20,
    // a hung probe gives up soon (the default waits for SGLang's slow /health)
    healthCheckTimeoutMs: 500,
    log: () => {},
    ...options,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const out = (id: string) => router.listWorkers().find((w) => w.id === id)?.available === false;
  return { router, gateway, base, out };
}

/** A worker of `model` for each engine, named by its key. */
function ofModel(model: string, engines: Record<string, FakeEngine>): GatewayWorker[] {
  return Object.entries(engines).map(([id, e]) => ({ id, url: e.url, models: [model] }));
}

type Fleet = Awaited<ReturnType<typeof gatewayOver>>;
type Answer = Awaited<ReturnType<typeof post>>;
type FleetBody = (g: Fleet) => Promise<void>;

/**
 * Runs `body` over a gateway in front of `workers` (see gatewayOver), then, however it ends,
 * answers what the engines still hold (a request held would hold the gateway's close) and closes
 * the gateway and `engines`.
 */
async function withFleet(
  engines: Array<FakeEngine | HoldingEngine>,
  workers: GatewayWorker[],
  ...rest: [body: FleetBody] | [options: Partial<GatewayOptions>, body: FleetBody]
): Promise<void> {
  const options = rest.length === 2 ? rest[0] : {};
  const body = rest.length === 2 ? rest[1] : rest[0];
  let g: Fleet | undefined;
  try {
    g = await gatewayOver(workers, options);
    await body(g);
  } finally {
    for (const e of engines) if ('release' in e) e.release();
    await g?.gateway.close();
    for (const e of engines) await e.close();
  }
}

/**
 * POSTs a completion of `body` (max_tokens 1) through the gateway and waits until `engine` has
 * received `posts` requests; the answer comes in `pending`, left to the test to await.
 */
async function sendTo(
  g: Fleet,
  engine: HoldingEngine,
  body: Record<string, unknown>,
  what: string,
  posts = 1,
): Promise<{ pending: Promise<Answer> }> {
  const pending = post(g.base, '/v1/completions', { ...body, max_tokens: 1 });
  await until(() => engine.posts === posts, what);
  return { pending };
}

/** Awaits `answer` and asserts it is a 200 from `worker`; returns it for further checks. */
async function answeredBy(answer: Answer | Promise<Answer>, worker: string): Promise<Answer> {
  const r = await answer;
  assert.equal(r.status, 200, r.text);
  assert.equal(r.headers.get('x-contextforge-worker'), worker);
  return r;
}

interface PartEngine extends FakeEngine {
  /** The answer's headers and first part were written to the gateway's connection. */
  readonly partSent: boolean;
  /** Writes the rest of the answer and ends it. */
  finish(): void;
}

/**
 * An engine that answers a POST, once read, with `status`, a JSON body's `first` part (none
 * when empty), and holds the `rest` until finish(): an answer under way. Its /health answers
 * `healthStatus()`. With `declared`, the answer carries its Content-Length; else it is chunked.
 */
async function partEngine(
  status: number,
  first: string,
  rest: string,
  healthStatus: () => HealthAnswer,
  declared = false,
  contentType = 'application/json',
): Promise<PartEngine> {
  let partSent = false;
  let finish = () => {};
  const engine = await fakeEngine((req, res) => {
    req.resume();
    req.on('end', () => {
      const headers: Record<string, string | number> = { 'content-type': contentType };
      if (declared) headers['content-length'] = Buffer.byteLength(first + rest);
      res.writeHead(status, headers);
      // headers alone are written (and flushed) with the first write
      res.write(first, () => (partSent = true));
      finish = () => res.end(rest);
    });
  }, healthStatus);
  return Object.defineProperties(engine, {
    partSent: { get: () => partSent },
    finish: { value: () => finish() },
  }) as PartEngine;
}

/**
 * Answers what the engines hold until every request in `pending` is answered: a request moved
 * (given up and sent again) reaches an engine after an earlier release, and is answered by a later one.
 */
async function releaseUntilAnswered<T>(engines: HoldingEngine[], pending: Array<Promise<T>>): Promise<T[]> {
  let answers: T[] | undefined;
  void Promise.all(pending).then((all) => (answers = all));
  await until(() => {
    for (const e of engines) e.release();
    return answers !== undefined;
  }, 'every request answered');
  return answers!;
}

test("one worker whose /health turns 500 with a request in flight: the request stays and gets the engine's answer", async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  await withFleet([a], [{ id: 'a', url: a.url }], async (g) => {
    const { pending } = await sendTo(g, a, { prompt: 'kept' }, 'the request on the engine');
    health = 500;
    await until(() => g.out('a'), 'a out of rotation');
    assert.deepEqual(g.gateway.health.reasons('a'), ['health-check']);
    a.release();
    const r = await answeredBy(pending, 'a');
    assert.match(r.text, /from-a/);
    assert.equal(a.abandoned, 0, 'the engine kept the request');
    assert.equal(a.posts, 1, 'sent once');
  });
});

test('two workers of one model: the request unanswered on the one whose /health turns 500 moves to the other', async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  const b = await holdingEngine('from-b');
  const workers = ofModel('m', { a, b });
  await withFleet([a, b], workers, async (g) => {
    // round robin: the first request goes to the first worker
    const { pending } = await sendTo(g, a, { model: 'm', prompt: 'moves' }, 'the request on a');
    health = 500;
    await until(() => b.posts === 1, 'the request moved to b');
    b.release();
    const r = await answeredBy(pending, 'b');
    assert.match(r.text, /from-b/);
    await until(() => a.abandoned === 1, 'a let go of the request');
  });
});

test('a request kept on a worker out of rotation moves once a worker serving its model comes into rotation', async () => {
  let healthA = 200;
  let healthB = 500;
  const a = await holdingEngine('from-a', () => healthA);
  const b = await holdingEngine('from-b', () => healthB);
  const workers = ofModel('m', { a, b });
  await withFleet([a, b], workers, async (g) => {
    await until(() => g.out('b'), 'b out of rotation');
    const { pending } = await sendTo(g, a, { model: 'm', prompt: 'waits' }, 'the request on a');
    healthA = 500;
    await until(() => g.out('a'), 'a out of rotation');
    assert.equal(b.posts, 0, 'no worker in rotation to move to');
    healthB = 200;
    await until(() => b.posts === 1, 'the kept request moved to b once b is back in rotation');
    b.release();
    await answeredBy(pending, 'b');
    await until(() => a.abandoned === 1, 'a let go of the request');
  });
});

test('a request kept on a worker out of rotation moves to a worker of its model added meanwhile', async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  const c = await holdingEngine('from-c');
  await withFleet([a, c], [{ id: 'a', url: a.url, models: ['m'] }], async (g) => {
    const { pending } = await sendTo(g, a, { model: 'm', prompt: 'waits' }, 'the request on a');
    health = 500;
    await until(() => g.out('a'), 'a out of rotation');
    g.gateway.addWorker({ id: 'c', url: c.url, models: ['m'] });
    await until(() => c.posts === 1, 'the kept request moved to the worker added');
    c.release();
    await answeredBy(pending, 'c');
    await until(() => a.abandoned === 1, 'a let go of the request');
  });
});

test('a request kept on a worker out of rotation moves to a worker of its model resumed from draining', async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  const d = await holdingEngine('from-d');
  const workers = ofModel('m', { a, d });
  await withFleet([a, d], workers, async (g) => {
    g.router.drainWorker('d');
    const { pending } = await sendTo(g, a, { model: 'm', prompt: 'waits' }, 'the request on a');
    health = 500;
    await until(() => g.out('a'), 'a out of rotation');
    assert.equal(d.posts, 0, 'a draining worker takes no request');
    const resumed = await fetch(`${g.base}/admin/workers/d/resume`, {
      method: 'POST',
      headers: { authorization: `Bearer ${g.gateway.adminToken}` },
    });
    assert.equal(resumed.status, 200, await resumed.text());
    await until(() => d.posts === 1, 'the kept request moved to the worker resumed');
    d.release();
    await answeredBy(pending, 'd');
    await until(() => a.abandoned === 1, 'a let go of the request');
  });
});

test('a data-parallel worker whose ranks leave rotation one after the other keeps the requests of both, and sends none twice when they come back', async () => {
  const a = await holdingEngine('from-a');
  // no checker: the verdicts come rank by rank, as the health check probing each rank gives them
  await withFleet([a], [{ id: 'a', url: a.url, dpSize: 2 }], { healthCheckIntervalMs: 0 }, async (g) => {
    const ranks = g.router.listWorkers().map((w) => w.id);
    assert.deepEqual(ranks, ['a#0', 'a#1']);
    const pending = [0, 1].map((i) => post(g.base, '/v1/completions', { prompt: `rank ${i}`, max_tokens: 1 }));
    await until(() => a.posts === 2, 'a request on each rank');
    // the other rank, in rotation for a moment longer, is the same engine: no place to move to
    for (const id of ranks) g.gateway.health.set(id, 'health-check', false, 'HTTP 500');
    // the first rank back is the engine the other's request is on already
    for (const id of ranks) g.gateway.health.set(id, 'health-check', true);
    const answers = await releaseUntilAnswered([a], pending);
    assert.deepEqual(
      answers.map((r) => r.status),
      [200, 200],
      answers.map((r) => r.text).join('\n'),
    );
    assert.equal(a.posts, 2, 'each sent once');
    assert.equal(a.abandoned, 0, 'the engine kept both');
  });
});

test('a data-parallel worker whose /health turns 500 and back with a request on each rank: both get the engine answer, each sent once', async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  await withFleet([a], [{ id: 'a', url: a.url, dpSize: 2 }], async (g) => {
    const pending = [0, 1].map((i) => post(g.base, '/v1/completions', { prompt: `rank ${i}`, max_tokens: 1 }));
    await until(() => a.posts === 2, 'a request on each rank');
    health = 500;
    await until(() => g.router.listWorkers().every((w) => !w.available), 'both ranks out of rotation');
    health = 200;
    await until(() => g.router.listWorkers().every((w) => w.available), 'both ranks back in rotation');
    const answers = await releaseUntilAnswered([a], pending);
    assert.deepEqual(
      answers.map((r) => r.status),
      [200, 200],
      answers.map((r) => r.text).join('\n'),
    );
    assert.equal(a.posts, 2, 'each sent once');
    assert.equal(a.abandoned, 0, 'the engine kept both');
  });
});

test('with panic routing off, the only worker whose probes time out keeps its request past the grace period', async () => {
  let health: number | 'hang' = 200;
  const a = await holdingEngine('from-a', () => health);
  await withFleet([a], [{ id: 'a', url: a.url }], { panicRouting: false }, async (g) => {
    const { pending } = await sendTo(g, a, { prompt: 'kept' }, 'the request on the engine');
    health = 'hang';
    await until(() => g.out('a'), 'a out of rotation after its probes timed out');
    assert.equal(g.gateway.health.heldOutBySlowProbesOnly('a'), true);
    const left = a.probes;
    // each probe waits its 500 ms timeout before the next: four more outlast the 1 s grace period
    await until(() => a.probes >= left + 4, 'the grace period for slow probes over', { timeoutMs: 20_000 });
    a.release();
    const r = await pending;
    assert.equal(r.status, 200, r.text);
    assert.match(r.text, /from-a/);
    assert.equal(a.abandoned, 0, 'the engine kept the request');
    assert.equal(a.posts, 1, 'sent once');
  });
});

test('a request kept past the grace period on a worker whose probes time out moves once a worker of its model comes into rotation', async () => {
  let healthA: number | 'hang' = 200;
  let healthB = 500;
  const a = await holdingEngine('from-a', () => healthA);
  const b = await holdingEngine('from-b', () => healthB);
  const workers = ofModel('m', { a, b });
  await withFleet([a, b], workers, async (g) => {
    await until(() => g.out('b'), 'b out of rotation');
    const { pending } = await sendTo(g, a, { model: 'm', prompt: 'waits' }, 'the request on a');
    healthA = 'hang';
    await until(() => g.out('a'), 'a out of rotation after its probes timed out');
    const left = a.probes;
    // each probe waits its 500 ms timeout before the next: four more outlast the 1 s grace period
    await until(() => a.probes >= left + 4, 'the grace period for slow probes over', { timeoutMs: 20_000 });
    assert.equal(b.posts, 0, 'no worker in rotation to move to');
    healthB = 200;
    await until(() => b.posts === 1, 'the kept request moved to b once b is back in rotation');
    b.release();
    await answeredBy(pending, 'b');
    await until(() => a.abandoned === 1, 'a let go of the request');
  });
});

/** A base model `m` and its LoRA adapter `m-lora`, as an engine serving the adapter lists them in /v1/models. */
const WITH_ADAPTER = [{ id: 'm' }, { id: 'm-lora', parent: 'm' }];

/**
 * Waits until the gateway read the adapter from a's /v1/models and b read b's at least once (the
 * reads made when the workers were added), so a later read of b is the one the test makes.
 */
async function adaptersRead(g: Fleet, b: FakeEngine): Promise<void> {
  await until(() => g.gateway.connections.loraOf('m-lora') === 'm-lora', "a's adapter read");
  await until(() => b.requests >= 1, "b's /v1/models read");
}

test('a request kept for a LoRA adapter moves to a worker in rotation once its /v1/models lists the adapter', async () => {
  let healthA = 200;
  let listedB = [{ id: 'm' }];
  const a = await holdingEngine('from-a', () => healthA, { models: () => WITH_ADAPTER });
  const b = await holdingEngine('from-b', () => 200, { models: () => listedB });
  await withFleet([a, b], ofModel('m', { a, b }), async (g) => {
    await adaptersRead(g, b);
    const { pending } = await sendTo(g, a, { model: 'm-lora', prompt: 'waits' }, 'the request on a');
    healthA = 500;
    await until(() => g.out('a'), 'a out of rotation');
    assert.equal(b.posts, 0, 'no worker in rotation lists the adapter: kept');
    listedB = WITH_ADAPTER;
    await g.gateway.connections.readAdapters('b');
    await until(() => b.posts === 1, 'the kept request moved to b once b lists the adapter');
    b.release();
    const r = await answeredBy(pending, 'b');
    assert.match(r.text, /from-b/);
    await until(() => a.abandoned === 1, 'a let go of the request');
  });
});

test('a request that fails on the only worker listing its LoRA adapter is retried on a worker that lists the adapter by then', async () => {
  let listedB = [{ id: 'm' }];
  // a holds the request, then answers it 500
  const a = await holdingEngine('a exploded', () => 200, { status: 500, models: () => WITH_ADAPTER });
  const b = await holdingEngine('from-b', () => 200, { models: () => listedB });
  await withFleet([a, b], ofModel('m', { a, b }), async (g) => {
    await adaptersRead(g, b);
    const { pending } = await sendTo(g, a, { model: 'm-lora', prompt: 'retried' }, 'the request on a');
    listedB = WITH_ADAPTER;
    await g.gateway.connections.readAdapters('b');
    a.release();
    // b serves the adapter now: the retry goes there
    const [r] = await releaseUntilAnswered([b], [pending]);
    assert.match((await answeredBy(r, 'b')).text, /from-b/);
    assert.equal(a.posts, 1, 'a, which failed it, tried once');
  });
});

test('a worker of two models leaving rotation: its request of the model another worker in rotation serves moves there, the other stays', async () => {
  let health = 200;
  const a = await holdingEngine('from-a', () => health);
  const b = await holdingEngine('from-b');
  const workers = [
    { id: 'a', url: a.url, models: ['m1', 'm2'] },
    { id: 'b', url: b.url, models: ['m1'] },
  ];
  await withFleet([a, b], workers, async (g) => {
    // round robin: the first request goes to the first worker; only a serves m2
    const m1 = await sendTo(g, a, { model: 'm1', prompt: 'moves' }, 'the m1 request on a');
    const m2 = await sendTo(g, a, { model: 'm2', prompt: 'stays' }, 'the m2 request on a', 2);
    health = 500;
    await until(() => b.posts === 1, 'the m1 request moved to b');
    const [r1, r2] = await releaseUntilAnswered([a, b], [m1.pending, m2.pending]);
    await answeredBy(r1, 'b');
    await answeredBy(r2, 'a');
    assert.equal(a.posts, 2, 'the m2 request sent once');
    assert.equal(a.abandoned, 1, 'a let go of the m1 request only');
  });
});

test('a worker of two models out of rotation: when a worker of one of them comes into rotation, only the requests of that model move', async () => {
  let healthA = 200;
  let healthB = 500;
  const a = await holdingEngine('from-a', () => healthA);
  const b = await holdingEngine('from-b', () => healthB);
  const workers = [
    { id: 'a', url: a.url, models: ['m1', 'm2'] },
    { id: 'b', url: b.url, models: ['m1'] },
  ];
  await withFleet([a, b], workers, async (g) => {
    await until(() => g.out('b'), 'b out of rotation');
    const pending = ['m1', 'm2'].map((model) =>
      post(g.base, '/v1/completions', { model, prompt: model, max_tokens: 1 }),
    );
    await until(() => a.posts === 2, 'both requests on a');
    healthA = 500;
    await until(() => g.out('a'), 'a out of rotation');
    assert.equal(b.posts, 0, 'no worker in rotation to move to');
    healthB = 200;
    await until(() => b.posts === 1, 'the m1 request moved to b once b is back in rotation');
    const [r1, r2] = await releaseUntilAnswered([a, b], pending);
    await answeredBy(r1, 'b');
    await answeredBy(r2, 'a');
    assert.equal(a.posts, 2, 'the m2 request sent once');
    assert.equal(a.abandoned, 1, 'a let go of the m1 request only');
  });
});

test('a request moved off a data-parallel rank leaving rotation goes to another engine, not to a rank of the same one', async () => {
  const a = await holdingEngine('from-a');
  const b = await holdingEngine('from-b');
  const workers = [
    { id: 'b', url: b.url },
    { id: 'a', url: a.url, dpSize: 2 },
  ];
  await withFleet([a, b], workers, { healthCheckIntervalMs: 0 }, async (g) => {
    assert.deepEqual(
      g.router.listWorkers().map((w) => w.id),
      ['b', 'a#0', 'a#1'],
    );
    // round robin: one request on each of b, a#0 and a#1; the next turn over b and a#1 is a#1's
    const pending = ['on b', 'moves', 'on a#1'].map((prompt) =>
      post(g.base, '/v1/completions', { prompt, max_tokens: 1 }),
    );
    await until(() => a.posts === 2 && b.posts === 1, 'a request on b and one on each rank of a');
    g.gateway.health.set('a#0', 'health-check', false, 'HTTP 500');
    await until(() => a.posts + b.posts === 4, 'the request on a#0 sent again');
    assert.equal(b.posts, 2, 'moved to b');
    const answers = await releaseUntilAnswered([a, b], pending);
    assert.deepEqual(
      answers.map((r) => [r.status, r.headers.get('x-contextforge-worker')]),
      [
        [200, 'b'],
        [200, 'b'],
        [200, 'a'],
      ],
    );
  });
});

test('a request retried after a server error stays on the worker whose /health turns 500 when the only other worker in rotation is the one that failed it', async () => {
  let healthB = 200;
  const a = await failingEngine();
  const b = await holdingEngine('from-b', () => healthB);
  const workers = ofModel('m', { a, b });
  await withFleet([b, a], workers, async (g) => {
    // round robin: the first attempt goes to a, which answers 500; the retry goes to b
    const { pending } = await sendTo(g, b, { model: 'm', prompt: 'retried' }, 'the request retried on b');
    healthB = 500;
    await until(() => g.out('b'), 'b out of rotation');
    assert.equal(g.out('a'), false, 'a, which failed the request, is in rotation');
    b.release();
    const r = await answeredBy(pending, 'b');
    assert.match(r.text, /from-b/);
    assert.equal(b.abandoned, 0, 'b kept the request');
    assert.equal(b.posts, 1, 'sent to b once');
  });
});

test('a request on its last attempt stays on the worker whose /health turns 500, though another worker of its model is in rotation', async () => {
  let healthA = 200;
  const a = await holdingEngine('from-a', () => healthA);
  const b = await holdingEngine('from-b');
  const workers = ofModel('m', { a, b });
  await withFleet([a, b], workers, { maxRetries: 0 }, async (g) => {
    const { pending } = await sendTo(g, a, { model: 'm', prompt: 'last' }, 'the request on a');
    healthA = 500;
    await until(() => g.out('a'), 'a out of rotation');
    a.release();
    await answeredBy(pending, 'a');
    assert.equal(a.abandoned, 0, 'a kept the request');
    assert.equal(b.posts, 0, 'no retry left to move it with');
  });
});

test("a worker that lists no models leaving rotation: its request moves to a worker in rotation that lists the request's model", async () => {
  let healthA = 200;
  const a = await holdingEngine('from-a', () => healthA);
  const b = await holdingEngine('from-b');
  const workers = [
    { id: 'a', url: a.url },
    { id: 'b', url: b.url, models: ['m'] },
  ];
  await withFleet([a, b], workers, async (g) => {
    const { pending } = await sendTo(g, a, { model: 'm', prompt: 'moves' }, 'the request on a');
    healthA = 500;
    await until(() => b.posts === 1, 'the request moved to b');
    const [r] = await releaseUntilAnswered([a, b], [pending]);
    await answeredBy(r, 'b');
    await until(() => a.abandoned === 1, 'a let go of the request');
  });
});

test('a rank held out only by its open circuit: a request that times out there is retried on another rank of its engine', async () => {
  // an open circuit is the gateway's count of its own requests failing on that rank, no verdict
  // on the engine: its other ranks stay where the request may go
  const a = await holdingEngine('from-a');
  const options = { healthCheckIntervalMs: 0, upstreamTimeoutMs: 300 };
  await withFleet([a], [{ id: 'a', url: a.url, dpSize: 2 }], options, async (g) => {
    // round robin: the first request goes to a#0
    const { pending } = await sendTo(g, a, { prompt: 'kept' }, 'the request on a#0');
    g.gateway.health.set('a#0', 'breaker', false, 'circuit open');
    assert.equal(g.out('a#1'), false, 'a#1 is in rotation');
    await until(() => a.posts === 2, 'the request sent again, to a#1');
    a.release();
    const r = await pending;
    assert.equal(r.status, 200, r.text);
  });
});

test('a request kept on a data-parallel rank out of rotation that times out is not retried on another rank of the same engine', async () => {
  const a = await holdingEngine('from-a');
  const options = { healthCheckIntervalMs: 0, upstreamTimeoutMs: 300 };
  await withFleet([a], [{ id: 'a', url: a.url, dpSize: 2 }], options, async (g) => {
    // round robin: the first request goes to a#0
    const { pending } = await sendTo(g, a, { prompt: 'kept' }, 'the request on a#0');
    g.gateway.health.set('a#0', 'health-check', false, 'HTTP 500');
    assert.equal(g.out('a#1'), false, 'a#1 is in rotation');
    const r = await pending;
    assert.equal(r.status, 502, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), null);
    assert.equal(a.posts, 1, 'not sent again to the engine that timed out');
  });
});

test("a non-streamed answer being gathered when its worker's /health turns 500: the client gets that answer, sent once", async () => {
  let healthA = 200;
  const answer = JSON.stringify({ choices: [{ text: 'from-a' }], usage: { prompt_tokens: 1, completion_tokens: 1 } });
  const a = await partEngine(200, answer.slice(0, 20), answer.slice(20), () => healthA);
  const b = await holdingEngine('from-b');
  const workers = ofModel('m', { a, b });
  await withFleet([a, b], workers, async (g) => {
    // round robin: the first request goes to a, whose chunked answer takes its bytes from the
    // answer budget as they come: the gateway holds part of it
    const pending = post(g.base, '/v1/completions', { model: 'm', prompt: 'gathered', max_tokens: 1 });
    await until(() => a.partSent && g.gateway.answerBudget.used > 0, 'part of the answer gathered from a');
    healthA = 500;
    await until(() => g.out('a'), 'a out of rotation');
    a.finish();
    const [r] = await releaseUntilAnswered([b], [pending]);
    await answeredBy(r, 'a');
    assert.equal(r.text, answer);
    assert.equal(b.posts, 0, 'not sent again');
    assert.equal(await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="a"}'), 0);
  });
});

test("a stream whose first event is partly sent when its worker's /health turns 500: the client gets that stream, sent once", async () => {
  let healthA = 200;
  const events = 'data: {"choices":[{"text":"from-a"}]}\n\ndata: [DONE]\n\n';
  const a = await partEngine(200, events.slice(0, 20), events.slice(20), () => healthA, false, 'text/event-stream');
  const b = await holdingEngine('from-b');
  const workers = ofModel('m', { a, b });
  await withFleet([a, b], workers, async (g) => {
    const pending = post(g.base, '/v1/completions', { model: 'm', prompt: 'streamed', max_tokens: 1, stream: true });
    // (written before the flip: the gateway reads it before the answer to any probe sent after)
    await until(() => a.partSent, "the first bytes of a's first event on their way");
    healthA = 500;
    await until(() => g.out('a'), 'a out of rotation');
    a.finish();
    const [r] = await releaseUntilAnswered([b], [pending]);
    await answeredBy(r, 'a');
    assert.equal(r.text, events);
    assert.equal(b.posts, 0, 'not sent again');
  });
});

test("a 2xx whose body has not begun when its worker's /health turns 500: the request moves, the headers alone are no answer", async () => {
  let healthA = 200;
  const answer = JSON.stringify({ choices: [{ text: 'from-a' }] });
  const a = await partEngine(200, '', answer, () => healthA, true);
  const b = await holdingEngine('from-b');
  const workers = ofModel('m', { a, b });
  await withFleet([a, b], workers, async (g) => {
    // an answer of declared length takes all of it from the answer budget when its headers arrive
    const pending = post(g.base, '/v1/completions', { model: 'm', prompt: 'headers only', max_tokens: 1 });
    await until(() => g.gateway.answerBudget.used === answer.length, "a's headers at the gateway");
    healthA = 500;
    await until(() => b.posts === 1, 'the request moved to b');
    const [r] = await releaseUntilAnswered([b], [pending]);
    await answeredBy(r, 'b');
  });
});

test("a server error being read and dropped when its worker's /health turns 500: it counts against the worker as any other", async () => {
  let healthA = 200;
  const error = JSON.stringify({ error: { message: 'engine exploded', type: 'server_error' } });
  const a = await partEngine(500, error.slice(0, 10), error.slice(10), () => healthA);
  const b = await holdingEngine('from-b');
  const workers = ofModel('m', { a, b });
  // one failure opens a circuit: the breaker's count shows in a's reasons
  await withFleet([a, b], workers, { breakerFailures: 1 }, async (g) => {
    const pending = post(g.base, '/v1/completions', { model: 'm', prompt: 'fails on a', max_tokens: 1 });
    // (written before the flip: the gateway reads it before the answer to any probe sent after)
    await until(() => a.partSent, "a's server error on its way");
    healthA = 500;
    await until(() => g.out('a'), 'a out of rotation');
    a.finish();
    const [r] = await releaseUntilAnswered([b], [pending]);
    await answeredBy(r, 'b');
    assert.equal(await sample(g.gateway.metrics, 'contextforge_upstream_failures_total{worker="a"}'), 1);
    // b answered the request a failed: a's server error counts against it
    assert.deepEqual(g.gateway.health.reasons('a').sort(), ['breaker', 'health-check']);
  });
});
