/**
 * Pipelined requests (several sent on one connection before the first is answered): at most
 * MAX_PIPELINED_REQUESTS are served at once on a connection (one connection would otherwise
 * start as many engine requests as it can pipeline, past the cap on client connections, and
 * hold every answer completed behind a slower one); the next is answered 503 in its turn and
 * the connection closed after it. Real sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { MAX_PIPELINED_REQUESTS, PipelinedRequests } from '../../src/server/pipelining.js';
import { listening } from '../helpers/listening.js';
import { rawClient } from '../helpers/raw-client.js';
import { completionCounts } from '../helpers/request-counts.js';
import { settled, until } from '../helpers/wait.js';

/** An engine that answers each completion when the test says, and records the prompts it was asked. */
async function holdingEngine() {
  const prompts: string[] = [];
  const held: ServerResponse[] = [];
  const server = await listening(
    createServer((req, res) => {
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      let body = '';
      req.on('data', (d: Buffer) => (body += d.toString()));
      req.on('end', () => {
        prompts.push((JSON.parse(body) as { prompt: string }).prompt);
        held.push(res);
      });
    }),
  );
  return {
    ...server,
    prompts,
    /** Answers every request asked so far. */
    answerAll() {
      const text = JSON.stringify({ choices: [{ text: 'ok' }] });
      for (const res of held.splice(0))
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': text.length }).end(text);
    },
    finish() {
      for (const res of held) res.destroy();
    },
  };
}

/** A gateway listening on a free port in front of one holdingEngine(). */
async function gatewayOnHoldingEngine() {
  const engine = await holdingEngine();
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url: engine.url }],
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const port = (gateway.app.server.address() as { port: number }).port;
  return { engine, gateway, port };
}

const completion = (prompt: string) => {
  const body = JSON.stringify({ model: 'm', prompt });
  return `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
};

test('past the pipelining depth a request reaches no engine, is answered 503 in its turn, and the connection closes after it', async () => {
  const { engine, gateway, port } = await gatewayOnHoldingEngine();
  const client = await rawClient(port);
  const { socket } = client;
  const other = (await rawClient(port)).socket;
  try {
    // the depth served at once, one refused, and one more after the refusal
    const n = MAX_PIPELINED_REQUESTS + 2;
    let all = '';
    for (let i = 0; i < n; i++) all += completion(`p${i}`);
    socket.write(all);
    const pipelined = () => engine.prompts.filter((p) => p !== 'elsewhere');
    await until(() => pipelined().length >= MAX_PIPELINED_REQUESTS, 'the pipelined requests served at once');
    // a request on another connection, sent after them all: by the time it is at the engine,
    // any pipelined request the gateway was to serve would be there too
    other.write(completion('elsewhere'));
    await until(() => engine.prompts.includes('elsewhere'), "the other connection's request at the engine");
    assert.equal(pipelined().length, MAX_PIPELINED_REQUESTS, 'the requests past the depth reached no engine');

    engine.answerAll();
    await until(client.closed, 'the connection closed after the refusal');
    const received = client.received();
    const statuses = [...received.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));
    assert.deepEqual(statuses, [...Array<number>(MAX_PIPELINED_REQUESTS).fill(200), 503]);
    const refusal = received.slice(received.lastIndexOf('HTTP/1.1 503'));
    assert.match(refusal, /connection: close/i);
    assert.match(refusal, /"code":"pipelining_depth_exceeded"/);
    assert.equal(pipelined().length, MAX_PIPELINED_REQUESTS);
  } finally {
    socket.destroy();
    other.destroy();
    engine.finish();
    await gateway.close(0);
    await engine.close();
  }
});

test('requests pipelined behind a refusal, closed with the connection the gateway closes after it, count as refused, not as clients that left', async () => {
  const { engine, gateway, port } = await gatewayOnHoldingEngine();
  const client = await rawClient(port);
  try {
    // the depth served at once, one refused, and two more behind the refusal
    const n = MAX_PIPELINED_REQUESTS + 3;
    let all = '';
    for (let i = 0; i < n; i++) all += completion(`p${i}`);
    client.socket.write(all);
    await until(() => engine.prompts.length >= MAX_PIPELINED_REQUESTS, 'the pipelined requests served at once');
    engine.answerAll();
    await until(client.closed, 'the connection closed after the refusal');
    // the two behind the refusal never got the connection: the gateway closed it, the client did not leave
    const counts = await settled(
      () => completionCounts(() => gateway.metrics.metrics()),
      (c) => Object.values(c).reduce((a, b) => a + b, 0) >= n,
    );
    assert.deepEqual(counts, { 200: MAX_PIPELINED_REQUESTS, 503: 3 });
  } finally {
    client.socket.destroy();
    engine.finish();
    await gateway.close(0);
    await engine.close();
  }
});

test('responses queued behind another close, once each, when the client closes the connection', async () => {
  const pipelined = new PipelinedRequests();
  const responses: ServerResponse[] = [];
  const closes: number[] = [];
  const server = await listening(
    createServer((req, res) => {
      pipelined.closeWithConnection(req, res);
      const i = responses.push(res) - 1;
      closes[i] = 0;
      res.on('close', () => closes[i]++);
      req.resume();
    }),
  );
  const port = Number(new URL(server.url).port);
  let closed = false;
  try {
    const client = await rawClient(port);
    client.socket.write(completion('a') + completion('b') + completion('c'));
    await until(() => responses.length === 3, 'the three requests handed over');
    // the first has the connection; those behind it wait for it
    assert.equal(responses[0].socket !== null, true);
    assert.equal(responses[1].socket, null);
    client.socket.destroy();
    await until(() => closes.every((n) => n > 0), 'every response closed');
    // what the gateway writes to a response closed so is dropped, and closes nothing again
    const late = responses[2];
    assert.equal(late.destroyed, true);
    assert.equal(late.writableFinished, false, 'closed unanswered: a client that left');
    late.writeHead(200, { 'content-type': 'application/json' });
    late.end('{}');
    await server.close();
    closed = true;
    assert.deepEqual(closes, [1, 1, 1]);
  } finally {
    if (!closed) await server.close();
  }
});

const unreadable = () =>
  'POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 3\r\n\r\n{x}';

for (const pattern of ['bbb', 'bgg', 'bgb']) {
  test(`nothing pipelined behind an answer that closes the connection is served or answered (${pattern})`, async () => {
    // an unreadable body is answered 400 with Connection: close; Node still parses what follows
    // it, and handing a later request the connection being closed took the process down
    const { engine, gateway, port } = await gatewayOnHoldingEngine();
    const client = await rawClient(port);
    const other = (await rawClient(port)).socket;
    try {
      client.socket.write([...pattern].map((c, i) => (c === 'g' ? completion(`after${i}`) : unreadable())).join(''));
      await until(client.closed, 'the connection closed after the first answer');
      const statuses = [...client.received().matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));
      assert.deepEqual(statuses, [400]);
      assert.match(client.received(), /connection: close/i);
      // the gateway is up, and a request on another connection, sent after them, reaches the
      // engine: any request behind the 400 that the gateway was to forward would be there too
      other.write(completion('elsewhere'));
      await until(() => engine.prompts.includes('elsewhere'), "the other connection's request at the engine");
      assert.deepEqual(engine.prompts, ['elsewhere']);
    } finally {
      client.socket.destroy();
      other.destroy();
      engine.finish();
      await gateway.close(0);
      await engine.close();
    }
  });
}
