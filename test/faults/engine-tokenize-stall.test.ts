/**
 * Engines whose /tokenize accepts the request and never answers while their completions are
 * served (an API server wedged on that path, or overloaded): with `--tokenize engine` each
 * request asks the engines in turn, and however many stall it waits for them within one
 * deadline in all, then routes on its text.
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { post } from './harness.js';

const quiet = { metricsIntervalMs: 0, healthCheckIntervalMs: 0, adminToken: 'fault-suite-admin' };

test('engines whose /tokenize never answers hold a request for one deadline in all, not one each', async () => {
  const asked = { tokenize: 0 };
  const servers = await Promise.all(
    Array.from({ length: 5 }, async () => {
      const server = createServer((req, res) => {
        req.resume();
        if (req.url === '/tokenize') return void asked.tokenize++; // never answered
        if (req.url !== '/v1/completions') return void res.writeHead(404).end();
        req.on('end', () =>
          res.writeHead(200, { 'content-type': 'application/json' }).end('{"id":"cmpl-1","choices":[{"text":"a"}]}'),
        );
      });
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      return server;
    }),
  );
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    tokenize: 'engine',
    workers: servers.map((s, i) => ({ id: `w${i}`, url: `http://127.0.0.1:${(s.address() as AddressInfo).port}` })),
    ...quiet,
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const r = await post(base, '/v1/completions', { prompt: 'hello there', max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
    // each stalled /tokenize costs its own wait (2 s for its headers): the deadline in all (4 s)
    // ends the asking before every engine was asked
    assert.ok(asked.tokenize < servers.length, `${asked.tokenize} engines' /tokenize asked, one after the other`);
  } finally {
    await gateway.close();
    for (const s of servers) {
      s.closeAllConnections();
      s.close();
    }
  }
});
