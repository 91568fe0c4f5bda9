/**
 * With `--tokenize engine` every request asks an engine's /tokenize before it is routed. Those
 * calls take the connections the gateway keeps to the engine (--engine-connections), as the
 * proxied requests do: a flood of requests needing tokenization waits for a free one instead of
 * opening a new connection each. An engine whose connections are all taken (by streams) is passed
 * over for one with a free connection; only when every engine's are taken does the call wait, for
 * the first that frees.
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

/**
 * Engines that count their /tokenize calls and hold every streamed completion open until the
 * test ends it (a long generation): with one connection each, a held stream takes the engine's
 * only connection.
 */
async function streamingEngines(count: number) {
  const tokenizeCalls = Array.from({ length: count }, () => 0);
  const streams: ServerResponse[][] = Array.from({ length: count }, () => []);
  const servers = await Promise.all(
    Array.from({ length: count }, async (_, i) => {
      const server = createServer((req, res) => {
        const parts: Buffer[] = [];
        req.on('data', (c: Buffer) => parts.push(c));
        req.on('end', () => {
          if (req.url === '/tokenize') {
            tokenizeCalls[i]++;
            return void res
              .writeHead(200, { 'content-type': 'application/json' })
              .end('{"tokens":[1,2,3,4],"count":4}');
          }
          if (req.url !== '/v1/completions') return void res.writeHead(404).end();
          if ((JSON.parse(Buffer.concat(parts).toString()) as { stream?: boolean }).stream === true) {
            res.writeHead(200, { 'content-type': 'text/event-stream' });
            res.write('data: {"choices":[{"text":"a"}]}\n\n');
            return void streams[i].push(res);
          }
          res
            .writeHead(200, { 'content-type': 'application/json' })
            .end('{"id":"c","object":"text_completion","created":0,"model":"m","choices":[{"index":0,"text":"a"}]}');
        });
      });
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      return server;
    }),
  );
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    tokenize: 'engine',
    engineConnections: 1,
    workers: servers.map((s, i) => ({ id: `e${i}`, url: `http://127.0.0.1:${(s.address() as AddressInfo).port}` })),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: 'fault-suite-admin',
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  /** Starts a stream and returns once its first event arrived (it holds its engine's connection). */
  const openStream = async (prompt: string) => {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt, max_tokens: 1, stream: true }),
    });
    assert.equal(res.status, 200);
    return { worker: res.headers.get('x-contextforge-worker'), done: res.text().catch(() => '') };
  };
  const endStreams = (i: number) => {
    for (const s of streams[i].splice(0)) s.end('data: [DONE]\n\n');
  };
  const close = async () => {
    for (let i = 0; i < count; i++) endStreams(i);
    await gateway.close();
    for (const s of servers) {
      s.closeAllConnections();
      s.close();
    }
  };
  return { base, gateway, tokenizeCalls, streams, openStream, endStreams, close };
}

test('a request is tokenized by an engine with a free connection, not held for one whose connection a stream holds', async () => {
  const t = await streamingEngines(2);
  try {
    const long = await t.openStream('a long generation');
    assert.equal(long.worker, 'e0', 'the stream holds the only connection to e0');
    const before = [...t.tokenizeCalls];
    const r = await post(t.base, '/v1/completions', { prompt: 'short', max_tokens: 1 });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(
      [t.tokenizeCalls[0] - before[0], t.tokenizeCalls[1] - before[1]],
      [0, 1],
      '/tokenize calls on e0 and e1 for the request',
    );
    assert.equal(t.streams[0].length, 1, 'the stream on e0 is still held: the request did not wait for it');
    assert.equal(t.streams[0][0].writableEnded, false);
    t.endStreams(0);
    await long.done;
  } finally {
    await t.close();
  }
});

test("when every engine's connection is taken, /tokenize waits for the first that frees on any of them", async () => {
  const t = await streamingEngines(2);
  try {
    const first = await t.openStream('first generation');
    const second = await t.openStream('second generation');
    assert.deepEqual([first.worker, second.worker], ['e0', 'e1']);
    const before = [...t.tokenizeCalls];
    const answer = post(t.base, '/v1/completions', { prompt: 'short', max_tokens: 1 });
    const slots = [0, 1].map((i) => t.gateway.connections.get(`e${i}`)!.slots);
    await until(() => slots[0].queued === 1 && slots[1].queued === 1, 'the request to wait for either connection');
    // e1's connection frees first: the request is tokenized there while e0's stream is still held
    t.endStreams(1);
    await second.done;
    await until(() => t.tokenizeCalls[1] - before[1] === 1, 'the /tokenize call on e1');
    assert.equal(t.tokenizeCalls[0] - before[0], 0, 'no /tokenize call on e0');
    assert.equal(t.streams[0].length, 1, 'the stream on e0 is still held');
    t.endStreams(0);
    await first.done;
    const r = await answer;
    assert.equal(r.status, 200, r.text);
    assert.equal(t.tokenizeCalls[0] - before[0], 0, 'the wait left e0 without calling its /tokenize');
    // nothing kept a connection or a place in a wait
    await until(
      () => slots.every((s) => s.inUse === 0 && s.queued === 0),
      'every connection to be given back and no request left waiting',
    );
  } finally {
    await t.close();
  }
});

test('a worker removed while another engine is asked to tokenize is passed over, not a server error', async () => {
  const held: ServerResponse[] = [];
  const servers = await Promise.all(
    [0, 1].map(async (i) => {
      const server = createServer((req, res) => {
        req.resume();
        req.on('end', () => {
          // e0's /tokenize answers only when the test lets it, and then without token ids
          if (req.url === '/tokenize') return i === 0 ? void held.push(res) : void res.writeHead(500).end();
          if (req.url !== '/v1/completions') return void res.writeHead(404).end();
          res.writeHead(200, { 'content-type': 'application/json' }).end('{"id":"c","choices":[{"text":"a"}]}');
        });
      });
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      return server;
    }),
  );
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    tokenize: 'engine',
    workers: servers.map((s, i) => ({ id: `e${i}`, url: `http://127.0.0.1:${(s.address() as AddressInfo).port}` })),
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: 'fault-suite-admin',
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const answer = post(base, '/v1/completions', { prompt: 'short', max_tokens: 1 });
    await until(() => held.length === 1, "the request to reach e0's /tokenize");
    const auth = { authorization: 'Bearer fault-suite-admin' };
    assert.equal((await fetch(`${base}/admin/workers/e1`, { method: 'DELETE', headers: auth })).status, 200);
    held[0].writeHead(500).end();
    const r = await answer;
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers.get('x-contextforge-worker'), 'e0');
  } finally {
    await gateway.close();
    for (const s of servers) {
      s.closeAllConnections();
      s.close();
    }
  }
});
