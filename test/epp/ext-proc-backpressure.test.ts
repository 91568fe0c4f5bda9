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
  const handler = createProcessHandler({
    bodyLimit: 1 << 20,
    picker: {
      pick: () => ({
        ok: true,
        endpoints: ['10.0.0.1:8000'],
        inFlight: { served: () => undefined, refused: () => {}, firstByte: () => {}, end: () => void ended++ },
      }),
    },
  });
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
