/**
 * An engine whose /tokenize refuses the request (SGLang releases whose /tokenize takes only a
 * `prompt` answer a chat's `messages` with 400): the request is routed without token ids, as
 * before, but the refusal is logged once per worker and counted per worker and status in
 * contextforge_engine_tokenize_refusals_total.
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { listening } from '../helpers/listening.js';

/** An engine answering everything but a chat's /tokenize, which it refuses 400 as older SGLang does. */
async function promptOnlyTokenizeEngine() {
  let tokenizeCalls = 0;
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      const path = req.url ?? '';
      const json = (status: number, value: unknown) =>
        res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(value));
      if (path === '/tokenize') {
        tokenizeCalls++;
        const parsed = JSON.parse(body) as { prompt?: unknown };
        if (typeof parsed.prompt === 'string') return json(200, { tokens: [1, 2, 3, 4], count: 4 });
        return json(400, { object: 'error', message: 'prompt is required', type: 'BadRequest', code: 400 });
      }
      if (path === '/health') return void res.writeHead(200).end();
      if (path === '/metrics') return void res.writeHead(200, { 'content-type': 'text/plain' }).end('# none\n');
      if (path === '/v1/models') return json(200, { object: 'list', data: [{ id: 'm', object: 'model' }] });
      if (path === '/v1/chat/completions')
        return json(200, {
          id: 'c',
          object: 'chat.completion',
          choices: [{ index: 0, message: { role: 'assistant', content: 'a' } }],
        });
      res.writeHead(404).end();
    });
  });
  return { ...(await listening(server)), tokenizeCalls: () => tokenizeCalls };
}

/** The gateway's count of /tokenize refusals of `worker` with `status` (0 when absent). */
async function refusals(base: string, worker: string, status: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text
    .split('\n')
    .find(
      (l) =>
        l.startsWith('contextforge_engine_tokenize_refusals_total{') &&
        l.includes(`worker="${worker}"`) &&
        l.includes(`status="${status}"`),
    );
  return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(' ') + 1));
}

test('a /tokenize refusal is logged once per worker and counted per worker and status', async () => {
  const engine = await promptOnlyTokenizeEngine();
  const logs: string[] = [];
  const gateway = await createGateway({
    router: new KVAwareRouter(),
    workers: [{ id: 'e', url: engine.url }],
    tokenize: 'engine',
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 0,
    log: (m) => logs.push(m),
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  try {
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: [{ role: 'user', content: `hi ${i}` }], max_tokens: 1 }),
      });
      // routed without token ids, as before
      assert.equal(res.status, 200, await res.text());
    }
    assert.equal(engine.tokenizeCalls(), 3);
    assert.equal(await refusals(base, 'e', '400'), 3);
    const lines = logs.filter((l) => l.includes('/tokenize'));
    assert.equal(lines.length, 1, lines.join('\n'));
    assert.match(lines[0], /'e'/);
    assert.match(lines[0], /400/);
    assert.match(lines[0], /prompt is required/, "the engine's message");
    // a prompt it tokenizes is not counted
    const ok = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'hello', max_tokens: 1 }),
    });
    await ok.arrayBuffer();
    assert.equal(await refusals(base, 'e', '400'), 3);
    // a removed worker's series leaves with it
    const removed = await fetch(`${base}/admin/workers/e`, {
      method: 'DELETE',
      headers: { authorization: `Bearer ${gateway.adminToken}` },
    });
    assert.ok(removed.ok, String(removed.status));
    assert.equal(await refusals(base, 'e', '400'), 0);
  } finally {
    await gateway.close(0);
    await engine.close();
  }
});
