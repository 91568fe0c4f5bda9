/**
 * Routing loops: a worker URL that leads back to the gateway (its own address, or another
 * gateway that routes back). Each gateway appends its pseudonym to the Via of what it forwards
 * (RFC 9110 §7.6.3); a request whose Via already holds it has come back, and is answered 508
 * Loop Detected at once instead of being forwarded again and again. Gateways chained without a
 * loop still work, and the engine gets what it got before, with the Via added.
 */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage } from 'node:http';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayWorker } from '../../src/server/gateway.js';
import { MAX_VIA_BYTES, MAX_VIA_ENTRIES } from '../../src/server/via.js';
import { listening } from '../helpers/listening.js';

const quiet = { healthCheckIntervalMs: 0, metricsIntervalMs: 0 };

async function gatewayWith(workers: GatewayWorker[] = []) {
  const gateway = await createGateway({ router: new KVAwareRouter({ policy: 'round-robin' }), workers, ...quiet });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return { gateway, base };
}

async function post(base: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, text: await res.text() };
}

/** The gateway's count of /v1/completions requests answered with `status`. */
async function answered(base: string, status: number): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text
    .split('\n')
    .find(
      (l) =>
        l.startsWith('contextforge_requests_total{') && l.includes('"/v1/completions"') && l.includes(`"${status}"`),
    );
  return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(' ') + 1));
}

/** An engine that records each request's headers and answers a whole completion (streamed when asked). */
async function recordingEngine() {
  const seen: IncomingMessage['headers'][] = [];
  const server = createServer((req, res) => {
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      seen.push(req.headers);
      const stream = (JSON.parse(Buffer.concat(parts).toString()) as { stream?: boolean }).stream === true;
      if (stream) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: {"choices":[{"text":"a"}]}\n\n');
        return void res.end('data: [DONE]\n\n');
      }
      const body = JSON.stringify({ id: 'c', choices: [{ text: 'a' }] });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    });
  });
  return { ...(await listening(server)), seen };
}

const LOOP_ERROR = (message: string) => ({
  error: { message, type: 'server_error', param: 'via', code: 'loop_detected' },
});

test(
  'a gateway whose only worker is its own URL answers 508 naming via, leaks nothing and stays healthy',
  { timeout: 60_000 },
  async () => {
    const { gateway, base } = await gatewayWith();
    gateway.addWorker({ id: 'self', url: base });
    try {
      for (const stream of [false, true]) {
        const r = await post(base, { prompt: `loop ${stream}`, max_tokens: 2, stream });
        assert.equal(r.status, 508, r.text);
        assert.deepEqual(
          JSON.parse(r.text),
          LOOP_ERROR(
            'the request came back to a gateway it had passed: a worker URL leads back to a gateway on the way (a routing loop)',
          ),
        );
      }
      // each client request came back once: the inner one was answered 508 before it was forwarded again
      assert.equal(await answered(base, 508), 4, 'two client requests, each seen twice');
      assert.equal(gateway.router.getStats().inFlightRequests, 0);
      // the workers' model lists are gathered through the same Via: the loop contributes nothing,
      // and with no other worker the list is an error naming it, not an empty list
      const models = await fetch(`${base}/v1/models`);
      assert.equal(models.status, 502);
      const { error } = (await models.json()) as { error: { code: string; message: string } };
      assert.equal(error.code, 'engine_models_failed');
      assert.match(error.message, /\bself answered 508\b/);
      // healthy: it answers, and serves as soon as it has a real engine
      assert.equal((await fetch(`${base}/healthz`)).status, 200);
      const engine = await new MockEngine().start();
      try {
        gateway.removeWorker('self');
        gateway.addWorker({ id: 'engine', url: `http://127.0.0.1:${engine.port}` });
        const ok = await post(base, { prompt: 'after the loop', max_tokens: 2 });
        assert.equal(ok.status, 200, ok.text);
        assert.equal(gateway.router.getStats().inFlightRequests, 0);
      } finally {
        await engine.close();
      }
    } finally {
      await gateway.close(0);
    }
  },
);

