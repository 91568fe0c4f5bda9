/**
 * The endpoint picker's plaintext gRPC health port (--health-port), where kubelet's startup,
 * liveness and readiness probes go: connections that hold it without asking anything must not
 * keep the probes out, or any pod that reaches the port could restart the pickers.
 */
import assert from 'node:assert/strict';
import { connect as connectHttp2 } from 'node:http2';
import { connect, type Socket } from 'node:net';
import { after, test } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import {
  credentials,
  status as grpcStatus,
  loadPackageDefinition,
  type ChannelCredentials,
  type Client,
  type ClientReadableStream,
} from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { protoPath as healthProtoPath } from 'grpc-health-check';
import { PROTO_LOADER_OPTIONS } from '../../src/epp/proto.js';
import { HEALTH_MESSAGE_BYTES, startEppServer, type EppServer, type EppServerOptions } from '../../src/epp/server.js';
import { settled, until } from '../helpers/wait.js';

/** More connections than the health port holds at once (64). */
const FLOOD = 80;

const open: Array<{ close(): unknown }> = [];
after(async () => {
  for (const o of open.reverse()) await o.close();
});

async function start(o: Partial<EppServerOptions> = {}): Promise<EppServer> {
  const server = await startEppServer({
    host: '127.0.0.1',
    port: 0,
    healthPort: 0,
    bodyLimit: 1 << 20,
    picker: { pick: () => ({ ok: false, status: 503, message: 'none' }) },
    ready: () => true,
    readinessIntervalMs: 10,
    ...o,
  });
  open.push({ close: () => server.close(0) });
  return server;
}

type HealthClient = Client & {
  Check(
    req: { service: string },
    options: { deadline: number },
    cb: (err: Error | null, res?: { status: string }) => void,
  ): void;
};
const Health = (
  loadPackageDefinition(loadSync(healthProtoPath, PROTO_LOADER_OPTIONS)) as unknown as {
    grpc: { health: { v1: { Health: new (a: string, c: ChannelCredentials, o: object) => HealthClient } } };
  }
).grpc.health.v1.Health;

/** One probe as kubelet makes it: a connection of its own, one Check, closed; its status or error. */
function probe(port: number, service = 'readiness'): Promise<string> {
  const client = new Health(`127.0.0.1:${port}`, credentials.createInsecure(), {
    'grpc.use_local_subchannel_pool': 1,
  });
  return new Promise((resolve) =>
    client.Check({ service }, { deadline: Date.now() + 1000 }, (err, res) => {
      client.close();
      resolve(err ? `error: ${err.message}` : res!.status);
    }),
  );
}

/** `n` TCP connections to `port` that send nothing; `closed()` counts those the server closed. */
async function idleConnections(port: number, n: number): Promise<{ sockets: Socket[]; closed: () => number }> {
  const sockets: Socket[] = [];
  let closed = 0;
  for (let i = 0; i < n; i++) {
    const socket = connect(port, '127.0.0.1');
    socket.on('error', () => {});
    // read what the server sends (its SETTINGS), so its closing the connection is seen
    socket.resume();
    socket.once('close', () => closed++);
    sockets.push(socket);
  }
  open.push({ close: () => sockets.forEach((s) => s.destroy()) });
  await Promise.all(sockets.map((s) => new Promise((resolve) => s.once('connect', resolve))));
  return { sockets, closed: () => closed };
}

test('a probe gets through while more idle connections than the cap hold the health port', async () => {
  // timeouts far off: the newest connection gets in by the oldest going
  const server = await start({ healthPrefaceTimeoutMs: 60_000, healthIdleTimeoutMs: 60_000 });
  const port = server.healthPort!;
  const flood = await idleConnections(port, FLOOD);
  const status = await settled(
    () => probe(port),
    (s) => s === 'SERVING',
    { timeoutMs: 5000 },
  );
  assert.equal(status, 'SERVING');
  assert.equal(await probe(port, 'liveness'), 'SERVING');
  await until(() => flood.closed() >= FLOOD - 64, 'the oldest connections closed past the cap');
});

test('at the cap the oldest connection goes, not the newest', async () => {
  const server = await start({ healthPrefaceTimeoutMs: 60_000, healthIdleTimeoutMs: 60_000 });
  const port = server.healthPort!;
  const first = await idleConnections(port, 64);
  const closedFirst: number[] = [];
  first.sockets.forEach((s, i) => s.once('close', () => closedFirst.push(i)));
  const newest = await idleConnections(port, 1);
  await until(() => closedFirst.length === 1, 'one of the 64 closed');
  assert.deepEqual(closedFirst, [0], 'the oldest');
  assert.equal(newest.closed(), 0, 'the newest is kept');
  assert.equal(await probe(port), 'SERVING');
});

