/**
 * The endpoint picker's share of the process's buffered-body budget (the gateway's, one per
 * process): bodies arriving slowly on many ext_proc streams must not make it hold (streams ×
 * body limit) bytes. A body chunk that does not fit gets an immediate 503 with Retry-After; a
 * stream gives its bytes back once its body is routed on, or when it fails or is cancelled.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { ProcessingRequest, ProcessingResponse } from '../../src/epp/proto.js';
import { EnvoyRole } from './envoy-role.js';
import { startPickerWithClients, type ExtProcClient, type PickerFleet } from './harness.js';
import { until } from '../helpers/wait.js';

const BODY_LIMIT = 64 * 1024;
const BUDGET = 100_000;

let fleet: PickerFleet;
let envoy: EnvoyRole;
let client: ExtProcClient;
let close: () => Promise<void>;
before(async () => {
  ({ fleet, envoy, client, close } = await startPickerWithClients({
    engines: 1,
    gateway: { bodyLimit: BODY_LIMIT, bufferedBodyLimit: BUDGET },
  }));
});
after(() => close());

const held = () => fleet.gateways[0].bodyBudget.used;
/** contextforge_request_body_budget_refusals_total: the gateway's and the picker's refusals. */
const refusals = async () =>
  (await fleet.gateways[0].metrics.getSingleMetric('contextforge_request_body_budget_refusals_total')!.get()).values[0]
    ?.value ?? 0;

const REQUEST_HEADERS: ProcessingRequest = {
  request_headers: {
    headers: {
      headers: [':method', ':path'].map((key, i) => ({ key, raw_value: Buffer.from(['POST', '/v1/completions'][i]) })),
    },
    end_of_stream: false,
  },
};
/** What the budget counts for REQUEST_HEADERS: the bytes of their names and values. */
const H = ':method'.length + 'POST'.length + ':path'.length + '/v1/completions'.length;
const chunk = (n: number): ProcessingRequest => ({
  request_body: { body: Buffer.alloc(n, 0x20), end_of_stream: false },
});

/** A stream that has sent its request headers; what the picker answered so far is in `answers`. */
function openStream() {
  const call = client.Process();
  const answers: ProcessingResponse[] = [];
  call.on('data', (m: ProcessingResponse) => answers.push(m));
  call.on('error', () => {});
  call.write(REQUEST_HEADERS);
  return { call, answers };
}

test('a body chunk over the budget gets an immediate 503 with retry-after; cancelled streams give their bytes back', async () => {
  const a = openStream();
  a.call.write(chunk(60_000));
  await until(() => held() === H + 60_000, "the first stream's headers and body taken");
  const b = openStream();
  b.call.write(chunk(30_000));
  await until(() => held() === 2 * H + 90_000, "the second stream's headers and first chunk taken");
  const refusedBefore = await refusals();
  // this one does not fit: answered at once, and what the stream took goes back
  b.call.write(chunk(20_000));
  await until(() => b.answers.length > 0, 'the answer to the chunk that does not fit', { timeoutMs: 5000 });
  const immediate = b.answers[0].immediate_response;
  assert.ok(immediate, `an immediate response, got ${JSON.stringify(Object.keys(b.answers[0]))}`);
  assert.equal(immediate.status?.code, 'ServiceUnavailable');
  const set = new Map(
    (immediate.headers?.set_headers ?? []).map((h) => [
      h.header?.key,
      Buffer.from(h.header?.raw_value ?? []).toString(),
    ]),
  );
  assert.equal(set.get('retry-after'), '1');
  assert.equal(await refusals(), refusedBefore + 1, 'the refusal counted');
  assert.equal(set.get('content-type'), 'application/json');
  assert.deepEqual(JSON.parse(Buffer.from(immediate.body ?? []).toString()), {
    error: {
      message: 'the router is holding as many request bodies as it may at once; retry shortly',
      type: 'server_error',
      param: null,
      code: 'body_budget_exceeded',
    },
  });
  await until(() => held() === H + 60_000, 'the refused stream gave its bytes back');

  // the first stream's peer goes away mid-body: its bytes come back
  a.call.cancel();
  await until(() => held() === 0, 'the cancelled stream gave its bytes back');

  // a body that fills most of the budget is routed, and gives its bytes back once routed on
  const out = await envoy.request({ body: JSON.stringify({ model: 'mock', prompt: 'x'.repeat(50_000) }) });
  assert.equal(out.kind, 'routed');
  await until(() => held() === 0, 'the routed body gave its bytes back');
  if (out.kind === 'routed') await out.stream.end();
  b.call.cancel();
});

