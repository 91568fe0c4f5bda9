/**
 * With `--tokenize engine` every request asks an engine's /tokenize before it is routed. Those
 * calls take the connections the gateway keeps to the engine (--engine-connections), as the
 * proxied requests do: a flood of requests needing tokenization waits for a free one instead of
 * opening a new connection each.
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';
import { post } from './harness.js';

const CAP = 2;
const REQUESTS = 8;

test('/tokenize calls to an engine never use more connections than --engine-connections', async () => {
  // sockets that carried a /tokenize or a completion, open now; the most of them open at once
  const open = new Set<Socket>();
  let most = 0;
  const held: ServerResponse[] = [];
  let holding = true;
  const answerTokenize = (res: ServerResponse) =>
    res.writeHead(200, { 'content-type': 'application/json' }).end('{"tokens":[1,2,3,4],"count":4}');
  const engine = createServer((req, res) => {
    req.resume();
    if (req.url === '/tokenize' || req.url === '/v1/completions') {
      const socket = req.socket;
      if (!open.has(socket)) {
        open.add(socket);
        most = Math.max(most, open.size);
        socket.once('close', () => open.delete(socket));
      }
    }
    req.on('end', () => {
      if (req.url === '/tokenize') return holding ? void held.push(res) : answerTokenize(res);
      if (req.url === '/v1/completions')
        return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[{"text":"a"}]}');
      res.writeHead(404).end();
    });
  });
  await new Promise<void>((r) => engine.listen(0, '127.0.0.1', r));
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    tokenize: 'engine',
    engineConnections: CAP,
    workers: [{ id: 'e0', url: `http://127.0.0.1:${(engine.address() as AddressInfo).port}` }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: 'fault-suite-admin',
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const answers = Array.from({ length: REQUESTS }, (_, i) =>
      post(base, '/v1/completions', { prompt: `prompt ${i}`, max_tokens: 1 }),
    );
    const slots = gateway.connections.get('e0')!.slots;
    // every request is either at the engine's /tokenize or waiting for one of its connections
    await until(() => held.length + slots.queued === REQUESTS, 'every request to reach /tokenize or wait for it');
    assert.ok(most <= CAP, `${most} connections to the engine at once (cap ${CAP})`);
    assert.equal(held.length, CAP, 'as many /tokenize calls at once as the cap allows');
    holding = false;
    for (const res of held.splice(0)) answerTokenize(res);
    for (const r of await Promise.all(answers)) assert.equal(r.status, 200, r.text);
    assert.ok(most <= CAP, `${most} connections to the engine at once (cap ${CAP})`);
  } finally {
    await gateway.close();
    engine.closeAllConnections();
    engine.close();
  }
});
