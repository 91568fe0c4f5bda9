/**
 * Bytes that do not parse, arriving on a connection behind a request received whole: a request
 * pipelined after it that is not HTTP, bytes after a request that asked to close the
 * connection, headers that do not arrive in time. They are the next request's fault, not the
 * one in flight's: its answer (a stream too) is written whole first, then the refusal, and then
 * the connection closes. Nothing after a `Connection: close` request is read at all (RFC 9112
 * §9.6), so nothing answers it. Real sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { listening } from '../helpers/listening.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

/** Completions the engine holds until `answerAll`; a streamed one gets its first event at once. */
const held: Array<{ res: ServerResponse; stream: boolean }> = [];
const prompts: string[] = [];
/** Engine requests whose connection closed before their answer was complete (the gateway aborted them). */
let aborted = 0;
let engine: { url: string; close: () => Promise<void> };
let gateway: Gateway;
let port = 0;
/** Parse errors the gateway's server met on client connections. */
let clientErrors = 0;

before(async () => {
  engine = await listening(
    createServer((req, res) => {
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      let body = '';
      req.on('data', (d: Buffer) => (body += d.toString()));
      req.on('end', () => {
        const { prompt, stream } = JSON.parse(body) as { prompt: string; stream?: boolean };
        prompts.push(prompt);
        res.once('close', () => {
          if (!res.writableFinished) aborted++;
        });
        if (stream) {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write('data: {"choices":[{"text":"first"}]}\n\n');
        }
        held.push({ res, stream: stream === true });
      });
    }),
  );
  gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url: engine.url }],
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  port = (gateway.app.server.address() as { port: number }).port;
  gateway.app.server.on('clientError', () => clientErrors++);
});
after(async () => {
  for (const { res } of held.splice(0)) res.destroy();
  await gateway.close(0);
  await engine.close();
});

/** Answers every completion the engine holds: a whole JSON answer, or a stream's last event and [DONE]. */
function answerAll(): void {
  for (const { res, stream } of held.splice(0)) {
    if (stream) return void res.end('data: {"choices":[{"text":"last"}]}\n\ndata: [DONE]\n\n');
    const text = JSON.stringify({ choices: [{ text: 'whole answer' }] });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': text.length }).end(text);
  }
}

const completion = (prompt: string, extra: { stream?: boolean; headers?: string } = {}) => {
  const body = JSON.stringify({ model: 'm', prompt, ...(extra.stream ? { stream: true } : {}) });
  return `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n${extra.headers ?? ''}content-length: ${body.length}\r\n\r\n${body}`;
};

const statusesOf = (received: string) => [...received.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));

test('a request that does not parse, pipelined behind one in flight, is refused after its answer, not instead of it', async () => {
  const client = await rawClient(port);
  const errorsBefore = clientErrors;
  const abortedBefore = aborted;
  try {
    client.socket.write(completion('in flight') + 'GARBAGE\r\n\r\n');
    await until(() => prompts.includes('in flight'), 'the request at the engine');
    await until(() => clientErrors > errorsBefore, 'the parse error behind it');
    answerAll();
    await until(client.closed, 'the connection closed after the refusal');
    const received = client.received();
    assert.deepEqual(statusesOf(received), [200, 400], received);
    assert.match(received, /"text":"whole answer"/);
    const refusal = received.slice(received.indexOf('HTTP/1.1 400'));
    assert.match(refusal, /connection: close/i);
    assert.match(refusal, /"type":"invalid_request_error"/);
    assert.equal(aborted, abortedBefore, 'the engine request was not aborted');
  } finally {
    client.socket.destroy();
  }
});

test('a stream in flight runs to its end when what follows its request does not parse', async () => {
  const client = await rawClient(port);
  const errorsBefore = clientErrors;
  const abortedBefore = aborted;
  try {
    client.socket.write(completion('streaming', { stream: true }));
    await until(() => client.received().includes('"text":"first"'), "the stream's first event at the client");
    client.socket.write('NOT HTTP\r\n\r\n');
    await until(() => clientErrors > errorsBefore, 'the parse error behind it');
    answerAll();
    await until(client.closed, 'the connection closed after the refusal');
    const received = client.received();
    assert.deepEqual(statusesOf(received), [200, 400], received);
    const stream = received.slice(0, received.indexOf('HTTP/1.1 400'));
    assert.match(stream, /"text":"last"/);
    assert.match(stream, /data: \[DONE\]/);
    // the chunked stream ended properly before the refusal began
    assert.match(stream, /\r\n0\r\n\r\n$/);
    assert.equal(aborted, abortedBefore, 'the engine request was not aborted');
  } finally {
    client.socket.destroy();
  }
});

test('bytes after a request that asked to close the connection are not read: its answer is written whole, nothing more', async () => {
  const client = await rawClient(port);
  const errorsBefore = clientErrors;
  const abortedBefore = aborted;
  try {
    client.socket.write(completion('closing', { headers: 'connection: close\r\n' }) + 'x');
    await until(() => prompts.includes('closing'), 'the request at the engine');
    await until(() => clientErrors > errorsBefore, 'the bytes after it seen');
    answerAll();
    await until(client.closed, 'the connection closed after the answer');
    const received = client.received();
    assert.deepEqual(statusesOf(received), [200], received);
    assert.ok(received.endsWith('{"choices":[{"text":"whole answer"}]}'), received);
    assert.equal(aborted, abortedBefore, 'the engine request was not aborted');
  } finally {
    client.socket.destroy();
  }
});
