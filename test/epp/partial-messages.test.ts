/**
 * What grpc-js holds of gRPC messages that have begun to arrive but not ended is charged to a
 * budget (partial-messages.ts): a peer that sends most of a large message on many streams and
 * holds them open must not make the picker hold (streams × receive limit) bytes. Real sockets
 * and HTTP/2 frames from a raw client; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { connect, constants, type ClientHttp2Stream } from 'node:http2';
import { createServer, type AddressInfo } from 'node:net';
import { test } from 'node:test';
import { Server, ServerCredentials, type ServerDuplexStream } from '@grpc/grpc-js';
import { chargePartialMessages } from '../../src/epp/partial-messages.js';
import { extProcService, type ProcessingRequest, type ProcessingResponse } from '../../src/epp/proto.js';
import { BodyBudget } from '../../src/server/body-budget.js';
import { until } from '../helpers/wait.js';

const PATH = '/envoy.service.ext_proc.v3.ExternalProcessor/Process';

test('an unfinished message is charged until it is whole or its stream ends; one that does not fit resets its stream', async () => {
  const received: ProcessingRequest[] = [];
  const server = new Server({ 'grpc.max_receive_message_length': 4 * 1024 * 1024 });
  server.addService(extProcService(), {
    Process: (call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => {
      call.on('data', (m: ProcessingRequest) => received.push(m));
      call.on('error', () => {});
    },
  });
  const injector = server.createConnectionInjector(ServerCredentials.createInsecure());
  const budget = new BodyBudget(100_000);
  let refused = 0;
  assert.equal(
    chargePartialMessages(server, budget, () => refused++),
    true,
    "grpc-js's HTTP/2 servers are read as this grpc-js keeps them",
  );
  const listener = createServer((socket) => injector.injectConnection(socket));
  await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
  const session = connect(`http://127.0.0.1:${(listener.address() as AddressInfo).port}`);
  session.on('error', () => {});
  const open = (): ClientHttp2Stream => {
    const stream = session.request({
      ':method': 'POST',
      ':path': PATH,
      'content-type': 'application/grpc',
      te: 'trailers',
    });
    stream.on('error', () => {});
    return stream;
  };
  /** A whole ProcessingRequest of a request body of `n` bytes, with its gRPC prefix. */
  const message = (n: number): Buffer => {
    const body = extProcService().Process.requestSerialize({
      request_body: { body: Buffer.alloc(n, 0x61), end_of_stream: false },
    });
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(body.length, 1);
    return Buffer.concat([prefix, body]);
  };
  try {
    // 60,000 bytes of a 3 MiB message: held by grpc-js, charged
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(3 * 1024 * 1024, 1);
    const first = open();
    first.write(Buffer.concat([prefix, Buffer.alloc(60_000)]));
    await until(() => budget.used === 60_005, 'the unfinished message charged');
    // another does not fit beside it: its stream is reset, nothing of it stays charged
    const second = open();
    second.write(Buffer.concat([prefix, Buffer.alloc(60_000)]));
    await until(() => second.closed, 'the stream whose message does not fit reset');
    assert.equal(second.rstCode, constants.NGHTTP2_ENHANCE_YOUR_CALM);
    assert.equal(refused, 1);
    assert.equal(budget.used, 60_005);
    // a stream that ends gives back what its unfinished message held
    first.close();
    await until(() => budget.used === 0, 'the closed stream gave its bytes back');
    // a message sent in pieces is charged while it arrives and handed over whole, then given back
    const whole = message(90_000);
    const third = open();
    third.write(whole.subarray(0, 50_000));
    await until(() => budget.used === 50_000, 'the first piece charged');
    third.write(whole.subarray(50_000));
    await until(() => received.length === 1, 'the message handed to the handler');
    assert.equal(received[0].request_body?.body?.length, 90_000);
    assert.equal(budget.used, 0);
    assert.equal(refused, 1);
    third.close();
  } finally {
    session.destroy();
    server.forceShutdown();
    await new Promise<void>((resolve) => listener.close(() => resolve()));
  }
});
