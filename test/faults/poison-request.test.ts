/**
 * A request that makes every engine answer with a server error (an input that hits an engine
 * bug) is the request's failure, not the workers': a client sending a few of them must not open
 * every worker's circuit and leave everyone else with 503. A worker that answers 5xx where
 * another worker answers the same request is still taken out, and failures that are no answer
 * (a refused connection) still count at once.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { fakeEngine, failingEngine, freePort, post, sample, type FakeEngine } from './harness.js';

/** The prompt text that makes the engines below fail. */
const MARKER = 'POISON';

const completion = JSON.stringify({
  id: 'cmpl-1',
  object: 'text_completion',
  created: 0,
  model: 'mock',
  choices: [{ index: 0, text: 'ok', finish_reason: 'stop', logprobs: null }],
  usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
});

/**
 * An engine failing a request whose body holds MARKER with a server error, and answering any
 * other with a completion: with a 500 status, or (`inStream`) with vLLM's error event as its
 * stream's first event, as vLLM fails a streamed request.
 */
const poisonableEngine = (inStream: boolean) =>
  fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      if (!Buffer.concat(parts).includes(MARKER))
        return void res.writeHead(200, { 'content-type': 'application/json' }).end(completion);
      const error = '{"error":{"message":"engine bug hit","type":"InternalServerError","param":null,"code":500}}';
      if (!inStream) return void res.writeHead(500, { 'content-type': 'application/json' }).end(error);
      res.writeHead(200, { 'content-type': 'text/event-stream' }).end(`data: ${error}\n\ndata: [DONE]\n\n`);
    });
  });

/** An engine answering every request with a completion. */
const goodEngine = () =>
  fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(completion));
  });

/**
 * A gateway over `engines` (workers w0, w1, …), round-robin with 2 retries unless told otherwise:
 * 3 failures in a row open a circuit for a minute.
 */
async function gatewayOver(
  urls: string[],
  { policy = 'round-robin', maxRetries = 2 }: { policy?: string; maxRetries?: number } = {},
): Promise<{ gateway: Gateway; base: string }> {
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy }),
    workers: urls.map((url, i) => ({ id: `w${i}`, url })),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    breakerFailures: 3,
    breakerCooldownMs: 60_000,
    maxRetries,
  });
  return { gateway, base: await gateway.app.listen({ host: '127.0.0.1', port: 0 }) };
}

async function closeAll(gateway: Gateway | undefined, engines: FakeEngine[]): Promise<void> {
  await gateway?.close(0);
  for (const e of engines) await e.close();
}

/** Three engines that answer a poisoned prompt with a server error (see poisonableEngine). */
async function threePoisonableEngines(inStream: boolean) {
  return [await poisonableEngine(inStream), await poisonableEngine(inStream), await poisonableEngine(inStream)];
}

for (const [how, inStream] of [
  ['with a 5xx status', false],
  ['with a server error as the first event of its stream', true],
] as const)
  test(`requests every engine fails ${how} open no circuit: an ordinary request after them is served`, async () => {
    const engines = await threePoisonableEngines(inStream);
    let gateway: Gateway | undefined;
    try {
      const g = await gatewayOver(engines.map((e) => e.url));
      gateway = g.gateway;
      for (let i = 0; i < 10; i++) {
        const r = await post(g.base, '/v1/completions', {
          prompt: `${MARKER} ${i}`,
          max_tokens: 1,
          stream: inStream,
        });
        assert.equal(r.status, 502, `marked request ${i}: ${r.text}`);
      }
      for (const e of engines) assert.ok(e.requests >= 3, 'every engine was tried, more than once');
      for (const id of ['w0', 'w1', 'w2']) {
        assert.deepEqual(gateway.health.reasons(id), [], `${id}'s circuit stays closed`);
        assert.ok(
          (await sample(gateway.metrics, `contextforge_upstream_failures_total{worker="${id}"}`)) >= 3,
          `${id}'s failed attempts are still counted as failures`,
        );
      }
      assert.ok(
        (await sample(gateway.metrics, 'contextforge_upstream_retries_total{worker="w0"}')) >= 1,
        'retries still counted',
      );
      const r = await post(g.base, '/v1/completions', { prompt: 'an ordinary prompt', max_tokens: 1 });
      assert.equal(r.status, 200, r.text);
    } finally {
      await closeAll(gateway, engines);
    }
  });

