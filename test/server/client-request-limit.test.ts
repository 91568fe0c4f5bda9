/**
 * The cap on requests one client holds in flight (--max-requests-per-client): past it a request
 * is answered 429 with an OpenAI error body and Retry-After, before its body is read, and counted;
 * other clients (another address, another API key) go on; a slot is given back once, however its
 * request ends (answered, its client gone, its engine failing before or during the answer, queued
 * behind another on a connection that closes), and the table holds no client without a request in
 * flight. Real sockets against a real gateway (a second client address is 127.0.0.2, on the
 * loopback); every wait has a deadline.
 */
import assert from 'node:assert/strict';
import {
  request,
  type ClientRequest,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { ApiKeys } from '../../src/server/api-keys.js';
import { clientAddressKey, ClientRequests, MAX_REQUESTS_PER_CLIENT } from '../../src/server/client-requests.js';
import { createGateway, type Gateway, type GatewayOptions } from '../../src/server/gateway.js';
import { fakeEngine, type FakeEngine } from '../faults/harness.js';
import { rawClient } from '../helpers/raw-client.js';
import { resolveServe } from '../helpers/serve-config.js';
import { until } from '../helpers/wait.js';

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

interface Sent {
  req: ClientRequest;
  /** The whole answer, or the error that ended the request. */
  done: Promise<Answer | Error>;
  /** The answer once it has come, else undefined. */
  answer: () => Answer | Error | undefined;
}

/** POSTs a completion of `prompt` on a connection of its own, from `localAddress`, with an API key when given. */
function post(
  port: number,
  prompt: string,
  o: { from?: string; key?: string; stream?: boolean; path?: string } = {},
): Sent {
  const body = JSON.stringify({ model: 'm', prompt, ...(o.stream ? { stream: true } : {}) });
  let answer: Answer | Error | undefined;
  const req = request({
    host: '127.0.0.1',
    port,
    method: 'POST',
    path: o.path ?? '/v1/completions',
    agent: false,
    localAddress: o.from ?? '127.0.0.1',
    headers: {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
      ...(o.key === undefined ? {} : { authorization: `Bearer ${o.key}` }),
    },
  });
  const done = new Promise<Answer | Error>((resolve) => {
    req.on('error', (err) => resolve((answer ??= err)));
    req.on('response', (res: IncomingMessage) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => resolve((answer ??= { status: res.statusCode!, headers: res.headers, body: text })));
      res.on('error', (err) => resolve((answer ??= err)));
    });
  });
  req.end(body);
  return { req, done, answer: () => answer };
}

/** The answer of `sent`, which must be an HTTP answer (not a connection error). */
async function answered(sent: Sent): Promise<Answer> {
  const a = await sent.done;
  if (a instanceof Error) throw a;
  return a;
}

/** An engine that answers completions at once, but holds those whose prompt starts with `hold` until the test says. */
interface HoldingEngine {
  engine: FakeEngine;
  held: Array<{ req: IncomingMessage; res: ServerResponse }>;
  /** Completions (POSTs) that reached the engine. */
  completions: () => number;
}

async function holdingEngine(): Promise<HoldingEngine> {
  const held: HoldingEngine['held'] = [];
  let completions = 0;
  const engine = await fakeEngine((req, res) => {
    if (req.method !== 'POST') {
      const models = '{"object":"list","data":[{"id":"m","object":"model"}]}';
      return void res.writeHead(200, { 'content-type': 'application/json' }).end(models);
    }
    completions++;
    let text = '';
    req.setEncoding('utf8');
    req.on('data', (d: string) => (text += d));
    req.on('end', () => {
      const body = JSON.parse(text) as { prompt: string; stream?: boolean };
      if (body.stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {"choices":[{"text":"a"}]}\n\n');
      }
      if (body.prompt.startsWith('hold')) return void held.push({ req, res });
      if (body.stream) return void res.end('data: [DONE]\n\n');
      const answer = '{"choices":[{"text":"ok"}]}';
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': answer.length }).end(answer);
    });
  });
  return { engine, held, completions: () => completions };
}

/** Ends a held non-streamed completion with a whole answer. */
function finish({ res }: { res: ServerResponse }): void {
  const answer = '{"choices":[{"text":"done"}]}';
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': answer.length }).end(answer);
}

