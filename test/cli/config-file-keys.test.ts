import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { readConfigFile } from '../../src/cli/config/resolve.js';
import { kebab, SERVE_SCHEMA } from '../../src/cli/config/settings.js';

const doc = readFileSync(new URL('../../docs/configuration.md', import.meta.url), 'utf8');
const dir = mkdtempSync(join(tmpdir(), 'cf-config-keys-'));

/** The config-file keys the settings table lists for each flag. */
function documentedKeys(): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const m of doc.matchAll(/^\| `--([a-z0-9-]+)[^`]*` \| `[^`]*` \| ([^|]*) \|/gm))
    out.set(
      m[1],
      [...m[2].matchAll(/`([^`]+)`/g)].map((k) => k[1]),
    );
  return out;
}

/** Whether the config file takes `key` (dotted: under that mapping) as the setting. */
function takes(key: string, setting: string): boolean {
  const [outer, inner] = key.split('.');
  const file = join(dir, `${key}.yaml`);
  writeFileSync(file, inner === undefined ? `${outer}: 1\n` : `${outer}:\n  ${inner}: 1\n`);
  try {
    return readConfigFile(file, SERVE_SCHEMA.shape).has(setting);
  } catch {
    return false;
  }
}

test('the settings table lists exactly the config-file keys the file takes', () => {
  const documented = documentedKeys();
  assert.ok(documented.size > 50, `only ${documented.size} rows read from the table`);
  for (const setting of Object.keys(SERVE_SCHEMA.shape)) {
    const flag = kebab(setting);
    const keys = documented.get(flag) ?? [];
    for (const key of keys) assert.ok(takes(key, setting), `${flag}: the table lists ${key}, which the file refuses`);
    for (const key of [flag, setting, `router.${setting}`])
      if (takes(key, setting)) assert.ok(keys.includes(key), `${flag}: the file takes ${key}, which the table omits`);
    assert.equal(new Set(keys).size, keys.length, `${flag}: a key is listed twice`);
  }
});
