/**
 * The endpoint picker's gRPC listener has the gateway's cap on client connections
 * (--max-client-connections): at the cap a new connection is closed as it is accepted, unread,
 * and counted under `listener="ext_proc"`; once one closes, a new one is served. Raw sockets
 * that speak the HTTP/2 connection preface; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { connect, type Settings } from 'node:http2';
import type { Socket } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { startPicker } from '../../src/epp/run-picker.js';
import { MAX_CONCURRENT_STREAMS } from '../../src/epp/server.js';
import { createGateway } from '../../src/server/gateway.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

/** The client's HTTP/2 connection preface and an empty SETTINGS frame: a gRPC server answers with its SETTINGS. */
const PREFACE = Buffer.concat([
  Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1'),
  Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]),
]);

interface RawPeer {
  socket: Socket;
  receivedBytes: () => number;
  closed: () => boolean;
}

async function http2Peer(port: number): Promise<RawPeer> {
  const { socket, received, closed } = await rawClient(port);
  socket.write(PREFACE);
  return { socket, receivedBytes: () => received().length, closed };
}

function metricLine(text: string, name: string, listener: string): number | undefined {
  const prefix = `${name}{listener="${listener}"} `;
  const line = text.split('\n').find((l) => l.startsWith(prefix));
  return line === undefined ? undefined : Number(line.slice(prefix.length));
}

test('the picker refuses a connection over --max-client-connections, counts it, and serves one once a place is free', async () => {
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    maxClientConnections: 2,
    openAiRoutes: false,
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  const picker = await startPicker(
    gateway,
    { bodyLimit: 1 << 20, shedQueueDepth: 5, shedKvUsage: 0.8, eppFallbacks: 2 },
    { host: '127.0.0.1', port: 0, log: () => {} },
  );
  const port = picker.eppPort!;
  const peers: RawPeer[] = [];
  const metric = async (name: string) =>
    metricLine((await gateway.app.inject({ method: 'GET', url: '/metrics' })).body, name, 'ext_proc');
  try {
    for (let i = 0; i < 2; i++) {
      const peer = await http2Peer(port);
      peers.push(peer);
      await until(() => peer.receivedBytes() > 0, `the server's SETTINGS on connection ${i + 1}`);
    }
    const over = await http2Peer(port);
    peers.push(over);
    await until(over.closed, 'the connection over the cap closed');
    assert.equal(over.receivedBytes(), 0, 'nothing is written to a connection over the cap');
    assert.equal(peers[0].closed(), false);
    assert.equal(peers[1].closed(), false);
    assert.equal(await metric('contextforge_client_connections_refused_total'), 1);
    assert.equal(await metric('contextforge_client_connections_limit'), 2);
    assert.equal(await metric('contextforge_client_connections_open'), 2);

    peers[0].socket.destroy();
    await until(
      async () => (await metric('contextforge_client_connections_open')) === 1,
      'the closed connection counted out',
    );
    const next = await http2Peer(port);
    peers.push(next);
    await until(() => next.receivedBytes() > 0, "the server's SETTINGS on a connection made after one closed");
  } finally {
    for (const p of peers) p.socket.destroy();
    await picker.close();
    await gateway.close(0);
  }
});

test('the picker caps the streams on one connection (SETTINGS_MAX_CONCURRENT_STREAMS)', async () => {
  const gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    log: () => {},
  });
  const picker = await startPicker(
    gateway,
    { shedQueueDepth: 5, shedKvUsage: 0.8, eppFallbacks: 2, bodyLimit: 1024 * 1024 },
    { host: '127.0.0.1', port: 0, log: () => {} },
  );
  const session = connect(`http://127.0.0.1:${picker.eppPort}`);
  session.on('error', () => {});
  try {
    const settings = await new Promise<Settings>((resolve) => session.once('remoteSettings', resolve));
    assert.equal(settings.maxConcurrentStreams, MAX_CONCURRENT_STREAMS);
  } finally {
    session.destroy();
    await picker.close();
    await gateway.close();
  }
});
