/**
 * Every answer the gateway writes itself — its refusals (400, 401, 404, 503, …), on the fast
 * path and on Fastify's route, and those written before any route runs — carries the client's
 * x-request-id back when the client sent a valid one (at most MAX_PASSED_HEADER_BYTES, on one
 * line); one it refuses is not echoed. An engine's answer carries the engine's x-request-id only.
 */
import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { ApiKeys } from '../../src/server/api-keys.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { MAX_PASSED_HEADER_BYTES } from '../../src/server/passed-headers.js';
import { fakeEngine } from '../faults/harness.js';
import { rawClient } from '../helpers/raw-client.js';
import { until } from '../helpers/wait.js';

const KEY = 'sk-own-answers-request-id-0000';
const ID = 'client-request-7f3a';

/** The fast path (no API keys) and Fastify's route (API keys take every request there). */
const ROUTES = {
  'fast path': {} as Partial<GatewayOptions>,
  'Fastify route': { apiKeys: new ApiKeys({ [KEY]: 'team' }) } as Partial<GatewayOptions>,
};

async function withGateway(
  options: Partial<GatewayOptions>,
  run: (base: string, gateway: Gateway) => Promise<void>,
): Promise<void> {
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    ...options,
  });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    await run(base, gateway);
  } finally {
    await gateway.close(0);
  }
}

function post(base: string, body: string, headers: Record<string, string>) {
  return fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, ...headers },
    body,
  });
}

const COMPLETION = JSON.stringify({ prompt: 'hello there', max_tokens: 2 });

for (const [route, options] of Object.entries(ROUTES))
  test(`the gateway's own 400, 404 and 503 carry the client's x-request-id (${route})`, async () => {
    await withGateway(options, async (base) => {
      const malformed = await post(base, '{"prompt": ', { 'x-request-id': ID });
      assert.equal(malformed.status, 400, await malformed.text());
      assert.equal(malformed.headers.get('x-request-id'), ID, 'a malformed body');

      const invalid = await post(base, JSON.stringify({ prompt: 'x', model: 'm'.repeat(8192) }), {
        'x-request-id': ID,
      });
      assert.equal(invalid.status, 400, await invalid.text());
      assert.equal(invalid.headers.get('x-request-id'), ID, 'a body the validation refuses');

      const unknown = await fetch(`${base}/v1/nowhere`, { headers: { 'x-request-id': ID } });
      assert.equal(unknown.status, 404, await unknown.text());
      assert.equal(unknown.headers.get('x-request-id'), ID, 'an unknown route');

      const noEngine = await post(base, COMPLETION, { 'x-request-id': ID });
      assert.equal(noEngine.status, 503, await noEngine.text());
      assert.equal(noEngine.headers.get('x-request-id'), ID, 'no engine');

      const plain = await post(base, COMPLETION, {});
      await plain.text();
      assert.equal(plain.headers.get('x-request-id'), null, 'none sent, none answered');
    });
  });

test("a 401 for a missing API key carries the client's x-request-id", async () => {
  await withGateway(ROUTES['Fastify route'], async (base) => {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': ID },
      body: COMPLETION,
    });
    assert.equal(res.status, 401, await res.text());
    assert.equal(res.headers.get('x-request-id'), ID);
  });
});

test('an x-request-id refused (too long, or given twice) is not echoed', async () => {
  await withGateway({}, async (base, gateway) => {
    const long = await post(base, COMPLETION, { 'x-request-id': 'a'.repeat(MAX_PASSED_HEADER_BYTES + 1) });
    assert.equal(long.status, 400, await long.text());
    assert.equal(long.headers.get('x-request-id'), null);

    const port = (gateway.app.server.address() as AddressInfo).port;
    const client = await rawClient(port);
    client.socket.write(
      `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n` +
        `content-length: ${COMPLETION.length}\r\nconnection: close\r\nx-request-id: one, two\r\nx-request-id: three\r\n\r\n${COMPLETION}`,
    );
    await until(() => client.closed(), 'the answer to a repeated x-request-id');
    assert.match(client.received(), /^HTTP\/1\.1 400 /);
    assert.doesNotMatch(client.received(), /x-request-id:/i);
  });
});

