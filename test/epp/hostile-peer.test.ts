import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { status as GrpcStatus } from '@grpc/grpc-js';
import type { ProcessingRequest, ProcessingResponse } from '../../src/epp/proto.js';
import { TokenizerBusyError } from '../../src/engines/tokenizer-pool.js';
import { EnvoyRole } from './envoy-role.js';
import { startPickerFleet, startPickerWithClients, type ExtProcClient, type PickerFleet } from './harness.js';
import { until } from '../helpers/wait.js';

// Peers that break the ext_proc protocol or send what no gateway should: each gets a clean
// answer (a gRPC status or a local reply naming the problem), and the picker goes on routing.

let fleet: PickerFleet;
let envoy: EnvoyRole;
let client: ExtProcClient;
let close: () => Promise<void>;
before(async () => {
  ({ fleet, envoy, client, close } = await startPickerWithClients({ engines: 2 }));
});
after(() => close());

const inFlight = () => fleet.gateways[0].router.listWorkers().reduce((n, w) => n + w.inFlightRequests, 0);

const headers = (h: Record<string, string>) => ({
  headers: Object.entries(h).map(([key, v]) => ({ key, raw_value: Buffer.from(v) })),
});
const REQUEST_HEADERS: ProcessingRequest = {
  request_headers: { headers: headers({ ':method': 'POST', ':path': '/v1/completions' }), end_of_stream: false },
};
const BODY: ProcessingRequest = {
  request_body: { body: Buffer.from(JSON.stringify({ model: 'mock', prompt: 'hello' })), end_of_stream: true },
};
const EMPTY_BODY_END: ProcessingRequest = { request_body: { body: Buffer.alloc(0), end_of_stream: true } };
/** A request routed on its body, ready for its response. */
const ROUTED: ProcessingRequest[] = [REQUEST_HEADERS, BODY];
const RESPONSE_HEADERS: ProcessingRequest = { response_headers: { headers: headers({ ':status': '200' }) } };
const RESPONSE_END: ProcessingRequest = { response_body: { body: Buffer.from('{}'), end_of_stream: true } };

interface Ended {
  answers: ProcessingResponse[];
  code: number;
  details: string;
}

/**
 * Writes `messages` on one stream (without half-closing it, unless `halfClose`) and resolves once
 * the picker ends the stream.
 */
function exchange(messages: ProcessingRequest[], halfClose = false): Promise<Ended> {
  const call = client.Process();
  const answers: ProcessingResponse[] = [];
  call.on('data', (m: ProcessingResponse) => answers.push(m));
  const ended = new Promise<Ended>((resolve, reject) => {
    // the deadline: a picker that never ends the stream fails the test instead of hanging it
    const deadline = setTimeout(() => {
      call.cancel();
      reject(new Error('the picker did not end the stream within 10 s'));
    }, 10_000);
    const done = (e: Ended) => {
      clearTimeout(deadline);
      resolve(e);
    };
    call.on('error', (e: Error & { code: number; details: string }) =>
      done({ answers, code: e.code, details: e.details }),
    );
    call.on('status', (s: { code: number; details: string }) => {
      if (s.code === GrpcStatus.OK) done({ answers, code: s.code, details: s.details });
    });
  });
  call.on('end', () => {});
  for (const m of messages) call.write(m);
  if (halfClose) call.end();
  return ended;
}

/** The picker still routes a normal request, answers its health check, and holds nothing in flight. */
async function stillServing(): Promise<void> {
  const out = await envoy.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: 'after' }) });
  assert.equal(out.kind, 'routed');
  if (out.kind === 'routed') await out.stream.end();
  assert.equal(await envoy.healthStatus('liveness'), 'SERVING');
  await until(() => inFlight() === 0, 'nothing in flight');
}

