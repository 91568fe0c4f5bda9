import assert from 'node:assert/strict';
import { test } from 'node:test';
import { structToPlain, type ProcessingRequest } from '../../src/epp/proto.js';
import {
  BODY_CHUNK_BYTES,
  endpointOfUrl,
  immediateResponse,
  inSubset,
  ModelNameRestorer,
  readHeaders,
  readResponseStatus,
  readServedEndpoint,
  readSubsetHint,
  readSubsetHintWithProblem,
  routingHeadersResponse,
  splitEndpoint,
  streamedBodyResponses,
} from '../../src/epp/protocol.js';

const chunks = (n: number, eos: boolean) =>
  streamedBodyResponses('request_body', Buffer.alloc(n, 1), eos).map(
    (m) => m.request_body!.response!.body_mutation!.streamed_response!,
  );

test('bodies are cut into chunks of at most 62,000 bytes; only the last carries end_of_stream', () => {
  assert.deepEqual(
    chunks(BODY_CHUNK_BYTES, true).map((c) => [c.body.length, c.end_of_stream]),
    [[62_000, true]],
  );
  assert.deepEqual(
    chunks(BODY_CHUNK_BYTES + 1, true).map((c) => [c.body.length, c.end_of_stream]),
    [
      [62_000, false],
      [1, true],
    ],
  );
  assert.deepEqual(
    chunks(3 * BODY_CHUNK_BYTES, false).map((c) => [c.body.length, c.end_of_stream]),
    [
      [62_000, false],
      [62_000, false],
      [62_000, false],
    ],
  );
  assert.deepEqual(
    chunks(0, true).map((c) => [c.body.length, c.end_of_stream]),
    [[0, true]],
    'an empty end is one empty chunk with end_of_stream',
  );
  assert.deepEqual(chunks(0, false), [], 'nothing to say: no message');
});

test('the routing answer: clear_route_cache, one destination header, the identical value in envoy.lb metadata', () => {
  const r = routingHeadersResponse(['10.0.0.1:8000', '10.0.0.2:8000'], { 'content-length': '12' });
  const common = r.request_headers!.response!;
  assert.equal(common.clear_route_cache, true);
  const set = common.header_mutation!.set_headers!;
  assert.deepEqual(
    set.map((h) => [h.header.key, Buffer.from(h.header.raw_value!).toString(), h.append_action]),
    [
      ['x-gateway-destination-endpoint', '10.0.0.1:8000,10.0.0.2:8000', 'OVERWRITE_IF_EXISTS_OR_ADD'],
      ['content-length', '12', 'OVERWRITE_IF_EXISTS_OR_ADD'],
    ],
  );
  assert.deepEqual(structToPlain(r.dynamic_metadata), {
    'envoy.lb': { 'x-gateway-destination-endpoint': '10.0.0.1:8000,10.0.0.2:8000' },
  });
  assert.throws(() => routingHeadersResponse([]), /at least one endpoint/);
});

test('immediate responses carry the status, a JSON error naming the field, and a details token without spaces', () => {
  const r = immediateResponse(400, 'messages must be a non-empty array', 'messages').immediate_response!;
  assert.equal(r.status.code, 400);
  assert.deepEqual(JSON.parse(Buffer.from(r.body!).toString()), {
    error: {
      message: 'messages must be a non-empty array',
      type: 'invalid_request_error',
      param: 'messages',
      code: null,
    },
  });
  assert.match(r.details!, /^\S+$/);
  assert.equal(
    JSON.parse(Buffer.from(immediateResponse(429, 'x').immediate_response!.body!).toString()).error.type,
    'rate_limit_error',
  );
});

const withMeta = (ns: string, key: string, value: object): ProcessingRequest => ({
  metadata_context: { filter_metadata: { [ns]: { fields: { [key]: value } } } },
});