test('a connection that sends no HTTP/2 preface in time is closed', async () => {
  const server = await start({ healthPrefaceTimeoutMs: 200, healthIdleTimeoutMs: 60_000 });
  const port = server.healthPort!;
  const silent = await idleConnections(port, 8);
  // half a preface is no preface
  const partial = await idleConnections(port, 1);
  partial.sockets[0].write('PRI * HTTP/2.0\r\n');
  await until(() => silent.closed() === 8 && partial.closed() === 1, 'every connection without a preface closed', {
    timeoutMs: 5000,
  });
  assert.equal(await probe(port), 'SERVING');
});

test('an HTTP/2 connection with no call in flight is closed once idle', async () => {
  const server = await start({ healthPrefaceTimeoutMs: 60_000, healthIdleTimeoutMs: 300 });
  const session = connectHttp2(`http://127.0.0.1:${server.healthPort}`);
  session.on('error', () => {});
  open.push({ close: () => session.destroy() });
  let goaway = false;
  session.once('goaway', () => (goaway = true));
  let closed = false;
  session.once('close', () => (closed = true));
  await until(() => closed, 'the idle connection closed', { timeoutMs: 5000 });
  assert.ok(goaway, 'closed with a GOAWAY');
});

type WatchClient = Client & {
  Watch(req: { service: string }): ClientReadableStream<{ status: string }>;
};
const WatchHealth = Health as unknown as new (a: string, c: ChannelCredentials, o: object) => WatchClient;

/** A Watch on `port` for `service`: the statuses it received, and how it ended (once it has). */
function watch(port: number, service: string) {
  const client = new WatchHealth(`127.0.0.1:${port}`, credentials.createInsecure(), {
    'grpc.use_local_subchannel_pool': 1,
  });
  open.push({ close: () => client.close() });
  const call = client.Watch({ service });
  const statuses: string[] = [];
  let ended: number | undefined;
  call.on('data', (m: { status: string }) => statuses.push(m.status));
  call.on('error', (e: Error & { code: number }) => (ended = e.code));
  call.on('status', (s: { code: number }) => (ended ??= s.code));
  return { call, client, statuses, ended: () => ended };
}

test('Watch and Check calls for names the picker does not serve leave nothing behind', async () => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const server = await start({ healthPrefaceTimeoutMs: 60_000, healthIdleTimeoutMs: 60_000 });
  // a name the picker does not serve: Check NOT_FOUND, Watch SERVICE_UNKNOWN and held open
  assert.match(await probe(server.healthPort!, 'no-such-service'), /NOT_FOUND|health status unknown/);
  const unknown = watch(server.healthPort!, 'no-such-service');
  await until(() => unknown.statuses.length === 1, 'the first status');
  assert.deepEqual(unknown.statuses, ['SERVICE_UNKNOWN']);
  assert.equal(unknown.ended(), undefined, 'held open, as the health protocol asks');
  unknown.call.cancel();
  // distinct names of 1 MB on both ports, each Watch cancelled at its first status; the health
  // port reads no message past HEALTH_MESSAGE_BYTES: refused unread there
  gc();
  const before = process.memoryUsage().heapUsed;
  const N = 40;
  for (let i = 0; i < N; i++) {
    const onHealthPort = i % 2 === 0;
    const w = watch(onHealthPort ? server.healthPort! : server.port, String(i).padEnd(1 << 20, 'x'));
    await until(() => w.statuses.length > 0 || w.ended() !== undefined, 'an answer');
    if (onHealthPort) {
      assert.deepEqual(w.statuses, []);
      assert.equal(w.ended(), grpcStatus.RESOURCE_EXHAUSTED);
    } else assert.equal(w.statuses[0], 'SERVICE_UNKNOWN');
    w.call.cancel();
    w.client.close();
  }
  // a name just within the bound is still answered there
  const within = watch(server.healthPort!, 'y'.repeat(HEALTH_MESSAGE_BYTES - 16));
  await until(() => within.statuses.length > 0 || within.ended() !== undefined, 'an answer');
  assert.deepEqual(within.statuses, ['SERVICE_UNKNOWN']);
  within.call.cancel();
  await new Promise((resolve) => setTimeout(resolve, 200));
  gc();
  const grown = process.memoryUsage().heapUsed - before;
  assert.ok(grown < (N << 20) / 4, `${N} Watches with 1 MB names left ${(grown / 2 ** 20).toFixed(0)} MiB behind`);
});

test('a Watch on the ext_proc port does not hold shutdown: it is told NOT_SERVING and ended', async () => {
  const server = await start({ healthPrefaceTimeoutMs: 60_000, healthIdleTimeoutMs: 60_000 });
  const readiness = watch(server.port, 'readiness');
  const liveness = watch(server.port, 'liveness');
  await until(() => readiness.statuses.includes('SERVING') && liveness.statuses.length > 0, 'watching');
  const started = Date.now();
  await server.close(4000);
  const took = Date.now() - started;
  assert.ok(took < 2000, `close() took ${took} ms with Watch calls open (grace 4000 ms)`);
  await until(() => readiness.ended() !== undefined && liveness.ended() !== undefined, 'both Watch calls ended');
  assert.equal(readiness.statuses.at(-1), 'NOT_SERVING', 'told before it ended');
});
