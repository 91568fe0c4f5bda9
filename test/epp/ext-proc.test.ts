import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  credentials,
  makeGenericClientConstructor,
  status as GrpcStatus,
  type ClientDuplexStream,
} from '@grpc/grpc-js';
import {
  EXT_PROC_SERVICE,
  extProcService,
  type ProcessingRequest,
  type ProcessingResponse,
} from '../../src/epp/proto.js';
import { ModelNameRestorer } from '../../src/epp/protocol.js';
import { EnvoyRole } from './envoy-role.js';
import { startPickerFleet, type PickerFleet } from './harness.js';
import { until } from '../helpers/wait.js';

// The endpoint picker driven by a client that plays Envoy and fails on every ordering rule of
// the protocol (see envoy-role.ts), against the real router and mock engines.

let fleet: PickerFleet;
let envoy: EnvoyRole;
before(async () => {
  fleet = await startPickerFleet({
    engines: 3,
    picker: {
      objectives: new Map([
        ['batch', -1],
        ['chat', 0],
      ]),
    },
  });
  envoy = new EnvoyRole(fleet.addresses[0]);
});
after(async () => {
  envoy.close();
  await fleet.close();
});

const router = () => fleet.gateways[0].router;
const inFlight = () =>
  router()
    .listWorkers()
    .reduce((n, w) => n + w.inFlightRequests, 0);
const chat = (content: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'mock', messages: [{ role: 'user', content }], max_tokens: 4, ...extra });

test('a chat request in several chunks: routed on the whole body, echoed unchanged, in-flight until the response ends', async () => {
  const body = chat('explain the routing of requests to engines '.repeat(900)); // ~40 KB
  const out = await envoy.request({
    headers: { ':path': '/v1/chat/completions', 'x-request-id': 'req-1' },
    body,
    chunkBytes: 7000,
  });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') return;
  assert.equal(out.endpoints.length, 3, 'the chosen endpoint and two fallbacks');
  for (const e of out.endpoints) assert.ok(fleet.workerAt.has(e), `${e} is an engine`);
  assert.equal(out.body.toString(), body, 'the body is forwarded byte for byte');
  assert.equal(out.setHeaders.get('content-length'), String(Buffer.byteLength(body)));
  assert.equal(inFlight(), 1, 'counted in flight from the decision');
  const worker = router()
    .listWorkers()
    .find((w) => w.inFlightRequests === 1)!;
  assert.equal(worker.id, fleet.workerAt.get(out.endpoints[0]));
  const resp = await out.stream.respond({
    served: out.endpoints[0],
    chunks: ['data: {"x":1}\n\n', 'data: [DONE]\n\n'],
  });
  assert.equal(resp.setHeaders.get('x-contextforge-worker'), worker.id);
  assert.deepEqual(resp.removedHeaders, [], 'an unchanged body keeps its length');
  assert.equal(
    resp.body.toString(),
    'data: {"x":1}\n\ndata: [DONE]\n\n',
    'the response body streams through unchanged',
  );
  await out.stream.end();
  await until(() => inFlight() === 0, 'the request to leave the in-flight count');
});

test('a body over 62,000 bytes is echoed in chunks of at most 62,000 bytes, one end_of_stream', async () => {
  const body = chat('x'.repeat(200_000));
  const out = await envoy.request({ headers: { ':path': '/v1/chat/completions' }, body, chunkBytes: 16 * 1024 });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') return;
  assert.equal(out.body.length, Buffer.byteLength(body));
  assert.ok(out.body.length > 3 * 62_000);
  // a long response chunk is split on the way back as well
  const resp = await out.stream.respond({ served: out.endpoints[0], chunks: [Buffer.alloc(130_000, 97)] });
  assert.equal(resp.body.length, 130_000);
  await out.stream.end();
});

test('a header-only request gets an endpoint and no body answer', async () => {
  const out = await envoy.request({ headers: { ':method': 'GET', ':path': '/v1/models' } });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') return;
  assert.ok(fleet.workerAt.has(out.endpoints[0]));
  assert.equal(out.body.length, 0);
  await out.stream.respond({ served: out.endpoints[0], chunks: ['{"object":"list","data":[]}'] });
  await out.stream.end();
  await until(() => inFlight() === 0, 'release');
});

