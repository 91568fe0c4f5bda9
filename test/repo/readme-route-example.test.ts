import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';

// The README's route() snippet is what a newcomer copies: it must run as written, every name it
// uses defined in it (examples/route.ts is the same code with its output printed).

const root = fileURLToPath(new URL('../../', import.meta.url));

function routeSnippet(): string {
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const section = readme.indexOf('\n### `route()`\n');
  assert.ok(section >= 0, 'README.md has a "### `route()`" section');
  const start = readme.indexOf('```ts\n', section);
  const end = readme.indexOf('\n```', start + 1);
  assert.ok(start >= 0 && end > start, 'the route() section has a ts code block');
  return readme.slice(start + '```ts\n'.length, end);
}

test("the README's route() snippet runs as written, against the package's source", () => {
  const snippet = routeSnippet();
  assert.match(snippet, /from 'contextforge-router';/);
  const source = pathToFileURL(join(root, 'src/index.ts')).href;
  const dir = mkdtempSync(join(tmpdir(), 'readme-route-'));
  try {
    const file = join(dir, 'snippet.ts');
    writeFileSync(file, snippet.replace("from 'contextforge-router';", `from '${source}';`));
    const r = spawnSync(process.execPath, ['--import', 'tsx', file], { encoding: 'utf8', cwd: root });
    assert.equal(r.status, 0, r.stderr);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
