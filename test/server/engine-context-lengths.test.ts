/**
 * Engines of one model started with different context lengths (--max-model-len): each lists its
 * own in /v1/models (`max_model_len`), and a request too long for one goes to one that takes it,
 * not to one that answers it 400.
 */
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { test, type TestContext } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { OUT_FOR_NOW_MS } from '../../src/server/worker-connections.js';
import { fakeEngine, type FakeEngine } from '../faults/harness.js';
import { until } from '../helpers/wait.js';
import { keptRequest, quietConnections } from '../helpers/worker-connections.js';

/**
 * An engine whose /v1/models lists model m, with `length` as its max_model_len when given, and
 * that answers every other request with `answer` (a completion by default).
 */
function listingEngine(
  length: number | undefined,
  answer: (res: ServerResponse) => void = (res) =>
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ id: 'c', choices: [{ index: 0, text: 'ok', finish_reason: 'length' }] })),
): Promise<FakeEngine> {
  return fakeEngine((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url !== '/v1/models') return answer(res);
      const card = length === undefined ? { id: 'm', object: 'model' } : { id: 'm', max_model_len: length };
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data: [card] }));
    });
  });
}

/** Prompts as token ids: the gateway knows their length before it routes them. */
const prompt = (tokens: number, family = 1) => Array.from({ length: tokens }, (_, i) => family * 100_000 + i);

async function complete(url: string, body: Record<string, unknown>) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', ...body }),
  });
  return { status: r.status, worker: r.headers.get('x-contextforge-worker'), text: await r.text() };
}

async function dryRun(gw: Gateway, url: string, body: Record<string, unknown>) {
  const r = await fetch(`${url}/v1/route`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${gw.adminToken}` },
    body: JSON.stringify({ model: 'm', ...body }),
  });
  return (await r.json()) as { worker: string | null };
}

/** A round-robin gateway in front of `engines`, closed with them when the test ends. */
async function fleet(t: TestContext, engines: Array<{ id: string; url: string; engine: { close(): Promise<void> } }>) {
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: engines.map(({ id, url }) => ({ id, url })),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  t.after(async () => {
    await gw.close();
    for (const { engine } of engines) await engine.close();
  });
  return { gw, url: await gw.app.listen({ host: '127.0.0.1', port: 0 }) };
}

/** Mock engines of model m with contexts of 64 ('short') and 4096 ('long') tokens behind a round-robin gateway. */
async function shortAndLong(t: TestContext) {
  const short = await new MockEngine({ model: 'm', maxModelLen: 64 }).start();
  const long = await new MockEngine({ model: 'm', maxModelLen: 4096 }).start();
  return fleet(t, [
    { id: 'short', url: `http://127.0.0.1:${short.port}`, engine: short },
    { id: 'long', url: `http://127.0.0.1:${long.port}`, engine: long },
  ]);
}