async function start(
  options: Omit<Partial<GatewayOptions>, 'router' | 'workers'>,
): Promise<HoldingEngine & { gateway: Gateway; port: number; close: () => Promise<void> }> {
  const e = await holdingEngine();
  const gateway = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'e0', url: e.engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    ...options,
  });
  await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return {
    ...e,
    gateway,
    port: (gateway.app.server.address() as { port: number }).port,
    close: async () => {
      await gateway.close(0);
      await e.engine.close();
    },
  };
}

/** A sample of the gateway's /metrics page (`name` with its labels as written, `{…}`, or none). */
async function metric(gateway: Gateway, name: string): Promise<number | undefined> {
  const page = (await gateway.app.inject({ method: 'GET', url: '/metrics' })).body;
  const line = page.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.slice(name.length + 1));
}

const inFlight = (g: Gateway) => metric(g, 'contextforge_client_requests_in_flight');
const clients = (g: Gateway) => metric(g, 'contextforge_clients_in_flight');

/** Waits until the gateway counts `n` requests in flight against the limit. */
async function untilInFlight(g: Gateway, n: number, what: string): Promise<void> {
  await until(async () => (await inFlight(g)) === n, `${what} (${n} requests counted in flight)`);
}

/** Asserts `a` is the 429 of a client over the limit of `limit`. */
function assertRefused(a: Answer, limit: number): void {
  assert.equal(a.status, 429, a.body);
  assert.equal(a.headers['retry-after'], '1');
  assert.match(String(a.headers['content-type']), /^application\/json/);
  const { error } = JSON.parse(a.body) as { error: { message: string; type: string; code: string; param: unknown } };
  assert.equal(error.type, 'rate_limit_error');
  assert.equal(error.code, 'client_request_limit_exceeded');
  assert.equal(error.param, null);
  assert.match(error.message, new RegExp(`--max-requests-per-client ${limit}\\b`));
}

test(
  'past --max-requests-per-client an address gets 429 with Retry-After, another address is served, and the slots come back as requests end',
  { timeout: 60_000 },
  async () => {
    const g = await start({ maxRequestsPerClient: 2 });
    try {
      const a = post(g.port, 'hold 1');
      const b = post(g.port, 'hold 2');
      await until(() => g.held.length === 2, 'both requests held by the engine');

      // the third of the same address: refused at once, its body unread, nothing sent to the engine
      const refused = await answered(post(g.port, 'hold 3'));
      assertRefused(refused, 2);
      assert.equal(refused.headers.connection, 'close');
      assert.equal(g.completions(), 2);

      // the same route written another way (Fastify matches the percent-decoded path) is the same route
      for (const path of ['/v1/%63ompletions', '/v1/completions#x', '/v1/c%6Fmpletions?x=1']) {
        const encoded = await answered(post(g.port, 'hold 4', { path }));
        assertRefused(encoded, 2);
      }
      assert.equal(g.completions(), 2, 'none of them reached the engine');

      // another address is another client
      const other = await answered(post(g.port, 'quick', { from: '127.0.0.2' }));
      assert.equal(other.status, 200, other.body);

      // health, metrics and the model list are not counted
      for (const path of ['/healthz', '/readyz', '/health', '/metrics', '/v1/models']) {
        const res = await fetch(`http://127.0.0.1:${g.port}${path}`);
        await res.arrayBuffer();
        assert.notEqual(res.status, 429, path);
      }

      assert.equal(await metric(g.gateway, 'contextforge_client_request_limit_refusals_total{client="address"}'), 4);
      assert.equal(await metric(g.gateway, 'contextforge_client_request_limit_refusals_total{client="api_key"}'), 0);
      assert.equal(
        await metric(g.gateway, 'contextforge_requests_total{path="/v1/completions",status="429"}'),
        4,
        'the refusal is counted with its status',
      );
      assert.equal(await inFlight(g.gateway), 2);
      assert.equal(await clients(g.gateway), 1);

      // once the held requests end, the client sends again
      for (const h of g.held.splice(0)) finish(h);
      assert.equal((await answered(a)).status, 200);
      assert.equal((await answered(b)).status, 200);
      await untilInFlight(g.gateway, 0, 'the answered requests released');
      const again = await Promise.all([post(g.port, 'quick'), post(g.port, 'quick')].map(answered));
      assert.deepEqual(
        again.map((x) => x.status),
        [200, 200],
      );
      await untilInFlight(g.gateway, 0, 'every request released');
      assert.equal(await clients(g.gateway), 0, 'no client without a request in flight is kept');
    } finally {
      await g.close();
    }
  },
);

