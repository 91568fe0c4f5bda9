/**
 * Methods the gateway does not serve: on a path it serves with other methods the answer is 405
 * with an Allow header naming them and an OpenAI error body; CONNECT (which Node hands over
 * outside the routes) gets the same kind of answer instead of a socket dropped unanswered; an
 * unknown path stays a 404 whatever the method.
 */
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { connect } from 'node:net';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';

let gateway: Gateway;
let port = 0;

before(async () => {
  gateway = await createGateway({ router: new KVAwareRouter(), metricsIntervalMs: 0, healthCheckIntervalMs: 0 });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  port = Number(new URL(base).port);
});
after(async () => {
  await gateway.close(0);
});

interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** The gateway closed the connection after the answer. */
  closed: boolean;
}

/** Writes `raw` (in `encoding`) on a new connection; resolves with the answer once the gateway closes it (or fails after 5 s). */
function exchange(raw: string, encoding: BufferEncoding = 'utf8'): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let text = '';
    const deadline = setTimeout(() => {
      socket.destroy();
      reject(
        new Error(
          `no answer closed within 5 s to ${JSON.stringify(raw.split('\r\n')[0])}; got ${JSON.stringify(text)}`,
        ),
      );
    }, 5000);
    socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
    socket.on('close', () => {
      clearTimeout(deadline);
      const end = text.indexOf('\r\n\r\n');
      const [statusLine, ...lines] = text.slice(0, Math.max(end, 0)).split('\r\n');
      resolve({
        status: Number(/^HTTP\/1\.1 (\d{3})/.exec(statusLine)?.[1] ?? 0),
        headers: Object.fromEntries(
          lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]),
        ),
        body: end === -1 ? '' : text.slice(end + 4),
        closed: true,
      });
    });
    socket.on('error', () => {});
    socket.write(raw, encoding);
  });
}

/** One request with any method (fetch refuses TRACE and CONNECT): its status, headers and body. */
function send(
  method: string,
  path: string,
): Promise<{ status: number; headers: Record<string, unknown>; text: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method, path }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }));
    });
    req.on('error', reject);
    req.end();
  });
}

const errorOf = (body: string) =>
  (JSON.parse(body) as { error: { message: string; type: string; param: string | null; code: string | null } }).error;

test('a served path with a method it is not served with: 405, an Allow header naming its methods, an OpenAI error', async () => {
  const cases: Array<[string, string, string]> = [
    ['TRACE', '/v1/completions', 'POST'],
    ['PUT', '/v1/chat/completions', 'POST'],
    ['DELETE', '/v1/completions', 'POST'],
    ['OPTIONS', '/v1/completions?x=1', 'POST'],
    ['GET', '/v1/completions', 'POST'],
    ['PATCH', '/v1/models', 'GET, HEAD'],
    ['POST', '/healthz', 'GET, HEAD'],
    ['TRACE', '/metrics', 'GET, HEAD'],
    ['GET', '/admin/workers/w1', 'DELETE'],
    ['GET', '/admin/workers/w1/drain', 'POST'],
    ['DELETE', '/admin/workers', 'GET, HEAD, POST'],
  ];
  for (const [method, path, allow] of cases) {
    const { status, headers, text } = await send(method, path);
    assert.equal(status, 405, `${method} ${path}: ${text}`);
    assert.equal(headers.allow, allow, `${method} ${path}`);
    assert.match(String(headers['content-type']), /^application\/json/);
    assert.deepEqual(errorOf(text), {
      message: `method ${method} is not allowed on ${path} (allowed: ${allow})`,
      type: 'invalid_request_error',
      param: 'method',
      code: null,
    });
  }
  // a TRACE goes through the same answer on a raw connection: no echo of the request
  const trace = await exchange('TRACE /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Secret: s\r\n\r\n');
  assert.equal(trace.status, 405);
  assert.equal(trace.headers.allow, 'POST');
  assert.doesNotMatch(trace.body, /X-Secret/i);
});

test('an unknown path is still a 404 whatever the method', async () => {
  for (const method of ['TRACE', 'PUT', 'GET', 'POST']) {
    const { status, headers, text } = await send(method, '/v1/nothing');
    assert.equal(status, 404, `${method}: ${text}`);
    assert.equal(headers.allow, undefined);
    assert.equal(errorOf(text).message, `no route ${method} /v1/nothing`);
  }
});

test('a long unknown path (or query) is not echoed whole: the 404 repeats its first 64 characters', async () => {
  for (const path of [`/${'a'.repeat(15_000)}`, `/v1/nothing?${'q'.repeat(15_000)}`]) {
    const { status, text } = await send('GET', path);
    assert.equal(status, 404);
    const { message, param } = errorOf(text);
    assert.equal(message, `no route GET ${path.slice(0, 64)}…`);
    assert.equal(param, null);
  }
});

test('bytes a terminal acts on in a header value are repeated escaped, not raw', async () => {
  // Node takes bytes 0x80-0xFF in a header value (obs-text) and reads them as Latin-1: C1 controls,
  // which JSON leaves raw (U+009B opens a terminal sequence, U+0085 ends a line for some readers)
  const expect = await exchange(
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-\x9b31mgo\x85x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}',
    'latin1',
  );
  assert.equal(expect.status, 417, JSON.stringify(expect));
  assert.equal(errorOf(expect.body).message, "the expectation '100-\\x9b31mgo\\x85x' is not supported");
});

test('CONNECT gets 405 with an OpenAI error body and the connection closed, not a socket dropped unanswered', async () => {
  const tunnel = await exchange('CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n');
  assert.equal(tunnel.status, 405, JSON.stringify(tunnel));
  // a host:port is no resource of the gateway's: it allows no method there
  assert.equal(tunnel.headers.allow, '');
  assert.equal(tunnel.headers.connection, 'close');
  assert.match(tunnel.headers['content-type'], /^application\/json/);
  assert.equal(Number(tunnel.headers['content-length']), Buffer.byteLength(tunnel.body));
  assert.deepEqual(errorOf(tunnel.body), {
    message:
      "method CONNECT is not supported: the gateway serves its own paths, it is not a proxy (target 'example.com:443')",
    type: 'invalid_request_error',
    param: 'method',
    code: null,
  });
  // to one of its own paths, the Allow header names that path's methods
  const own = await exchange('CONNECT /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n');
  assert.equal(own.status, 405, JSON.stringify(own));
  assert.equal(own.headers.allow, 'POST');
  assert.equal(errorOf(own.body).param, 'method');
  // the gateway goes on serving
  assert.equal((await fetch(`http://127.0.0.1:${port}/healthz`)).status, 200);
});
