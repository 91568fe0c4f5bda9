/**
 * Shutting down: requests in flight finish within the grace, and a stream that outlives it is
 * ended with an error event and data: [DONE] and cut (its engine request aborted) instead of
 * holding the process open.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { connect } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { fakeEngine, RedisProcess, RedisProxy } from '../faults/harness.js';
import { until } from '../helpers/wait.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0, adminToken: 'shutdown-admin' };

/** The engine's other paths (the gateway asks for /v1/models on its own): not found. */
function completionsOnly(req: IncomingMessage, res: ServerResponse): boolean {
  if (req.method === 'POST' && req.url === '/v1/completions') return true;
  req.resume();
  res.writeHead(404).end();
  return false;
}

/** A listening gateway in front of one engine. */
async function gatewayTo(url: string) {
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'e0', url }],
    ...quiet,
  });
  return { gateway, base: await gateway.app.listen({ host: '127.0.0.1', port: 0 }) };
}

/** Resolves with `p`'s outcome, or rejects once `ms` have passed: a hang fails the test instead of stalling it. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not done after ${ms} ms`)), ms);
  });
  return Promise.race([p, deadline]).finally(() => clearTimeout(timer));
}

/**
 * An engine that holds each completion until its `answer()` (the last request's) is called, and
 * counts the completions it was sent.
 */
async function holdingEngine() {
  const state = { answer: undefined as (() => void) | undefined, completions: 0 };
  const engine = await fakeEngine((req, res) => {
    if (!completionsOnly(req, res)) return;
    state.completions++;
    req.resume();
    req.on('end', () => {
      state.answer = () =>
        res
          .writeHead(200, { 'content-type': 'application/json' })
          .end(JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'done' }] }));
    });
  });
  return Object.assign(engine, { state });
}

test('close() lets a request in flight finish, answers it whole, and ends once it is answered', async () => {
  const engine = await holdingEngine();
  const { gateway, base } = await gatewayTo(engine.url);
  try {
    const reply = fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'finish me', max_tokens: 4 }),
    });
    await until(() => engine.state.answer !== undefined, 'the engine has the request');
    const closed = gateway.close(120_000);
    engine.state.answer!();
    const res = await reply;
    assert.equal(res.status, 200);
    assert.match(await res.text(), /"done"/);
    // the client's connection, idle once answered, does not hold the close until its keep-alive ends
    await within(closed, 30_000, 'close() after the last answer');
  } finally {
    await engine.close();
  }
});

test('close() answers a request that arrives meanwhile on an open connection 503 gateway_shutdown in the OpenAI shape, and counts it', async () => {
  const engine = await holdingEngine();
  const { gateway, base } = await gatewayTo(engine.url);
  try {
    // a request in flight on a connection, and another sent on it once the gateway closes
    const body = JSON.stringify({ prompt: 'finish me', max_tokens: 4 });
    const request = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    const socket = connect(Number(new URL(base).port), '127.0.0.1');
    let text = '';
    socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
    const ended = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    let received = 0;
    gateway.app.server.on('request', () => received++);
    socket.write(request);
    await until(() => engine.state.answer !== undefined, 'the engine has the first request');
    const closed = gateway.close(120_000);
    socket.write(request);
    // its answer waits for the first's (answers go in order): the first is answered once the
    // gateway has the second
    await until(() => received === 2, 'the gateway to receive the second request');
    engine.state.answer!();
    await within(ended, 30_000, 'the connection to close after the answers');
    const answers = text.split(/(?=HTTP\/1\.1 )/);
    assert.equal(answers.length, 2, text);
    assert.match(answers[0], /^HTTP\/1\.1 200 /);
    assert.match(answers[1], /^HTTP\/1\.1 503 /);
    assert.match(answers[1], /\r\nconnection: close\r\n/i);
    const error = JSON.parse(answers[1].slice(answers[1].indexOf('\r\n\r\n') + 4)).error;
    assert.deepEqual(error, {
      message: 'the gateway is shutting down; send the request again',
      type: 'server_error',
      param: null,
      code: 'gateway_shutdown',
    });
    // the engine never saw it; the gateway counted it
    assert.equal(engine.state.completions, 1);
    await within(closed, 30_000, 'close() after the last answer');
    assert.match(
      await gateway.metrics.metrics(),
      /^contextforge_requests_total\{path="\/v1\/completions",status="503"\} 1$/m,
    );
  } finally {
    await engine.close();
  }
});

