import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { test } from 'node:test';
import OpenAI from 'openai';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';
import { listening } from '../helpers/listening.js';

test('killing a worker under load loses no request that had not started streaming', async () => {
  const engines = [
    await new MockEngine({ decodeTokS: 100 }).start(),
    await new MockEngine({ decodeTokS: 100 }).start(),
  ];
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const logs: string[] = [];
  const gateway = await createGateway({
    router,
    workers: engines.map((e, i) => ({ id: `e${i}`, url: `http://127.0.0.1:${e.port}` })),
    breakerFailures: 2,
    log: (m) => logs.push(m),
  });
  // closed whatever happens: a failed assertion must not leave the gateway and engines open
  // (the test process would then never end)
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const one = (i: number) =>
      fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: `request ${i}`, max_tokens: 20 }),
      }).then(async (r) => ({
        status: r.status,
        worker: r.headers.get('x-contextforge-worker'),
        body: (await r.json()) as { usage?: { completion_tokens: number } },
      }));
    // 40 non-streaming requests in flight on both engines (20 tokens at 100 tok/s: ~200 ms each)
    const inFlight = Array.from({ length: 40 }, (_, i) => one(i));
    const onE1 = () => router.listWorkers().find((w) => w.id === 'e1')!.inFlightRequests;
    await until(() => onE1() >= 10, 'requests in flight on e1');
    await engines[1].close(); // dies with requests in its queue and batch
    const more = Array.from({ length: 20 }, (_, i) => one(100 + i));
    const results = await Promise.all([...inFlight, ...more]);
    for (const r of results) {
      assert.equal(r.status, 200);
      assert.equal(r.body.usage?.completion_tokens, 20);
    }
    const lateOnE1 = results.slice(40).filter((r) => r.worker === 'e1').length;
    assert.equal(lateOnE1, 0, 'nothing after the kill was answered by the dead worker');
    assert.equal(router.listWorkers().find((w) => w.id === 'e1')!.healthy, false, 'its circuit is open');
    assert.equal(router.getStats().inFlightRequests, 0, 'every ticket was released');
    const metrics = await (await fetch(`${base}/metrics`)).text();
    assert.match(metrics, /contextforge_upstream_retries_total\{worker="e1"\} [1-9]/);
    // the failures are named in the log, the worker and what became of the request
    assert.ok(
      logs.some((l) => /^worker e1 failed request before its answer \(\w+\): retried/.test(l)),
      logs.join('\n'),
    );
  } finally {
    await gateway.close();
    await Promise.all(engines.map((e) => e.close()));
  }
});

/** A fake engine: `handler` answers every request; /health answers `healthStatus()`. */
async function fakeEngine(
  handler: (req: IncomingMessage, res: ServerResponse) => void,
  healthStatus: () => number = () => 200,
) {
  const server = createServer((req, res) => {
    if (req.url === '/health') return void res.writeHead(healthStatus()).end();
    if (req.url === '/metrics') return void res.writeHead(404).end();
    handler(req, res);
  });
  return listening(server);
}

test('an engine failing mid-stream: the stream ends with an OpenAI-style error event and the ticket is released', async () => {
  const engine = await fakeEngine((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(
      `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'par' } }] })}\n\n`,
    );
    setTimeout(() => res.socket?.destroy(), 30); // the engine dies after the first chunk
  });
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const logs: string[] = [];
  const gateway = await createGateway({
    router,
    workers: [{ id: 'f0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    log: (m) => logs.push(m),
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': 'mid-stream-1' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], stream: true }),
  });
  assert.equal(res.status, 200);
  const text = await res.text(); // ends: the router closes the stream instead of hanging
  // the error event has every member of the gateway's other error bodies, and data: [DONE] follows
  // it, as it follows vLLM's own error event (serving_chat.py, chat_completion_stream_generator)
  assert.ok(
    text.endsWith(
      '\n\ndata: {"error":{"message":"the engine failed mid-stream","type":"server_error","param":null,"code":null}}\n\ndata: [DONE]\n\n',
    ),
    JSON.stringify(text.slice(-200)),
  );
  const events = text
    .split('\n\n')
    .filter((e) => e !== '' && e !== 'data: [DONE]')
    .map(
      (e) => JSON.parse(e.replace(/^data: /, '')) as { choices?: unknown; error?: { message: string; type: string } },
    );
  assert.equal(events.length, 2);
  assert.deepEqual(
    events[0].choices,
    [{ index: 0, delta: { content: 'par' } }],
    'the chunk sent before the failure came through',
  );
  assert.equal(events[1].error?.type, 'server_error');
  assert.match(events[1].error!.message, /failed mid-stream/);
  assert.equal(router.getStats().inFlightRequests, 0);
  assert.ok(
    logs.some((l) =>
      /^worker f0 broke off the answer to request "mid-stream-1" after it reached the client \(\w+\): cut$/.test(l),
    ),
    logs.join('\n'),
  );
  // the openai SDK surfaces it as an error, after the content it got
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
  const seen: string[] = [];
  await assert.rejects(async () => {
    const stream = await client.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
    });
    for await (const chunk of stream) seen.push(chunk.choices[0]?.delta.content ?? '');
  }, /failed mid-stream/);
  assert.deepEqual(seen, ['par']);
  await gateway.close();
  await engine.close();
});

test('active health checks take a worker out of rotation and back, independently of the metrics scrape', async () => {
  let status = 200;
  const answer = (name: string) => (req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ id: name, choices: [{ index: 0, text: name }] }));
  };
  const sick = await fakeEngine(answer('sick'), () => status);
  const well = await fakeEngine(answer('well'));
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const logs: string[] = [];
  const gateway = await createGateway({
    router,
    workers: [
      { id: 'sick', url: sick.url },
      { id: 'well', url: well.url },
    ],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 20,
    log: (m) => logs.push(m),
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const healthy = (id: string) => router.listWorkers().find((w) => w.id === id)!.healthy;
  status = 503;
  await until(() => !healthy('sick'), 'the failing worker to leave');
  const admin = (await (
    await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${gateway.adminToken}` } })
  ).json()) as { workers: Array<{ id: string; outOfRotation: string[] }> };
  assert.deepEqual(admin.workers.find((w) => w.id === 'sick')!.outOfRotation, ['health-check']);
  for (let i = 0; i < 6; i++) {
    const r = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: `p${i}` }),
    });
    assert.equal(r.headers.get('x-contextforge-worker'), 'well');
    await r.arrayBuffer();
  }
  // another source holding it out keeps it out when the health check recovers
  gateway.health.set('sick', 'metrics', false, 'scrape failed');
  status = 200;
  await until(() => !gateway.health.reasons('sick').includes('health-check'), 'the health check to pass again');
  assert.equal(healthy('sick'), false, 'still held out by the metrics verdict');
  gateway.health.set('sick', 'metrics', true);
  assert.equal(healthy('sick'), true);
  assert.ok(
    logs.some((l) => /sick is out of rotation \(health-check: HTTP 503\)/.test(l)),
    logs.join('\n'),
  );
  await gateway.close();
  await sick.close();
  await well.close();
});