test('the subset hint restricts the choice, as a list or a comma-separated string, with or without ports', async () => {
  const [a, b, c] = fleet.endpoints;
  for (let i = 0; i < 6; i++) {
    const out = await envoy.request({
      headers: { ':path': '/v1/completions' },
      body: JSON.stringify({ model: 'mock', prompt: `subset ${i} `.repeat(50) }),
      subset: [b, c],
    });
    assert.equal(out.kind, 'routed');
    if (out.kind !== 'routed') return;
    assert.ok(
      out.endpoints.every((e) => e === b || e === c),
      `${out.headerValue} stays within ${b},${c}`,
    );
    assert.ok(!out.endpoints.includes(a));
    await out.stream.end();
  }
  const str = await envoy.request({
    headers: {},
    body: JSON.stringify({ model: 'mock', prompt: 'hello' }),
    subset: ` ${c} , `,
  });
  assert.equal(str.kind === 'routed' && str.headerValue, c, 'one endpoint named: no fallbacks');
  if (str.kind === 'routed') await str.stream.end();
  const bare = await envoy.request({
    headers: {},
    body: JSON.stringify({ model: 'mock', prompt: 'hello' }),
    subset: ['127.0.0.1'],
  });
  assert.equal(bare.kind === 'routed' && bare.endpoints.length, 3, 'an address without a port allows every port');
  if (bare.kind === 'routed') await bare.stream.end();
  await until(() => inFlight() === 0, 'release');
});

test('no eligible endpoint → 503; an empty subset → 503', async () => {
  const out = await envoy.request({
    headers: {},
    body: JSON.stringify({ model: 'mock', prompt: 'hi' }),
    subset: ['10.9.9.9:8000'],
  });
  assert.equal(out.kind, 'immediate');
  assert.equal(out.kind === 'immediate' && out.status, 503);
  const empty = await envoy.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: 'hi' }), subset: [] });
  assert.equal(empty.kind === 'immediate' && empty.status, 503);
  assert.match(empty.kind === 'immediate' ? JSON.parse(empty.body).error.message : '', /lists no endpoint/);
  // a hint Envoy set to something other than a list of strings names no endpoint, and says so
  const unreadable = await envoy.request({
    headers: {},
    body: JSON.stringify({ model: 'mock', prompt: 'hi' }),
    subset: { value: { numberValue: 8000 } },
  });
  assert.equal(unreadable.kind === 'immediate' && unreadable.status, 503);
  assert.match(
    unreadable.kind === 'immediate' ? JSON.parse(unreadable.body).error.message : '',
    /x-gateway-destination-endpoint-subset is a number, not a list of ip:port strings/,
  );
  for (const w of router().listWorkers()) router().drainWorker(w.id);
  try {
    const drained = await envoy.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: 'hi' }) });
    assert.equal(drained.kind === 'immediate' && drained.status, 503);
    assert.equal(drained.kind === 'immediate' && drained.headers.get('retry-after'), '1');
    assert.equal(drained.kind === 'immediate' && JSON.parse(drained.body).error.type, 'server_error');
    assert.equal(await envoy.healthStatus('liveness'), 'SERVING', 'alive');
    await until(
      async () => (await envoy.healthStatus('readiness')) === 'NOT_SERVING',
      'readiness to drop with no available worker',
    );
    assert.equal(await envoy.healthStatus(EXT_PROC_SERVICE), 'NOT_SERVING');
  } finally {
    for (const w of router().listWorkers()) router().resumeWorker(w.id);
  }
  await until(async () => (await envoy.healthStatus('readiness')) === 'SERVING', 'readiness back');
  assert.equal(await envoy.healthStatus(EXT_PROC_SERVICE), 'SERVING');
});

test('bad JSON → 400; a field the API needs missing → 400 naming it; x-request-id on the reply', async () => {
  const bad = await envoy.request({
    headers: { ':path': '/v1/chat/completions', 'x-request-id': 'abc-123' },
    body: '{"model": "mock", "messages": [',
  });
  assert.equal(bad.kind, 'immediate');
  if (bad.kind !== 'immediate') return;
  assert.equal(bad.status, 400);
  assert.match(JSON.parse(bad.body).error.message, /not valid JSON/);
  assert.equal(bad.headers.get('content-type'), 'application/json');
  assert.equal(bad.headers.get('x-request-id'), 'abc-123');
  // one no header could carry as it is (CR, LF) is not echoed: it would smuggle in headers of its own
  const smuggling = await envoy.request({
    headers: { ':path': '/v1/chat/completions', 'x-request-id': 'abc\r\ninjected: 1' },
    body: '{"model": "mock", "messages": [',
  });
  assert.equal(smuggling.kind === 'immediate' && smuggling.status, 400);
  if (smuggling.kind !== 'immediate') return;
  assert.equal(smuggling.headers.get('x-request-id'), undefined);
  assert.deepEqual([...smuggling.headers.keys()].sort(), ['content-type']);
  const missing = await envoy.request({
    headers: { ':path': '/v1/chat/completions' },
    body: JSON.stringify({ model: 'mock' }),
  });
  assert.equal(missing.kind === 'immediate' && missing.status, 400);
  assert.equal(missing.kind === 'immediate' && JSON.parse(missing.body).error.param, 'messages');
  const array = await envoy.request({ headers: {}, body: '[1,2]' });
  assert.equal(array.kind === 'immediate' && array.status, 400);
  assert.equal(inFlight(), 0, 'nothing counted for rejected requests');
});