test('the subset hint says what in it could not be read', () => {
  const hint = (v: object, max?: number) =>
    readSubsetHintWithProblem(withMeta('envoy.lb.subset_hint', 'x-gateway-destination-endpoint-subset', v), max);
  assert.deepEqual(hint({ kind: 'stringValue', stringValue: '10.0.0.1:80' }), {
    endpoints: ['10.0.0.1:80'],
    problem: undefined,
  });
  assert.deepEqual(hint({ kind: 'numberValue', numberValue: 8000 }), {
    endpoints: [],
    problem: 'is a number, not a list of ip:port strings',
  });
  assert.deepEqual(hint({ kind: 'structValue', structValue: {} }), {
    endpoints: [],
    problem: 'is a struct, not a list of ip:port strings',
  });
  assert.deepEqual(
    hint({
      kind: 'listValue',
      listValue: {
        values: [
          { kind: 'stringValue', stringValue: '10.0.0.1:80' },
          { kind: 'numberValue', numberValue: 1 },
          { kind: 'boolValue', boolValue: true },
        ],
      },
    }),
    { endpoints: ['10.0.0.1:80'], problem: 'has 2 entries that are not an ip:port string' },
  );
  assert.deepEqual(hint({ kind: 'listValue', listValue: { values: [] } }), {
    endpoints: [],
    problem: 'lists no endpoint',
  });
  const long = hint({ kind: 'stringValue', stringValue: Array(10).fill('1.1.1.1:1').join(',') }, 4);
  assert.equal(long?.endpoints.length, 4);
  assert.equal(long?.problem, 'names more than 4 endpoints; only the first 4 are read');
  assert.equal(hint({ kind: 'stringValue', stringValue: 'a:1,b:2' }, 2)?.problem, undefined, 'exactly the bound');
  // a list past the bound is not walked to its end: entries past it are never looked at
  const values = Array.from({ length: 10 }, () => ({ kind: 'stringValue', stringValue: '1.1.1.1:1' }));
  Object.defineProperty(values, 6, {
    get() {
      throw new Error('an entry past the bound was read');
    },
  });
  const longList = hint({ kind: 'listValue', listValue: { values } }, 4);
  assert.equal(longList?.endpoints.length, 4);
  assert.equal(longList?.problem, 'has more than 4 entries; only the first 4 are read');
  const numbers = Array.from({ length: 10 }, () => ({ kind: 'numberValue', numberValue: 1 }));
  Object.defineProperty(numbers, 6, {
    get() {
      throw new Error('an entry past the bound was read');
    },
  });
  assert.equal(
    hint({ kind: 'listValue', listValue: { values: numbers } }, 4)?.problem,
    'has more than 4 entries; only the first 4 are read',
  );
  assert.equal(
    hint({ kind: 'listValue', listValue: { values: [{ kind: 'stringValue', stringValue: 'a:1,b:2' }] } }, 2)?.problem,
    undefined,
    'exactly the bound, in a list',
  );
});

test('the subset hint: a list, a comma string, list entries with commas; absent is undefined, empty is []', () => {
  const hint = (v: object) =>
    readSubsetHint(withMeta('envoy.lb.subset_hint', 'x-gateway-destination-endpoint-subset', v));
  assert.deepEqual(
    hint({
      kind: 'listValue',
      listValue: {
        values: [
          { kind: 'stringValue', stringValue: '10.0.0.1:80' },
          { kind: 'stringValue', stringValue: '10.0.0.2:80, 10.0.0.3:80' },
        ],
      },
    }),
    ['10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80'],
  );
  assert.deepEqual(hint({ kind: 'stringValue', stringValue: ' 10.0.0.1:80 ,,10.0.0.2:80' }), [
    '10.0.0.1:80',
    '10.0.0.2:80',
  ]);
  assert.deepEqual(hint({ kind: 'listValue', listValue: { values: [] } }), []);
  assert.equal(readSubsetHint({}), undefined);
  assert.equal(
    readSubsetHint(
      withMeta('envoy.lb', 'x-gateway-destination-endpoint-subset', { kind: 'stringValue', stringValue: 'a:1' }),
    ),
    undefined,
    'only under its namespace',
  );
  assert.equal(
    readSubsetHint(
      withMeta('envoy.lb.subset_hint', 'x-gateway-destination-endpoint-subset', {
        kind: 'stringValue',
        stringValue: Array(10_000).fill('1.1.1.1:1').join(','),
      }),
      4096,
    )!.length,
    4096,
    'bounded',
  );
});

