/**
 * What one ext_proc stream costs the picker and how it is counted, on the handler alone (a
 * stream of its own, no gRPC): a flood of empty body messages is bounded and answered one at a
 * time, and a routed stream whose response never begins gives back its in-flight accounting.
 */
import assert from 'node:assert/strict';
import { Duplex } from 'node:stream';
import { test } from 'node:test';
import type { ServerDuplexStream } from '@grpc/grpc-js';
import { createProcessHandler, type ExtProcHandlerOptions } from '../../src/epp/ext-proc-handler.js';
import type { ProcessingRequest, ProcessingResponse } from '../../src/epp/proto.js';
import { MAX_BODY_MESSAGES, perMessageBodyResponses } from '../../src/epp/protocol.js';

import { until } from '../helpers/wait.js';

/** The handler on a stream of its own: push what Envoy sends; `answers` is what the picker wrote. */
function handlerStream(options: Partial<ExtProcHandlerOptions> = {}) {
  const answers: ProcessingResponse[] = [];
  const outcomes: Array<string | number> = [];
  let responseTimeouts = 0;
  let picks = 0;
  const inFlight = { ended: 0, served: 0 };
  const call = new Duplex({
    objectMode: true,
    read() {},
    write: (m: ProcessingResponse, _e, done: () => void) => {
      answers.push(m);
      done();
    },
  });
  createProcessHandler({
    bodyLimit: 1 << 20,
    picker: {
      pick: () => {
        picks++;
        return {
          ok: true,
          endpoints: ['10.0.0.1:8000'],
          inFlight: {
            served: () => void inFlight.served++,
            refused: () => {},
            firstByte: () => {},
            end: () => void inFlight.ended++,
          },
        };
      },
    },
    onOutcome: (o) => outcomes.push(o),
    onResponseTimeout: () => void responseTimeouts++,
    ...options,
  })(call as unknown as ServerDuplexStream<ProcessingRequest, ProcessingResponse>);
  return { call, answers, outcomes, inFlight, picks: () => picks, responseTimeouts: () => responseTimeouts };
}

const STREAMED_HEADERS: ProcessingRequest = {
  request: 'request_headers',
  request_headers: { headers: { headers: [{ key: ':path', raw_value: Buffer.from('/v1/completions') }] } },
  protocol_config: {
    request_body_mode: 'STREAMED',
    response_body_mode: 'STREAMED',
    send_body_without_waiting_for_header_response: true,
  },
};
const empty = (eos = false): ProcessingRequest => ({
  request: 'request_body',
  request_body: { body: Buffer.alloc(0), end_of_stream: eos },
});

test('a body in more messages than MAX_BODY_MESSAGES is answered 413, empty ones counted', async () => {
  const s = handlerStream();
  s.call.push(STREAMED_HEADERS);
  for (let i = 0; i <= MAX_BODY_MESSAGES; i++) s.call.push(empty());
  await until(() => s.answers.length > 0, 'the picker to answer');
  const reply = s.answers[0].immediate_response;
  assert.equal(reply?.status.code, 413);
  const error = JSON.parse(Buffer.from(reply.body ?? []).toString()) as { error: { message: string; param: string } };
  assert.equal(error.error.param, 'body');
  assert.match(error.error.message, /65536 messages/);
  assert.equal(s.picks(), 0, 'never routed');
  assert.deepEqual(s.outcomes, [413]);
  s.call.destroy();
});

test('a body in as many messages as allowed is routed, one answer per message', async () => {
  const s = handlerStream();
  s.call.push(STREAMED_HEADERS);
  const messages = 2000;
  for (let i = 1; i < messages; i++) s.call.push(empty());
  s.call.push(empty(true));
  await until(() => s.answers.length === 1 + messages, `the headers answer and ${messages} body answers`);
  assert.ok(s.answers[0].request_headers, 'the headers answer first');
  assert.ok(s.answers.slice(1).every((a) => a.request_body !== undefined));
  assert.deepEqual(s.outcomes, ['routed']);
  s.call.destroy();
});

test('the per-message answers are made as they are taken, not as one array', () => {
  const answers = perMessageBodyResponses(3, Buffer.from('{}'));
  assert.ok(!Array.isArray(answers), 'an iterator, not an array built whole');
  assert.deepEqual(
    [...answers].map((a) => Object.keys(a.request_body?.response?.body_mutation ?? {})),
    [['clear_body'], ['clear_body'], ['body']],
  );
  // far more answers than could ever be held: taking the first makes only the first
  const huge = perMessageBodyResponses(Number.MAX_SAFE_INTEGER)[Symbol.iterator]();
  assert.deepEqual(huge.next().value, { request_body: { response: {} } });
});

const HEADERS_ONLY: ProcessingRequest = {
  request: 'request_headers',
  request_headers: { headers: { headers: [{ key: ':method', raw_value: Buffer.from('GET') }] }, end_of_stream: true },
};

test('a routed stream whose response never begins gives its worker back the request', async () => {
  const s = handlerStream({ responseTimeoutMs: 20 });
  s.call.push(HEADERS_ONLY);
  await until(() => s.inFlight.ended > 0, 'the in-flight accounting to end');
  // one outcome per stream, routed; the timeout counted apart
  assert.deepEqual(s.outcomes, ['routed']);
  assert.equal(s.responseTimeouts(), 1);
  assert.equal(s.inFlight.ended, 1);
  // a response that comes after all is still processed
  s.call.push({ request: 'response_headers', response_headers: { headers: { headers: [] } } });
  await until(() => s.answers.some((a) => a.response_headers !== undefined), 'the response headers answer');
  s.call.destroy();
});

test('a response that begins in time keeps the accounting until it ends', async () => {
  const s = handlerStream({ responseTimeoutMs: 60_000 });
  s.call.push(HEADERS_ONLY);
  await until(() => s.outcomes.length > 0, 'the routing');
  s.call.push({ request: 'response_headers', response_headers: { headers: { headers: [] } } });
  s.call.push({ request: 'response_body', response_body: { body: Buffer.from('{}'), end_of_stream: true } });
  await until(() => s.inFlight.ended > 0, 'the response to end');
  assert.deepEqual(s.outcomes, ['routed']);
  s.call.destroy();
});