test('sheddable objectives get 429 when the pool is saturated; others are routed', async () => {
  for (const w of router().listWorkers()) router().updateWorkerMetrics(w.id, { kvUsage: 0.95 });
  try {
    const shed = await envoy.request({
      headers: { 'x-gateway-inference-objective': 'batch' },
      body: JSON.stringify({ model: 'mock', prompt: 'bulk job' }),
    });
    assert.equal(shed.kind === 'immediate' && shed.status, 429);
    const kept = await envoy.request({
      headers: { 'x-gateway-inference-objective': 'chat' },
      body: JSON.stringify({ model: 'mock', prompt: 'interactive' }),
    });
    assert.equal(kept.kind, 'routed', 'priority 0 is never shed');
    if (kept.kind === 'routed') await kept.stream.end();
  } finally {
    for (const w of router().listWorkers()) router().updateWorkerMetrics(w.id, { kvUsage: 0.1 });
  }
  const calm = await envoy.request({
    headers: { 'x-gateway-inference-objective': 'batch' },
    body: JSON.stringify({ model: 'mock', prompt: 'bulk job' }),
  });
  assert.equal(calm.kind, 'routed', 'a sheddable request passes when the pool is not saturated');
  if (calm.kind === 'routed') await calm.stream.end();
});

test('a body the picker changes (model rewritten, metadata dropped) keeps every other member as the client wrote it: a 64-bit seed is not rounded', async () => {
  const seed = '18446744073709551557';
  for (const [headers, body] of [
    [{ 'x-gateway-model-name-rewrite': 'mock-v2' }, `{"model":"mock","prompt":"seeded","seed":${seed}}`],
    [{}, `{"model":"mock","prompt":"seeded","seed":${seed},"contextforge":{"workflowId":"w"}}`],
  ] as const) {
    const out = await envoy.request({ headers, body });
    assert.equal(out.kind, 'routed');
    if (out.kind !== 'routed') return;
    const text = out.body.toString();
    assert.match(text, new RegExp(`"seed":${seed}[,}]`), text);
    assert.doesNotMatch(text, /contextforge/);
    assert.equal((JSON.parse(text) as { model: string }).model, headers['x-gateway-model-name-rewrite'] ?? 'mock');
    assert.equal(out.setHeaders.get('content-length'), String(out.body.length));
    await out.stream.end();
  }
});

test('the KV-transfer fields a client sends are removed from the body the picker forwards, the rest as written', async () => {
  const seed = '18446744073709551557';
  const out = await envoy.request({
    headers: {},
    body: `{"model":"mock","prompt":"p","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"203.0.113.7"},"bootstrap_host":"203.0.113.7","bootstrap_port":8998,"bootstrap_room":1,"seed":${seed}}`,
  });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') return;
  const text = out.body.toString();
  assert.equal(text, `{"model":"mock","prompt":"p","seed":${seed}}`);
  assert.equal(out.setHeaders.get('content-length'), String(out.body.length));
  await out.stream.end();
});

test('x-gateway-model-name-rewrite rewrites the model in the forwarded body, with its length, and the response gets the client’s name back', async () => {
  const out = await envoy.request({
    headers: { 'x-gateway-model-name-rewrite': 'mock-v2' },
    body: JSON.stringify({ model: 'mock', prompt: 'rewrite me' }),
  });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') return;
  const forwarded = JSON.parse(out.body.toString()) as { model: string; prompt: string };
  assert.equal(forwarded.model, 'mock-v2');
  assert.equal(forwarded.prompt, 'rewrite me');
  assert.equal(out.setHeaders.get('content-length'), String(out.body.length));
  // the client gets the name it asked for back, as the reference picker gives it
  const resp = await out.stream.respond({
    served: out.endpoints[0],
    chunks: [
      'data: {"id":"c","model":"mo',
      'ck-v2","choices":[]}\n\n',
      'data: {"model": "mock-v2"}\n\ndata: [DONE]\n\n',
    ],
    headers: { 'content-type': 'text/event-stream', 'content-length': '120' },
    bodyChanges: true,
  });
  assert.deepEqual(resp.removedHeaders, ['content-length'], "the engine's length no longer holds");
  assert.equal(
    resp.body.toString(),
    'data: {"id":"c","model":"mock","choices":[]}\n\ndata: {"model": "mock"}\n\ndata: [DONE]\n\n',
  );
  await out.stream.end();
});

