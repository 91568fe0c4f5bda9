/**
 * A request whose client leaves before its answer is complete is counted in
 * contextforge_requests_total once, with status 499 (nginx's "client closed request"), on the
 * fast path and on Fastify's route alike.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { test } from 'node:test';
import { Agent, fetch } from 'undici';
import { KVAwareRouter } from '../../src/index.js';
import { ApiKeys } from '../../src/server/api-keys.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { fakeEngine } from '../faults/harness.js';
import { rawClient } from '../helpers/raw-client.js';
import { completionCounts } from '../helpers/request-counts.js';
import { settled, until } from '../helpers/wait.js';

const KEY = 'sk-client-closed-0000';

/** The completion counts once the first request is counted (see completionCounts). */
function firstCounts(gateway: Gateway): Promise<Record<string, number>> {
  return settled(
    () => completionCounts(() => gateway.metrics.metrics()),
    (c) => Object.keys(c).length > 0,
  );
}

/**
 * A gateway (with `options` added) in front of an engine that answers 404 to everything, listening
 * on a free port; `body` runs with it and its port, then both are closed.
 */
async function withNotFoundEngine(
  options: Partial<GatewayOptions>,
  body: (gateway: Gateway, port: number) => Promise<void>,
): Promise<void> {
  const engine = await fakeEngine((_req: IncomingMessage, res: ServerResponse) => void res.writeHead(404).end());
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    ...options,
  });
  try {
    await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    await body(gateway, (gateway.app.server.address() as AddressInfo).port);
  } finally {
    await gateway.close();
    await engine.close();
  }
}