test('gateways chained without a loop work: A forwards to B, B to the engine, which gets the Via of both', async () => {
  const engine = await recordingEngine();
  const b = await gatewayWith([{ id: 'engine', url: engine.url }]);
  const a = await gatewayWith([{ id: 'b', url: b.base }]);
  try {
    const plain = await post(a.base, { prompt: 'chained', max_tokens: 2 });
    assert.equal(plain.status, 200, plain.text);
    assert.deepEqual(JSON.parse(plain.text), { id: 'c', choices: [{ text: 'a' }] });
    const streamed = await post(a.base, { prompt: 'chained', max_tokens: 2, stream: true });
    assert.equal(streamed.status, 200, streamed.text);
    assert.equal(streamed.text, 'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n');
    // a Via the client's own proxy sent is kept, and each gateway appends its entry
    const proxied = await post(a.base, { prompt: 'chained', max_tokens: 2 }, { via: '1.1 corp-proxy (Squid)' });
    assert.equal(proxied.status, 200, proxied.text);
    const [pa, pb] = [a.gateway.viaPseudonym, b.gateway.viaPseudonym];
    assert.match(pa, /^contextforge-[0-9a-f]{12}$/);
    assert.notEqual(pa, pb, 'each gateway has a pseudonym of its own');
    assert.deepEqual(
      engine.seen.map((h) => h.via),
      [`1.1 ${pa}, 1.1 ${pb}`, `1.1 ${pa}, 1.1 ${pb}`, `1.1 corp-proxy (Squid), 1.1 ${pa}, 1.1 ${pb}`],
    );
    // otherwise the engine gets the headers it got before (and asks for no content coding)
    for (const h of engine.seen)
      assert.deepEqual(Object.keys(h).sort(), [
        'accept-encoding',
        'connection',
        'content-length',
        'content-type',
        'host',
        'via',
      ]);
    assert.equal(a.gateway.router.getStats().inFlightRequests, 0);
    assert.equal(b.gateway.router.getStats().inFlightRequests, 0);
  } finally {
    await a.gateway.close(0);
    await b.gateway.close(0);
    await engine.close();
  }
});

test(
  'a loop behind another gateway: A forwards to B, whose worker is B itself; A answers 508 too',
  { timeout: 60_000 },
  async () => {
    const b = await gatewayWith();
    b.gateway.addWorker({ id: 'self', url: b.base });
    const a = await gatewayWith([{ id: 'b', url: b.base }]);
    try {
      const r = await post(a.base, { prompt: 'behind', max_tokens: 2 });
      assert.equal(r.status, 508, r.text);
      assert.equal((JSON.parse(r.text) as { error: { param: string } }).error.param, 'via');
      assert.equal(a.gateway.router.getStats().inFlightRequests, 0);
      assert.equal(b.gateway.router.getStats().inFlightRequests, 0);
    } finally {
      await a.gateway.close(0);
      await b.gateway.close(0);
    }
  },
);

test("a client's Via: this gateway's own pseudonym is a loop; too many entries or bytes is a 400 naming via", async () => {
  const engine = await recordingEngine();
  const { gateway, base } = await gatewayWith([{ id: 'engine', url: engine.url }]);
  try {
    const own = await post(base, { prompt: 'p' }, { via: `1.0 a, 1.1 ${gateway.viaPseudonym}:8000 (comment)` });
    assert.equal(own.status, 508);
    assert.equal((JSON.parse(own.text) as { error: { param: string } }).error.param, 'via');
    const entries = (n: number) => Array.from({ length: n }, (_, i) => `1.1 p${i}`).join(', ');
    const many = await post(base, { prompt: 'p' }, { via: entries(MAX_VIA_ENTRIES + 1) });
    assert.equal(many.status, 400);
    assert.deepEqual(JSON.parse(many.text), {
      error: {
        message: `the Via header has more than ${MAX_VIA_ENTRIES} entries`,
        type: 'invalid_request_error',
        param: 'via',
        code: null,
      },
    });
    const long = await post(base, { prompt: 'p' }, { via: `1.1 ${'x'.repeat(MAX_VIA_BYTES)}` });
    assert.equal(long.status, 400);
    assert.equal((JSON.parse(long.text) as { error: { param: string } }).error.param, 'via');
    assert.equal(engine.seen.length, 0, 'nothing refused reached the engine');
    // at the bounds, and with empty list elements, the request goes through
    const most = await post(base, { prompt: 'p' }, { via: `, ${entries(MAX_VIA_ENTRIES)},` });
    assert.equal(most.status, 200, most.text);
    assert.equal(engine.seen[0].via, `, ${entries(MAX_VIA_ENTRIES)}, 1.1 ${gateway.viaPseudonym}`);
    assert.equal(gateway.router.getStats().inFlightRequests, 0);
  } finally {
    await gateway.close(0);
    await engine.close();
  }
});
