/**
 * A stream Envoy gives up on is counted `cancelled`, whatever phase it was in. Envoy resets the
 * ext_proc stream (HTTP/2 RST_STREAM, after ending it with an empty DATA frame when it closes
 * the stream first); grpc-js ends the call's reading before it reports the reset, and the picker
 * must not take that end for a request that ended before its body (400) or before its headers
 * (failed_precondition). The frames are written by hand: Node's HTTP/2 client always ends a
 * stream in a write of its own before it resets it, which no test could tell from a half-close.
 */
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { after, before, test } from 'node:test';
import { Server, ServerCredentials } from '@grpc/grpc-js';
import { createProcessHandler } from '../../src/epp/ext-proc-handler.js';
import { extProcService, type ProcessingRequest } from '../../src/epp/proto.js';
import { until } from '../helpers/wait.js';

const outcomes: Array<string | number> = [];
let server: Server;
let port: number;
before(async () => {
  server = new Server();
  server.addService(extProcService(), {
    Process: createProcessHandler({
      bodyLimit: 1 << 20,
      picker: { pick: () => ({ ok: false, status: 400, message: 'not routed here' }) },
      onOutcome: (o) => outcomes.push(o),
    }),
  });
  port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
});
after(() => server.forceShutdown());

function frame(type: number, flags: number, stream: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(stream, 5);
  return Buffer.concat([head, payload]);
}
const DATA = 0;
const HEADERS = 1;
const RST_STREAM = 3;
const SETTINGS = 4;
const END_STREAM = 1;
const END_HEADERS = 4;
const CANCEL = Buffer.from([0, 0, 0, 8]);

/** HPACK literal header fields without indexing, no Huffman coding. */
function headerBlock(fields: Record<string, string>): Buffer {
  const literal = (s: string) => Buffer.concat([Buffer.from([s.length]), Buffer.from(s)]);
  return Buffer.concat(
    Object.entries(fields).map(([k, v]) => Buffer.concat([Buffer.from([0]), literal(k), literal(v)])),
  );
}

/** gRPC messages as one DATA frame's payload. */
function messages(...ms: ProcessingRequest[]): Buffer {
  const serialize = extProcService().Process.requestSerialize;
  return Buffer.concat(
    ms.map((m) => {
      const payload = serialize(m);
      const prefix = Buffer.alloc(5);
      prefix.writeUInt32BE(payload.length, 1);
      return Buffer.concat([prefix, payload]);
    }),
  );
}

/** A connection with stream 1 open on Process, and `first` sent on it. */
async function openStream(first: ProcessingRequest[]): Promise<Socket> {
  const socket = connect(port, '127.0.0.1');
  socket.on('data', () => {});
  socket.on('error', () => {});
  await new Promise<void>((resolve) => socket.once('connect', resolve));
  const open = headerBlock({
    ':method': 'POST',
    ':scheme': 'http',
    ':path': '/envoy.service.ext_proc.v3.ExternalProcessor/Process',
    ':authority': 'picker',
    'content-type': 'application/grpc',
    te: 'trailers',
  });
  socket.write(
    Buffer.concat([
      Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'),
      frame(SETTINGS, 0, 0, Buffer.alloc(0)),
      frame(HEADERS, END_HEADERS, 1, open),
      ...(first.length > 0 ? [frame(DATA, 0, 1, messages(...first))] : []),
    ]),
  );
  return socket;
}

const midBody: ProcessingRequest[] = [
  {
    request_headers: { headers: { headers: [{ key: ':path', raw_value: Buffer.from('/v1/completions') }] } },
    protocol_config: { request_body_mode: 'FULL_DUPLEX_STREAMED' },
  },
  { request_body: { body: Buffer.from('{"prompt":'), end_of_stream: false } },
];

/** Runs `script` on a fresh stream and returns the one outcome the picker counted for it. */
async function outcomeOf(first: ProcessingRequest[], then: Buffer): Promise<string | number> {
  const counted = outcomes.length;
  const socket = await openStream(first);
  // the first messages are handled before the stream is given up (as Envoy's arrive long before)
  if (first.length > 0) await new Promise<void>((resolve) => setImmediate(resolve));
  socket.write(then);
  await until(() => outcomes.length > counted, 'the stream to be counted');
  socket.destroy();
  return outcomes[counted];
}

test('a stream reset in the middle of its body is counted cancelled, not 400', async () => {
  assert.equal(await outcomeOf(midBody, frame(RST_STREAM, 0, 1, CANCEL)), 'cancelled');
});

test('a stream closed then reset in one write (as Envoy gives up) is counted cancelled', async () => {
  const closeThenReset = Buffer.concat([frame(DATA, END_STREAM, 1, Buffer.alloc(0)), frame(RST_STREAM, 0, 1, CANCEL)]);
  assert.equal(await outcomeOf(midBody, closeThenReset), 'cancelled');
});

test('a stream reset before its request headers is counted cancelled, not failed_precondition', async () => {
  assert.equal(await outcomeOf([], frame(RST_STREAM, 0, 1, CANCEL)), 'cancelled');
});

test('a stream only half-closed in the middle of its body is still answered 400', async () => {
  assert.equal(await outcomeOf(midBody, frame(DATA, END_STREAM, 1, Buffer.alloc(0))), 400);
});
