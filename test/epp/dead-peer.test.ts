/**
 * A gateway that vanishes without closing its connection (its node lost power, a network
 * partition): no FIN, no RST, nothing more on the wire. Its streams must not stay open in the
 * picker for ever, holding requests in flight on the workers they were routed to.
 */
import { createServer, connect, type AddressInfo, type Socket } from 'node:net';
import { test } from 'node:test';
import { credentials, makeGenericClientConstructor, type ClientDuplexStream } from '@grpc/grpc-js';
import { extProcService, type ProcessingRequest, type ProcessingResponse } from '../../src/epp/proto.js';
import { startEppServer } from '../../src/epp/server.js';
import { until } from '../helpers/wait.js';

test('a peer that goes silent with streams open: they end after an unanswered keepalive ping', async () => {
  let inFlight = 0;
  const epp = await startEppServer({
    host: '127.0.0.1',
    port: 0,
    bodyLimit: 1 << 20,
    picker: {
      pick: () => {
        inFlight++;
        let ended = false;
        const end = () => {
          if (!ended) inFlight--;
          ended = true;
        };
        return {
          ok: true,
          endpoints: ['10.0.0.1:8000'],
          inFlight: { served: () => undefined, refused: () => {}, firstByte: () => {}, end },
        };
      },
    },
    ready: () => true,
    keepaliveTimeMs: 200,
    keepaliveTimeoutMs: 200,
  });
  // a TCP relay that can freeze: it stops passing bytes either way and closes nothing
  let frozen = false;
  const sockets: Socket[] = [];
  const relay = createServer((down) => {
    const up = connect(epp.port, '127.0.0.1');
    sockets.push(down, up);
    down.on('data', (d) => void (frozen || up.write(d)));
    up.on('data', (d) => void (frozen || down.write(d)));
    down.on('error', () => {});
    up.on('error', () => {});
  });
  await new Promise<void>((r) => relay.listen(0, '127.0.0.1', r));
  const Ctor = makeGenericClientConstructor(extProcService(), 'ExternalProcessor');
  const client = new Ctor(
    `127.0.0.1:${(relay.address() as AddressInfo).port}`,
    credentials.createInsecure(),
  ) as unknown as {
    Process(): ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
    close(): void;
  };
  try {
    const calls: Array<ClientDuplexStream<ProcessingRequest, ProcessingResponse>> = [];
    let answers = 0;
    for (let i = 0; i < 3; i++) {
      const call = client.Process();
      call.on('data', () => void answers++);
      call.on('error', () => {});
      call.write({ request_headers: { headers: { headers: [] }, end_of_stream: true } });
      calls.push(call);
    }
    await until(() => answers === 3 && inFlight === 3, 'three routed requests');
    frozen = true;
    await until(() => inFlight === 0, 'the silent peer’s requests to be released', { timeoutMs: 15_000 });
    for (const c of calls) c.cancel();
  } finally {
    client.close();
    for (const s of sockets) s.destroy();
    relay.close();
    await epp.close(0);
  }
});
