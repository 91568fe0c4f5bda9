import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { eppSettingsTable, settingsTable } from '../../src/cli/config/doc-table.js';
import { EPP_SCHEMA, kebab, SERVE_SCHEMA } from '../../src/cli/config/settings.js';

const doc = readFileSync(new URL('../../docs/configuration.md', import.meta.url), 'utf8');

test('docs/configuration.md lists exactly the settings of the schema', () => {
  const documented = [...doc.matchAll(/^\| `--([a-z0-9-]+)[ `]/gm)].map((m) => m[1]);
  const declared = [...new Set([...Object.keys(SERVE_SCHEMA.shape), ...Object.keys(EPP_SCHEMA.shape)])].map(kebab);
  assert.deepEqual(
    documented.filter((f) => !declared.includes(f)),
    [],
    'documented but not in the schema',
  );
  assert.deepEqual(
    declared.filter((f) => !documented.includes(f)),
    [],
    'in the schema but not documented',
  );
  // defaults and help too: the table is the generated one (npm run docs:config rewrites it)
  assert.ok(doc.includes(settingsTable()), 'docs/configuration.md is out of date: run npm run docs:config');
  assert.ok(
    doc.includes(eppSettingsTable()),
    "docs/configuration.md's epp table is out of date: run npm run docs:config",
  );
});