/** A stream that outlives the grace, its engine having sent one event and `tail` (part of another). */
async function streamCutAtGrace(tail: string): Promise<void> {
  let engineRequestClosed = false;
  const engine = await fakeEngine((req, res) => {
    if (!completionsOnly(req, res)) return;
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(
        `data: ${JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'a' }] })}\n\n${tail}`,
      );
      // and never ends
    });
    res.on('close', () => (engineRequestClosed = true));
  });
  const { gateway, base } = await gatewayTo(engine.url);
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'stream forever', max_tokens: 4, stream: true }),
    });
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    const first = await reader.read();
    assert.match(Buffer.from(first.value!).toString(), /"a"/);
    await within(gateway.close(100), 30_000, 'close(100) with a stream that never ends');
    // the client's stream ends as a stream an engine broke off does: its error event, then [DONE]
    const rest = await within(
      (async () => {
        let text = '';
        try {
          for (;;) {
            const { done, value } = await reader.read();
            if (done) return text;
            text += Buffer.from(value).toString();
          }
        } catch {
          return text;
        }
      })(),
      30_000,
      'the client stream ending',
    );
    const events = rest.split('\n\n').filter((e) => e !== '');
    assert.deepEqual(events.slice(-1), ['data: [DONE]'], rest);
    const error = JSON.parse(events.at(-2)!.replace(/^data: /, '')) as { error: { type: string; code: string } };
    assert.equal(error.error.type, 'server_error');
    assert.equal(error.error.code, 'gateway_shutdown');
    await until(() => engineRequestClosed, "the engine's request is aborted");
    await until(() => gateway.router.listWorkers()[0].inFlightRequests === 0, 'the cut request is released');
  } finally {
    await engine.close();
  }
}

test('close(grace) ends a stream that outlives the grace with an error event and [DONE], and aborts its engine request', () =>
  streamCutAtGrace(''));

test('close(grace) ends a stream cut in the middle of an event with the error event as an event of its own', () =>
  streamCutAtGrace('data: {"id":"c1","object":"text_'));

test('close() refuses a negative grace', async () => {
  const gateway = await createGateway({ router: new KVAwareRouter({ policy: 'round-robin' }), workers: [], ...quiet });
  await assert.rejects(gateway.close(-1), RangeError);
  await gateway.close();
});

/** A request (streamed or not) that no engine has answered when the grace ends. */
async function unansweredAtGrace(stream: boolean): Promise<void> {
  let received = 0;
  let engineRequestClosed = false;
  const silent = (req: IncomingMessage, res: ServerResponse) => {
    if (!completionsOnly(req, res)) return;
    received++;
    req.resume();
    res.on('close', () => (engineRequestClosed = true));
    // and never answers
  };
  // two engines: a failure counted for the first would send the request to the second
  const engines = [await fakeEngine(silent), await fakeEngine(silent)];
  const logs: string[] = [];
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: engines.map((e, i) => ({ id: `e${i}`, url: e.url })),
    ...quiet,
    log: (m) => logs.push(m),
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    const reply = fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'never answered', max_tokens: 4, stream }),
    });
    await until(() => received === 1, 'an engine has the request');
    const closed = gateway.close(100);
    const res = await within(reply, 30_000, 'the answer at the end of the grace');
    assert.equal(res.status, 503);
    assert.equal(res.headers.get('connection'), 'close');
    const body = (await res.json()) as { error: { type: string; code: string } };
    assert.equal(body.error.type, 'server_error');
    assert.equal(body.error.code, 'gateway_shutdown');
    await within(closed, 30_000, 'close(100) with a request no engine answers');
    await until(() => engineRequestClosed, "the engine's request is aborted");
    // not tried again on the other engine, not logged or counted as the engine's failure
    assert.equal(received, 1);
    assert.deepEqual(
      logs.filter((l) => /failed/.test(l)),
      [],
    );
    const text = await gateway.metrics.metrics();
    assert.equal(
      text
        .split('\n')
        .filter((l) => /^contextforge_(upstream_failures|upstream_retries)_total\{/.test(l) && !/ 0$/.test(l)).length,
      0,
      text,
    );
    assert.match(text, /contextforge_requests_total\{[^}]*status="503"[^}]*\} 1/);
    await until(() => gateway.router.listWorkers().every((w) => w.inFlightRequests === 0), 'the request is released');
  } finally {
    await Promise.all(engines.map((e) => e.close()));
  }
}

test('close(grace) answers a request no engine has answered by then 503 gateway_shutdown, aborts it, and counts no engine failure', () =>
  unansweredAtGrace(false));

test('close(grace) answers a stream whose engine has sent nothing by then 503 gateway_shutdown, not as an engine failure', () =>
  unansweredAtGrace(true));

