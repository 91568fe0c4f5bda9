/**
 * An engine's model-not-found 404 (vLLM's `NotFoundError`) before anything reached the client is
 * retried on another worker whose engine lists the model, and only there: an adapter unloaded
 * from one engine at run time (vLLM's /v1/unload_lora_adapter) is still served by the others
 * before the gateway reads the lists again. The 404 is no failure of the worker's (its circuit
 * does not count it); a name no engine lists, or one only workers whose lists are unknown may
 * serve, still gets the engine's 404 after one attempt.
 */
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { fakeEngine, OK_COMPLETION, sample } from '../faults/harness.js';
import { until } from '../helpers/wait.js';
import { keptRequest, quietConnections } from '../helpers/worker-connections.js';

const complete = (url: string, model: string, stream = false) =>
  fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt: 'same prompt', max_tokens: 2, stream }),
  });

/** A gateway (round-robin, a circuit that opens at one counted failure) over `workers`, listening. */
async function gateway(
  workers: Array<{ id: string; url: string; models?: string[] }>,
): Promise<{ gw: Gateway; url: string }> {
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    breakerFailures: 1,
  });
  const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  return { gw, url };
}

/** Engines a and b, each serving m and the adapter l1, behind a gateway(); all closed after test `t`. */
async function twoServingL1(t: TestContext): Promise<{ a: MockEngine; gw: Gateway; url: string }> {
  const a = await new MockEngine({ model: 'm', loraModules: ['l1'] }).start();
  const b = await new MockEngine({ model: 'm', loraModules: ['l1'] }).start();
  const { gw, url } = await gateway([
    { id: 'a', url: `http://127.0.0.1:${a.port}` },
    { id: 'b', url: `http://127.0.0.1:${b.port}` },
  ]);
  t.after(async () => {
    await gw.close();
    await a.close();
    await b.close();
  });
  return { a, gw, url };
}

const available = async (url: string) =>
  ((await (await fetch(`${url}/readyz`)).json()) as { availableWorkers: number }).availableWorkers;

for (const stream of [false, true]) {
  test(`an adapter unloaded from one engine is served by another that lists it (stream: ${stream})`, async (t) => {
    const { a, gw, url } = await twoServingL1(t);
    await until(
      () => ['a', 'b'].every((id) => gw.connections.get(id)?.listed?.has('l1') === true),
      'both lists read, listing l1',
    );
    const unloaded = await fetch(`http://127.0.0.1:${a.port}/v1/unload_lora_adapter`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ lora_name: 'l1' }),
    });
    assert.equal(unloaded.status, 200, await unloaded.text());
    const direct = await fetch(`http://127.0.0.1:${a.port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'l1', prompt: 'x', max_tokens: 1 }),
    });
    assert.equal(direct.status, 404, 'a serves l1 no more');
    // the gateway still reads a's list as listing l1: round-robin sends one of the first requests
    // there, whose 404 is retried on b (and has a's list read again)
    const tried = () => sample(gw.metrics, 'contextforge_upstream_retries_total{worker="a"}');
    for (let i = 0; i < 4 && (await tried()) === 0; i++) {
      const r = await complete(url, 'l1', stream);
      const text = await r.text();
      assert.equal(r.status, 200, text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'b', text);
      if (stream) {
        assert.match(r.headers.get('content-type') ?? '', /text\/event-stream/);
        assert.match(text, /data: \[DONE\]/);
      } else assert.ok(((JSON.parse(text) as { choices: unknown[] }).choices ?? []).length > 0, text);
    }
    assert.equal(await tried(), 1, "a's 404 retried once");
    assert.equal(
      await sample(gw.metrics, 'contextforge_upstream_failures_total{worker="a",reason="status"}'),
      1,
      'counted as a failed attempt whose reason is its status',
    );
    // no breaker count: with a circuit that opens at one failure, a is still in rotation
    assert.equal(await available(url), 2, "a's circuit is not opened by its 404");
    await until(() => gw.connections.get('a')?.listed?.has('l1') === false, "a's list read again");
  });
}

test('a name no engine serves gets the engine 404 after one attempt', async (t) => {
  const { gw, url } = await twoServingL1(t);
  await until(() => ['a', 'b'].every((id) => gw.connections.get(id)?.listed !== undefined), 'both lists read');
  for (const stream of [false, true]) {
    const r = await complete(url, 'nope', stream);
    assert.equal(r.status, 404);
    const body = (await r.json()) as { error: { type: string; code: number; message: string } };
    assert.equal(body.error.type, 'NotFoundError', 'the engine 404, passed on');
    assert.equal(body.error.code, 404);
    assert.match(body.error.message, /The model `nope` does not exist/);
  }
  assert.equal(await sample(gw.metrics, 'contextforge_upstream_retries_total'), 0, 'no retry');
  assert.equal(await sample(gw.metrics, 'contextforge_upstream_failures_total'), 0, 'no failed attempt');
});

test('a 404 is not retried on a worker whose model list is unknown', async (t) => {
  const a = await new MockEngine({ model: 'm', loraModules: ['l1'] }).start();
  // c serves every name, but its /v1/models never answers with a list
  let completions = 0;
  const c = await fakeEngine((req, res) => {
    req.resume();
    if (req.url === '/v1/models') return void res.writeHead(500).end();
    completions++;
    res.writeHead(200, { 'content-type': 'application/json' }).end(OK_COMPLETION);
  });
  const { gw, url } = await gateway([
    { id: 'a', url: `http://127.0.0.1:${a.port}` },
    { id: 'c', url: c.url },
  ]);
  t.after(async () => {
    await gw.close();
    await a.close();
    await c.close();
  });
  await until(() => gw.connections.get('a')?.listed?.has('l1') === true, "a's list read");
  await fetch(`http://127.0.0.1:${a.port}/v1/unload_lora_adapter`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ lora_name: 'l1' }),
  }).then((r) => r.arrayBuffer());
  let served = 0;
  let notFound = 0;
  for (let i = 0; i < 4 && notFound === 0; i++) {
    const r = await complete(url, 'l1');
    const text = await r.text();
    if (r.status === 200) {
      assert.equal(r.headers.get('x-contextforge-worker'), 'c', text);
      served++;
    } else {
      assert.equal(r.status, 404, text);
      assert.equal(r.headers.get('x-contextforge-worker'), 'a', text);
      notFound++;
    }
  }
  assert.equal(notFound, 1, "a's 404 passed on");
  assert.equal(completions, served, 'c took only the requests routed to it first');
  assert.equal(await sample(gw.metrics, 'contextforge_upstream_retries_total'), 0, 'no retry');
});

