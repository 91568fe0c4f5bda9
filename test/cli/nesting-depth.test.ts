import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { loadApiKeysFile } from '../../src/server/api-keys.js';
import { CLI } from '../helpers/cli-entry.js';
import { resolveServe } from '../helpers/serve-config.js';

function cli(args: string[], env: Record<string, string> = {}) {
  return spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8', env: { ...process.env, ...env } });
}

/** Lists `n` deep: far past what the YAML parser's recursion follows at 30,000. */
const deepList = (n: number) => `${'['.repeat(n)}${']'.repeat(n)}`;
const deepMapping = (n: number) => `${'{"a":'.repeat(n)}1${'}'.repeat(n)}`;

test('a mapping or list flag nested too deeply names the flag and the depth bound, not a stack overflow', () => {
  for (const [flag, value] of [
    ['--cost-weights', deepList(30_000)],
    ['--cost-weights', deepMapping(20_000)],
    ['--policy-options', deepMapping(20_000)],
    ['--judge-roles', deepList(30_000)],
  ] as const) {
    const r = cli(['serve', flag, value, '--print-config']);
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, new RegExp(`${flag}: nested more than 64 levels deep \\(line 1, column \\d+\\)\\n$`));
    assert.doesNotMatch(r.stderr, /call stack/);
  }
  // its variable too
  const env = cli(['serve', '--print-config'], { CONTEXTFORGE_COST_WEIGHTS: deepList(30_000) });
  assert.equal(env.status, 2, env.stderr);
  assert.match(env.stderr, /from env 'CONTEXTFORGE_COST_WEIGHTS'.*--cost-weights: nested more than 64 levels deep/);
  // a syntax error is still reported as one, with what the flag takes
  assert.throws(
    () => resolveServe(['--cost-weights', '{recompute: 2']),
    /--cost-weights must be a mapping such as '\{"key": 1\}': Flow map must end with a \}/,
  );
  assert.deepEqual(resolveServe(['--cost-weights', '{recompute: 2}']).config.costWeights, { recompute: 2 });
});

test('a config file or API keys file nested too deeply names the file, the bound and the line', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cfr-depth-'));
  try {
    const yaml = join(dir, 'router.yaml');
    writeFileSync(yaml, `port: 8080\ncost-weights: ${deepList(30_000)}\n`);
    const r = cli(['serve', '--config', yaml, '--print-config']);
    assert.equal(r.status, 2, r.stderr);
    assert.equal(r.stderr, `error: --config ${yaml}: nested more than 64 levels deep (line 2, column 78)\n`);
    const json = join(dir, 'router.json');
    writeFileSync(json, `{"router": {"costWeights": ${deepMapping(20_000)}}}`);
    assert.throws(
      () => resolveServe(['--config', json]),
      new RegExp(`^RangeError: --config ${json}: nested more than 64 levels deep \\(line 1, column \\d+\\)$`),
    );
    const keys = join(dir, 'keys.yaml');
    writeFileSync(keys, `sk-live-0123456789abcdef: ${deepList(30_000)}\n`);
    chmodSync(keys, 0o600);
    assert.throws(
      () => loadApiKeysFile(keys),
      new RegExp(`^RangeError: --api-keys-file ${keys}: nested more than 64 levels deep \\(line 1, column \\d+\\)$`),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
