/**
 * Engines whose side endpoints (/v1/models, /tokenize, /metrics, /health) answer without end:
 * a body that trickles forever or never stops coming. The router reads each within a bound of
 * time and size, and a client request never waits on one for long.
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { post } from './harness.js';
import { until } from '../helpers/wait.js';

const MiB = 1024 * 1024;
const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0, adminToken: 'fault-suite-admin' };

/** Writes `opening` then spaces as fast as the reader takes them, until the connection closes; resolves to the bytes written. */
function endless(res: ServerResponse, opening: string): Promise<number> {
  return new Promise((resolve) => {
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    let written = 0;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write(opening);
    const pump = () => {
      while (!res.destroyed) {
        written += chunk.length;
        if (!res.write(chunk)) return void res.once('drain', pump);
      }
    };
    res.on('close', () => resolve(written));
    pump();
  });
}

/** An engine whose `path` answers without end; every other path 404. */
async function endlessEngine(path: string) {
  let closed: Promise<number> | undefined;
  const server = createServer((req, res) => {
    req.resume();
    if (req.url !== path) return void res.writeHead(404).end();
    closed = endless(res, '{"data":[');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    /** Bytes written to the first request on `path` once the router dropped it (Infinity: not within 10 s). */
    dropped: async () => {
      await until(() => closed !== undefined, `a request on ${path}`);
      return Promise.race([closed!, new Promise<number>((r) => setTimeout(() => r(Infinity), 10_000).unref())]);
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

test('an endless /v1/models answer is dropped after a few MiB', async () => {
  const engine = await endlessEngine('/v1/models');
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'w', url: engine.url }],
    ...quiet,
  });
  const written = await engine.dropped();
  assert.ok(written < 32 * MiB, `the router stopped reading at its bound (${(written / MiB).toFixed(0)} MiB written)`);
  await gateway.close();
  await engine.close();
});

test('a /tokenize answer that trickles forever does not hold the client: another engine tokenizes', async () => {
  const trickling = createServer((req, res) => {
    req.resume();
    // its completions fail (so they move to the good engine); its /tokenize trickles
    if (req.url === '/v1/completions') return void res.writeHead(500).end();
    if (req.url !== '/tokenize') return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"tokens":[1');
    // a byte well within undici's body timeout each time: only a deadline on the whole body ends it
    const timer = setInterval(() => res.write(',1'), 200);
    res.on('close', () => clearInterval(timer));
  });
  await new Promise<void>((r) => trickling.listen(0, '127.0.0.1', r));
  const good = await new MockEngine().start();
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    tokenize: 'engine',
    workers: [
      { id: 'trickle', url: `http://127.0.0.1:${(trickling.address() as AddressInfo).port}` },
      { id: 'good', url: `http://127.0.0.1:${good.port}` },
    ],
    ...quiet,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const answer = await Promise.race([
    post(base, '/v1/completions', { prompt: 'hello there', max_tokens: 1 }),
    new Promise<undefined>((r) => setTimeout(() => r(undefined), 15_000).unref()),
  ]);
  assert.ok(answer, 'the request was answered within 15 s');
  assert.equal(answer.status, 200);
  await gateway.close();
  trickling.closeAllConnections();
  await new Promise<void>((r) => trickling.close(() => r()));
  await good.close();
});
