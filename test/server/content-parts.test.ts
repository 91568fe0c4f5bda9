/**
 * Chat content parts through the gateway: a request vLLM's OpenAI server takes (a plain string
 * in the list, a part whose type comes from its media field, thinking and tool_reference parts,
 * media named by a uuid with its data left out) must reach the engine, not end in the
 * gateway's own 400; a part vLLM refuses is a 400 naming the field. The fast path and Fastify's
 * route alike; the engine behind is the mock, which checks messages as the gateway does.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { REFUSED_PARTS, VLLM_PARTS } from '../helpers/content-parts.js';

describe('content parts through the gateway', () => {
  let engine: MockEngine;
  let gateway: Gateway;
  let base = '';
  before(async () => {
    engine = await new MockEngine().start();
    gateway = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ id: 'e0', url: `http://127.0.0.1:${engine.port}` }],
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
    });
    base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  });
  after(async () => {
    await gateway?.close(0);
    await engine?.close();
  });

  const chat = (target: string, part: unknown) =>
    fetch(`${base}${target}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'mock',
        max_tokens: 1,
        messages: [{ role: 'user', content: [{ type: 'text', text: 'look' }, part] }],
      }),
    });
  // the fast path, and Fastify's route (a query string takes a request past the fast path)
  const targets = ['/v1/chat/completions', '/v1/chat/completions?via=fastify'];

  test('each part vLLM takes is forwarded and answered', async () => {
    for (const target of targets)
      for (const { name, part } of VLLM_PARTS) {
        const res = await chat(target, part);
        const text = await res.text();
        assert.equal(res.status, 200, `${target}, ${name}: ${text}`);
        assert.equal(res.headers.get('x-contextforge-worker'), 'e0', `${target}, ${name}`);
      }
  });

  test('each part vLLM refuses is a 400 naming the field', async () => {
    for (const target of targets)
      for (const { part, field, message } of REFUSED_PARTS) {
        const res = await chat(target, part);
        const text = await res.text();
        assert.equal(res.status, 400, `${target}, ${JSON.stringify(part)}: ${text}`);
        assert.equal(res.headers.get('x-contextforge-worker'), null, 'refused before any engine');
        const { error } = JSON.parse(text) as { error: { message: string; param: string } };
        assert.equal(error.param, `messages[0].content[1]${field}`, text);
        if (typeof message === 'string') assert.equal(error.message, `messages[0].content[1]${message}`);
        else assert.match(error.message, message);
      }
  });
});