test('a stream half-closed before its request was whole is refused, not ended with OK and no answer', async () => {
  // before any request_headers: nothing to answer with a reply, so a protocol error
  const none = await exchange([], true);
  assert.equal(none.code, GrpcStatus.FAILED_PRECONDITION);
  assert.match(none.details, /the stream ended before request_headers/);
  assert.equal(none.answers.length, 0);
  // in the middle of a body: the request cannot be routed on half a body, so a local reply says why
  const partBody: ProcessingRequest = {
    request_body: { body: Buffer.from('{"model":"mock","prompt":"cut'), end_of_stream: false },
  };
  for (const messages of [[REQUEST_HEADERS], [REQUEST_HEADERS, partBody]]) {
    const cut = await exchange(messages, true);
    assert.equal(cut.code, GrpcStatus.OK, 'a local reply, then a clean close');
    assert.equal(cut.answers.length, 1);
    const reply = cut.answers[0].immediate_response;
    assert.ok(reply, `an immediate response, got ${cut.answers[0].response}`);
    assert.equal(reply.status.code, 'BadRequest');
    const error = JSON.parse(Buffer.from(reply.body ?? []).toString()).error;
    assert.equal(error.message, 'the request ended before its body did');
    assert.equal(error.param, 'body');
  }
  // a routed request half-closed before its response phase ends as before: cleanly, released
  const routed = await exchange(ROUTED, true);
  assert.equal(routed.code, GrpcStatus.OK);
  assert.ok(routed.answers[0].request_headers, 'routed');
  assert.equal(fleet.gateways[0].bodyBudget.used, 0);
  await stillServing();
});

test('messages out of order end the stream with FAILED_PRECONDITION naming them, not a stream left open', async () => {
  const cases: Array<[string, ProcessingRequest[], RegExp]> = [
    ['response_headers first', [{ response_headers: { headers: headers({ ':status': '200' }) } }], /response_headers/],
    ['response_body first', [{ response_body: { body: Buffer.from('x'), end_of_stream: true } }], /response_body/],
    ['response_trailers first', [{ response_trailers: { trailers: headers({}) } }], /response_trailers/],
    ['request_body first', [BODY], /request_body arrived before request_headers/],
    ['request_trailers first', [{ request_trailers: { trailers: headers({}) } }], /request_trailers/],
    ['request_headers twice', [REQUEST_HEADERS, REQUEST_HEADERS], /request_headers arrived twice/],
    [
      'request_body after the body ended',
      [REQUEST_HEADERS, BODY, { request_body: { body: Buffer.from('more'), end_of_stream: true } }],
      /after the body ended/,
    ],
    [
      'request_body after a request that ended with its headers',
      [
        {
          request_headers: {
            headers: headers({ ':method': 'GET', ':path': '/v1/models' }),
            end_of_stream: true,
          },
        },
        BODY,
      ],
      /request_body arrived after the request ended with its headers/,
    ],
    [
      'request_trailers twice',
      [
        REQUEST_HEADERS,
        { request_body: { body: Buffer.from('{"model":"mock","prompt":"t"}'), end_of_stream: false } },
        { request_trailers: { trailers: headers({}) } },
        { request_trailers: { trailers: headers({}) } },
      ],
      /request_trailers arrived after the body ended/,
    ],
    [
      'request_trailers after the body ended',
      [...ROUTED, { request_trailers: { trailers: headers({}) } }],
      /request_trailers arrived after the body ended/,
    ],
    ['response_headers twice', [...ROUTED, RESPONSE_HEADERS, RESPONSE_HEADERS], /response_headers arrived twice/],
    [
      'response_body before response_headers',
      [...ROUTED, RESPONSE_END],
      /response_body arrived before response_headers/,
    ],
    [
      'response_trailers before response_headers',
      [...ROUTED, { response_trailers: { trailers: headers({}) } }],
      /response_trailers arrived before response_headers/,
    ],
    [
      'response_body after the response ended',
      [...ROUTED, RESPONSE_HEADERS, RESPONSE_END, RESPONSE_END],
      /response_body arrived after the response ended/,
    ],
    [
      'request_headers after a response that ended with its headers',
      [
        ...ROUTED,
        { response_headers: { headers: headers({ ':status': '204' }), end_of_stream: true } },
        REQUEST_HEADERS,
      ],
      /request_headers arrived after the response ended/,
    ],
    [
      'response_headers after the response trailers',
      [...ROUTED, RESPONSE_HEADERS, { response_trailers: { trailers: headers({}) } }, RESPONSE_HEADERS],
      /response_headers arrived after the response ended/,
    ],
  ];
  for (const [name, messages, details] of cases) {
    const out = await exchange(messages);
    assert.equal(out.code, GrpcStatus.FAILED_PRECONDITION, `${name}: status ${out.code} ${out.details}`);
    assert.match(out.details, details, name);
    const routed = out.answers.some((a) => a.response === 'request_headers');
    assert.ok(
      routed || out.answers.every((a) => a.response !== 'response_trailers' && a.response !== 'request_trailers'),
      `${name}: no trailers answer to a request that was never routed`,
    );
  }
  await stillServing();
});