test('a response of nothing but model fields is given the client’s long name back a piece at a time, not grown whole first', async () => {
  // each 17-byte field grows to 1,034 bytes: restored whole, 256 KiB of them would be 15.6 MB at once
  const long = 'x'.repeat(1024);
  const field = '"model":"mock-v2"';
  const count = Math.floor((256 * 1024) / field.length);
  let largest = 0;
  const push = ModelNameRestorer.prototype.push;
  ModelNameRestorer.prototype.push = function (chunk: Buffer, end: boolean): Buffer {
    const out = push.call(this, chunk, end);
    largest = Math.max(largest, out.length);
    return out;
  };
  try {
    const out = await envoy.request({
      headers: { 'x-gateway-model-name-rewrite': 'mock-v2' },
      body: JSON.stringify({ model: long, prompt: 'p' }),
    });
    assert.equal(out.kind, 'routed');
    if (out.kind !== 'routed') return;
    const resp = await out.stream.respond({
      served: out.endpoints[0],
      chunks: [field.repeat(count)],
      headers: { 'content-type': 'application/json' },
      bodyChanges: true,
    });
    assert.equal(resp.body.toString(), `"model":${JSON.stringify(long)}`.repeat(count));
    assert.ok(largest <= 4 * 1024 * 1024, `restored ${largest} bytes at once`);
    await out.stream.end();
  } finally {
    ModelNameRestorer.prototype.push = push;
  }
});

test('a client model over 4 × maxIdBytes bytes is refused with 400 naming model, rewritten or not', async () => {
  const long = 'x'.repeat(1025);
  const rewrites: Record<string, string>[] = [{}, { 'x-gateway-model-name-rewrite': 'mock-v2' }];
  for (const headers of rewrites) {
    const out = await envoy.request({ headers, body: JSON.stringify({ model: long, prompt: 'p' }) });
    assert.equal(out.kind, 'immediate', JSON.stringify(headers));
    if (out.kind !== 'immediate') return;
    assert.equal(out.status, 400);
    const { error } = JSON.parse(out.body) as { error: { param: string; message: string } };
    assert.equal(error.param, 'model');
    assert.equal(error.message, 'model is longer than 1024 bytes');
  }
  // at the limit, the rewrite still gives the client its own name back
  const atLimit = 'x'.repeat(1024);
  const out = await envoy.request({
    headers: { 'x-gateway-model-name-rewrite': 'mock-v2' },
    body: JSON.stringify({ model: atLimit, prompt: 'p' }),
  });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') return;
  assert.equal((JSON.parse(out.body.toString()) as { model: string }).model, 'mock-v2');
  const resp = await out.stream.respond({
    served: out.endpoints[0],
    chunks: ['{"model":"mock-v2","choices":[]}'],
    headers: { 'content-type': 'application/json' },
    bodyChanges: true,
  });
  assert.equal((JSON.parse(resp.body.toString()) as { model: string }).model, atLimit);
  await out.stream.end();
});

test('an x-gateway-model-name-rewrite over 4 × maxIdBytes bytes is the gateway’s: 503 naming the header, not the client’s model', async () => {
  const out = await envoy.request({
    headers: { 'x-gateway-model-name-rewrite': 'r'.repeat(1025) },
    body: JSON.stringify({ model: 'mock', prompt: 'p' }),
  });
  assert.equal(out.kind, 'immediate');
  if (out.kind !== 'immediate') return;
  assert.equal(out.status, 503);
  const { error } = JSON.parse(out.body) as { error: { param: string; message: string; type: string } };
  assert.equal(error.param, 'x-gateway-model-name-rewrite');
  assert.equal(error.type, 'server_error');
  assert.match(error.message, /x-gateway-model-name-rewrite .*longer than 1024 bytes/);
  assert.equal(out.headers.get('retry-after'), undefined, 'a retry meets the same header');
  assert.equal(inFlight(), 0);
});

