/**
 * An engine's /tokenize answer is its word on the prompt, and a bad one is the engine's fault: a
 * token list longer than the router's maxPromptTokens (no prompt the router takes has that many
 * tokens, and the engine would refuse one that long itself) is no answer. The request is routed
 * without token ids, not refused with a 400 that blames the client; the answer is read only up to
 * what maxPromptTokens tokens can take.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { fakeEngine, OK_COMPLETION } from '../faults/harness.js';

for (const [name, count] of [
  ['one token more than maxPromptTokens', 1025],
  ['millions of tokens', 2_000_000],
] as const) {
  test(`a /tokenize answer of ${name} is no answer: the request is routed without token ids, not refused`, async (t) => {
    let tokenized = 0;
    const engine = await fakeEngine((req, res) => {
      req.resume();
      req.on('end', () => {
        if (req.url === '/tokenize') {
          tokenized++;
          const tokens = Array.from({ length: count }, (_, k) => 1000 + (k % 9000));
          res.writeHead(200, { 'content-type': 'application/json' });
          return void res.end(JSON.stringify({ tokens, count, max_model_len: 4096 }));
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end(OK_COMPLETION);
      });
    });
    const gateway = await createGateway({
      router: new KVAwareRouter({ blockSize: 16, maxPromptTokens: 1024 }),
      workers: [{ id: 'e0', url: engine.url }],
      tokenize: 'engine',
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
    });
    t.after(async () => {
      await gateway.close();
      await engine.close();
    });
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 }),
    });
    const text = await r.text();
    assert.equal(r.status, 200, text);
    assert.equal(tokenized, 1, 'the engine was asked');
  });
}
