import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { status as GrpcStatus } from '@grpc/grpc-js';
import type { ProcessingRequest, ProcessingResponse, ProtocolConfiguration } from '../../src/epp/proto.js';
import { startPickerWithClients, streamEnd, type ExtProcClient } from './harness.js';

// Envoy's body modes that take one answer per body message (STREAMED, BUFFERED) with
// send_body_without_waiting_for_header_response: the picker has the whole body before it
// answers the headers, routes on it, and the engine must get the body it routed on (a
// rewritten model, the router's metadata removed) with a content-length that matches it.

let client: ExtProcClient;
let close: () => Promise<void>;
before(async () => {
  ({ client, close } = await startPickerWithClients({ engines: 2 }));
});
after(() => close());

const headers = (h: Record<string, string>) => ({
  headers: Object.entries(h).map(([key, v]) => ({ key, raw_value: Buffer.from(v) })),
});

/** Writes `messages`, half-closes, and resolves to every answer once the picker closes the stream. */
function exchange(messages: ProcessingRequest[]): Promise<ProcessingResponse[]> {
  const call = client.Process();
  const answers: ProcessingResponse[] = [];
  call.on('data', (m: ProcessingResponse) => answers.push(m));
  const ended = new Promise<ProcessingResponse[]>((resolve, reject) => {
    const deadline = setTimeout(() => {
      call.cancel();
      reject(new Error('the picker did not end the stream within 10 s'));
    }, 10_000);
    call.on('error', (e: Error) => {
      clearTimeout(deadline);
      reject(e);
    });
    call.on('status', (s: { code: number }) => {
      if (s.code !== GrpcStatus.OK) return;
      clearTimeout(deadline);
      resolve(answers);
    });
  });
  call.on('end', () => {});
  for (const m of messages) call.write(m);
  call.end();
  return ended;
}

/** The request phase in `mode`: the headers, then `chunks` as body messages, the last one ending the body. */
async function requestPhase(
  mode: ProtocolConfiguration['request_body_mode'],
  extraHeaders: Record<string, string>,
  chunks: string[],
): Promise<{ contentLength: number | undefined; forwarded: Buffer; bodyAnswers: number }> {
  const answers = await exchange([
    {
      request_headers: {
        headers: headers({ ':method': 'POST', ':path': '/v1/completions', ...extraHeaders }),
        end_of_stream: false,
      },
      protocol_config: {
        request_body_mode: mode,
        response_body_mode: mode,
        send_body_without_waiting_for_header_response: true,
      },
    },
    ...chunks.map((c, i) => ({ request_body: { body: Buffer.from(c), end_of_stream: i === chunks.length - 1 } })),
  ]);
  assert.equal(answers[0]?.response, 'request_headers', `routed, got ${answers[0]?.response}`);
  const set = answers[0].request_headers?.response?.header_mutation?.set_headers ?? [];
  const length = set.find((h) => h.header.key === 'content-length');
  const bodyAnswers = answers.slice(1);
  assert.ok(
    bodyAnswers.every((a) => a.response === 'request_body'),
    `only body answers follow: ${bodyAnswers.map((a) => a.response).join(', ')}`,
  );
  // what Envoy forwards: each message's bytes, unless its answer replaces or clears them
  const forwarded = chunks.map((c, i) => {
    const mutation = bodyAnswers[i]?.request_body?.response?.body_mutation;
    if (mutation?.clear_body) return Buffer.alloc(0);
    if (mutation?.body !== undefined) return Buffer.from(mutation.body);
    return Buffer.from(c);
  });
  return {
    contentLength: length ? Number(Buffer.from(length.header.raw_value ?? []).toString()) : undefined,
    forwarded: Buffer.concat(forwarded),
    bodyAnswers: bodyAnswers.length,
  };
}

test('BUFFERED, body before the header answer: the rewritten model reaches the engine, with its exact length', async () => {
  const body = JSON.stringify({ model: 'mock', prompt: 'buffered rewrite', max_tokens: 2 });
  const out = await requestPhase('BUFFERED', { 'x-gateway-model-name-rewrite': 'mock-v2' }, [body]);
  assert.equal(out.bodyAnswers, 1, 'one answer for the one body message');
  assert.equal(JSON.parse(out.forwarded.toString()).model, 'mock-v2', 'the engine gets the rewritten model');
  assert.equal(out.contentLength, out.forwarded.length, 'content-length is the forwarded body’s');
});

test('STREAMED in two chunks, body before the header answer: the router’s metadata is removed from what is forwarded', async () => {
  const body = JSON.stringify({ model: 'mock', prompt: 'streamed', contextforge: { workflowId: 'wf-1' } });
  const out = await requestPhase('STREAMED', {}, [body.slice(0, 20), body.slice(20)]);
  assert.equal(out.bodyAnswers, 2, 'one answer per body message');
  assert.deepEqual(JSON.parse(out.forwarded.toString()), { model: 'mock', prompt: 'streamed' });
  assert.equal(out.contentLength, out.forwarded.length, 'content-length is the forwarded body’s');
});

test('an unchanged body in these modes passes as it came, every answer changing nothing', async () => {
  const body = JSON.stringify({ model: 'mock', prompt: 'as it came' });
  for (const mode of ['BUFFERED', 'STREAMED'] as const) {
    const out = await requestPhase(mode, {}, [body.slice(0, 10), body.slice(10)]);
    assert.equal(out.forwarded.toString(), body, mode);
    assert.equal(out.contentLength, Buffer.byteLength(body), mode);
  }
});

test('in the modes whose body follows the header answer, a body message after the body ended ends the stream', async () => {
  const body = (text: string, end: boolean): ProcessingRequest => ({
    request_body: { body: Buffer.from(text), end_of_stream: end },
  });
  const trailers: ProcessingRequest = { request_trailers: { trailers: headers({}) } };
  for (const mode of ['BUFFERED', 'STREAMED', 'BUFFERED_PARTIAL'] as const) {
    // routed on the headers: Envoy sends the body once it has the header answer
    const first: ProcessingRequest = {
      request_headers: { headers: headers({ ':method': 'POST', ':path': '/v1/completions' }), end_of_stream: false },
      protocol_config: { request_body_mode: mode, response_body_mode: mode },
    };
    const cases: Array<[string, ProcessingRequest[], RegExp]> = [
      [
        'a body after end_of_stream',
        [first, body('{}', true), body('more', false)],
        /request_body arrived after the body ended/,
      ],
      [
        'a body after the trailers',
        [first, body('{', false), trailers, body('}', true)],
        /request_body arrived after the body ended/,
      ],
      [
        'trailers after end_of_stream',
        [first, body('{}', true), trailers],
        /request_trailers arrived after the body ended/,
      ],
    ];
    for (const [name, messages, details] of cases) {
      const out = await streamEnd(client.Process(), messages);
      assert.equal(out.code, GrpcStatus.FAILED_PRECONDITION, `${mode}, ${name}: status ${out.code} ${out.details}`);
      assert.match(out.details, details, `${mode}, ${name}`);
      assert.equal(out.answers[0]?.response, 'request_headers', `${mode}, ${name}: routed first`);
    }
  }
});