test('a ProcessingRequest that sets no request ends the stream with INVALID_ARGUMENT', async () => {
  const out = await exchange([{}]);
  assert.equal(out.code, GrpcStatus.INVALID_ARGUMENT);
  assert.match(out.details, /without a request/);
  await stillServing();
});

test('a body nested deeper than the gateway allows → 400 naming the body, with or without a model rewrite', async () => {
  const deep = (depth: number) => `{"model":"mock","prompt":"deep","x":${'['.repeat(depth)}${']'.repeat(depth)}}`;
  for (const depth of [65, 10_000, 200_000]) {
    const rewrites: Array<Record<string, string>> = [{}, { 'x-gateway-model-name-rewrite': 'mock' }];
    for (const rewrite of rewrites) {
      const out = await envoy.request({ headers: rewrite, body: deep(depth) });
      if (out.kind === 'routed') await out.stream.end();
      if (out.kind !== 'immediate') assert.fail(`depth ${depth}: routed, not refused`);
      assert.equal(out.status, 400, `depth ${depth} ${JSON.stringify(rewrite)}: ${out.body}`);
      const error = JSON.parse(out.body).error as { message: string; param: string };
      assert.match(error.message, /nests deeper than 64 levels/);
      assert.equal(error.param, 'body');
    }
  }
  const within = await envoy.request({ headers: {}, body: deep(60) });
  assert.equal(within.kind, 'routed', 'a body within the depth is routed');
  if (within.kind === 'routed') await within.stream.end();
  await stillServing();
});

test('a compressed body → 415 naming content-encoding, as the gateway answers', async () => {
  const out = await envoy.request({
    headers: { 'content-encoding': 'gzip' },
    body: Buffer.from([0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00]),
  });
  assert.equal(out.kind === 'immediate' && out.status, 415);
  if (out.kind === 'immediate') assert.equal(JSON.parse(out.body).error.param, 'content-encoding');
  const identity = await envoy.request({
    headers: { 'content-encoding': 'identity' },
    body: JSON.stringify({ model: 'mock', prompt: 'plain' }),
  });
  assert.equal(identity.kind, 'routed');
  if (identity.kind === 'routed') await identity.stream.end();
  await stillServing();
});

test('a body that is not UTF-8 is forwarded as the router read it, valid JSON in UTF-8', async () => {
  // "prompt": "a\xff\xfeb": the invalid bytes are read as U+FFFD
  const body = Buffer.concat([
    Buffer.from('{"model":"mock","prompt":"a'),
    Buffer.from([0xff, 0xfe]),
    Buffer.from('b"}'),
  ]);
  const out = await envoy.request({ headers: {}, body });
  assert.equal(out.kind, 'routed');
  if (out.kind !== 'routed') return;
  assert.ok(!out.body.equals(body), 'not the invalid bytes');
  assert.equal(JSON.parse(out.body.toString()).prompt, 'a\ufffd\ufffdb');
  assert.equal(out.setHeaders.get('content-length'), String(out.body.length));
  await out.stream.end();
  await stillServing();
});