test("answers written before any route runs carry the client's x-request-id", async () => {
  await withGateway({}, async (_base, gateway) => {
    const port = (gateway.app.server.address() as AddressInfo).port;
    const send = async (request: string) => {
      const client = await rawClient(port);
      client.socket.write(request);
      await until(() => client.closed(), 'the refusal');
      return client.received();
    };
    // a transfer coding the gateway does not take (answerMalformed)
    const coded = await send(
      `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: gzip, chunked\r\n` +
        `x-request-id: ${ID}\r\n\r\n0\r\n\r\n`,
    );
    assert.match(coded, /^HTTP\/1\.1 400 /);
    assert.match(coded, new RegExp(`\r\nx-request-id: ${ID}\r\n`, 'i'));
    // an expectation the gateway does not meet (checkExpectation)
    const expect = await send(
      `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nexpect: teapot\r\ncontent-length: 0\r\n` +
        `x-request-id: ${ID}\r\n\r\n`,
    );
    assert.match(expect, /^HTTP\/1\.1 417 /);
    assert.match(expect, new RegExp(`\r\nx-request-id: ${ID}\r\n`, 'i'));
    // CONNECT, answered on the raw socket
    const connect = await send(
      `CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\nx-request-id: ${ID}\r\n\r\n`,
    );
    assert.match(connect, /^HTTP\/1\.1 405 /);
    assert.match(connect, new RegExp(`\r\nx-request-id: ${ID}\r\n`, 'i'));
    // a body whose chunked framing is broken (the HTTP layer's refusal of a request it has read the headers of)
    const framing = await send(
      `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n` +
        `transfer-encoding: chunked\r\nx-request-id: ${ID}\r\n\r\nzz\r\n`,
    );
    assert.match(framing, /^HTTP\/1\.1 400 /);
    assert.match(framing, new RegExp(`\r\nx-request-id: ${ID}\r\n`, 'i'));
  });
});

test("an engine's answer carries the engine's x-request-id, not the client's", async () => {
  const engine = await fakeEngine((req, res) => {
    req.resume();
    req.on('end', () => {
      const answer = '{"choices":[{"text":"ok"}]}';
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': answer.length }).end(answer);
    });
  });
  try {
    await withGateway({ workers: [{ id: 'e', url: engine.url }] }, async (base) => {
      for (const query of ['', '?via=fastify']) {
        const res = await fetch(`${base}/v1/completions${query}`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-request-id': ID },
          body: COMPLETION,
        });
        assert.equal(res.status, 200, await res.text());
        assert.equal(res.headers.get('x-request-id'), null, query || 'fast path');
      }
    });
  } finally {
    await engine.close();
  }
});

/** Ids of bytes over 0x7f (obs-text): UTF-8 é, and a byte that is no UTF-8. Node reads them one character a byte. */
const BYTE_IDS = [Buffer.from([0x61, 0xc3, 0xa9]), Buffer.from([0x61, 0xff, 0x20, 0x09, 0x7e])];

/** Writes `head` with an `x-request-id: <id>` line and `body` as raw bytes; resolves once the connection closed, with what came back. */
async function sendWithId(port: number, head: string, id: Buffer, body = ''): Promise<string> {
  const client = await rawClient(port);
  try {
    client.socket.write(Buffer.concat([Buffer.from(`${head}x-request-id: `), id, Buffer.from(`\r\n\r\n${body}`)]));
    await until(() => client.closed(), `the answer to ${head.split('\r\n')[0]}`);
    return client.received();
  } finally {
    client.socket.destroy();
  }
}

/** The echoed x-request-id's bytes (received as latin1: one character a byte), and the answer's body, whole. */
function echoedBytes(answer: string, what: string): Buffer | undefined {
  const end = answer.indexOf('\r\n\r\n');
  assert.ok(end > 0, `${what}: a whole head`);
  const head = answer.slice(0, end);
  const body = Buffer.from(answer.slice(end + 4), 'latin1');
  const length = /\r\ncontent-length: (\d+)/i.exec(head)?.[1];
  if (length !== undefined) {
    assert.equal(body.length, Number(length), `${what}: a body of its declared length`);
    if (/\r\ncontent-type: application\/json/i.test(head)) JSON.parse(body.toString('utf8'));
  }
  const id = /\r\nx-request-id: ([^\r]*)\r\n/i.exec(head)?.[1];
  return id === undefined ? undefined : Buffer.from(id, 'latin1');
}