test('a worker answering 5xx to every request while the others answer them is taken out', async () => {
  const bad = await failingEngine();
  const engines = [bad, await goodEngine(), await goodEngine()];
  let gateway: Gateway | undefined;
  try {
    const g = await gatewayOver(engines.map((e) => e.url));
    gateway = g.gateway;
    for (let i = 0; i < 12 && gateway.health.reasons('w0').length === 0; i++) {
      const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 1 });
      assert.equal(r.status, 200, `request ${i}: ${r.text}`);
      assert.notEqual(r.headers.get('x-contextforge-worker'), 'w0');
    }
    assert.deepEqual(gateway.health.reasons('w0'), ['breaker'], "the failing worker's circuit opened");
    assert.equal(
      await sample(gateway.metrics, 'contextforge_upstream_failures_total{worker="w0"}'),
      3,
      'after three failures where another worker answered',
    );
    assert.equal(await sample(gateway.metrics, 'contextforge_worker_out_of_rotation{worker="w0",reason="breaker"}'), 1);
    const tried = bad.requests;
    for (let i = 0; i < 3; i++)
      assert.equal((await post(g.base, '/v1/completions', { prompt: `q${i}`, max_tokens: 1 })).status, 200);
    assert.equal(bad.requests, tried, 'an open circuit keeps the worker out');
  } finally {
    await closeAll(gateway, engines);
  }
});

for (const policy of ['round-robin', 'cost'])
  test(`with retries off (${policy}), a worker answering 5xx to every request while another answers them is taken out`, async () => {
    const bad = await failingEngine();
    const engines = [bad, await goodEngine()];
    let gateway: Gateway | undefined;
    try {
      const g = await gatewayOver(
        engines.map((e) => e.url),
        { policy, maxRetries: 0 },
      );
      gateway = g.gateway;
      let failed = 0;
      for (let i = 0; i < 30 && gateway.health.reasons('w0').length === 0; i++) {
        const r = await post(g.base, '/v1/completions', {
          prompt: `p${i} ${'lorem ipsum '.repeat(20)}`,
          max_tokens: 1,
        });
        // nothing retries the failing worker's answers: their clients get 502
        if (r.status === 502) failed++;
        else assert.equal(r.status, 200, `request ${i}: ${r.text}`);
      }
      assert.deepEqual(gateway.health.reasons('w0'), ['breaker'], "the failing worker's circuit opened");
      assert.equal(
        failed,
        3,
        'after its third server error answer, each with an answer of the other worker between them',
      );
      const tried = bad.requests;
      assert.equal(
        await sample(gateway.metrics, 'contextforge_worker_out_of_rotation{worker="w0",reason="breaker"}'),
        1,
      );
      for (let i = 0; i < 10; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `q${i}`, max_tokens: 1 });
        assert.equal(r.status, 200, `request ${i} after the circuit opened: ${r.text}`);
        assert.equal(r.headers.get('x-contextforge-worker'), 'w1');
      }
      assert.equal(bad.requests, tried, 'an open circuit keeps the worker out');
    } finally {
      await closeAll(gateway, engines);
    }
  });

for (const [how, inStream] of [
  ['with a 5xx status', false],
  ['with a server error as the first event of its stream', true],
] as const)
  test(`with retries off, requests every engine fails ${how} open no circuit`, async () => {
    const engines = await threePoisonableEngines(inStream);
    let gateway: Gateway | undefined;
    try {
      const g = await gatewayOver(
        engines.map((e) => e.url),
        { maxRetries: 0 },
      );
      gateway = g.gateway;
      for (let i = 0; i < 12; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `${MARKER} ${i}`, max_tokens: 1, stream: inStream });
        assert.equal(r.status, 502, `marked request ${i}: ${r.text}`);
      }
      for (const e of engines) assert.ok(e.requests >= 4, 'each engine answered 4 of them');
      for (const id of ['w0', 'w1', 'w2'])
        assert.deepEqual(gateway.health.reasons(id), [], `${id}'s circuit stays closed`);
      for (let i = 0; i < 3; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `an ordinary prompt ${i}`, max_tokens: 1 });
        assert.equal(r.status, 200, r.text);
      }
    } finally {
      await closeAll(gateway, engines);
    }
  });

for (const maxRetries of [0, 2])
  test(`the only worker answering 5xx to every request stays in rotation (max retries ${maxRetries}): 502, not 503`, async () => {
    const engines = [await failingEngine()];
    let gateway: Gateway | undefined;
    try {
      const g = await gatewayOver(
        engines.map((e) => e.url),
        { maxRetries },
      );
      gateway = g.gateway;
      for (let i = 0; i < 8; i++) {
        const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 1 });
        assert.equal(r.status, 502, `request ${i}: ${r.text}`);
      }
      assert.deepEqual(gateway.health.reasons('w0'), []);
    } finally {
      await closeAll(gateway, engines);
    }
  });

test('a refused connection still counts at once, even on the only worker tried', async () => {
  const port = await freePort();
  let gateway: Gateway | undefined;
  try {
    const g = await gatewayOver([`http://127.0.0.1:${port}`]);
    gateway = g.gateway;
    for (let i = 0; i < 3; i++) {
      const r = await post(g.base, '/v1/completions', { prompt: `p${i}`, max_tokens: 1 });
      assert.equal(r.status, 502, r.text);
    }
    assert.deepEqual(gateway.health.reasons('w0'), ['breaker']);
  } finally {
    await closeAll(gateway, []);
  }
});
