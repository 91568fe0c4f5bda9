import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

test('the embedded wasm module matches its .wat source', () => {
  const script = fileURLToPath(new URL('../../scripts/build-wasm.mjs', import.meta.url));
  const root = fileURLToPath(new URL('../..', import.meta.url));
  const r = spawnSync(process.execPath, [script, '--check'], { cwd: root, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
});
