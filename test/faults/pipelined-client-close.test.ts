/**
 * A client that pipelines requests on one connection and closes it while the first is still
 * pending: the answers queued behind the first never get the connection, and each of those
 * requests ends as one whose client left: its engine request aborted (or, still waiting for a
 * connection to the engine, never sent), its in-flight ticket released, its gathered answer's
 * bytes given back to the answer budget, counted 499. Real sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { ApiKeys } from '../../src/server/api-keys.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';
import { fakeEngine } from './harness.js';

/** The size of a large answer's text: gathered whole (it declares its length) before it is written. */
const LARGE = 256 * 1024;

/**
 * An engine answering by prompt: 'hold' never (until it closes), 'large' a JSON answer of LARGE
 * characters with its length, 'stream' an event every few ms until the gateway closes it, any
 * other a small JSON answer. Records the prompts it was asked and the streams that were closed.
 */
async function promptEngine() {
  const prompts: string[] = [];
  const held: ServerResponse[] = [];
  let streamsClosed = 0;
  let streamed = 0;
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const { prompt } = JSON.parse(Buffer.concat(chunks).toString()) as { prompt: string };
      prompts.push(prompt);
      if (prompt === 'hold') return void held.push(res);
      if (prompt === 'stream') {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const timer = setInterval(() => {
          res.write('data: {"choices":[{"text":"t"}]}\n\n');
          streamed++;
        }, 5);
        res.on('close', () => {
          clearInterval(timer);
          streamsClosed++;
        });
        return;
      }
      const text = JSON.stringify({ choices: [{ text: prompt === 'large' ? 'x'.repeat(LARGE) : 'ok' }] });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    });
  });
  return {
    ...engine,
    prompts,
    streamsClosed: () => streamsClosed,
    /** Events the engine has written to its streams. */
    streamed: () => streamed,
    finish() {
      for (const res of held) res.destroy();
    },
  };
}

/** A key that sends the requests that carry it through Fastify's route (the fast path takes none with API keys). */
const KEY = 'sk-pipelined-close-0000';

