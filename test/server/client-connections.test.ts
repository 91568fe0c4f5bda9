/**
 * The cap on client connections (--max-client-connections): at the cap, a new connection is
 * closed as soon as it is accepted (no request of it is read, nothing hangs) and counted; the
 * connections already open, and the requests in flight on them, go on as before; once one
 * closes, a new connection is served. Real sockets against a real gateway; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer, type ServerResponse } from 'node:http';
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

test(
  'at --max-client-connections a new connection is closed unanswered and counted; open ones and their requests go on; a freed place is taken',
  { timeout: 60_000 },
  async () => {
    // an engine whose stream the test ends: a request stays in flight while the cap is hit
    let held: ServerResponse | undefined;
    const engine = await listening(
      createServer((req, res) => {
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {"choices":[{"text":"a"}]}\n\n');
        held = res;
      }),
    );
    const gateway = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ id: 'e', url: engine.url }],
      maxClientConnections: 2,
      healthCheckIntervalMs: 0,
      metricsIntervalMs: 0,
    });
    await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const port = (gateway.app.server.address() as { port: number }).port;
    const clients: RawClient[] = [];
    try {
      const a = await rawClient(port);
      clients.push(a);
      await healthz(a, 'the first connection');
      // the second connection carries a stream that is in flight while the cap is reached
      const b = await rawClient(port);
      clients.push(b);
      const body = JSON.stringify({ model: 'm', prompt: 'hello', stream: true });
      b.socket.write(
        `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`,
      );
      await until(() => b.received().includes('"text":"a"'), 'the first event of the stream in flight');

      // over the cap: closed by the gateway, with no answer, though it sent a request
      const c = await rawClient(port);
      clients.push(c);
      c.socket.write(get('/healthz'));
      await until(c.closed, 'the connection over the cap closed');
      assert.equal(c.received(), '', 'nothing is read from or written to a connection over the cap');

      // the open connections are untouched: a keep-alive request is answered, the stream ends whole
      await healthz(a, 'the first connection, after the refusal');
      held!.end('data: [DONE]\n\n');
      await until(() => b.received().includes('data: [DONE]'), 'the stream in flight ended');
      assert.equal(b.closed(), false);

      const metrics = await gateway.app.inject({ method: 'GET', url: '/metrics' });
      assert.equal(metricValue(metrics.body, 'contextforge_client_connections_refused_total'), 1);
      assert.equal(metricValue(metrics.body, 'contextforge_client_connections_limit'), 2);
      assert.equal(metricValue(metrics.body, 'contextforge_client_connections_open'), 2);

      // a connection closes: its place is free, and a new connection is served
      a.socket.destroy();
      await until(
        async () => (await new Promise<number>((r) => gateway.app.server.getConnections((_e, n) => r(n)))) === 1,
        'the closed connection counted out',
      );
      const d = await rawClient(port);
      clients.push(d);
      await healthz(d, 'a new connection after one closed');
    } finally {
      for (const c of clients) c.socket.destroy();
      held?.destroy();
      await gateway.close(0);
      await engine.close();
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