test(
  'with API keys a client is its key: another key from the same address is served',
  { timeout: 60_000 },
  async () => {
    const keyA = 'sk-test-a-0123456789abcdef';
    const keyB = 'sk-test-b-0123456789abcdef';
    const g = await start({ maxRequestsPerClient: 2, apiKeys: new ApiKeys({ [keyA]: 'team-a', [keyB]: 'team-b' }) });
    try {
      const held = [post(g.port, 'hold 1', { key: keyA }), post(g.port, 'hold 2', { key: keyA })];
      await until(() => g.held.length === 2, "both of key A's requests held by the engine");
      assertRefused(await answered(post(g.port, 'hold 3', { key: keyA })), 2);
      const other = await answered(post(g.port, 'quick', { key: keyB }));
      assert.equal(other.status, 200, other.body);
      assert.equal(await metric(g.gateway, 'contextforge_client_request_limit_refusals_total{client="api_key"}'), 1);
      assert.equal(await metric(g.gateway, 'contextforge_client_request_limit_refusals_total{client="address"}'), 0);
      for (const h of g.held.splice(0)) finish(h);
      for (const h of held) assert.equal((await answered(h)).status, 200);
      await untilInFlight(g.gateway, 0, "key A's requests released");
      assert.equal((await answered(post(g.port, 'quick', { key: keyA }))).status, 200);
    } finally {
      await g.close();
    }
  },
);

test('a client that goes away gives its slot back', { timeout: 60_000 }, async () => {
  const g = await start({ maxRequestsPerClient: 1 });
  try {
    for (const stream of [false, true]) {
      const gone = post(g.port, 'hold', { stream });
      await until(() => g.held.length === 1, 'the request held by the engine');
      assertRefused(await answered(post(g.port, 'quick')), 1);
      gone.req.destroy();
      // its engine request is aborted with it
      await until(() => g.held[0].res.destroyed || g.held[0].req.destroyed, 'the engine request aborted');
      g.held.splice(0);
      await untilInFlight(g.gateway, 0, 'the slot of the client gone');
      assert.equal(await clients(g.gateway), 0);
      assert.equal((await answered(post(g.port, 'quick'))).status, 200, 'the client sends again');
    }
  } finally {
    await g.close();
  }
});

test(
  'an engine that fails gives the slot back: before its answer (502) and in the middle of a stream',
  {
    timeout: 60_000,
  },
  async () => {
    const g = await start({ maxRequestsPerClient: 1, maxRetries: 0 });
    try {
      // the engine's connection breaks before any answer: 502
      const failed = post(g.port, 'hold');
      await until(() => g.held.length === 1, 'the request held by the engine');
      assertRefused(await answered(post(g.port, 'quick')), 1);
      g.held.splice(0)[0].res.socket!.destroy();
      assert.equal((await answered(failed)).status, 502);
      await untilInFlight(g.gateway, 0, 'the slot of the request that failed');
      assert.equal((await answered(post(g.port, 'quick'))).status, 200);

      // the engine breaks off a stream already reaching the client
      const cut = post(g.port, 'hold', { stream: true });
      await until(() => g.held.length === 1, 'the stream held by the engine');
      assertRefused(await answered(post(g.port, 'quick')), 1);
      g.held.splice(0)[0].res.socket!.destroy();
      await cut.done;
      await untilInFlight(g.gateway, 0, 'the slot of the stream cut');
      assert.equal((await answered(post(g.port, 'quick'))).status, 200);
      assert.equal(await clients(g.gateway), 0);
    } finally {
      await g.close();
    }
  },
);

