import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { KVAwareRouter } from '../../src/index.js';

// The README's getStats() comment is the list a newcomer reads of what the router reports: it
// names every key getStats() returns, and those of a worker's load and of the index.

const root = fileURLToPath(new URL('../../', import.meta.url));

/** The `// …` comment that follows `router.getStats();` in the README, over its continuation lines. */
function statsComment(): string {
  const lines = readFileSync(join(root, 'README.md'), 'utf8').split('\n');
  const first = lines.findIndex((l) => /^router\.getStats\(\);\s*\/\//.test(l));
  assert.ok(first >= 0, 'README.md has a `router.getStats(); // …` line');
  const parts = [lines[first].slice(lines[first].indexOf('//') + 2)];
  for (let i = first + 1; i < lines.length && /^\s+\/\//.test(lines[i]); i++)
    parts.push(lines[i].replace(/^\s+\/\//, ''));
  return parts.join(' ');
}

test("the README's getStats() comment names every key getStats() returns", () => {
  const router = new KVAwareRouter();
  router.registerWorker('gpu-0');
  const stats = router.getStats();
  const named = new Set(statsComment().match(/[A-Za-z]\w*/g));
  const keys = [...Object.keys(stats), ...Object.keys(stats.workerLoads['gpu-0']), ...Object.keys(stats.index)];
  const missing = keys.filter((k) => !named.has(k));
  assert.deepEqual(missing, [], 'keys getStats() returns that the README comment does not name');
});