test('a prompt longer than one engine takes goes to the engine with the longer context', async (t) => {
  const { gw, url } = await shortAndLong(t);
  // the lists are read when the workers are added: a long prompt's dry run shows when both are
  await until(
    async () =>
      (await dryRun(gw, url, { prompt: prompt(100) })).worker === 'long' &&
      (await dryRun(gw, url, { prompt: prompt(100) })).worker === 'long',
    'the context lengths read',
  );
  for (let i = 0; i < 6; i++) {
    // round robin alternates the two; the long prompts go to the long engine every time
    const r = await complete(url, { prompt: prompt(100 + i, i + 2), max_tokens: 1 });
    assert.deepEqual([r.status, r.worker], [200, 'long'], r.text);
  }
  const workers = new Set<string | null>();
  for (let i = 0; i < 4; i++) {
    const r = await complete(url, { prompt: prompt(10, 50 + i), max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
    workers.add(r.worker);
  }
  assert.deepEqual([...workers].sort(), ['long', 'short'], 'short prompts still go to both');
  // a prompt that fits whose max_tokens does not fit in what the short context leaves (vLLM's 400)
  for (let i = 0; i < 4; i++) {
    const r = await complete(url, { prompt: prompt(40, 80 + i), max_tokens: 30 });
    assert.deepEqual([r.status, r.worker], [200, 'long'], r.text);
  }
  // a completion without max_tokens asks for the engines' default of 16 tokens: 50 + 16 does not
  // fit in 64 (the short engine's 400), 40 + 16 does
  for (let i = 0; i < 4; i++) {
    const r = await complete(url, { prompt: prompt(50, 60 + i) });
    assert.deepEqual([r.status, r.worker], [200, 'long'], r.text);
  }
  const defaultFits = new Set<string | null>();
  for (let i = 0; i < 4; i++) {
    const r = await complete(url, { prompt: prompt(40, 70 + i) });
    assert.equal(r.status, 200, r.text);
    defaultFits.add(r.worker);
  }
  assert.deepEqual([...defaultFits].sort(), ['long', 'short']);
  // the completions endpoint has no max_completion_tokens (chat's): the engine reads max_tokens
  // only, so a prompt that fits with it goes to either engine
  const completionField = new Set<string | null>();
  for (let i = 0; i < 4; i++) {
    const r = await complete(url, { prompt: prompt(40, 90 + i), max_tokens: 1, max_completion_tokens: 30 });
    assert.equal(r.status, 200, r.text);
    completionField.add(r.worker);
  }
  assert.deepEqual([...completionField].sort(), ['long', 'short']);
  // a batch is checked by its longest prompt, whichever the router hashes (the first)
  for (let i = 0; i < 4; i++) {
    const r = await dryRun(gw, url, { prompt: [prompt(10, 110 + i), prompt(100, 120 + i)], max_tokens: 1 });
    assert.equal(r.worker, 'long');
  }
  // too long for every engine: the engine's own 400 says so, not a 503 for want of a worker
  const tooLong = await complete(url, { prompt: prompt(5000, 99), max_tokens: 1 });
  assert.equal(tooLong.status, 400, tooLong.text);
  assert.match(tooLong.text, /maximum context length/);
  assert.equal(gw.router.getStats().inFlightRequests, 0);
});

test('an engine that lists no context length, or one not in rotation, leaves nothing out', async (t) => {
  // a list without max_model_len: nothing known of its context
  const unlisted = await listingEngine(undefined);
  const short = await new MockEngine({ model: 'm', maxModelLen: 64 }).start();
  const { gw, url } = await fleet(t, [
    { id: 'short', url: `http://127.0.0.1:${short.port}`, engine: short },
    { id: 'unlisted', url: unlisted.url, engine: unlisted },
  ]);
  await until(async () => (await dryRun(gw, url, { prompt: prompt(100) })).worker === 'unlisted', 'the lists read');
  for (let i = 0; i < 4; i++) {
    const r = await complete(url, { prompt: prompt(100, i + 2), max_tokens: 1 });
    assert.deepEqual([r.status, r.worker], [200, 'unlisted'], r.text);
  }
  // the worker that could take it drained: the short engine answers, with its 400
  await fetch(`${url}/admin/workers/unlisted/drain`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${gw.adminToken}` },
    body: '{}',
  });
  await until(() => gw.router.listWorkers().find((w) => w.id === 'unlisted')?.available === false, 'drained');
  const refused = await complete(url, { prompt: prompt(100, 9), max_tokens: 1 });
  assert.deepEqual([refused.status, refused.worker], [400, 'short'], refused.text);
});

test('a request kept on a worker out of rotation moves only to a worker whose engine takes its prompt', async (t) => {
  const engines = [await listingEngine(4096), await listingEngine(64), await listingEngine(4096)];
  const { health, connections } = quietConnections();
  t.after(async () => {
    await connections.close();
    for (const e of engines) await e.close();
  });
  ['holder', 'short', 'long'].forEach((id, i) => connections.add({ id, url: engines[i].url }));
  for (const id of ['holder', 'short', 'long']) await connections.readAdapters(id);
  health.set('long', 'health-check', false, 'HTTP 500');
  const moved = keptRequest(connections, 'holder', 'm', false, 100);
  const shortPrompt = keptRequest(connections, 'holder', 'm', false, 10);
  health.set('holder', 'health-check', false, 'HTTP 500');
  assert.equal(shortPrompt(), 1, 'a prompt the short engine takes moves there');
  assert.equal(moved(), 0, 'kept: the one worker in rotation would refuse it as too long');
  health.set('long', 'health-check', true);
  assert.equal(moved(), 1, 'moved once a worker whose engine takes it is in rotation');
});

test('the only engines that take a prompt out of rotation for now: the short ones are still left out', async (t) => {
  const engines = [await listingEngine(64), await listingEngine(4096), await listingEngine(undefined)];
  const { router, health, connections } = quietConnections();
  t.after(async () => {
    await connections.close();
    for (const e of engines) await e.close();
  });
  ['short', 'long', 'unlisted'].forEach((id, i) => connections.add({ id, url: engines[i].url }));
  for (const id of ['short', 'long', 'unlisted']) await connections.readAdapters(id);
  const without = (tokens: number) => [...connections.withoutRoom(new Set(), 'm', tokens, 1)].sort();
  // the unlisted engine out of the way: what is known of a context decides
  router.drainWorker('unlisted');
  assert.deepEqual(without(100), ['short'], 'the long engine in rotation');
  // unhealthy for now (a failing health check, an open breaker): a 503 to try again beats the
  // short engine's 400, which would tell the client the prompt is too long for the fleet
  health.set('long', 'health-check', false, 'HTTP 500');
  assert.deepEqual(without(100), ['short']);
  assert.deepEqual(without(10), [], 'a prompt the short engine takes');
  // out for longer than OUT_FOR_NOW_MS, it is taken for gone: the short engine answers, with its 400
  t.mock.timers.enable({ apis: ['Date'], now: Date.now() });
  health.set('long', 'health-check', true);
  health.set('long', 'health-check', false, 'HTTP 500');
  t.mock.timers.tick(OUT_FOR_NOW_MS - 1);
  assert.deepEqual(without(100), ['short']);
  t.mock.timers.tick(1);
  assert.deepEqual(without(100), []);
  // drained, it is on its way out: the short engine answers, with its 400
  health.set('long', 'health-check', true);
  assert.deepEqual(without(100), ['short']);
  router.drainWorker('long');
  assert.deepEqual(without(100), []);
});

test('the long engine unhealthy for now: the client is answered 503 to try again, saying why', async (t) => {
  const { gw, url } = await shortAndLong(t);
  await until(async () => (await dryRun(gw, url, { prompt: prompt(100) })).worker === 'long', 'the lists read');
  gw.health.set('long', 'health-check', false, 'HTTP 500');
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: prompt(100, 7), max_tokens: 1 }),
  });
  const text = await r.text();
  assert.equal(r.status, 503, text);
  assert.equal(r.headers.get('retry-after'), '1');
  assert.match(text, /no_worker_available/);
  assert.match(text, /1 context too short for the prompt/);
  assert.match(text, /1 health check failing/);
  // a prompt the short engine takes is served meanwhile
  const fits = await complete(url, { prompt: prompt(10, 8), max_tokens: 1 });
  assert.deepEqual([fits.status, fits.worker], [200, 'short'], fits.text);
  assert.equal(gw.router.getStats().inFlightRequests, 0);
});

test("the long engine busy or failing the prompt, the client is answered to try again, not the short engine's 400", async (t) => {
  const short = await new MockEngine({ model: 'm', maxModelLen: 64 }).start();
  let longAttempts = 0;
  let answer = 429;
  const long = await listingEngine(4096, (res) => {
    longAttempts++;
    res
      .writeHead(answer, { 'content-type': 'application/json', 'retry-after': '2' })
      .end('{"error":{"message":"overloaded"}}');
  });
  const { gw, url } = await fleet(t, [
    { id: 'short', url: `http://127.0.0.1:${short.port}`, engine: short },
    { id: 'long', url: long.url, engine: long },
  ]);
  await until(async () => (await dryRun(gw, url, { prompt: prompt(100) })).worker === 'long', 'the lists read');
  // the one engine that takes the prompt may take it once it is less busy: a 400 would tell the
  // client never to send it again
  for (const status of [429, 503]) {
    answer = status;
    const before = longAttempts;
    const r = await complete(url, { prompt: prompt(100, status), max_tokens: 1 });
    assert.ok(r.status === 429 || r.status === 503, `${status}: ${r.status} ${r.text}`);
    assert.notEqual(r.worker, 'short', r.text);
    assert.doesNotMatch(r.text, /maximum context length/);
    assert.ok(longAttempts > before, 'the long engine was tried');
  }
  assert.equal(gw.router.getStats().inFlightRequests, 0);
});

test('/v1/models lists a model with the longest context its engines list, whichever answers first', async (t) => {
  // the long engine answers its list only once the short one has answered its own
  let shortAnswered: () => void = () => {};
  const shortListed = new Promise<void>((resolve) => (shortAnswered = resolve));
  const card = (length: number) => JSON.stringify({ object: 'list', data: [{ id: 'm', max_model_len: length }] });
  const long = await fakeEngine((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url !== '/v1/models') return void res.writeHead(404).end();
      void shortListed.then(() => res.writeHead(200, { 'content-type': 'application/json' }).end(card(4096)));
    });
  });
  const short = await fakeEngine((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url !== '/v1/models') return void res.writeHead(404).end();
      res.writeHead(200, { 'content-type': 'application/json' }).end(card(64), () => shortAnswered());
    });
  });
  const { url } = await fleet(t, [
    { id: 'short', url: short.url, engine: short },
    { id: 'long', url: long.url, engine: long },
  ]);
  const r = await fetch(`${url}/v1/models`);
  const listed = (await r.json()) as { data: Array<{ id: string; max_model_len?: number }> };
  assert.equal(r.status, 200);
  assert.deepEqual(listed.data, [{ id: 'm', max_model_len: 4096 }]);
});
