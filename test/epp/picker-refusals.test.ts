/**
 * The picker's refusals name the field as the gateway's do: a prompt over the router's
 * maxPromptTokens is refused on `messages` (a chat) or `prompt`, and an
 * x-gateway-model-name-rewrite or metadata header whose bytes are not UTF-8 is refused on the
 * header, not passed to the engine or the router as U+FFFD.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { status as GrpcStatus } from '@grpc/grpc-js';
import { KVAwareRouter } from '../../src/core/router/index.js';
import type { ProcessingResponse } from '../../src/epp/proto.js';
import { startPickerWithClients, type ExtProcClient } from './harness.js';
import type { EnvoyRole } from './envoy-role.js';
import { statusNumber } from './http-status.js';

let envoy: EnvoyRole;
let client: ExtProcClient;
let close: () => Promise<void>;
before(async () => {
  ({ envoy, client, close } = await startPickerWithClients({
    engines: 1,
    gateway: { router: new KVAwareRouter({ blockSize: 16, maxPromptTokens: 64 }) },
  }));
});
after(() => close());

const LONG = 'many words '.repeat(400);

for (const [path, body, field] of [
  ['/v1/chat/completions', { model: 'mock', messages: [{ role: 'user', content: LONG }] }, 'messages'],
  ['/v1/completions', { model: 'mock', prompt: LONG }, 'prompt'],
] as const) {
  test(`a prompt over maxPromptTokens on ${path} is refused 400 naming ${field}`, async () => {
    const out = await envoy.request({ headers: { ':path': path }, body: JSON.stringify(body) });
    assert.equal(out.kind, 'immediate');
    if (out.kind !== 'immediate') return;
    assert.equal(out.status, 400, out.body);
    const { error } = JSON.parse(out.body) as { error: { message: string; param: string | null } };
    assert.match(error.message, /maxPromptTokens/);
    assert.equal(error.param, field);
  });
}

/**
 * The picker's immediate answer to one stream whose request headers carry raw bytes (`headers`:
 * name → value), with a body when one is given (else the headers end the stream): its status
 * and error object.
 */
async function refusalOf(
  headers: Array<[string, string | Buffer]>,
  body?: string,
): Promise<{ status: number; error: { message: string; param: string | null } }> {
  const call = client.Process();
  const answers: ProcessingResponse[] = [];
  call.on('data', (m: ProcessingResponse) => answers.push(m));
  const ended = new Promise<void>((resolve, reject) => {
    call.on('error', reject);
    call.on('status', (s: { code: number }) =>
      s.code === GrpcStatus.OK ? resolve() : reject(new Error(String(s.code))),
    );
  });
  call.write({
    request_headers: {
      headers: { headers: headers.map(([key, v]) => ({ key, raw_value: Buffer.from(v) })) },
      end_of_stream: body === undefined,
    },
    ...(body === undefined ? {} : { protocol_config: { request_body_mode: 'FULL_DUPLEX_STREAMED' } }),
  });
  if (body !== undefined) call.write({ request_body: { body: Buffer.from(body), end_of_stream: true } });
  call.end();
  await ended;
  const reply = answers[0]?.immediate_response;
  const { error } = JSON.parse(Buffer.from(reply?.body ?? []).toString()) as {
    error: { message: string; param: string | null };
  };
  return { status: statusNumber(reply?.status.code ?? 0), error };
}

for (const name of ['x-gateway-model-name-rewrite', 'x-workflow-id', 'x-agent-role', 'x-anchor-ids'])
  test(`an ${name} header that is not UTF-8 is refused 400 naming it`, async () => {
    const { status, error } = await refusalOf(
      [
        [':method', 'POST'],
        [':path', '/v1/completions'],
        [name, Buffer.from([0x6d, 0x6f, 0xff, 0x6b])],
      ],
      '{"model":"mock","prompt":"hi"}',
    );
    assert.equal(status, 400);
    assert.equal(error.param, name);
    assert.match(error.message, /not UTF-8/);
  });

test('a metadata header that is not UTF-8 is refused on a request without a body too', async () => {
  const { status, error } = await refusalOf([
    [':method', 'GET'],
    [':path', '/v1/models'],
    ['x-workflow-id', Buffer.from([0x77, 0xff, 0x66])],
  ]);
  assert.equal(status, 400);
  assert.equal(error.param, 'x-workflow-id');
});
