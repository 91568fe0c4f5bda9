import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { CLI } from '../helpers/cli-entry.js';

// The README says `npm run demo:core` is deterministic and shows what it prints: the table and the
// token hit rates over seeds 1, 2, 3 and 7 must be what the demo prints today, or a newcomer who
// runs it reads other figures than the README's.

const root = fileURLToPath(new URL('../../', import.meta.url));
const readme = readFileSync(join(root, 'README.md'), 'utf8');

function demo(...args: string[]): string {
  const r = spawnSync(process.execPath, [...CLI, 'demo', ...args], { encoding: 'utf8', cwd: root });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout;
}

test("the README's demo table is what `demo` prints (seed 7)", () => {
  const printed = demo().split('\n');
  for (const policy of ['seed', 'cost']) {
    const row = new RegExp(`^${policy} +320 .*$`, 'm');
    const inReadme = readme.match(row);
    assert.ok(inReadme, `README.md has the demo's ${policy} row`);
    assert.ok(printed.includes(inReadme[0]), `README row\n${inReadme[0]}\nnot printed by demo:\n${printed.join('\n')}`);
  }
});

test("the README's token hit rates over seeds 1, 2, 3 and 7 are what `demo --seed N` prints", () => {
  const sentence = readme.replace(/\s+/g, ' ').match(/higher token hit rate every time \(([^)]*)\)/);
  assert.ok(sentence, 'README.md gives the token hit rates over the four seeds');
  const pairs = sentence[1].split(', ');
  assert.equal(pairs.length, 4);
  [1, 2, 3, 7].forEach((seed, i) => {
    const out = JSON.parse(demo('--seed', String(seed), '--json')) as {
      results: Array<{ policy: string; tokenHitRatio: number }>;
    };
    const rate = (p: string) => `${(out.results.find((r) => r.policy === p)!.tokenHitRatio * 100).toFixed(1)}%`;
    assert.equal(pairs[i], `${rate('seed')} → ${rate('cost')}`, `seed ${seed}`);
  });
});
