/**
 * The cap on client connections (--max-client-connections): at the cap, a new connection takes
 * the place of the connection idle the longest (closed and counted), and when none is idle it is
 * closed as soon as it is accepted (no request of it is read, nothing hangs) and counted; the
 * requests in flight go on as before; once a connection closes, a new one is served. Real
 * sockets against a real gateway; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { DESCRIPTOR_RESERVE, descriptorLimitWarning, openFileLimit } from '../../src/server/client-connections.js';
import { CLI } from '../helpers/cli-entry.js';
import { listening } from '../helpers/listening.js';
import { rawClient, type RawClient } from '../helpers/raw-client.js';
import { resolveServe } from '../helpers/serve-config.js';
import { until } from '../helpers/wait.js';

const get = (path: string) => `GET ${path} HTTP/1.1\r\nhost: x\r\n\r\n`;

/** Sends a keep-alive GET /healthz on `c` and waits for its whole answer: the gateway has accepted the connection. */
async function healthz(c: RawClient, what: string): Promise<void> {
  const before = c.received().length;
  c.socket.write(get('/healthz'));
  await until(() => c.received().slice(before).includes('{"status":"ok"}'), `${what} answered`);
}

/** A metric's value for the gateway's HTTP listener. */
function metricValue(text: string, name: string): number | undefined {
  const prefix = `${name}{listener="http"} `;
  const line = text.split('\n').find((l) => l.startsWith(prefix));
  return line === undefined ? undefined : Number(line.slice(prefix.length));
}

/** A gateway capped at `maxClientConnections` over an engine whose streams the test ends (`held`). */
async function cappedGateway(maxClientConnections: number) {
  const held: ServerResponse[] = [];
  const engine = await listening(
    createServer((req, res) => {
      req.resume();
      // what the gateway asks on its own (its first look at the worker) is answered at once
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"text":"a"}]}\n\n');
      held.push(res);
    }),
  );
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url: engine.url }],
    maxClientConnections,
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const port = (gateway.app.server.address() as { port: number }).port;
  // the gateway's side of each connection, in the order accepted
  const accepted: Socket[] = [];
  gateway.app.server.on('connection', (socket: Socket) => accepted.push(socket));
  const metric = async (name: string) =>
    metricValue((await gateway.app.inject({ method: 'GET', url: '/metrics' })).body, name);
  return {
    gateway,
    port,
    held,
    accepted,
    metric,
    close: async () => {
      for (const res of held) res.destroy();
      await gateway.close(0);
      await engine.close();
    },
  };
}

/** Starts a stream on `c` and waits for its first event: a request in flight on the connection. */
async function startStream(c: RawClient, what: string): Promise<void> {
  const body = JSON.stringify({ model: 'm', prompt: 'hello', stream: true });
  c.socket.write(
    `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`,
  );
  await until(() => c.received().includes('"text":"a"'), `the first event of ${what}`);
}

test(
  'at --max-client-connections with every connection in flight a new connection is closed unanswered and counted; the requests go on; a freed place is taken',
  { timeout: 60_000 },
  async () => {
    const { gateway, port, held, metric, close } = await cappedGateway(2);
    const clients: RawClient[] = [];
    try {
      // both connections carry a stream that is in flight while the cap is reached: none is idle
      for (const what of ['the first stream', 'the second stream']) {
        const c = await rawClient(port);
        clients.push(c);
        await startStream(c, what);
      }
      const [a, b] = clients;

      // over the cap: closed by the gateway, with no answer, though it sent a request
      const c = await rawClient(port);
      clients.push(c);
      c.socket.write(get('/healthz'));
      await until(c.closed, 'the connection over the cap closed');
      assert.equal(c.received(), '', 'nothing is read from or written to a connection over the cap');

      // the open connections are untouched: the streams end whole, and a keep-alive request is answered
      for (const res of held) res.end('data: [DONE]\n\n');
      await until(() => a.received().includes('data: [DONE]'), 'the first stream ended');
      await until(() => b.received().includes('data: [DONE]'), 'the second stream ended');
      assert.equal(a.closed(), false);
      assert.equal(b.closed(), false);
      await healthz(a, 'the first connection, after the refusal');

      assert.equal(await metric('contextforge_client_connections_refused_total'), 1);
      assert.equal(await metric('contextforge_client_connections_idle_closed_total'), 0);
      assert.equal(await metric('contextforge_client_connections_limit'), 2);
      assert.equal(await metric('contextforge_client_connections_open'), 2);

      // a connection closes: its place is free, and a new connection is served
      a.socket.destroy();
      await until(
        async () => (await new Promise<number>((r) => gateway.app.server.getConnections((_e, n) => r(n)))) === 1,
        'the closed connection counted out',
      );
      const d = await rawClient(port);
      clients.push(d);
      await healthz(d, 'a new connection after one closed');
      assert.equal(b.closed(), false, 'a place free: no connection is closed for the new one');
      assert.equal(await metric('contextforge_client_connections_idle_closed_total'), 0);
    } finally {
      for (const c of clients) c.socket.destroy();
      await close();
    }
  },
);

