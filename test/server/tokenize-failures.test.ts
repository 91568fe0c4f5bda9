/**
 * With --tokenize engine, an engine's /tokenize that fails (no answer in time, an answer that is
 * no list of token ids, a connection that breaks) is counted in
 * contextforge_engine_tokenize_refusals_total with its reason (timeout, malformed, error), and
 * its first failure per worker is logged: the request is routed without token ids as before,
 * but no longer unseen. Real sockets; every wait has a deadline.
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { after, before, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { sample } from '../faults/harness.js';
import { listening } from '../helpers/listening.js';

type Mode = 'timeout' | 'malformed' | 'error';
let mode: Mode = 'malformed';
let engine: { url: string; close: () => Promise<void> };
let gateway: Gateway;
let base = '';
const logs: string[] = [];

before(async () => {
  engine = await listening(
    createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        const json = (value: unknown) =>
          res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(value));
        if (req.url === '/tokenize') {
          if (mode === 'malformed') return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"tok');
          if (mode === 'error') return void req.socket.destroy();
          return; // timeout: never answered (the gateway waits 2 s for the headers)
        }
        if (req.url === '/v1/models') return json({ object: 'list', data: [{ id: 'm', object: 'model' }] });
        if (req.url === '/v1/completions')
          return json({ id: 'c', object: 'text_completion', choices: [{ text: 'a' }] });
        res.writeHead(404).end();
      });
    }),
  );
  gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url: engine.url }],
    tokenize: 'engine',
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
    log: (m) => logs.push(m),
  });
  base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await gateway.close(0);
  await engine.close();
});

/** The gateway's count of /tokenize failures of worker `e` for `reason` (0 when absent). */
const failures = (reason: Mode) =>
  sample(gateway.metrics, `contextforge_engine_tokenize_refusals_total{worker="e",reason="${reason}"}`);

const complete = async (i: number) => {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: `hello ${i}`, max_tokens: 1 }),
    signal: AbortSignal.timeout(10_000),
  });
  // routed without token ids, as before
  assert.equal(res.status, 200, await res.text());
};

test('a failing /tokenize is counted per reason and its first failure per worker logged', async () => {
  let i = 0;
  for (const m of ['malformed', 'error', 'timeout'] as const) {
    mode = m;
    await complete(i++);
    await complete(i++);
    assert.equal(await failures(m), 2, m);
  }
  const lines = logs.filter((l) => l.includes('/tokenize'));
  assert.equal(lines.length, 1, lines.join('\n'));
  assert.match(lines[0], /'e'/);
  assert.match(lines[0], /malformed|no list of token ids|no JSON/);
});
