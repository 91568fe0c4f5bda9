import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { adminCaller } from '../helpers/admin-call.js';
import { listening } from '../helpers/listening.js';
import { until } from '../helpers/wait.js';

const TOKEN = 'admin-token-for-first-checks';

/**
 * A fake engine counting its completions and health probes: `health` answers a probe (a status,
 * or a promise of one: the probe waits), `status` the completions.
 */
async function engine(health: () => number | Promise<number>, status = 200) {
  const seen = { completions: 0, probes: 0 };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    if (req.url === '/health') {
      seen.probes++;
      return void Promise.resolve(health()).then((s) => res.writeHead(s).end());
    }
    if (req.url === '/metrics' || req.url === '/v1/models') return void res.writeHead(404).end();
    req.resume();
    req.on('end', () => {
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      seen.completions++;
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(
        status === 200
          ? JSON.stringify({ id: 'c', object: 'text_completion', choices: [{ index: 0, text: 'ok' }] })
          : JSON.stringify({ error: { message: 'failing' } }),
      );
    });
  });
  return { seen, ...(await listening(server)) };
}

/** A /health that answers only once `release()` is called (a probe under way meanwhile). */
function heldHealth() {
  let release!: (status: number) => void;
  const answer = new Promise<number>((r) => (release = r));
  return { health: () => answer, release };
}

async function gatewayWith(workers: Array<{ id: string; url: string }>, healthCheckIntervalMs: number) {
  const logs: string[] = [];
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const gateway = await createGateway({
    router,
    workers,
    adminToken: TOKEN,
    tokenize: 'text',
    // no round comes during the test: only the check sent when a worker is added
    healthCheckIntervalMs,
    healthCheckTimeoutMs: 30_000,
    metricsIntervalMs: 0,
    breakerFailures: 1000,
    log: (m) => logs.push(m),
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const available = (id: string) => router.listWorkers().find((w) => w.id === id)?.available === true;
  const complete = () =>
    fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'hello', max_tokens: 1 }),
    }).then(async (r) => ({ status: r.status, text: await r.text() }));
  return { gateway, base, logs, available, complete, admin: adminCaller(base, TOKEN) };
}

test('a worker added while the gateway runs takes no request before its first health check passes, checked at once', async () => {
  const a = await engine(() => 200);
  const held = heldHealth();
  const b = await engine(held.health);
  const g = await gatewayWith([{ id: 'a', url: a.url }], 60_000);
  try {
    assert.equal((await g.admin('POST', '/admin/workers', { id: 'b', url: b.url })).status, 201);
    const listed = JSON.parse((await g.admin('GET', '/admin/workers')).text) as {
      workers: Array<{ id: string; healthy: boolean; outOfRotation: string[] }>;
    };
    const shown = listed.workers.find((w) => w.id === 'b')!;
    assert.equal(shown.healthy, false, 'out of rotation until its first check passes');
    assert.deepEqual(shown.outOfRotation, ['health-check']);
    // probed at once, not an interval (60 s) later
    await until(() => b.seen.probes >= 1, "b's first health probe");
    for (let i = 0; i < 6; i++) assert.equal((await g.complete()).status, 200);
    assert.equal(b.seen.completions, 0, 'no request went to b before its check passed');
    held.release(200);
    await until(() => g.available('b'), 'b in rotation once its first check passed');
    assert.ok(g.logs.includes('b is in rotation (its first health check passed)'), g.logs.join('\n'));
    for (let i = 0; i < 6; i++) assert.equal((await g.complete()).status, 200);
    assert.ok(b.seen.completions > 0, 'b takes requests once in rotation');
  } finally {
    held.release(200);
    await g.gateway.close();
    await Promise.all([a.close(), b.close()]);
  }
});

test('a retry does not go to a worker awaiting its first check; one whose first check fails stays out, logged', async () => {
  const a = await engine(() => 200, 500);
  const held = heldHealth();
  const b = await engine(held.health);
  const c = await engine(() => 500);
  const g = await gatewayWith([{ id: 'a', url: a.url }], 60_000);
  try {
    assert.equal((await g.admin('POST', '/admin/workers', { id: 'b', url: b.url })).status, 201);
    assert.equal((await g.admin('POST', '/admin/workers', { id: 'c', url: c.url })).status, 201);
    const r = await g.complete();
    assert.equal(r.status, 502, r.text);
    assert.ok(a.seen.completions >= 1);
    assert.equal(b.seen.completions + c.seen.completions, 0, 'the retry went to no worker out of rotation');
    await until(
      () => g.logs.includes('c stays out of rotation: its first health check failed (HTTP 500)'),
      "c's first check failing",
    );
    assert.equal(g.available('c'), false);
    assert.equal(g.available('b'), false);
  } finally {
    held.release(200);
    await g.gateway.close();
    await Promise.all([a.close(), b.close(), c.close()]);
  }
});

test('without health checks an added worker takes requests at once; a configured one does from the start', async () => {
  const held = heldHealth();
  const a = await engine(held.health);
  const b = await engine(() => 200);
  const g = await gatewayWith([{ id: 'a', url: a.url }], 60_000);
  const off = await gatewayWith([], 0);
  try {
    // a configured worker is in rotation before its first check answers, the gateway ready
    assert.equal(g.available('a'), true);
    assert.equal((await fetch(`${g.base}/readyz`)).status, 200);
    assert.equal((await off.admin('POST', '/admin/workers', { id: 'b', url: b.url })).status, 201);
    assert.equal(off.available('b'), true, 'no check to wait for');
    assert.equal((await off.complete()).status, 200);
    assert.equal(b.seen.probes, 0);
  } finally {
    held.release(200);
    await Promise.all([g.gateway.close(), off.gateway.close()]);
    await Promise.all([a.close(), b.close()]);
  }
});

test('with only workers awaiting their first check, the 503 names them as such, not as failing', async () => {
  const held = heldHealth();
  const b = await engine(held.health);
  const g = await gatewayWith([], 60_000);
  try {
    assert.equal((await g.admin('POST', '/admin/workers', { id: 'b', url: b.url })).status, 201);
    await until(() => b.seen.probes >= 1, "b's first health probe");
    const r = await g.complete();
    assert.equal(r.status, 503, r.text);
    const { error } = JSON.parse(r.text) as { error: { code: string; message: string } };
    assert.equal(error.code, 'no_worker_available');
    assert.match(error.message, /\b1 workers?: 1 first health check pending\b/);
    // once its first check has failed, it is a failing check
    held.release(500);
    await until(() => g.logs.some((l) => l.startsWith('b stays out of rotation')), "b's first check failing");
    assert.match((await g.complete()).text, /\b1 health check failing\b/);
  } finally {
    held.release(200);
    await g.gateway.close();
    await b.close();
  }
});
