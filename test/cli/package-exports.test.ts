import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { test } from 'node:test';

// `npm test` builds first (pretest), so the package's own name resolves through "exports" to dist/.
test("import { KVAwareRouter } from 'contextforge-router' works after the build", async () => {
  assert.ok(existsSync(new URL('../../dist/index.js', import.meta.url)), 'run npm run build first');
  const mod = await import('contextforge-router');
  const router = new mod.KVAwareRouter({ policy: 'seed' });
  router.registerWorker('w1');
  const d = await router.selectWorker('anchor');
  assert.equal(d.targetWorkerId, 'w1');
  assert.equal(d.preRope, true);
});