test('a busy tokenizer → 503 with retry-after, as the gateway answers', async () => {
  const busy = await startPickerFleet({
    engines: 1,
    gateway: {
      tokenize: 'tokenizer',
      promptTokenizer: { async: true, tokenize: () => Promise.reject(new TokenizerBusyError(64)) },
    },
  });
  const e = new EnvoyRole(busy.addresses[0]);
  try {
    const out = await e.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: 'busy' }) });
    assert.equal(out.kind === 'immediate' && out.status, 503);
    if (out.kind !== 'immediate') return;
    assert.match(JSON.parse(out.body).error.message, /requests waiting/);
    assert.equal(out.headers.get('retry-after'), '1');
  } finally {
    e.close();
    await busy.close();
  }
});

test('a metadata header that takes one value, repeated → 400 naming it, as the gateway answers', async () => {
  for (const name of ['x-workflow-id', 'x-agent-role']) {
    const out = await exchange([
      {
        request_headers: {
          headers: {
            headers: [
              { key: ':path', raw_value: Buffer.from('/v1/completions') },
              { key: name, raw_value: Buffer.from('a') },
              { key: name, raw_value: Buffer.from('b') },
            ],
          },
          end_of_stream: false,
        },
      },
      BODY,
    ]);
    assert.equal(out.code, GrpcStatus.OK);
    const reply = out.answers[0]?.immediate_response;
    assert.ok(reply, `${name}: a local reply, got ${out.answers.map((a) => a.response).join(', ')}`);
    assert.equal(reply.status.code, 'BadRequest');
    const error = JSON.parse(Buffer.from(reply.body ?? []).toString()).error as { message: string; param: string };
    assert.equal(error.param, name);
    assert.match(error.message, /must be given once/);
  }
  await stillServing();
});

test('a pseudo-header given twice → 400 naming it, not read as one comma-joined value', async () => {
  for (const [name, a, b] of [
    [':path', '/v1/completions', '/v1/chat/completions'],
    [':method', 'POST', 'POST'],
  ]) {
    const out = await exchange([
      {
        request_headers: {
          headers: {
            headers: [
              { key: ':method', raw_value: Buffer.from('POST') },
              { key: ':path', raw_value: Buffer.from('/v1/completions') },
            ]
              .filter((h) => h.key !== name)
              .concat([
                { key: name, raw_value: Buffer.from(a) },
                { key: name, raw_value: Buffer.from(b) },
              ]),
          },
          end_of_stream: false,
        },
      },
      BODY,
    ]);
    assert.equal(out.code, GrpcStatus.OK);
    const reply = out.answers[0]?.immediate_response;
    assert.ok(reply, `${name}: a local reply, got ${out.answers.map((x) => x.response).join(', ')}`);
    assert.equal(reply.status.code, 'BadRequest');
    const error = JSON.parse(Buffer.from(reply.body ?? []).toString()).error as { message: string; param: string };
    assert.equal(error.param, name);
    assert.match(error.message, new RegExp(`${name} .*once`));
  }
  await stillServing();
});