/** The answer a request waiting before its engine attempt gets when the grace ends: 503 gateway_shutdown, Connection: close. */
async function assertShutdownAnswer(reply: Promise<Response>): Promise<void> {
  const res = await within(reply, 30_000, 'the answer at the end of the grace');
  assert.equal(res.status, 503);
  assert.equal(res.headers.get('connection'), 'close');
  const body = (await res.json()) as { error: { type: string; param: unknown; code: string } };
  assert.equal(body.error.type, 'server_error');
  assert.equal(body.error.param, null);
  assert.equal(body.error.code, 'gateway_shutdown');
}

/** No routing decision, engine failure or retry in `gateway`'s metrics. */
async function assertNothingStarted(gateway: { metrics: { metrics(): Promise<string> } }): Promise<void> {
  const text = await gateway.metrics.metrics();
  assert.deepEqual(
    text
      .split('\n')
      .filter(
        (l) =>
          /^contextforge_(route_decisions|upstream_failures|upstream_retries|stream_failures)_total\{/.test(l) &&
          !/ 0$/.test(l),
      ),
    [],
  );
}

/** An engine answering completions with a whole answer, counting them (`completions`); its other paths are not found. */
async function answeringEngine() {
  let completions = 0;
  const engine = await fakeEngine((req, res) => {
    if (!completionsOnly(req, res)) return;
    completions++;
    req.resume();
    req.on('end', () =>
      res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ id: 'c1', object: 'text_completion', choices: [{ index: 0, text: 'done' }] })),
    );
  });
  return Object.assign(engine, { completions: () => completions });
}

const completion = (base: string, body: Record<string, unknown>) =>
  fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'waiting', max_tokens: 4, ...body }),
  });

test('close(grace) answers a request still waiting for its tokenizer 503 gateway_shutdown, and sends it nowhere once tokenized', async () => {
  const engine = await answeringEngine();
  let tokenized: ((ids: number[]) => void) | undefined;
  const promptTokenizer = {
    async: true as const,
    tokenize: () => new Promise<ArrayLike<number>>((resolve) => (tokenized = resolve)),
  };
  const logs: string[] = [];
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'e0', url: engine.url }],
    tokenize: 'tokenizer',
    promptTokenizer,
    ...quiet,
    log: (m) => logs.push(m),
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    const reply = completion(base, { prompt: 'tokenize me slowly' });
    await until(() => tokenized !== undefined, 'the request waits for its tokenizer');
    const closed = gateway.close(100);
    await assertShutdownAnswer(reply);
    await within(closed, 30_000, 'close(100) with a request waiting for its tokenizer');
    // its tokens come after the cut: the request goes no further (the handler resumes within
    // this turn's microtasks, and would route and forward it before the next)
    tokenized!([1, 2, 3]);
    await new Promise((r) => setImmediate(r));
    assert.equal(engine.completions(), 0);
    await assertNothingStarted(gateway);
    assert.deepEqual(
      logs.filter((l) => /failed/.test(l)),
      [],
    );
  } finally {
    await engine.close();
  }
});

test("close(grace) answers a request still waiting for Redis's workflow lookup 503 gateway_shutdown, and sends it nowhere after", async () => {
  const redis = await new RedisProcess().start();
  const proxy = await new RedisProxy(redis.port).start();
  const engine = await answeringEngine();
  // the lookup outlasts the grace by far, and ends (times out) after the cut
  const store = new RedisStateStore({
    url: proxy.url,
    prefix: 'cf-shutdown-wait:',
    syncIntervalMs: 60_000,
    commandTimeoutMs: 3000,
    stallTimeoutMs: 3000,
  });
  const logs: string[] = [];
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'e0', url: engine.url }],
    state: store,
    ...quiet,
    log: (m) => logs.push(m),
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    await until(() => store.stats().connected === true, 'the replica to connect');
    const before = Number(store.stats().errors);
    proxy.withhold('shutdown-wf');
    const reply = completion(base, { contextforge: { workflowId: 'shutdown-wf-1', workflowStep: 0 } });
    await until(() => proxy.withheld > 0, 'the workflow lookup is sent, and withheld');
    const closed = gateway.close(100);
    await assertShutdownAnswer(reply);
    await within(closed, 30_000, 'close(100) with a request waiting for its workflow lookup');
    // the lookup has ended (timed out, or failed with the closed connection), and the request
    // with it, within the turn it ended in
    await until(() => Number(store.stats().errors) > before, 'the withheld lookup ends');
    await new Promise((r) => setImmediate(r));
    assert.equal(engine.completions(), 0);
    await assertNothingStarted(gateway);
    assert.deepEqual(
      logs.filter((l) => /failed/.test(l)),
      [],
    );
  } finally {
    await engine.close();
    await proxy.close();
    await redis.kill();
  }
});

