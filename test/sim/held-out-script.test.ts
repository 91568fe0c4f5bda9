import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));
const README_FILE = join(root, 'bench/results/held-out.json');

/** bench/held-out.ts with the given arguments, from the repository's root. */
const heldOut = (...args: string[]) =>
  spawnSync(process.execPath, ['--import', 'tsx', 'bench/held-out.ts', ...args], { cwd: root, encoding: 'utf8' });

describe('bench:held-out', () => {
  test("--policies other than the defaults without --out is refused before any run, the README's file untouched", () => {
    const before = readFileSync(README_FILE, 'utf8');
    for (const policies of ['cost,smg', 'cost,seed,dynamo,sglang,llmd,llmd-affinity,smg,round-robin']) {
      const r = heldOut('--policies', policies, '--only', 'tenants');
      assert.equal(r.status, 2, r.stderr);
      assert.match(r.stderr, /--policies other than the defaults .* needs --out/);
      assert.equal(r.stdout, '');
    }
    assert.equal(readFileSync(README_FILE, 'utf8'), before);
  });

  test("--only without --out is refused before any run, the README's file untouched", () => {
    const before = readFileSync(README_FILE, 'utf8');
    const r = heldOut('--only', 'tenants');
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /--only needs --out/);
    assert.equal(r.stdout, '');
    assert.equal(readFileSync(README_FILE, 'utf8'), before);
  });

  test('with --out, another set of policies goes past the check', () => {
    const dir = mkdtempSync(join(tmpdir(), 'held-out-'));
    try {
      // an unknown shape stops it after the flags are taken, before any run
      const r = heldOut('--policies', 'cost,smg', '--out', join(dir, 'held-out.json'), '--only', 'no-such-shape');
      assert.notEqual(r.status, 0);
      assert.match(r.stderr, /--only: no shape 'no-such-shape'/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