test(
  'at --max-client-connections a new connection takes the place of the connection idle the longest; one with a request in flight is never closed',
  { timeout: 60_000 },
  async () => {
    const { port, held, metric, close } = await cappedGateway(4);
    const clients: RawClient[] = [];
    try {
      // a stream in flight, then three keep-alive connections idle after a request each
      const streaming = await rawClient(port);
      clients.push(streaming);
      await startStream(streaming, 'the stream');
      const idle: RawClient[] = [];
      for (let i = 0; i < 3; i++) {
        const c = await rawClient(port);
        clients.push(c);
        idle.push(c);
        await healthz(c, `idle connection ${i}`);
      }
      // the first one is used again: the second is now the one idle the longest
      await healthz(idle[0], 'the first idle connection, again');

      const newcomer = await rawClient(port);
      clients.push(newcomer);
      await healthz(newcomer, 'the connection past the cap');
      await until(idle[1].closed, 'the connection idle the longest closed');
      assert.equal(idle[0].closed(), false);
      assert.equal(idle[2].closed(), false);
      assert.equal(streaming.closed(), false);
      assert.equal(await metric('contextforge_client_connections_idle_closed_total'), 1);
      assert.equal(await metric('contextforge_client_connections_refused_total'), 0);
      assert.equal(await metric('contextforge_client_connections_open'), 4);

      // the stream in flight was not touched: it ends whole
      held[0].end('data: [DONE]\n\n');
      await until(() => streaming.received().includes('data: [DONE]'), 'the stream ended');
      assert.equal(streaming.closed(), false);
    } finally {
      for (const c of clients) c.socket.destroy();
      await close();
    }
  },
);

test(
  'at --max-client-connections a connection whose request headers are half received is not idle; one that sent nothing yet is',
  { timeout: 60_000 },
  async () => {
    const { port, accepted, metric, close } = await cappedGateway(3);
    const clients: RawClient[] = [];
    try {
      // the oldest connection has sent half its request's headers: a request in progress
      const halfway = await rawClient(port);
      clients.push(halfway);
      halfway.socket.write('GET /healthz HTTP/1.1\r\nho');
      await until(() => accepted[0]?.bytesRead > 0, 'the half-sent headers read by the gateway');
      // then one idle after a request, and one that has sent nothing yet
      const used = await rawClient(port);
      clients.push(used);
      await healthz(used, 'the keep-alive connection');
      await healthz(used, 'the keep-alive connection, again');
      const silent = await rawClient(port);
      clients.push(silent);

      // past the cap: the one idle the longest goes first (the half-sent request is passed over)
      const first = await rawClient(port);
      clients.push(first);
      await healthz(first, 'the first connection past the cap');
      await until(used.closed, 'the keep-alive connection closed');
      assert.equal(halfway.closed(), false);
      // then the one that sent nothing
      const second = await rawClient(port);
      clients.push(second);
      await healthz(second, 'the second connection past the cap');
      await until(silent.closed, 'the connection that sent nothing closed');
      assert.equal(silent.received(), '');
      assert.equal(await metric('contextforge_client_connections_idle_closed_total'), 2);

      // the half-received request was not cut: its headers end, and it is answered
      halfway.socket.write('st: x\r\n\r\n');
      await until(() => halfway.received().includes('{"status":"ok"}'), 'the half-received request answered');
      assert.equal(await metric('contextforge_client_connections_refused_total'), 0);
    } finally {
      for (const c of clients) c.socket.destroy();
      await close();
    }
  },
);