test('close(grace) answers a request waiting to be retried 503 gateway_shutdown, and tries no other engine', async () => {
  let failed = 0;
  const failing = await fakeEngine((req, res) => {
    if (!completionsOnly(req, res)) return;
    failed++;
    req.resume();
    req.on('end', () =>
      res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"engine exploded"}}'),
    );
  });
  const good = await answeringEngine();
  let closed: Promise<void> | undefined;
  const logs: string[] = [];
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [
      { id: 'bad', url: failing.url },
      { id: 'good', url: good.url },
    ],
    ...quiet,
    log: (m) => {
      logs.push(m);
      // the failed attempt is logged just before the pause before its retry: a grace of 0 ends
      // within that pause (its timer is due before the pause's)
      if (/failed request before its answer .*: retried/.test(m)) closed ??= gateway.close(0);
    },
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    const reply = completion(base, {});
    await assertShutdownAnswer(reply);
    assert.ok(closed !== undefined, logs.join('\n'));
    await within(closed, 30_000, 'close(0) with a request waiting to be retried');
    assert.equal(failed, 1);
    assert.equal(good.completions(), 0);
    // the engine's own failure counts; the shutdown adds no retry
    const text = await gateway.metrics.metrics();
    assert.doesNotMatch(text, /^contextforge_upstream_retries_total\{[^}]*\} [1-9]/m);
    // routed, and answered by the gateway: observed like every routed request's answer (once
    // its handler, past the pause, finds it answered)
    await until(
      async () => /^contextforge_request_duration_seconds_count(\{\})? 1$/m.test(await gateway.metrics.metrics()),
      'the answer observed in contextforge_request_duration_seconds',
    );
  } finally {
    await failing.close();
    await good.close();
  }
});

test("close(grace) answers a request waiting for the engines' model lists 503 gateway_shutdown", async () => {
  let listsRead = 0;
  let completions = 0;
  const engine = await fakeEngine((req, res) => {
    if (req.method === 'GET' && req.url === '/v1/models') {
      listsRead++;
      // the first list (read when the worker is added) is answered; the next, asked for a model
      // it does not list, is not
      if (listsRead === 1)
        res
          .writeHead(200, { 'content-type': 'application/json' })
          .end(JSON.stringify({ object: 'list', data: [{ id: 'listed', object: 'model' }] }));
      return;
    }
    if (!completionsOnly(req, res)) return;
    completions++;
    req.resume();
    res.writeHead(500).end();
  });
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    // its operator names its models: a request for another has the lists read again
    workers: [{ id: 'e0', url: engine.url, models: ['listed'] }],
    ...quiet,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    await until(() => gateway.connections.get('e0')?.listed !== undefined, "the worker's model list is read");
    const reply = completion(base, { model: 'unlisted' });
    await until(() => listsRead === 2, 'the request waits for the model lists read again');
    const closed = gateway.close(100);
    await assertShutdownAnswer(reply);
    await within(closed, 30_000, 'close(100) with a request waiting for the model lists');
    assert.equal(completions, 0);
    await assertNothingStarted(gateway);
  } finally {
    await engine.close();
  }
});

test('close(grace) answers a /v1/route dry run still waiting for its tokenizer 503 gateway_shutdown', async () => {
  let waiting = false;
  const promptTokenizer = {
    async: true as const,
    tokenize: () => {
      waiting = true;
      return new Promise<ArrayLike<number>>(() => {});
    },
  };
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [],
    tokenize: 'tokenizer',
    promptTokenizer,
    ...quiet,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const reply = fetch(`${base}/v1/route`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${quiet.adminToken}` },
    body: JSON.stringify({ prompt: 'route me' }),
  });
  await until(() => waiting, 'the dry run waits for its tokenizer');
  const closed = gateway.close(100);
  await assertShutdownAnswer(reply);
  await within(closed, 30_000, 'close(100) with a dry run waiting for its tokenizer');
});

test("close(grace) answers a /v1/models request still waiting for the engines' lists 503 gateway_shutdown", async () => {
  let clientListAsked = false;
  // every list is read, and none answered; the client's read carries its Via
  const engine = await fakeEngine((req) => {
    if (req.url === '/v1/models' && /client-proxy/.test(req.headers.via ?? '')) clientListAsked = true;
  });
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'e0', url: engine.url }],
    ...quiet,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    const reply = fetch(`${base}/v1/models`, { headers: { via: '1.1 client-proxy' } });
    await until(() => clientListAsked, "the request waits for the engine's list");
    const closed = gateway.close(100);
    await assertShutdownAnswer(reply);
    await within(closed, 30_000, "close(100) with a request waiting for the engines' lists");
  } finally {
    await engine.close();
  }
});
