/**
 * GET /v1/models when workers give no list: an empty list would say no model is served, when the
 * gateway only could not ask. No worker answering is a 502 naming the workers and why; no worker
 * to ask a 503; some answering a 200 with their models. Real sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { listening } from '../helpers/listening.js';

const MODELS = JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model' }] });
let failing = false;
const held: ServerResponse[] = [];
const engines: Array<{ url: string; close: () => Promise<void> }> = [];
const gateways: Gateway[] = [];

/** An engine whose /v1/models answers `bad` (a status, 'hang' or 'not-json') while `failing`; 'ok' always lists. */
const engine = async (bad: number | 'hang' | 'not-json' | 'ok') => {
  const e = await listening(
    createServer((req, res) => {
      if (req.url !== '/v1/models') return void res.writeHead(404).end();
      if (!failing || bad === 'ok') return void res.writeHead(200, { 'content-type': 'application/json' }).end(MODELS);
      if (bad === 'hang') return void held.push(res);
      if (bad === 'not-json') return void res.writeHead(200).end('<html>');
      res.writeHead(bad).end();
    }),
  );
  engines.push(e);
  return e.url;
};

const gateway = async (workers: Array<{ id: string; url: string }>) => {
  const g = await createGateway({
    router: new KVAwareRouter(),
    workers,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
  });
  gateways.push(g);
  return g.app.listen({ host: '127.0.0.1', port: 0 });
};

const list = async (base: string) => {
  const res = await fetch(`${base}/v1/models`, { signal: AbortSignal.timeout(10_000) });
  return {
    status: res.status,
    body: (await res.json()) as { data?: Array<{ id: string }>; error?: { code: string | null; message: string } },
  };
};

let allFail = '';
let someFail = '';
let none = '';
before(async () => {
  const [a, b, c, d] = [await engine(500), await engine('hang'), await engine('not-json'), await engine('ok')];
  allFail = await gateway([
    { id: 'a', url: a },
    { id: 'b', url: b },
    { id: 'c', url: c },
  ]);
  someFail = await gateway([
    { id: 'a', url: a },
    { id: 'd', url: d },
  ]);
  none = await gateway([]);
  failing = true;
});
after(async () => {
  for (const res of held.splice(0)) res.destroy();
  for (const g of gateways) await g.close(0);
  for (const e of engines) await e.close();
});

test('no worker answering its /v1/models is a 502 naming each and why, not an empty list', async () => {
  const started = performance.now();
  const { status, body } = await list(allFail);
  assert.equal(status, 502);
  assert.equal(body.error?.code, 'engine_models_failed');
  const message = body.error?.message ?? '';
  assert.match(message, /\ba answered 500\b/);
  assert.match(message, /\bb timed out\b/);
  assert.match(message, /\bc answered with no JSON\b/);
  // a hanging engine's headers are waited for 2 s (docs/server.md)
  assert.ok(performance.now() - started < 4000, 'answered within the stated bound');
});

test('some workers answering is a 200 with their models', async () => {
  const { status, body } = await list(someFail);
  assert.equal(status, 200);
  assert.deepEqual(
    body.data?.map((m) => m.id),
    ['m'],
  );
});

test('no worker to ask is a 503', async () => {
  const { status, body } = await list(none);
  assert.equal(status, 503);
  assert.equal(body.error?.code, 'no_worker_available');
});
