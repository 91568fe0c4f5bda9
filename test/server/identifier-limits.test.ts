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
import { LIMIT_PATHS, passes, refused as refusedOn } from '../helpers/limit-checks.js';

/** Refused on the fast path and on Fastify's route (a query string takes a request past the fast path). */
const refused = (setup: GatewayOnEngine, path: string, fields: object, param: string) =>
  refusedOn(setup, path, fields, param, ['', '?via=fastify']);

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

for (const param of ['model', 'user'] as const) {
  describe(param, () => {
    for (const { path } of Object.values(LIMIT_PATHS)) {
      test(`over 4 × maxIdBytes bytes is refused, at it passes (${path})`, async () => {
        const message = await refused(defaults, path, { [param]: 'x'.repeat(1025) }, param);
        assert.equal(message, `${param} is longer than 1024 bytes`);
        await passes(defaults, path, { [param]: 'x'.repeat(1024) });
        await refused(tight, path, { [param]: 'x'.repeat(33) }, param);
        await passes(tight, path, { [param]: 'x'.repeat(32) });
      });
    }
    test('bytes are counted in UTF-8, not characters', async () => {
      const { path } = LIMIT_PATHS.completions;
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
      for (const { path } of Object.values(LIMIT_PATHS)) {
        const message = await refused(defaults, path, { [param]: huge }, param);
        assert.ok(!message.includes('yyyy'), message.slice(0, 80));
      }
    });
    test('absent or null passes', async () => {
      await passes(defaults, LIMIT_PATHS.completions.path, { [param]: null });
      await passes(defaults, LIMIT_PATHS.chat.path, { [param]: undefined });
    });
  });
}

test('a user that is not a string is refused, as the engines’ user: Optional[str] refuses it', async () => {
  for (const user of [5, true, {}, ['u'], { toString: 1 }]) {
    const message = await refused(defaults, LIMIT_PATHS.completions.path, { user }, 'user');
    assert.match(message, /^user must be a string/);
  }
  await refused(defaults, LIMIT_PATHS.chat.path, { user: 0 }, 'user');
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
