/**
 * Pipelined requests (several sent on one connection before the first is answered): their
 * answers go back in order, so the gateway serves them one after the other, not all at once
 * (one connection would otherwise start as many engine requests as it can pipeline, past the
 * cap on client connections, and hold every later answer until the first ends), and at most
 * MAX_QUEUED_PIPELINED_REQUESTS wait behind the one served: the next one is answered 503 and
 * the connection closed after it. Real sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import { connect } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { MAX_QUEUED_PIPELINED_REQUESTS } from '../../src/server/pipelining.js';
import { listening } from '../helpers/listening.js';
import { until } from '../helpers/wait.js';

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
  let answered = 0;
  return {
    ...server,
    prompts,
    /** Answers the oldest request not answered yet. */
    answerNext() {
      const res = held[answered++];
      const text = JSON.stringify({ choices: [{ text: 'ok' }] });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': text.length }).end(text);
    },
    finish() {
      for (const res of held) res.destroy();
    },
  };
}

const completion = (prompt: string) => {
  const body = JSON.stringify({ model: 'm', prompt });
  return `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
};

async function gatewayIn(front: string) {
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url: front }],
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return { gateway, port: (gateway.app.server.address() as { port: number }).port };
}

test('pipelined requests reach the engine one after the other, each once the answer before it has gone', async () => {
  const engine = await holdingEngine();
  const { gateway, port } = await gatewayIn(engine.url);
  const socket = connect(port, '127.0.0.1');
  let received = '';
  socket.on('data', (d: Buffer) => (received += d.toString('latin1')));
  socket.on('error', () => {});
  const other = connect(port, '127.0.0.1');
  other.on('error', () => {});
  const otherConnected = new Promise<void>((r) => other.once('connect', () => r()));
  try {
    await new Promise<void>((r) => socket.once('connect', () => r()));
    socket.write(completion('p1') + completion('p2') + completion('p3'));
    await until(() => engine.prompts.length >= 1, 'the first pipelined request at the engine');
    // a request on another connection, sent after the three were: it is not queued behind them
    await otherConnected;
    other.write(completion('elsewhere'));
    await until(() => engine.prompts.includes('elsewhere'), "the other connection's request at the engine");
    assert.deepEqual(
      engine.prompts.filter((p) => p !== 'elsewhere'),
      ['p1'],
      'only the first pipelined request is served while its answer is due',
    );
    const answers = () => (received.match(/HTTP\/1\.1 200/g) ?? []).length;
    for (let i = 1; i <= 3; i++) {
      const pipelined = () => engine.prompts.filter((p) => p !== 'elsewhere');
      await until(() => pipelined().length === i, `pipelined request ${i} at the engine`);
      assert.deepEqual(pipelined(), ['p1', 'p2', 'p3'].slice(0, i));
      engine.answerNext();
      // the other connection's request came second: answered in turn once the first has been
      if (i === 1) engine.answerNext();
      await until(() => answers() === i, `answer ${i}`);
    }
  } finally {
    socket.destroy();
    other.destroy();
    engine.finish();
    await gateway.close(0);
    await engine.close();
  }
});

test('past the pipelining depth a request is answered 503 in its turn and the connection closed after it', async () => {
  const engine = await holdingEngine();
  const { gateway, port } = await gatewayIn(engine.url);
  const socket = connect(port, '127.0.0.1');
  let received = '';
  let closed = false;
  socket.on('data', (d: Buffer) => (received += d.toString('latin1')));
  socket.on('error', () => {});
  socket.on('close', () => (closed = true));
  try {
    await new Promise<void>((r) => socket.once('connect', () => r()));
    // one served, MAX waiting behind it, one refused, and one more after the refusal
    const n = MAX_QUEUED_PIPELINED_REQUESTS + 3;
    let all = '';
    for (let i = 0; i < n; i++) all += completion(`p${i}`);
    socket.write(all);
    for (let i = 0; i < MAX_QUEUED_PIPELINED_REQUESTS + 1; i++) {
      await until(() => engine.prompts.length === i + 1, `pipelined request ${i} at the engine`);
      engine.answerNext();
    }
    await until(() => closed, 'the connection closed after the refusal');
    const statuses = [...received.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));
    assert.deepEqual(statuses, [...Array<number>(MAX_QUEUED_PIPELINED_REQUESTS + 1).fill(200), 503]);
    assert.match(received.slice(received.lastIndexOf('HTTP/1.1 503')), /connection: close/i);
    assert.match(received, /"code":"pipelining_depth_exceeded"/);
    assert.equal(engine.prompts.length, MAX_QUEUED_PIPELINED_REQUESTS + 1, 'the refused requests reached no engine');
  } finally {
    socket.destroy();
    engine.finish();
    await gateway.close(0);
    await engine.close();
  }
});