const completion = (prompt: string, stream = false) => {
  const body = JSON.stringify({ model: 'm', prompt, max_tokens: 4, ...(stream ? { stream: true } : {}) });
  return `POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${KEY}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
};

/** A value of the gateway's /metrics text: the sample of `name` (with its labels as written), 0 when absent. */
async function sample(gateway: Gateway, name: string): Promise<number> {
  const text = await gateway.metrics.metrics();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? 0 : Number(line.slice(name.length + 1));
}

const answerBytesHeld = (gateway: Gateway) => sample(gateway, 'contextforge_gathered_answer_bytes_held');
const bodyBytesHeld = (gateway: Gateway) => sample(gateway, 'contextforge_request_body_bytes_held');
const counted = (gateway: Gateway, status: number) =>
  sample(gateway, `contextforge_requests_total{path="/v1/completions",status="${status}"}`);

/**
 * A gateway (with `options` added) in front of a promptEngine, listening on a free port, and a raw
 * client connected to it; `body` runs with them, then the engine's held requests are let go and
 * the gateway and engine closed.
 */
async function withPipelinedClient(
  options: Partial<GatewayOptions>,
  body: (rig: {
    engine: Awaited<ReturnType<typeof promptEngine>>;
    router: KVAwareRouter;
    gateway: Gateway;
    port: number;
    client: Awaited<ReturnType<typeof rawClient>>;
  }) => Promise<void>,
): Promise<void> {
  const engine = await promptEngine();
  const router = new KVAwareRouter();
  const gateway = await createGateway({
    router,
    workers: [{ id: 'e0', url: engine.url }],
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
    ...options,
  });
  try {
    await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const port = (gateway.app.server.address() as AddressInfo).port;
    await body({ engine, router, gateway, port, client: await rawClient(port) });
  } finally {
    engine.finish();
    await gateway.close(0);
    await engine.close();
  }
}

for (const route of ['fast path', 'Fastify route'] as const) {
  test(`pipelined requests behind a pending one, whose client closes the connection, end as requests whose client left (${route})`, async () => {
    await withPipelinedClient(
      route === 'Fastify route' ? { apiKeys: new ApiKeys({ [KEY]: 'team' }) } : {},
      async ({ engine, router, gateway, client }) => {
        // a held request, large answers gathered behind it, a stream and a small answer
        client.socket.write(
          completion('hold') + completion('large').repeat(3) + completion('stream', true) + completion('small'),
        );
        await until(() => engine.prompts.length === 6, 'every whole request at the engine');
        await until(async () => (await answerBytesHeld(gateway)) >= 3 * LARGE, 'the large answers gathered');
        await until(() => engine.streamed() > 0, 'the stream under way');
        // in flight: the held request and the stream at least (the others may be answered, waiting their turn)
        assert.ok(router.getStats().inFlightRequests >= 2);

        client.socket.destroy();
        await until(() => router.getStats().inFlightRequests === 0, 'no request in flight');
        await until(async () => (await answerBytesHeld(gateway)) === 0, 'every gathered answer given back');
        await until(async () => (await counted(gateway, 499)) === 6, 'every request counted 499');
        await until(() => engine.streamsClosed() === 1, 'the stream aborted at the engine');
        await until(() => gateway.connections.get('e0')!.slots.inUse === 0, 'no connection to the engine held');
        assert.equal(await counted(gateway, 200), 0, 'nothing counted answered');
        // each counted once: still 6 once everything else has settled
        assert.equal(await counted(gateway, 499), 6);
      },
    );
  });
}

test('pipelined requests waiting for the one engine connection are never sent once their client closed, and the connection serves the next client', async () => {
  await withPipelinedClient({ engineConnections: 1 }, async ({ engine, router, gateway, port, client }) => {
    client.socket.write(completion('hold') + completion('large') + completion('stream', true) + completion('small'));
    await until(() => engine.prompts.length === 1, 'the held request at the engine');
    const slots = gateway.connections.get('e0')!.slots;
    await until(() => slots.queued === 3, 'the pipelined requests waiting for the engine connection');

    client.socket.destroy();
    await until(() => router.getStats().inFlightRequests === 0, 'no request in flight');
    await until(async () => (await counted(gateway, 499)) === 4, 'every request counted 499');
    await until(() => slots.inUse === 0 && slots.queued === 0, 'the engine connection free');
    assert.equal(await answerBytesHeld(gateway), 0);

    // a request on a connection of its own gets the engine's one connection
    const next = await rawClient(port);
    next.socket.write(completion('fresh'));
    await until(() => /\r\n\r\n\{"choices"/.test(next.received()), "the next client's answer");
    assert.match(next.received(), /^HTTP\/1\.1 200 /);
    next.socket.destroy();
    assert.deepEqual(engine.prompts, ['hold', 'fresh'], 'the pipelined requests never reached the engine');
  });
});

test('a pipelined request whose body has not arrived whole when its connection is reset is counted 499 and holds no budget', async () => {
  await withPipelinedClient({}, async ({ engine, router, gateway, client }) => {
    const partial = completion('never whole');
    client.socket.write(completion('hold') + partial.slice(0, partial.length - 5));
    await until(() => engine.prompts.length === 1, 'the held request at the engine');
    await until(async () => (await bodyBytesHeld(gateway)) > 0, 'the body behind it taken from the budget');

    client.socket.resetAndDestroy();
    await until(() => router.getStats().inFlightRequests === 0, 'no request in flight');
    await until(async () => (await counted(gateway, 499)) === 2, 'both requests counted 499');
    assert.equal(await bodyBytesHeld(gateway), 0);
    assert.deepEqual(engine.prompts, ['hold'], 'the request behind never reached the engine');
  });
});
