/**
 * A loaded engine whose health probes timed out (out of rotation for slow probes only) keeps its
 * unanswered requests while its next probe may still bring it back: with the default interval
 * (2 s) and probe timeout (5 s), that probe answers up to 7 s after it left, and a grace of two
 * intervals alone (4 s) moved its request to another engine first.
 */
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';

async function engine(name: string, health: () => number | 'hang', hold: boolean) {
  const prompts: string[] = [];
  const held: ServerResponse[] = [];
  const server = createServer((req, res) => {
    if (req.url === '/health') {
      const h = health();
      if (h === 'hang') return void held.push(res);
      const t = setTimeout(() => res.writeHead(200).end(), h);
      res.on('close', () => clearTimeout(t));
      return;
    }
    if (req.method !== 'POST') return void res.writeHead(404).end();
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      prompts.push((JSON.parse(Buffer.concat(parts).toString()) as { prompt: string }).prompt);
      if (hold) return void held.push(res);
      const text = JSON.stringify({ choices: [{ text: name }] });
      res.writeHead(200, { 'content-type': 'application/json' }).end(text);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    prompts,
    close: () =>
      new Promise<void>((r) => {
        for (const h of held) h.destroy();
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

test(
  'at the default interval and probe timeout, a worker out for slow probes keeps its request until its next probe',
  { timeout: 120_000 },
  async () => {
    let aHealth: number | 'hang' = 0;
    const a = await engine('a', () => aHealth, true);
    const b = await engine('b', () => 0, false);
    const g = await createGateway({
      router: new KVAwareRouter({ policy: 'round-robin' }),
      workers: [
        { id: 'a', url: a.url },
        { id: 'b', url: b.url },
      ],
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 2000, // defaults, spelled out
      healthCheckTimeoutMs: 5000,
    });
    const events: string[] = [];
    const t0 = Date.now();
    const at = () => `${((Date.now() - t0) / 1000).toFixed(1)}s`;
    g.health.onChange((id, available, detail) => {
      events.push(`${at()} ${id} ${available ? 'in' : 'out'} ${detail}`);
      // once out, the engine answers its next probe in 2.5 s: within the timeout
      if (id === 'a' && !available) aHealth = 2500;
    });
    await g.app.listen({ host: '127.0.0.1', port: 0 });
    const base = `http://127.0.0.1:${(g.app.server.address() as AddressInfo).port}`;
    try {
      const post = (prompt: string) =>
        fetch(`${base}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'm', prompt, max_tokens: 2 }),
        });
      // answered or cut when the gateway closes: neither is what this test checks
      const pending = [post('p0'), post('p1')].map((p) => p.catch(() => undefined));
      await until(() => a.prompts.length === 1, 'one request held on a', { timeoutMs: 10_000 });
      const heldPrompt = a.prompts[0];
      aHealth = 'hang';
      await until(
        () =>
          events.some((e) => / a in/.test(e)) ||
          (b.prompts.filter((p) => p === heldPrompt).length > 0 && events.some((e) => / a in/.test(e))),
        'a back in rotation',
        { timeoutMs: 60_000 },
      );
      const moved = b.prompts.includes(heldPrompt);
      assert.equal(
        moved,
        false,
        `the loaded engine came back with its next probe: its request is kept (${events.join('; ')})`,
      );
      void pending;
    } finally {
      await g.close(0);
      await a.close();
      await b.close();
    }
  },
);
