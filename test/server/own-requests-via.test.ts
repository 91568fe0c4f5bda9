/**
 * What the gateway asks its workers on its own — health checks, metrics scrapes, the periodic
 * /v1/models read, /tokenize — carries its Via entry as the requests it forwards do, so a
 * worker URL that leads back to a gateway shows as a loop on those too (via.ts).
 */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';
import { listening } from '../helpers/listening.js';

/** An engine that answers each side endpoint and a completion, recording each request's path and headers. */
async function recordingEngine() {
  const seen: Array<{ path: string; headers: IncomingMessage['headers'] }> = [];
  const answers: Record<string, string> = {
    '/health': '',
    '/metrics': '# no series\n',
    '/v1/models': JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model' }] }),
    '/tokenize': JSON.stringify({ tokens: [1, 2, 3, 4] }),
    '/v1/completions': JSON.stringify({ id: 'c', choices: [{ text: 'a' }] }),
  };
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const path = req.url ?? '';
      seen.push({ path, headers: req.headers });
      const body = answers[path];
      if (body === undefined) return void res.writeHead(404).end();
      res.writeHead(200, { 'content-type': path === '/metrics' ? 'text/plain' : 'application/json' }).end(body);
    });
  });
  return { ...(await listening(server)), seen };
}

test("health checks, metrics scrapes, the models read and /tokenize carry the gateway's Via", async () => {
  const engine = await recordingEngine();
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url: engine.url }],
    tokenize: 'engine',
    healthCheckIntervalMs: 50,
    metricsIntervalMs: 50,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'hello', max_tokens: 2 }),
    });
    assert.equal(res.status, 200, await res.text());
    const paths = ['/health', '/metrics', '/v1/models', '/tokenize', '/v1/completions'];
    await until(
      () => paths.every((p) => engine.seen.some((s) => s.path === p)),
      'a request to each endpoint of the engine',
    );
    const own = `1.1 ${gateway.viaPseudonym}`;
    for (const p of paths)
      for (const s of engine.seen.filter((r) => r.path === p)) assert.equal(s.headers.via, own, `${p}: its Via`);
  } finally {
    await gateway.close(0);
    await engine.close();
  }
});

/** The gateway's count of `path` requests answered with `status`. */
async function answered(base: string, path: string, status: number): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text
    .split('\n')
    .find((l) => l.startsWith('contextforge_requests_total{') && l.includes(`"${path}"`) && l.includes(`"${status}"`));
  return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(' ') + 1));
}

test('a gateway whose worker is itself sees the loop on its own models read at once, not one round later', async () => {
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    // adding the worker reads its models at once; a read asked for meanwhile shares it, and is awaited
    gateway.addWorker({ id: 'self', url: base });
    await gateway.connections.readAdapters('self');
    await until(async () => (await answered(base, '/v1/models', 508)) >= 1, 'the read answered 508');
    // the read came back once and was refused there: it was not served as a client's request
    assert.equal(await answered(base, '/v1/models', 200), 0, 'no read served as if it came from a client');
    assert.equal(await answered(base, '/v1/models', 508), 1);
  } finally {
    await gateway.close(0);
  }
});