test('requests sharing a prefix go to the same endpoint (KV-aware, not round-robin)', async () => {
  const system = 'You are a meticulous assistant for a large retrieval corpus. '.repeat(40);
  const chosen = new Set<string>();
  for (let i = 0; i < 5; i++) {
    const out = await envoy.request({
      headers: { ':path': '/v1/chat/completions' },
      body: chat(`${system} question ${i}`),
    });
    assert.equal(out.kind, 'routed');
    if (out.kind !== 'routed') return;
    chosen.add(out.endpoints[0]);
    await out.stream.respond({ served: out.endpoints[0], chunks: ['{}'] });
    await out.stream.end();
  }
  assert.equal(chosen.size, 1, `one endpoint for one prefix, got ${[...chosen].join(', ')}`);
});

test('served by a fallback: the in-flight count moves to the endpoint Envoy reports', async () => {
  const out = await envoy.request({
    headers: {},
    body: JSON.stringify({ model: 'mock', prompt: 'fallback '.repeat(100) }),
  });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') return;
  const [first, second] = out.endpoints;
  const count = (e: string) =>
    router()
      .listWorkers()
      .find((w) => w.id === fleet.workerAt.get(e))!.inFlightRequests;
  assert.equal(count(first), 1);
  const setHeaders = await out.stream.respondHeaders({ served: second }, true);
  assert.equal(setHeaders.get('x-contextforge-worker'), fleet.workerAt.get(second));
  assert.equal(count(first), 0, 'released on the endpoint that did not serve');
  assert.equal(count(second), 1, 'counted on the one that did, until the end');
  assert.equal((await out.stream.respondBody(['{"ok":true}'])).toString(), '{"ok":true}');
  assert.equal(count(second), 0, 'released at the end of the response');
  await out.stream.end();
  await until(() => inFlight() === 0, 'release');
});

test('served by a fallback that is draining or unhealthy by then: counted on it until the response ends', async () => {
  const changes: Array<[string, (id: string) => void, (id: string) => void]> = [
    ['draining', (id) => router().drainWorker(id), (id) => router().resumeWorker(id)],
    ['unhealthy', (id) => router().setWorkerHealth(id, false), (id) => router().setWorkerHealth(id, true)],
  ];
  for (const [name, change, undo] of changes) {
    const out = await envoy.request({
      headers: {},
      body: JSON.stringify({ model: 'mock', prompt: `fallback ${name} `.repeat(100) }),
    });
    assert.equal(out.kind, 'routed');
    if (out.kind !== 'routed') return;
    const [first, second] = out.endpoints;
    const id = fleet.workerAt.get(second)!;
    const count = (e: string) =>
      router()
        .listWorkers()
        .find((w) => w.id === fleet.workerAt.get(e))!.inFlightRequests;
    change(id);
    try {
      const setHeaders = await out.stream.respondHeaders({ served: second }, true);
      assert.equal(setHeaders.get('x-contextforge-worker'), id, name);
      assert.equal(count(first), 0, `${name}: released on the endpoint that did not serve`);
      assert.equal(count(second), 1, `${name}: counted on the one that serves it while it runs`);
      await out.stream.respondBody(['{"ok":true}']);
      assert.equal(count(second), 0, `${name}: released at the end of the response`);
      await out.stream.end();
    } finally {
      undo(id);
    }
    await until(() => inFlight() === 0, 'release');
  }
});

test('Envoy resetting the stream releases the request', async () => {
  const out = await envoy.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: 'abandoned' }) });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') return;
  assert.equal(inFlight(), 1);
  out.stream.cancel();
  await until(() => inFlight() === 0, 'the cancelled request to be released');
});

test('protocol_config is tolerated: FULL_DUPLEX_STREAMED explicit; body mode NONE routes on the headers', async () => {
  const full = await envoy.request({
    headers: {},
    body: JSON.stringify({ model: 'mock', prompt: 'p' }),
    protocolConfig: { request_body_mode: 'FULL_DUPLEX_STREAMED', response_body_mode: 'FULL_DUPLEX_STREAMED' },
  });
  assert.equal(full.kind, 'routed');
  if (full.kind === 'routed') await full.stream.end();
  const none = await envoy.request({
    headers: { ':method': 'GET', ':path': '/health' },
    protocolConfig: { request_body_mode: 'NONE', response_body_mode: 'NONE' },
  });
  assert.equal(none.kind, 'routed');
  if (none.kind === 'routed') await none.stream.end();
});

