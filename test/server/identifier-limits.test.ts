/**
 * `model` and `user` name something (a model or LoRA adapter the workers serve, the client's end
 * user), so they are bounded as names are: at most 4 × maxIdBytes UTF-8 bytes (1 KiB by
 * default), not by the body size alone. The gateway reads `model` (model lists, LoRA keys,
 * error messages); over the limit is a 400 naming the field and nothing reaches the engine; at
 * the limit passes. A `user` that is not a string is refused, as the engines' pydantic models
 * (`user: Optional[str]`) would refuse it.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { gatewayOnEngine, type GatewayOnEngine } from '../helpers/gateway-on-engine.js';

let defaults: GatewayOnEngine;
let tight: GatewayOnEngine;
before(async () => {
  defaults = await gatewayOnEngine({ adminToken: 'route-token' });
  tight = await gatewayOnEngine({ limits: { maxIdBytes: 8 } });
});
after(async () => {
  await defaults.close();
  await tight.close();
});

const PATHS = {
  completions: { path: '/v1/completions', body: { model: 'm', prompt: 'hi' } },
  chat: { path: '/v1/chat/completions', body: { model: 'm', messages: [{ role: 'user', content: 'hi' }] } },
} as const;

/** POSTs `fields` over the path's base body; the status, the error, and whether the engine got it. */
async function post(setup: GatewayOnEngine, path: string, fields: object, query = '') {
  const body = { ...(path === PATHS.chat.path ? PATHS.chat.body : PATHS.completions.body), ...fields };
  const before = setup.completions();
  const res = await fetch(`http://127.0.0.1:${setup.port}${path}${query}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  const answer = JSON.parse(text) as { error?: { param: string | null; message: string; type: string } };
  return { status: res.status, error: answer.error, text, reached: setup.completions() - before };
}

/** Asserts the request is refused with 400 naming `param` on the fast path and Fastify's route, no engine seeing it. */
async function refused(setup: GatewayOnEngine, path: string, fields: object, param: string) {
  let message = '';
  // a query string takes the request past the fast path to Fastify's route
  for (const query of ['', '?via=fastify']) {
    const r = await post(setup, path, fields, query);
    assert.equal(r.status, 400, `${path}${query} ${JSON.stringify(fields).slice(0, 80)}: ${r.text.slice(0, 200)}`);
    assert.equal(r.error?.param, param);
    assert.equal(r.error?.type, 'invalid_request_error');
    assert.equal(r.reached, 0, 'nothing reaches the engine');
    message = r.error!.message;
  }
  return message;
}

/** Asserts the request is forwarded to the engine and answered. */
async function passes(setup: GatewayOnEngine, path: string, fields: object) {
  const r = await post(setup, path, fields);
  assert.equal(r.status, 200, r.text.slice(0, 200));
  assert.equal(r.reached, 1);
}

for (const param of ['model', 'user'] as const) {
  describe(param, () => {
    for (const { path } of Object.values(PATHS)) {
      test(`over 4 × maxIdBytes bytes is refused, at it passes (${path})`, async () => {
        const message = await refused(defaults, path, { [param]: 'x'.repeat(1025) }, param);
        assert.equal(message, `${param} is longer than 1024 bytes`);
        await passes(defaults, path, { [param]: 'x'.repeat(1024) });
        await refused(tight, path, { [param]: 'x'.repeat(33) }, param);
        await passes(tight, path, { [param]: 'x'.repeat(32) });
      });
    }
    test('bytes are counted in UTF-8, not characters', async () => {
      const { path } = PATHS.completions;
      // 2 bytes each: 512 are 1024 bytes
      await passes(defaults, path, { [param]: 'é'.repeat(512) });
      await refused(defaults, path, { [param]: 'é'.repeat(513) }, param);
      // 4 bytes each (two UTF-16 units): 256 are 1024 bytes
      await passes(defaults, path, { [param]: '😀'.repeat(256) });
      await refused(defaults, path, { [param]: '😀'.repeat(256) + 'x' }, param);
      // 3 bytes each: under the length but over in bytes
      await refused(tight, path, { [param]: '€'.repeat(11) }, param);
      await passes(tight, path, { [param]: '€'.repeat(10) + 'xx' });
    });
    test('a megabyte name is refused without being echoed back', async () => {
      const huge = 'y'.repeat(1 << 20);
      for (const { path } of Object.values(PATHS)) {
        const message = await refused(defaults, path, { [param]: huge }, param);
        assert.ok(!message.includes('yyyy'), message.slice(0, 80));
      }
    });
    test('absent or null passes', async () => {
      await passes(defaults, PATHS.completions.path, { [param]: null });
      await passes(defaults, PATHS.chat.path, { [param]: undefined });
    });
  });
}

test('a user that is not a string is refused, as the engines’ user: Optional[str] refuses it', async () => {
  for (const user of [5, true, {}, ['u'], { toString: 1 }]) {
    const message = await refused(defaults, PATHS.completions.path, { user }, 'user');
    assert.match(message, /^user must be a string/);
  }
  await refused(defaults, PATHS.chat.path, { user: 0 }, 'user');
});

test('/v1/route refuses a model over the limit the same way', async () => {
  const res = await fetch(`http://127.0.0.1:${defaults.port}/v1/route`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer route-token' },
    body: JSON.stringify({ model: 'x'.repeat(1025), prompt: 'x' }),
  });
  const text = await res.text();
  assert.equal(res.status, 400, text);
  assert.equal((JSON.parse(text) as { error: { param: string } }).error.param, 'model');
});