test('the served endpoint and headers are read as Envoy sends them', () => {
  assert.equal(
    readServedEndpoint(
      withMeta('envoy.lb', 'x-gateway-destination-endpoint-served', {
        kind: 'stringValue',
        stringValue: '10.0.0.9:8000',
      }),
    ),
    '10.0.0.9:8000',
  );
  assert.equal(readServedEndpoint({}), undefined);
  const h = readHeaders({
    headers: {
      headers: [
        { key: 'X-Request-Id', raw_value: Buffer.from('r1') },
        { key: 'accept', value: 'a' },
        { key: 'accept', raw_value: Buffer.from('b') },
      ],
    },
  });
  assert.equal(h.get('x-request-id'), 'r1', 'names in lower case, raw_value read');
  assert.equal(h.get('accept'), 'a,b', 'repeated headers folded');
  const status = (...headers: Array<{ key: string; value?: string; raw_value?: Buffer }>) =>
    readResponseStatus({ response_headers: { headers: { headers } } });
  assert.equal(status({ key: 'content-type', value: 'x' }, { key: ':status', raw_value: Buffer.from('503') }), 503);
  assert.equal(status({ key: ':status', value: '404' }), 404, 'value, from builds without raw_value');
  assert.equal(status({ key: 'content-type', value: 'x' }), undefined, 'no :status');
  assert.equal(status({ key: ':status', raw_value: Buffer.from('5xx') }), undefined, 'not a status');
  assert.equal(readResponseStatus({}), undefined);
});

test('endpoints: host:port of a URL, IPv6 in brackets, subset entries with or without port', () => {
  assert.equal(endpointOfUrl('http://10.0.0.1:8000/'), '10.0.0.1:8000');
  assert.equal(endpointOfUrl('http://engine.local'), 'engine.local:80');
  assert.equal(endpointOfUrl('https://engine.local'), 'engine.local:443');
  assert.equal(endpointOfUrl('http://[fd00::1]:8000'), '[fd00::1]:8000');
  assert.deepEqual(splitEndpoint('[FD00::1]:8000'), { host: 'fd00::1', port: '8000' });
  assert.deepEqual(splitEndpoint('fd00::1'), { host: 'fd00::1', port: undefined });
  assert.ok(inSubset('10.0.0.1:8000', ['10.0.0.1:8000']));
  assert.ok(!inSubset('10.0.0.1:8000', ['10.0.0.1:8001']));
  assert.ok(inSubset('10.0.0.1:8000', ['10.0.0.1']), 'no port: any port');
  assert.ok(inSubset('[fd00::1]:8000', ['fd00::1']));
  assert.ok(!inSubset('10.0.0.12:8000', ['10.0.0.1']));
});

test('the client’s model name comes back in the response, also split between chunks and after "model": with a space', () => {
  const run = (chunks: string[]) => {
    const r = new ModelNameRestorer('llama-internal-01', 'public-chat');
    return chunks.map((c, i) => r.push(Buffer.from(c), i === chunks.length - 1).toString());
  };
  const sse =
    'data: {"id":"c1","model":"llama-internal-01","choices":[]}\n\ndata: {"id":"c1","model":"llama-internal-01"}\n\ndata: [DONE]\n\n';
  const restored =
    'data: {"id":"c1","model":"public-chat","choices":[]}\n\ndata: {"id":"c1","model":"public-chat"}\n\ndata: [DONE]\n\n';
  assert.deepEqual(run([sse]), [restored]);
  // cut at every byte: the same body comes out, never more than a match's length held back
  for (let cut = 0; cut <= sse.length; cut++) {
    const out = run([sse.slice(0, cut), sse.slice(cut)]);
    assert.equal(out.join(''), restored, `cut at ${cut}`);
    const firstRestored = sse.slice(0, cut).replaceAll('"model":"llama-internal-01"', '"model":"public-chat"');
    const held = firstRestored.length - out[0].length;
    assert.ok(held >= 0 && held < '"model": "llama-internal-01"'.length, `cut at ${cut}: held ${held}`);
  }
  assert.deepEqual(run(['{"model": "llama-internal-01", "usage": {}}']), ['{"model": "public-chat", "usage": {}}']);
  // other fields naming the model, and other models, are left alone
  assert.deepEqual(run(['{"root":"llama-internal-01","model":"llama-internal-012"}']), [
    '{"root":"llama-internal-01","model":"llama-internal-012"}',
  ]);
  // names are matched as JSON strings, escapes included
  const q = new ModelNameRestorer('a"b', 'c');
  assert.equal(q.push(Buffer.from('{"model":"a\\"b"}'), true).toString(), '{"model":"c"}');
});
