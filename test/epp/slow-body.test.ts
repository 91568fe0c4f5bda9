/**
 * A request body that does not arrive in time: the picker gives a stream --request-timeout-ms
 * from its request headers to its body's end, as the gateway gives an HTTP client. A client
 * sending its body a byte at a time (or never ending it) through the gateway otherwise holds
 * its bytes of the shared body budget for as long as the gateway keeps the stream open.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { status as GrpcStatus } from '@grpc/grpc-js';
import type { ProcessingRequest, ProcessingResponse } from '../../src/epp/proto.js';
import { EnvoyRole } from './envoy-role.js';
import { startPickerWithClients, type ExtProcClient, type PickerFleet } from './harness.js';
import { until } from '../helpers/wait.js';

// long enough that a body sent whole arrives in time on a busy machine (at 300 ms, one read
// beside a full test run did not), short enough to keep the test quick
const REQUEST_TIMEOUT_MS = 1500;

let fleet: PickerFleet;
let envoy: EnvoyRole;
let client: ExtProcClient;
let close: () => Promise<void>;
before(async () => {
  ({ fleet, envoy, client, close } = await startPickerWithClients({
    engines: 1,
    picker: { requestTimeoutMs: REQUEST_TIMEOUT_MS },
  }));
});
after(() => close());

const held = () => fleet.gateways[0].bodyBudget.used;
const inFlight = () => fleet.gateways[0].router.listWorkers().reduce((n, w) => n + w.inFlightRequests, 0);

test('a body that does not end in time gets a 408 and gives its bytes back; a routed request outlives the timeout', async () => {
  // routed before the slow one starts: its response phase comes after the slow one's timeout
  const routed = await envoy.request({ headers: {}, body: JSON.stringify({ model: 'mock', prompt: 'on time' }) });
  assert.equal(routed.kind, 'routed');
  if (routed.kind !== 'routed') return;

  const watched = watchedCall(client);
  const { call, answers } = watched;
  const headers: ProcessingRequest = {
    request_headers: {
      headers: { headers: [{ key: ':path', raw_value: Buffer.from('/v1/completions') }] },
      end_of_stream: false,
    },
  };
  call.write(headers);
  call.write({ request_body: { body: Buffer.from('{"model":"mock","prompt":"never'), end_of_stream: false } });
  await until(() => watched.code !== undefined, 'the picker to end the slow stream');
  assert.equal(watched.code, GrpcStatus.OK, 'a local reply, then a clean close');
  assert.equal(answers.length, 1, `one answer: ${answers.map((a) => a.response).join(', ')}`);
  const reply = answers[0].immediate_response;
  assert.ok(reply, `an immediate response, got ${answers[0].response}`);
  // by its name in Envoy's StatusCode enum: a number would mean the vendored enum lacks it
  assert.equal(reply.status.code, 'RequestTimeout');
  assert.match(JSON.parse(Buffer.from(reply.body ?? []).toString()).error.message, /did not arrive in time/);
  assert.equal(held(), 0, 'the slow body’s bytes are back in the budget');

  // the routed request was not cut by a timer of its own
  const resp = await routed.stream.respond({ served: routed.endpoints[0], chunks: ['{"ok":true}'] });
  assert.equal(resp.body.toString(), '{"ok":true}');
  await routed.stream.end();
  await until(() => inFlight() === 0, 'the routed request released');
});

/** Opens a Process stream on `on`, keeping what the picker answers and the status it ends it with. */
function watchedCall(on: ExtProcClient) {
  const call = on.Process();
  const watched = { call, answers: [] as ProcessingResponse[], code: undefined as number | undefined };
  call.on('data', (m: ProcessingResponse) => watched.answers.push(m));
  call.on('error', (e: Error & { code: number }) => (watched.code = e.code));
  call.on('status', (s: { code: number }) => (watched.code ??= s.code));
  return watched;
}

/** Opens a stream that sends nothing, and resolves to what the picker answered once it ends it. */
async function silentStream(on: ExtProcClient) {
  const watched = watchedCall(on);
  try {
    await until(() => watched.code !== undefined, 'the picker to end the silent stream');
  } finally {
    watched.call.cancel();
  }
  return { answers: watched.answers, code: watched.code };
}

function assertHeadersTimeout(out: { answers: ProcessingResponse[]; code: number | undefined }) {
  assert.equal(out.code, GrpcStatus.OK, 'a local reply, then a clean close');
  assert.equal(out.answers.length, 1);
  const reply = out.answers[0].immediate_response;
  assert.ok(reply, `an immediate response, got ${out.answers[0].response}`);
  assert.equal(reply.status.code, 'RequestTimeout');
  assert.match(
    JSON.parse(Buffer.from(reply.body ?? []).toString()).error.message,
    /the request headers did not arrive in time/,
  );
}

test('a stream that never sends its request headers gets a 408 in the request time, not held open for good', async () => {
  assertHeadersTimeout(await silentStream(client));
  assert.equal(held(), 0);
});

test('--headers-timeout-ms bounds the time to a stream’s request headers', async () => {
  const own = await startPickerWithClients({ engines: 1, picker: { headersTimeoutMs: 200 } });
  try {
    assertHeadersTimeout(await silentStream(own.client));
  } finally {
    await own.close();
  }
});
