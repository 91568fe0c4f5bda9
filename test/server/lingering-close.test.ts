/**
 * A request refused on its headers, before its body is read (the body budget full, a body over
 * the limit, too many header lines), is answered and its connection closed. Clients send the
 * body right after the headers (fetch, undici, the openai SDK do): a connection closed with
 * their bytes unread is reset, and a client that meets the reset while still writing (undici
 * does) reports a connection error instead of the answer it was sent, so no 503 with
 * Retry-After, no 413. The gateway keeps reading, and dropping, what the client still sends
 * after such an answer (RFC 9112 §9.6), until the client closes its side or a short while has
 * passed. Real sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';
import { rawClient, type RawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

const BODY_LIMIT = 8 * 1024 * 1024;
let setup: GatewayOnEngine;

before(async () => {
  setup = await gatewayOnEngine({ bodyLimit: BODY_LIMIT, bufferedBodyLimit: BODY_LIMIT });
});
after(() => setup.close());

const head = (length: number, headers = '') =>
  `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${headers}Content-Length: ${length}\r\n\r\n`;

/** Writes `bytes` and resolves with the write's error, or null once the gateway has taken them all. */
function written(client: RawClient, bytes: Buffer): Promise<Error | null> {
  return new Promise((resolve) => {
    client.socket.once('error', resolve);
    client.socket.write(bytes, (err) => resolve(err ?? null));
  });
}

/**
 * Sends `headers`, waits for the answer `status` to them, then sends 4 MiB of the body it
 * declared: the gateway must take them (read and drop them), not reset the connection.
 */
async function refusedThenBody(headers: string, status: number): Promise<string> {
  const client = await rawClient(setup.port);
  try {
    client.socket.write(headers);
    await until(() => /^HTTP\/1\.1 \d{3} /.test(client.received()), 'the answer to the headers');
    assert.match(client.received(), new RegExp(`^HTTP/1\\.1 ${status} `), client.received().slice(0, 200));
    const error = await written(client, Buffer.alloc(4 * 1024 * 1024, 'x'));
    assert.equal(error, null, `the body after the answer was taken, not reset (${String(error)})`);
    // the client closes its side: the gateway closes at once
    client.socket.end();
    await until(client.closed, 'the connection closed');
    return client.received();
  } finally {
    client.socket.destroy();
  }
}

test('after a 503 for the full body budget, what the client still sends is read, not reset', async () => {
  const holder = await rawClient(setup.port);
  try {
    holder.socket.write(`${head(BODY_LIMIT)}{`);
    await until(() => setup.gateway.bodyBudget.used === BODY_LIMIT, 'the budget held');
    const received = await refusedThenBody(head(6 * 1024 * 1024), 503);
    assert.match(received, /"code":"body_budget_exceeded"/);
  } finally {
    holder.socket.destroy();
  }
});

test('after a 413 for a body over the limit, what the client still sends is read, not reset', async () => {
  await refusedThenBody(head(BODY_LIMIT + 1), 413);
});

test('a body over the limit sent whole with its headers is read and dropped after the 413, not reset', async () => {
  // sent at once, as a client with the body in memory sends it: the body reaches the gateway
  // before its answer, fills the request stream and stops Node's reading of the connection
  const client = await rawClient(setup.port);
  try {
    const body = Buffer.alloc(2 * BODY_LIMIT, 'x');
    const error = await written(client, Buffer.concat([Buffer.from(head(body.length)), body]));
    assert.equal(error, null, `the body was taken, not reset (${String(error)})`);
    await until(() => /^HTTP\/1\.1 413 /.test(client.received()), 'the 413');
    client.socket.end();
    await until(client.closed, 'the connection closed');
  } finally {
    client.socket.destroy();
  }
});

test('after a 431 for too many header lines, what the client still sends is read, not reset', async () => {
  const filler = Array.from({ length: 1500 }, (_, i) => `f${i}:1\r\n`).join('');
  await refusedThenBody(head(6 * 1024 * 1024, filler), 431);
});

test('after a 400 for a chunk extension past the parser bound, what the client still sends is read, not reset', async () => {
  const chunked = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`;
  const received = await refusedThenBody(`${chunked}10;${'e'.repeat(100_000)}\r\n`, 400);
  assert.match(received, /not valid HTTP\/1\.1/);
});

test('a client that does not close its side after the answer is closed a short while later', async () => {
  const client = await rawClient(setup.port);
  try {
    client.socket.write(head(BODY_LIMIT + 1));
    await until(() => /^HTTP\/1\.1 413 /.test(client.received()), 'the 413');
    // the client never closes its side: the gateway does, within its deadline
    await until(client.closed, 'the gateway closing the connection', { timeoutMs: 10_000 });
  } finally {
    client.socket.destroy();
  }
});
