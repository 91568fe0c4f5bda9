import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { benchScript, inTempDir as inTemp } from '../helpers/bench-script.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const README_FILE = join(root, 'bench/results/held-out.json');

/**
 * bench/held-out.ts with the given arguments, from the repository's root. Refusals come before
 * any run; the deadline stops one that would take a flag and start the runs anyway.
 */
const heldOut = (...args: string[]) => benchScript('bench/held-out.ts', ...args);

/** Exit status 2 and one `error:` line matching `message`, no stack trace, nothing run. */
function assertRefused(r: ReturnType<typeof heldOut>, message: RegExp): void {
  assert.equal(r.status, 2, `status ${r.status} (signal ${r.signal}): ${r.stderr}`);
  assert.match(r.stderr, message);
  assert.doesNotMatch(r.stderr, /^\s+at /m);
  assert.equal(r.stdout, '');
}

/**
 * Runs `check` with a new temporary directory, removed after. The refusals' checks give `--out`
 * there and `--only tenants`: should the script take a bad flag and start the runs, the README's
 * file stays as it is and the runs are short.
 */
const inTempDir = (check: (dir: string) => void) => inTemp('held-out-', check);
const tenantsTo = (dir: string) => ['--out', join(dir, 'held-out.json'), '--only', 'tenants'];

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

  test('with --out, another set of policies goes past the check', () =>
    inTempDir((dir) => {
      // an unknown shape stops it after the flags are taken, before any run
      const r = heldOut('--policies', 'cost,smg', '--out', join(dir, 'held-out.json'), '--only', 'no-such-shape');
      assert.notEqual(r.status, 0);
      assert.match(r.stderr, /--only: no shape 'no-such-shape'/);
    }));

  test('an unknown flag is refused, naming it and the flags there are', () =>
    inTempDir((dir) =>
      assertRefused(
        heldOut('--polices', 'cost', ...tenantsTo(dir)),
        /^error: unknown flag --polices \(--out, --only, --policies\)/,
      ),
    ));

  test('--policies without its value is refused', () =>
    inTempDir((dir) => {
      assertRefused(heldOut(...tenantsTo(dir), '--policies'), /^error: --policies needs a value/);
      assertRefused(heldOut('--policies', ...tenantsTo(dir)), /^error: --policies needs a value/);
    }));

  test('a stray argument is refused, naming it', () =>
    inTempDir((dir) => {
      assertRefused(heldOut(...tenantsTo(dir), 'stray'), /^error: unexpected argument 'stray'/);
      assertRefused(heldOut('stray', ...tenantsTo(dir)), /^error: unexpected argument 'stray'/);
    }));

  test('--only with an unknown shape is refused, naming the shapes there are', () =>
    inTempDir((dir) =>
      assertRefused(
        heldOut('--out', join(dir, 'held-out.json'), '--only', 'tenants,nope'),
        /^error: --only: no shape 'nope' \(hot-prefixes, /,
      ),
    ));

  test('--policies with an unknown policy is refused, naming the policies there are', () =>
    inTempDir((dir) =>
      assertRefused(
        heldOut(...tenantsTo(dir), '--policies', 'cost,nope'),
        /^error: --policies must name some of cost, /,
      ),
    ));

  test('an --out that cannot be written is refused, naming it', () =>
    inTempDir((dir) =>
      assertRefused(
        heldOut('--out', join(dir, 'no-such-dir', 'held-out.json'), '--only', 'tenants'),
        /^error: --out .*held-out\.json: cannot write: /,
      ),
    ));
});
