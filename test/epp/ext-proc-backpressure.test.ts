/**
 * A long response streamed through a slow Envoy: every answer that waits for the stream to
 * drain must leave no listener behind, or a long stream piles them up on the call.
 */
import assert from 'node:assert/strict';
import { Duplex } from 'node:stream';
import { test } from 'node:test';
import type { ServerDuplexStream } from '@grpc/grpc-js';
import { createProcessHandler } from '../../src/epp/ext-proc-handler.js';
import type { ProcessingRequest, ProcessingResponse } from '../../src/epp/proto.js';
import { until } from '../helpers/wait.js';

/** A process handler whose picker routes every request to one endpoint; `onEnd` hears each request end. */
function oneEndpointHandler(onEnd: () => void) {
  return createProcessHandler({
    bodyLimit: 1 << 20,
    picker: {
      pick: () => ({
        ok: true,
        endpoints: ['10.0.0.1:8000'],
        inFlight: { served: () => undefined, refused: () => {}, firstByte: () => {}, end: onEnd },
      }),
    },
  });
}

test('answers that wait for drain leave no listeners on the call', async () => {
  const held: Array<() => void> = [];
  let answers = 0;
  // a call whose every write waits until the test lets it through: each answer meets backpressure
  const call = new Duplex({
    objectMode: true,
    writableHighWaterMark: 1,
    read() {},
    write(_chunk, _encoding, callback) {
      answers++;
      held.push(() => callback());
    },
  });
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(w.message);
  process.on('warning', onWarning);
  let ended = 0;
  const handler = oneEndpointHandler(() => void ended++);
  handler(call as unknown as ServerDuplexStream<ProcessingRequest, ProcessingResponse>);
  const drainAll = () => {
    while (held.length > 0) held.shift()!();
  };
  const push = (m: ProcessingRequest) => call.push(m);
  push({ request: 'request_headers', request_headers: { headers: { headers: [] }, end_of_stream: true } });
  push({ request: 'response_headers', response_headers: { headers: { headers: [] } } });
  const CHUNKS = 40;
  for (let i = 0; i < CHUNKS; i++)
    push({
      request: 'response_body',
      response_body: { body: Buffer.from(`data: ${i}\n\n`), end_of_stream: i === CHUNKS - 1 },
    });
  await until(() => {
    drainAll();
    return answers >= CHUNKS + 2;
  }, 'every answer to be written');
  await until(() => ended === 1, 'the request to end');
  process.off('warning', onWarning);
  assert.deepEqual(
    warnings.filter((w) => /listener/i.test(w)),
    [],
  );
  assert.ok(call.listenerCount('close') <= 2, `${call.listenerCount('close')} 'close' listeners left`);
  assert.ok(call.listenerCount('error') <= 2, `${call.listenerCount('error')} 'error' listeners left`);
  call.destroy();
});

test('a peer that streams a response body without reading the answers is not read ahead of them', async () => {
  const held: Array<() => void> = [];
  const TOTAL = 200;
  let pulled = 0;
  const body = (i: number): ProcessingRequest => ({
    request: 'response_body',
    response_body: { body: Buffer.alloc(1024, 97), end_of_stream: i === TOTAL - 1 },
  });
  const script: ProcessingRequest[] = [
    { request: 'request_headers', request_headers: { headers: { headers: [] }, end_of_stream: true } },
    { request: 'response_headers', response_headers: { headers: { headers: [] } } },
    ...Array.from({ length: TOTAL }, (_, i) => body(i)),
  ];
  // as grpc-js hands over messages: one per read, as they come off the connection
  const call = new Duplex({
    objectMode: true,
    writableHighWaterMark: 1,
    read() {
      setImmediate(() => {
        if (pulled < script.length) this.push(script[pulled++]);
      });
    },
    write(_chunk, _encoding, callback) {
      held.push(() => callback());
    },
  });
  let ended = 0;
  const handler = oneEndpointHandler(() => void ended++);
  handler(call as unknown as ServerDuplexStream<ProcessingRequest, ProcessingResponse>);
  // no answer is ever taken: the handler must stop reading, not take the whole stream in
  // (a paused stream still reads ahead up to its high-water mark, then no more)
  await until(
    () =>
      pulled === script.length ||
      (held.length > 0 && call.readableFlowing === false && call.readableLength >= call.readableHighWaterMark),
    'the handler to stop reading, or to read everything',
  );
  assert.ok(
    pulled <= call.readableHighWaterMark + 4,
    `${pulled} of ${script.length} messages read while no answer was taken`,
  );
  // the peer reads again: everything is answered, in order, and the request ends
  await until(() => {
    while (held.length > 0) held.shift()!();
    return ended === 1;
  }, 'the request to end');
  assert.equal(pulled, script.length);
  call.destroy();
});