for (const [route, options] of Object.entries(ROUTES))
  test(`an x-request-id of bytes over 0x7f comes back byte for byte on the gateway's own answers (${route})`, async () => {
    await withGateway(options, async (_base, gateway) => {
      const port = (gateway.app.server.address() as AddressInfo).port;
      const auth = `authorization: Bearer ${KEY}\r\n`;
      const post = (length: number) =>
        `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n${auth}content-type: application/json\r\ncontent-length: ${length}\r\nconnection: close\r\n`;
      const cases: [string, RegExp, string, string?][] = [
        ['GET /healthz', /^HTTP\/1\.1 200 /, `GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n`],
        [
          'another method (405)',
          /^HTTP\/1\.1 405 /,
          `GET /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n${auth}connection: close\r\n`,
        ],
        [
          'an unknown route (404)',
          /^HTTP\/1\.1 404 /,
          `GET /nope HTTP/1.1\r\nhost: 127.0.0.1\r\n${auth}connection: close\r\n`,
        ],
        ['a malformed body (400)', /^HTTP\/1\.1 400 /, post(3), '{"p'],
        ['no engine (503)', /^HTTP\/1\.1 503 /, post(COMPLETION.length), COMPLETION],
        [
          'a transfer coding not taken (answerMalformed)',
          /^HTTP\/1\.1 400 /,
          `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: gzip, chunked\r\nconnection: close\r\n`,
          '0\r\n\r\n',
        ],
        [
          'an expectation not met (417)',
          /^HTTP\/1\.1 417 /,
          `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nexpect: teapot\r\ncontent-length: 0\r\nconnection: close\r\n`,
        ],
        [
          'CONNECT (405 on the raw socket)',
          /^HTTP\/1\.1 405 /,
          `CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\nconnection: close\r\n`,
        ],
        [
          'broken chunked framing (400 on the raw socket)',
          /^HTTP\/1\.1 400 /,
          `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n${auth}content-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n`,
          'zz\r\n',
        ],
      ];
      // each id on a connection of its own, at once: a refusal on the raw socket closes its connection slowly (lingeringClose)
      for (const [what, status, head, body] of cases)
        await Promise.all(
          BYTE_IDS.map(async (id) => {
            const answer = await sendWithId(port, head, id, body);
            assert.match(answer, status, what);
            assert.deepEqual(echoedBytes(answer, what), id, `${what}: ${id.toString('hex')}`);
          }),
        );
    });
  });

test("an engine's x-request-id of bytes over 0x7f reaches the client byte for byte", async () => {
  const engine = await fakeEngine((req, res) => {
    req.resume();
    req.on('end', () => {
      // the engine echoes the client's id as it came (Node reads and writes it one character a byte)
      const id = req.headers['x-request-id'] ?? '';
      const streamed = req.url?.includes('stream') === true;
      const answer = streamed
        ? 'data: {"choices":[{"text":"ok","index":0}]}\n\ndata: [DONE]\n\n'
        : '{"choices":[{"text":"ok"}]}';
      res.writeHead(200, {
        'content-type': streamed ? 'text/event-stream' : 'application/json',
        'x-request-id': id,
      });
      res.end(Buffer.from(answer));
    });
  });
  try {
    await withGateway({ workers: [{ id: 'e', url: engine.url }] }, async (_base, gateway) => {
      const port = (gateway.app.server.address() as AddressInfo).port;
      for (const id of BYTE_IDS)
        for (const stream of [false, true])
          for (const query of ['', '?via=fastify']) {
            const body = JSON.stringify({ prompt: 'hello there', max_tokens: 2, stream });
            const answer = await sendWithId(
              port,
              `POST /v1/completions${query} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n` +
                `content-length: ${body.length}\r\nconnection: close\r\n`,
              id,
              body,
            );
            const what = `${stream ? 'streamed' : 'whole'} ${query || 'fast path'}`;
            assert.match(answer, /^HTTP\/1\.1 200 /, what);
            assert.deepEqual(echoedBytes(answer, what), id, `${what}: ${id.toString('hex')}`);
          }
    });
  } finally {
    await engine.close();
  }
});
