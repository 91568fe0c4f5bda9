/**
 * The deepest JSON body an operator may allow: every check the gateway makes of a body walks it
 * one call per level, so a depth past what the stack holds would be a RangeError of the stack
 * (a 500), not a 400 naming the field.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { checkRequestLimits, MAX_JSON_DEPTH } from '../../src/server/request-limits.js';

/** A JSON value `depth` objects deep. */
const nested = (depth: number): string => '{"a":'.repeat(depth - 1) + '{}' + '}'.repeat(depth - 1);

test('the JSON depth limit is bounded, and a body at the bound is answered without a server error', async (t) => {
  assert.throws(() => checkRequestLimits({ maxJsonDepth: MAX_JSON_DEPTH + 1 }), {
    name: 'RangeError',
    message: new RegExp(`^limits\\.maxJsonDepth must be <= ${MAX_JSON_DEPTH}`),
  });
  const engine = await new MockEngine({ model: 'm' }).start();
  const gw = await createGateway({
    router: new KVAwareRouter({ policy: 'round-robin' }),
    workers: [{ id: 'w', url: `http://127.0.0.1:${engine.port}` }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    limits: { maxJsonDepth: MAX_JSON_DEPTH, maxJsonContainers: 1_000_000, maxJsonObjectMembers: 1_000_000 },
  });
  const url = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  t.after(async () => {
    await gw.close();
    await engine.close();
  });
  // the body and response_format take two levels: the schema the rest, to the bound
  const schema = nested(MAX_JSON_DEPTH - 2);
  for (const [path, prompt] of [
    ['/v1/chat/completions', '"messages":[{"role":"user","content":"hi"}]'],
    ['/v1/completions', '"prompt":"hi"'],
  ]) {
    const body = `{"model":"m",${prompt},"max_tokens":1,"response_format":{"type":"json_schema","json_schema":${schema}}}`;
    const r = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const text = await r.text();
    assert.ok(r.status < 500, `${path}: ${r.status} ${text.slice(0, 200)}`);
    // one level more is refused before it is parsed
    const deeper = `{"model":"m",${prompt},"response_format":{"json_schema":{"x":${schema}}}}`;
    const refused = await fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: deeper,
    });
    assert.equal(refused.status, 400, await refused.text());
  }
});