test(
  'at --max-client-connections a connection that went idle and has begun a request since is passed over: with no other, the new connection is refused',
  { timeout: 60_000 },
  async () => {
    const { port, accepted, metric, close } = await cappedGateway(1);
    const clients: RawClient[] = [];
    try {
      const used = await rawClient(port);
      clients.push(used);
      await healthz(used, 'the keep-alive connection');
      // its next request's headers are half received: no longer idle
      used.socket.write('GET /healthz HTTP/1.1\r\nho');
      await until(
        () => accepted[0].bytesRead > 'GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n'.length,
        'the half-sent headers read',
      );

      const over = await rawClient(port);
      clients.push(over);
      over.socket.write(get('/healthz'));
      await until(over.closed, 'the connection over the cap closed');
      assert.equal(over.received(), '');
      assert.equal(await metric('contextforge_client_connections_refused_total'), 1);
      assert.equal(await metric('contextforge_client_connections_idle_closed_total'), 0);

      used.socket.write('st: x\r\n\r\n');
      await until(() => used.received().split('{"status":"ok"}').length === 3, 'the half-received request answered');
      assert.equal(used.closed(), false);
    } finally {
      for (const c of clients) c.socket.destroy();
      await close();
    }
  },
);

test('maxClientConnections must be a positive integer, named where it is wrong', async () => {
  for (const bad of [0, -1, 1.5, Number.NaN])
    await assert.rejects(
      createGateway({ router: new KVAwareRouter(), maxClientConnections: bad }),
      (err: Error) =>
        (err instanceof RangeError || err instanceof TypeError) && /maxClientConnections/.test(err.message),
      String(bad),
    );
  assert.throws(() => resolveServe(['--max-client-connections', '0']), /--max-client-connections must be >= 1/);
  assert.equal(resolveServe(['--max-client-connections', '100']).config.maxClientConnections, 100);
  assert.equal(resolveServe([], { CONTEXTFORGE_MAX_CLIENT_CONNECTIONS: '50' }).config.maxClientConnections, 50);
});

test("the open-file limit is read from /proc's text, and a limit the client cap cannot fit in is named", () => {
  const limits = [
    'Limit                     Soft Limit           Hard Limit           Units     ',
    'Max processes             unlimited            unlimited            processes ',
    'Max open files            600                  4096                 files     ',
  ].join('\n');
  assert.equal(openFileLimit(limits), 600);
  assert.equal(openFileLimit('Max open files            unlimited            unlimited            files'), undefined);
  assert.equal(openFileLimit(''), undefined);
  assert.match(
    descriptorLimitWarning(600, 16_384) ?? '',
    /^warning: the open-file limit \(600\) is below --max-client-connections \(16384\) plus 256/,
  );
  assert.equal(descriptorLimitWarning(16_384 + DESCRIPTOR_RESERVE, 16_384), undefined);
  assert.equal(descriptorLimitWarning(undefined, 16_384), undefined);
});

test('serve started under an open-file limit below its client cap says so once at start', async () => {
  const child = spawn(
    'bash',
    ['-c', `ulimit -n 600 && exec "$0" "$@"`, process.execPath, ...CLI, 'serve', '--port', '0'],
    {
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  try {
    await until(() => /serving on http:/.test(stderr), 'serve to listen', { timeoutMs: 60_000 });
    const lines = stderr.split('\n').filter((l) => l.includes('open-file limit'));
    assert.equal(lines.length, 1, stderr);
    assert.match(lines[0], /open-file limit \(600\) is below --max-client-connections \(16384\)/);
  } finally {
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await exited;
  }
});