test("a worker's models= is not its engine's list: a 404 for a name the operator lists is not retried", async (t) => {
  // every worker says (models=) it serves `typo`; the engines serve `m`, and answer `typo` with
  // vLLM's model-not-found
  const engines = await Promise.all([0, 1, 2].map(() => new MockEngine({ model: 'm' }).start()));
  const ids = ['w0', 'w1', 'w2'];
  const { gw, url } = await gateway(
    engines.map((e, i) => ({ id: ids[i]!, url: `http://127.0.0.1:${e.port}`, models: ['typo'] })),
  );
  t.after(async () => {
    await gw.close();
    for (const e of engines) await e.close();
  });
  await until(() => ids.every((id) => gw.connections.get(id)?.listed?.has('m') === true), 'the lists read');
  const r = await complete(url, 'typo');
  const body = (await r.json()) as { error: { type: string; message: string } };
  assert.equal(r.status, 404);
  assert.equal(body.error.type, 'NotFoundError', 'the engine 404, passed on');
  assert.match(body.error.message, /The model `typo` does not exist/);
  assert.equal(await sample(gw.metrics, 'contextforge_upstream_retries_total'), 0, 'no retry');
  assert.equal(await sample(gw.metrics, 'contextforge_upstream_failures_total'), 0, 'no failed attempt');
});

test("a JSON 404 that is not the engine's model-not-found (FastAPI's route 404) is not retried", async (t) => {
  // engines that list `m` and answer every completion as a server with no such route does
  let completions = 0;
  const engines = await Promise.all(
    [0, 1, 2].map(() =>
      fakeEngine((req, res) => {
        if (req.url === '/v1/models') {
          req.resume();
          return void res
            .writeHead(200, { 'content-type': 'application/json' })
            .end(JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model' }] }));
        }
        completions++;
        req.resume();
        req.on('end', () => res.writeHead(404, { 'content-type': 'application/json' }).end('{"detail":"Not Found"}'));
      }),
    ),
  );
  const ids = ['w0', 'w1', 'w2'];
  const { gw, url } = await gateway(engines.map((e, i) => ({ id: ids[i]!, url: e.url })));
  t.after(async () => {
    await gw.close();
    for (const e of engines) await e.close();
  });
  await until(() => ids.every((id) => gw.connections.get(id)?.listed?.has('m') === true), 'the lists read');
  const r = await complete(url, 'm');
  assert.equal(r.status, 404);
  assert.deepEqual(await r.json(), { detail: 'Not Found' }, "the engine's 404, passed on");
  assert.equal(await sample(gw.metrics, 'contextforge_upstream_retries_total'), 0, 'no retry');
  assert.equal(await sample(gw.metrics, 'contextforge_upstream_failures_total'), 0, 'no failed attempt');
  assert.equal(completions, 1, 'one attempt');
});

test('after a model-not-found 404, a request moves off a worker out of rotation only to one whose engine lists the model', async (t) => {
  const { health, connections } = quietConnections();
  // c's engine lists m (once the test lets it); a's and b's lists are never read
  let listing = false;
  const engine = await fakeEngine((req, res) => {
    req.resume();
    if (!listing) return void res.writeHead(500).end();
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ data: [{ id: 'm' }] }));
  });
  t.after(async () => {
    await connections.close();
    await engine.close();
  });
  connections.add({ id: 'a', url: 'http://127.0.0.1:9' });
  connections.add({ id: 'b', url: 'http://127.0.0.1:9' });
  connections.add({ id: 'c', url: engine.url });
  health.set('c', 'health-check', false, 'HTTP 500');
  const retried = keptRequest(connections, 'a', 'm', true);
  const first = keptRequest(connections, 'a', 'm');
  health.set('a', 'health-check', false, 'HTTP 500');
  assert.equal(first(), 1, 'a request on its first attempt moves to b, whose list is unknown');
  assert.equal(retried(), 0, "the retried one does not: b's engine may answer the same 404");
  health.set('c', 'health-check', true);
  await connections.readAdapters('c');
  assert.equal(retried(), 0, "c is in rotation, but its engine's list was not read");
  listing = true;
  await connections.readAdapters('c');
  assert.equal(retried(), 1, "moved once c's engine lists the model");
});