test('requests pipelined on a connection that closes give their slots back', { timeout: 60_000 }, async () => {
  const g = await start({ maxRequestsPerClient: 2 });
  try {
    const c = await rawClient(g.port);
    const body = JSON.stringify({ model: 'm', prompt: 'hold' });
    const one = `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
    // two served at once (the second's answer queued behind the first's), the third refused in its turn
    c.socket.write(one + one + one);
    await until(() => g.held.length === 2, 'both pipelined requests held by the engine');
    assert.equal(await inFlight(g.gateway), 2);
    c.socket.destroy();
    await untilInFlight(g.gateway, 0, 'the slots of the pipelined requests');
    assert.equal(await clients(g.gateway), 0);
    assert.equal((await answered(post(g.port, 'quick'))).status, 200);
  } finally {
    await g.close();
  }
});

test(
  'requests pipelined by a client at its limit: one refusal, the connection closed after it, none counted as a client that left',
  { timeout: 60_000 },
  async () => {
    const g = await start({ maxRequestsPerClient: 1 });
    try {
      const holding = post(g.port, 'hold');
      await until(() => g.held.length === 1, 'the request at the limit held by the engine');
      const c = await rawClient(g.port);
      const body = JSON.stringify({ model: 'm', prompt: 'quick' });
      const one = `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
      c.socket.write(one.repeat(5));
      await until(c.closed, 'the connection closed after the refusal');
      // the refusal says Connection: close: nothing after it on the connection is answered (RFC 9112 §9.6)
      const statuses = [...c.received().matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));
      assert.deepEqual(statuses, [429]);
      const refused = async () => metric(g.gateway, 'contextforge_requests_total{path="/v1/completions",status="429"}');
      // those handed over before the refusal went out are counted with it, as refused; those Node
      // parsed after it are no requests (never served, never counted); none as a client that left
      const n = await refused();
      assert.ok(n !== undefined && n >= 1 && n <= 5, `429s counted: ${n}`);
      assert.equal(
        await metric(g.gateway, 'contextforge_requests_total{path="/v1/completions",status="499"}'),
        undefined,
      );
      assert.equal(g.completions(), 1);
      finish(g.held[0]);
      assert.equal((await answered(holding)).status, 200);
    } finally {
      await g.close();
    }
  },
);

test('maxRequestsPerClient must be an integer from 0 to the bound, named where it is wrong', async () => {
  for (const bad of [-1, 1.5, Number.NaN, MAX_REQUESTS_PER_CLIENT + 1])
    await assert.rejects(
      createGateway({ router: new KVAwareRouter(), maxRequestsPerClient: bad }),
      (err: Error) =>
        (err instanceof RangeError || err instanceof TypeError) && /maxRequestsPerClient/.test(err.message),
      String(bad),
    );
  assert.throws(() => new ClientRequests(-1), /maxRequestsPerClient must be from 0/);
  assert.throws(() => resolveServe(['--max-requests-per-client', '-1']), /--max-requests-per-client must be >= 0/);
  assert.throws(
    () => resolveServe(['--max-requests-per-client', String(MAX_REQUESTS_PER_CLIENT + 1)]),
    new RegExp(`--max-requests-per-client must be <= ${MAX_REQUESTS_PER_CLIENT}`),
  );
  assert.throws(() => resolveServe(['--max-requests-per-client', '2.5']), /--max-requests-per-client/);
  assert.equal(resolveServe([]).config.maxRequestsPerClient, 0);
  assert.equal(resolveServe(['--max-requests-per-client', '8']).config.maxRequestsPerClient, 8);
  assert.equal(resolveServe([], { CONTEXTFORGE_MAX_REQUESTS_PER_CLIENT: '4' }).config.maxRequestsPerClient, 4);
});

test('a client address is an IPv4 address, an IPv6 address its /64', () => {
  assert.equal(clientAddressKey('10.1.2.3'), '10.1.2.3');
  // a dual-stack listener sees an IPv4 client as a mapped address
  assert.equal(clientAddressKey('::ffff:10.1.2.3'), '10.1.2.3');
  assert.equal(clientAddressKey('::FFFF:10.1.2.3'), '10.1.2.3');
  // one host rotating its addresses within its /64 is one client
  assert.equal(clientAddressKey('2001:db8:0:1::1'), '2001:db8:0:1::/64');
  assert.equal(clientAddressKey('2001:0db8:0000:0001:dead:beef:0:7'), '2001:db8:0:1::/64');
  assert.equal(clientAddressKey('2001:db8:0:1:a:b:1.2.3.4'), '2001:db8:0:1::/64');
  assert.notEqual(clientAddressKey('2001:db8:0:2::1'), clientAddressKey('2001:db8:0:1::1'));
  assert.equal(clientAddressKey('::1'), '0:0:0:0::/64');
  assert.equal(clientAddressKey('fe80::1%eth0'), 'fe80:0:0:0::/64');
  assert.equal(clientAddressKey(undefined), 'unknown');
});

test('the table keeps no client without a request in flight, and a release counts once', () => {
  const table = new ClientRequests(2);
  const first = table.admit('a')!;
  const second = table.admit('a')!;
  assert.equal(table.admit('a'), undefined);
  assert.ok(table.admit('b'));
  assert.equal(table.clients, 2);
  first();
  first();
  assert.equal(table.requests, 2, 'a second release of the same request counts for nothing');
  second();
  assert.equal(table.clients, 1);
  assert.ok(table.admit('a'));
});
