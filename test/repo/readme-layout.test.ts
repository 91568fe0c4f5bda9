import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

// The README's Layout section is how a newcomer finds their way: it names every top-level
// folder and every folder of src/, and names nothing that is not there.

const root = fileURLToPath(new URL('../../', import.meta.url));
/** Folders that are not part of the repository: installed, built, or git's own. */
const NOT_TRACKED = new Set(['.git', 'node_modules', 'dist', '.test-build']);

function layoutSection(): string {
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const start = readme.indexOf('\n## Layout\n');
  assert.ok(start >= 0, 'README.md has a "## Layout" section');
  const end = readme.indexOf('\n## ', start + 1);
  return readme.slice(start, end < 0 ? undefined : end);
}

const dirs = (path: string) =>
  readdirSync(join(root, path), { withFileTypes: true })
    .filter((d) => d.isDirectory() && !NOT_TRACKED.has(d.name))
    .map((d) => d.name);

test('the README Layout names every top-level folder', () => {
  const layout = layoutSection();
  const missing = dirs('.').filter((d) => !layout.includes(`\`${d}/`));
  assert.deepEqual(missing, [], 'top-level folders missing from the Layout section (as `name/`)');
});

test('the README Layout names every folder of src/', () => {
  const layout = layoutSection();
  const missing = dirs('src').filter((d) => !layout.includes(`\`src/${d}\``) && !layout.includes(`\`src/${d}/`));
  assert.deepEqual(missing, [], 'src/ folders missing from the Layout section (as `src/name`)');
});

test('every path the README Layout names exists', () => {
  // every backticked path (it has a slash): `src/core/router`, `bench/`, `.ci/run`
  const named = [...layoutSection().matchAll(/`(\.?[\w-]+\/[\w./-]*)`/g)].map((m) => m[1]);
  assert.ok(named.length >= 20, `the Layout names the tree (${named.length} paths found)`);
  const stale = named.filter((p) => !existsSync(join(root, p)));
  assert.deepEqual(stale, [], 'paths in the Layout section that are not in the tree');
});

test('a file the Layout names as a folder is a folder', () => {
  for (const m of layoutSection().matchAll(/`((?:\.?[\w-]+\/)*\.?[\w-]+)\/`/g)) {
    const path = join(root, m[1]);
    assert.ok(existsSync(path) && statSync(path).isDirectory(), `${m[1]}/ is a folder`);
  }
});