test('a body over the limit → 413, also when one message carries more than the limit', async () => {
  const small = await startPickerFleet({ engines: 1, gateway: { bodyLimit: 4096 } });
  const e = new EnvoyRole(small.addresses[0]);
  try {
    const out = await e.request({
      headers: {},
      body: JSON.stringify({ model: 'mock', prompt: 'y'.repeat(10_000) }),
      chunkBytes: 1024,
    });
    assert.equal(out.kind === 'immediate' && out.status, 413);
    // one chunk far over the body limit (Envoy reads up to its buffer limit, 1 MiB by default,
    // before it passes a chunk on; BUFFERED mode sends the whole body in one message)
    for (const size of [100_000, 1024 * 1024]) {
      const big = await e.request({
        headers: {},
        body: JSON.stringify({ model: 'mock', prompt: 'y'.repeat(size) }),
        chunkBytes: 2 * size,
      });
      assert.equal(big.kind, 'immediate', `a ${size}-byte chunk: a local reply`);
      if (big.kind !== 'immediate') return;
      assert.equal(big.status, 413, `a ${size}-byte chunk`);
      assert.match(JSON.parse(big.body).error.message, /request body too large: over 4096 bytes/);
    }
  } finally {
    e.close();
    await small.close();
  }
});

test('a message over the gRPC receive limit ends its stream with RESOURCE_EXHAUSTED; the picker goes on', async () => {
  const small = await startPickerFleet({ engines: 1, gateway: { bodyLimit: 4096 } });
  const e = new EnvoyRole(small.addresses[0]);
  const Ctor = makeGenericClientConstructor(extProcService(), 'ExternalProcessor');
  const client = new Ctor(small.addresses[0], credentials.createInsecure()) as unknown as {
    Process(): ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
    close(): void;
  };
  try {
    const call = client.Process();
    const answers: ProcessingResponse[] = [];
    call.on('data', (m: ProcessingResponse) => answers.push(m));
    const ended = new Promise<{ code: number; details: string }>((resolve) =>
      call.on('error', (err: Error & { code: number; details: string }) => resolve(err)),
    );
    call.write({
      request_headers: {
        headers: { headers: [{ key: ':path', raw_value: Buffer.from('/v1/completions') }] },
        end_of_stream: false,
      },
    });
    // past gRPC's own 4 MiB default, which the picker never goes below
    call.write({ request_body: { body: Buffer.alloc(5 * 1024 * 1024, 0x20), end_of_stream: true } });
    const status = await ended;
    assert.equal(status.code, GrpcStatus.RESOURCE_EXHAUSTED);
    assert.match(status.details, /larger than max/);
    assert.equal(answers.length, 0);
    await until(() => small.gateways[0].bodyBudget.used === 0, 'nothing held');
    const after = await e.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: 'after' }) });
    assert.equal(after.kind, 'routed');
    if (after.kind === 'routed') await after.stream.end();
  } finally {
    client.close();
    e.close();
    await small.close();
  }
});

test('trailers end the body instead of end_of_stream: headers answer, the body without end_of_stream, then the trailers answer', async () => {
  // EnvoyRole always ends bodies with end_of_stream: this stream is written by hand
  const Ctor = makeGenericClientConstructor(extProcService(), 'ExternalProcessor');
  const client = new Ctor(fleet.addresses[0], credentials.createInsecure()) as unknown as {
    Process(): ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
    close(): void;
  };
  const call = client.Process();
  const got: ProcessingResponse[] = [];
  call.on('data', (m: ProcessingResponse) => got.push(m));
  const ended = new Promise<void>((r) => call.on('end', () => r()));
  const body = Buffer.from(JSON.stringify({ model: 'mock', prompt: 'with trailers' }));
  call.write({
    request_headers: {
      headers: { headers: [{ key: ':path', raw_value: Buffer.from('/v1/completions') }] },
      end_of_stream: false,
    },
  });
  call.write({ request_body: { body, end_of_stream: false } });
  call.write({ request_trailers: { trailers: { headers: [] } } });
  await until(() => got.length >= 3, 'three answers');
  assert.deepEqual(
    got.map((m) => m.response),
    ['request_headers', 'request_body', 'request_trailers'],
  );
  const sr = got[1].request_body!.response!.body_mutation!.streamed_response!;
  assert.equal(Buffer.from(sr.body).toString(), body.toString());
  assert.ok(!sr.end_of_stream, 'the trailers, not the body, end the request');
  call.end();
  await ended;
  client.close();
  await until(() => inFlight() === 0, 'release');
});