/** Request headers with `extra` besides :method and :path, and the bytes the budget counts for them. */
function headersOf(extra: Record<string, string>): { message: ProcessingRequest; bytes: number } {
  const all: Record<string, string> = { ':method': 'POST', ':path': '/v1/completions', ...extra };
  let bytes = 0;
  for (const [k, v] of Object.entries(all)) bytes += k.length + Buffer.byteLength(v);
  return {
    message: {
      request_headers: {
        headers: { headers: Object.entries(all).map(([key, v]) => ({ key, raw_value: Buffer.from(v) })) },
        end_of_stream: false,
      },
    },
    bytes,
  };
}

/** The status and error of the immediate response a stream got first. */
async function refusal(answers: ProcessingResponse[]): Promise<{ code: string; error: Record<string, unknown> }> {
  await until(() => answers.length > 0, 'an answer', { timeoutMs: 5000 });
  const immediate = answers[0].immediate_response;
  assert.ok(immediate, `an immediate response, got ${JSON.stringify(Object.keys(answers[0]))}`);
  const body = JSON.parse(Buffer.from(immediate.body ?? []).toString()) as { error: Record<string, unknown> };
  return { code: String(immediate.status?.code), error: body.error };
}

test('request headers held while the body arrives are taken from the budget; what does not fit gets the budget’s 503', async () => {
  const a = client.Process();
  a.on('error', () => {});
  const big = headersOf({ 'x-big': 'h'.repeat(50_000) });
  a.write(big.message);
  await until(() => held() === big.bytes, "the first stream's headers taken");
  a.write(chunk(20_000));
  await until(() => held() === big.bytes + 20_000, 'its body chunk taken beside them');

  const b = client.Process();
  const answers: ProcessingResponse[] = [];
  b.on('data', (m: ProcessingResponse) => answers.push(m));
  b.on('error', () => {});
  const refusedBefore = await refusals();
  b.write(headersOf({ 'x-big': 'h'.repeat(40_000) }).message);
  const { code, error } = await refusal(answers);
  assert.equal(code, 'ServiceUnavailable');
  assert.equal(error.code, 'body_budget_exceeded');
  assert.equal(await refusals(), refusedBefore + 1, 'the refusal counted');
  assert.equal(held(), big.bytes + 20_000, 'the refused stream holds nothing');

  a.cancel();
  await until(() => held() === 0, 'the cancelled stream gave its headers’ bytes back');
  // a request routed on its body gives its headers' bytes back with the body's
  const out = await envoy.request({
    headers: { 'x-big': 'h'.repeat(30_000) },
    body: JSON.stringify({ model: 'mock', prompt: 'headers' }),
  });
  assert.equal(out.kind, 'routed');
  await until(() => held() === 0, 'the routed request gave its bytes back');
  if (out.kind === 'routed') await out.stream.end();
  b.cancel();
});

test('a header message over 64 KiB or 1,000 headers gets 431 naming the headers, nothing held', async () => {
  const many: Record<string, string> = {};
  for (let i = 0; i < 1000; i++) many[`x-h${i}`] = 'v';
  const cases: Array<[string, ProcessingRequest, RegExp]> = [
    ['over 64 KiB', headersOf({ 'x-big': 'h'.repeat(64 * 1024) }).message, /larger than 65536 bytes/],
    ['over 1,000 headers', headersOf(many).message, /more than 1000 headers/],
  ];
  const refusedBefore = await refusals();
  for (const [name, message, text] of cases) {
    const call = client.Process();
    const answers: ProcessingResponse[] = [];
    call.on('data', (m: ProcessingResponse) => answers.push(m));
    call.on('error', () => {});
    call.write(message);
    const { code, error } = await refusal(answers);
    assert.equal(code, 'RequestHeaderFieldsTooLarge', name);
    assert.equal(error.param, 'headers', name);
    assert.match(String(error.message), text, name);
    assert.equal(held(), 0, name);
    assert.equal(await refusals(), refusedBefore, `${name}: no budget refusal`);
    call.cancel();
  }
});