for (const route of ['fast path', 'Fastify route'] as const) {
  test(`a client that leaves before its answer is counted once as 499 (${route})`, async () => {
    /** Requests the engine has and has not answered: a stream sends one event and waits. */
    let received = 0;
    const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      const body: Buffer[] = [];
      req.on('data', (chunk: Buffer) => body.push(chunk));
      req.on('end', () => {
        received++;
        if ((JSON.parse(Buffer.concat(body).toString()) as { stream?: boolean }).stream === true) {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write('data: {"choices":[{"text":"a"}]}\n\n');
        }
        // otherwise the answer never comes
      });
    });
    const gateway = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ id: 'e0', url: engine.url }],
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      // one connection to the engine: a second request waits for it in the gateway
      engineConnections: 1,
      ...(route === 'Fastify route' ? { apiKeys: new ApiKeys({ [KEY]: 'team' }) } : {}),
    });
    const held = new AbortController();
    // the clients' own connections, closed before the gateway: a connection an aborted request
    // leaves open holds the gateway's close
    const clients = new Agent();
    try {
      const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
      const ask = (body: object, signal: AbortSignal) =>
        fetch(`${base}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
          body: JSON.stringify(body),
          signal,
          dispatcher: clients,
        });
      const counted = () => completionCounts(() => gateway.metrics.metrics());

      // 1. it leaves while its non-streamed answer is awaited; it holds the engine's one connection meanwhile
      const waiting = ask({ prompt: 'awaited', max_tokens: 1 }, held.signal).catch((err: Error) => err);
      await until(() => received === 1, 'the engine holding the first request');

      // 2. it leaves while it waits for the engine's connection the first one holds
      const queued = new AbortController();
      const queuedAnswer = ask({ prompt: 'queued', max_tokens: 1 }, queued.signal).catch((err: Error) => err);
      await until(
        () => gateway.connections.get('e0')!.slots.queued > 0,
        'the second request waiting for the engine connection',
      );
      queued.abort();
      assert.ok((await queuedAnswer) instanceof Error);
      await until(async () => (await counted())['499'] === 1, 'the queued request counted 499');

      held.abort();
      assert.ok((await waiting) instanceof Error);
      await until(async () => (await counted())['499'] === 2, 'the awaited request counted 499');

      // 3. it leaves in the middle of a stream
      const mid = new AbortController();
      const res = await ask({ prompt: 'streamed', max_tokens: 4, stream: true }, mid.signal);
      assert.equal(res.status, 200);
      const reader = res.body!.getReader();
      await reader.read();
      mid.abort();
      await reader.read().catch(() => undefined);
      await until(async () => (await counted())['499'] === 3, 'the streamed request counted 499');
    } finally {
      held.abort();
      await clients.destroy();
      await gateway.close();
      await engine.close();
    }
    // once everything has closed: each request counted once, and as nothing else
    assert.deepEqual(await completionCounts(() => gateway.metrics.metrics()), { '499': 3 });
  });
}

test('an answer the gateway cuts because its engine broke it off counts with the status it was sent with, not 499', async () => {
  // a stream was asked for, the engine answers JSON without a length (passed through as it comes:
  // the answer budget cannot take it), then dies
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"id":"cmpl-1","choices":[{"text":"hel', () => setImmediate(() => res.socket?.destroy()));
    });
  });
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    bufferedAnswerLimit: 1,
  });
  const clients = new Agent();
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const answer = fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'cut', max_tokens: 2, stream: true }),
      dispatcher: clients,
    }).then((res) => res.text());
    await assert.rejects(answer, 'the client sees the answer cut');
    // the gateway's side of the response closes after the client's: counted once it has
    const counts = await firstCounts(gateway);
    assert.deepEqual(counts, { '200': 1 });
  } finally {
    await clients.destroy();
    await gateway.close();
    await engine.close();
  }
});

test('a request the gateway answers before any route runs counts with the status it was answered', async () => {
  // a body that does not arrive in time is answered 408 by the gateway, not left by the client
  await withNotFoundEngine({ timeouts: { requestTimeoutMs: 300, headersTimeoutMs: 300 } }, async (gateway, port) => {
    /** What the gateway answers to `request`, written on a connection of its own that it closes. */
    const answer = async (request: string) => {
      const client = await rawClient(port);
      client.socket.write(request);
      await until(client.closed, 'the gateway to close the connection');
      return client.received();
    };
    const head = (length: number) =>
      `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\n\r\n`;
    assert.match(await answer(head(100) + '{"prompt":'), /^HTTP\/1\.1 408 /);
    // the 17th of 17 requests pipelined on one connection is answered 503 (pipelining.ts)
    const prompt = '{"prompt":"x"}';
    const pipelined = await answer((head(prompt.length) + prompt).repeat(17));
    assert.match(pipelined, /HTTP\/1\.1 503 [^]*pipelining_depth_exceeded/);
    const counted = () => completionCounts(() => gateway.metrics.metrics());
    await until(async () => (await counted())['503'] === 1, 'the refused request counted');
    const counts = await counted();
    assert.equal(counts['408'], 1, JSON.stringify(counts));
    assert.equal(counts['503'], 1, JSON.stringify(counts));
    assert.equal(counts['499'], undefined, JSON.stringify(counts));
  });
});

test('a body that stops arriving for the connection timeout is answered 408 naming body, counted 408', async () => {
  // the whole-request deadline is far off: the connection's idle timer is what ends the wait
  await withNotFoundEngine(
    { timeouts: { requestTimeoutMs: 60_000, interChunkTimeoutMs: 200, connectionTimeoutMs: 400 } },
    async (gateway, port) => {
      const client = await rawClient(port);
      client.socket.write(
        'POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"prompt":',
      );
      await until(client.closed, 'the gateway to answer and close the connection');
      const answer = client.received();
      assert.match(answer, /^HTTP\/1\.1 408 /, answer);
      assert.match(answer, /"param":"body"/, answer);
      assert.match(answer, /stopped arriving for 400 ms/, answer);
      const counts = await firstCounts(gateway);
      assert.deepEqual(counts, { '408': 1 });
    },
  );
});

for (const route of ['fast path', 'Fastify route'] as const) {
  test(`a client that ends its input in the middle of a body counts as 499, not 400 (${route})`, async () => {
    await withNotFoundEngine(
      route === 'Fastify route' ? { apiKeys: new ApiKeys({ [KEY]: 'team' }) } : {},
      async (gateway, port) => {
        let requests = 0;
        gateway.app.server.on('request', () => requests++);
        const head =
          'POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n' +
          `authorization: Bearer ${KEY}\r\ncontent-length: 1000\r\n\r\n`;
        const counted = () => completionCounts(() => gateway.metrics.metrics());
        // closed whole, and only its sending side closed (a FIN looks the same to the gateway)
        for (const [i, leave] of [(s: Socket) => s.destroy(), (s: Socket) => s.end()].entries()) {
          const client = await rawClient(port);
          client.socket.write(head + '{"prompt":"x');
          await until(() => requests === i + 1, 'the request in the gateway, its body being read');
          leave(client.socket);
          await until(client.closed, 'the connection closed');
          assert.equal(client.received(), '', 'no answer: the request was given up, not refused');
          const counts = await settled(counted, (c) => c['499'] === i + 1);
          assert.deepEqual(counts, { '499': i + 1 }, `request ${i} counted 499`);
        }
      },
    );
  });
}

for (const route of ['fast path', 'Fastify route'] as const) {
  test(`a request retried past the connection timeout is answered, its connection kept while it waits (${route})`, async () => {
    // the first attempt breaks after a while, the retry answers after as long: together longer
    // than the client connection's idle timeout, each within the upstream timeout (200 ms of room
    // either way: with 50 a busy machine's retry ran past the upstream timeout)
    const waitMs = 500;
    let posts = 0;
    const slow = () =>
      fakeEngine((req: IncomingMessage, res: ServerResponse) => {
        req.resume();
        if (req.url !== '/v1/completions') return void res.writeHead(404).end();
        req.on('end', () => {
          const first = ++posts === 1;
          setTimeout(() => {
            if (first) return void res.socket?.destroy();
            res.writeHead(200, { 'content-type': 'application/json' }).end('{"choices":[{"text":"late"}]}');
          }, waitMs);
        });
      });
    const engines = [await slow(), await slow()];
    const gateway = await createGateway({
      router: new KVAwareRouter(),
      workers: engines.map((e, i) => ({ id: `e${i}`, url: e.url })),
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      timeouts: { interChunkTimeoutMs: 2 * waitMs - 300, connectionTimeoutMs: 2 * waitMs - 200 },
      ...(route === 'Fastify route' ? { apiKeys: new ApiKeys({ [KEY]: 'team' }) } : {}),
    });
    const clients = new Agent();
    try {
      const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
      const res = await fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
        body: JSON.stringify({ prompt: 'retried', max_tokens: 1 }),
        dispatcher: clients,
      });
      assert.equal(res.status, 200);
      assert.match(await res.text(), /late/);
      assert.equal(posts, 2, 'answered by the retry');
      const counts = await firstCounts(gateway);
      assert.deepEqual(counts, { '200': 1 });
    } finally {
      await clients.destroy();
      await gateway.close();
      for (const e of engines) await e.close();
    }
  });
}
