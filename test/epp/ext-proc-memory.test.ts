/**
 * What a request body costs the picker while it arrives: its bytes, not the gRPC messages they
 * came in. A body chunk decoded from a message is a view into that message's buffer; a peer
 * that pads each message (here: 1 byte of body in a 1 MiB buffer) must not make the picker
 * hold megabytes per byte of body, all under the body limit.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { until } from '../helpers/wait.js';
import { handlerCapturingPick } from './harness.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

test('a body chunk does not keep the message buffer it was decoded from', async () => {
  const { call, picked } = handlerCapturingPick();
  let collected = 0;
  const registry = new FinalizationRegistry(() => void collected++);
  call.push({ request: 'request_headers', request_headers: { headers: { headers: [] }, end_of_stream: false } });
  const CHUNKS = 32;
  const text = '{"prompt":"0123456789012345678"}';
  assert.equal(text.length, CHUNKS);
  // each chunk a 1-byte view into a message buffer of its own, as protobufjs decodes bytes
  const pushChunk = (i: number) => {
    const message = Buffer.alloc(1 << 20);
    message[4096] = text.charCodeAt(i);
    registry.register(message.buffer, i);
    call.push({ request: 'request_body', request_body: { body: message.subarray(4096, 4097), end_of_stream: false } });
  };
  for (let i = 0; i < CHUNKS; i++) pushChunk(i);
  // the body has not ended: the picker holds what it received so far, and nothing more
  await until(() => {
    gc();
    return collected === CHUNKS;
  }, `the ${CHUNKS} message buffers to be collected`);
  call.push({ request: 'request_body', request_body: { body: Buffer.alloc(0), end_of_stream: true } });
  await until(() => picked() !== undefined, 'the pick');
  assert.equal(picked()!.body?.toString(), text, 'the body, byte for byte');
  call.destroy();
});