test('a request to an inference path without a body → 400 naming the body, the gateway’s own answer', async () => {
  const gateway = await fleet.gateways[0].app.inject({
    method: 'POST',
    url: '/v1/completions',
    headers: { 'content-type': 'application/json' },
  });
  assert.equal(gateway.statusCode, 400);
  const post = (path: string, endOfStream: boolean) => ({
    request_headers: {
      headers: headers({ ':method': 'POST', ':path': path, 'content-type': 'application/json' }),
      end_of_stream: endOfStream,
    },
  });
  const cases: Array<[string, ProcessingRequest[]]> = [
    ['end_of_stream on the headers', [post('/v1/completions', true)]],
    ['an empty body chunk with end_of_stream', [post('/v1/chat/completions', false), EMPTY_BODY_END]],
    [
      'no body bytes, ended by trailers',
      [post('/v1/completions?stream=1', false), { request_trailers: { trailers: headers({}) } }],
    ],
  ];
  for (const [name, messages] of cases) {
    const out = await exchange(messages);
    assert.equal(out.code, GrpcStatus.OK, `${name}: ${out.details}`);
    assert.deepEqual(
      out.answers.map((a) => a.response),
      ['immediate_response'],
      `${name}: one local reply, not a route`,
    );
    const reply = out.answers[0].immediate_response!;
    assert.equal(reply.status.code, 'BadRequest', name);
    assert.equal(Buffer.from(reply.body ?? []).toString(), gateway.body, `${name}: the gateway's error body`);
  }
  assert.equal(inFlight(), 0, 'nothing counted for a request that was not routed');
  // a request that has no body by nature is still routed: a GET of the model list
  const list = await envoy.request({ headers: { ':method': 'GET', ':path': '/v1/models' } });
  assert.equal(list.kind, 'routed');
  if (list.kind === 'routed') await list.stream.end();
  await stillServing();
});

test('a method an inference path is not served with → 405 naming it, allow: POST, the gateway’s own answer', async () => {
  const cases: Array<[string, string, string | undefined]> = [
    ['GET', '/v1/completions', undefined],
    ['DELETE', '/v1/chat/completions', undefined],
    ['HEAD', '/v1/completions', undefined],
    ['PUT', '/v1/chat/completions', JSON.stringify({ model: 'mock', messages: [{ role: 'user', content: 'hi' }] })],
    ['GET', '/v1/completions', JSON.stringify({ model: 'mock', prompt: 'a GET with a body' })],
  ];
  for (const [method, path, body] of cases) {
    const name = `${method} ${path}${body === undefined ? '' : ' with a body'}`;
    const gateway = await fleet.gateways[0].app.inject({ method, url: path });
    assert.equal(gateway.statusCode, 405, name);
    const out = await envoy.request({ headers: { ':method': method, ':path': path }, body });
    if (out.kind === 'routed') await out.stream.end();
    if (out.kind !== 'immediate') assert.fail(`${name}: routed, not refused`);
    assert.equal(out.status, 405, `${name}: ${out.body}`);
    assert.equal(out.headers.get('allow'), 'POST', name);
    if (method !== 'HEAD') assert.equal(out.body, gateway.body, `${name}: the gateway's error body`);
    assert.equal(JSON.parse(out.body).error.param, 'method', name);
  }
  assert.equal(inFlight(), 0, 'nothing counted for a request that was not routed');
  // a CORS preflight goes on to the engine, which may answer it (vLLM allows every origin by default)
  const preflight = await envoy.request({ headers: { ':method': 'OPTIONS', ':path': '/v1/chat/completions' } });
  assert.equal(preflight.kind, 'routed');
  if (preflight.kind === 'routed') await preflight.stream.end();
  await stillServing();
});

test('a stream ended with a gRPC error is counted under its status in contextforge_epp_requests_total', async () => {
  const count = async (outcome: string) => {
    const page = await fleet.gateways[0].metrics.metrics();
    const line = page.split('\n').find((l) => l.startsWith(`contextforge_epp_requests_total{outcome="${outcome}"} `));
    return line === undefined ? 0 : Number(line.split(' ')[1]);
  };
  const before = await count('failed_precondition');
  const none = await exchange([], true);
  assert.equal(none.code, GrpcStatus.FAILED_PRECONDITION);
  await until(async () => (await count('failed_precondition')) === before + 1, 'the stream counted once');
  await stillServing();
});
