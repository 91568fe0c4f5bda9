import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { AdminToken, resolveAdminToken } from '../../src/server/admin-auth.js';
import { serveAdminToken } from '../../src/cli/commands/serve-processes.js';
import { CLI } from '../helpers/cli-entry.js';

const dir = mkdtempSync(join(tmpdir(), 'cf-token-source-'));

function cli(args: string[], env: Record<string, string> = {}) {
  const inherited = { ...process.env };
  delete inherited.CONTEXTFORGE_ADMIN_TOKEN;
  return spawnSync(process.execPath, [...CLI, ...args], {
    encoding: 'utf8',
    // a serve that starts would run until killed
    timeout: 30_000,
    env: { ...inherited, ...env },
  });
}

function tokenFile(name: string, text: string): string {
  const file = join(dir, name);
  writeFileSync(file, text, { mode: 0o600 });
  return file;
}

test('an admin token an Authorization header cannot carry is refused, naming where it came from', () => {
  for (const bad of [
    'abcdefgh\nijklmnop',
    'abcdefgh\tijklmnop',
    'abcd efgh ijkl',
    'tökenwithumlaut',
    'abcdefgh\u0000x',
  ])
    assert.throws(() => new AdminToken(bad), /visible ASCII/, JSON.stringify(bad));
  assert.doesNotThrow(() => new AdminToken('A-z0-9._~+/=!#$%&*@^|'));
  const env = cli(['serve', '--print-config'], { CONTEXTFORGE_ADMIN_TOKEN: 'abcdefgh\nijklmnop' });
  assert.equal(env.status, 2, env.stderr);
  assert.match(env.stderr, /^error: CONTEXTFORGE_ADMIN_TOKEN must hold visible ASCII characters only/m);
  assert.doesNotMatch(env.stderr, /abcdefgh|ijklmnop/);
  const flag = cli(['serve', '--print-config', '--admin-token', 'abcdefgh\rijklmnop']);
  assert.equal(flag.status, 2, flag.stderr);
  assert.match(flag.stderr, /^error: --admin-token must hold visible ASCII characters only/m);
  const file = tokenFile('two-lines', 'abcdefgh\nijklmnop\n');
  assert.throws(
    () => resolveAdminToken({ tokenFile: file }),
    (err: Error) => err.message.startsWith(`--admin-token-file ${file}: `) && /visible ASCII/.test(err.message),
  );
  const served = cli(['serve', '--port', '0', '--admin-token-file', file]);
  assert.equal(served.status, 2, served.stderr);
  assert.match(served.stderr, /^error: --admin-token-file .*two-lines: the admin token must hold visible ASCII/m);
  assert.doesNotMatch(served.stderr, /ijklmnop/);
});

test('a named token file is created in a directory made 0700; a failure names that file; a blank one is refused, not replaced', () => {
  // with createDirectory false (a file another process just linked in place), no directory is made
  const missing = join(dir, 'no-such-dir', 'admin-token');
  assert.throws(() => resolveAdminToken({ tokenFile: missing, createDirectory: false }), /--admin-token-file .*ENOENT/);
  assert.equal(existsSync(join(dir, 'no-such-dir')), false);
  // serve makes a named file's missing directories, mode 0700, as it does for the default file
  const named = join(dir, 'other-missing', 'deeper', 'admin-token');
  assert.equal(serveAdminToken({ adminTokenFile: named }).origin, 'generated');
  assert.equal(statSync(join(dir, 'other-missing')).mode & 0o777, 0o700);
  assert.equal(statSync(join(dir, 'other-missing', 'deeper')).mode & 0o777, 0o700);
  assert.equal(statSync(named).mode & 0o777, 0o600);
  assert.equal(resolveAdminToken({ tokenFile: named }).origin, 'file');
  // a file that cannot be written is named as given, never by the temporary file written first
  const blocker = tokenFile('a-file', 'x');
  const under = cli(['serve', '--port', '0', '--admin-token-file', join(blocker, 'admin-token')]);
  assert.equal(under.status, 2, under.stderr);
  assert.match(under.stderr, /^error: --admin-token-file .*a-file\/admin-token: .*ENOTDIR/m);
  const long = join(dir, 'x'.repeat(250));
  assert.throws(
    () => resolveAdminToken({ tokenFile: long }),
    (err: Error) =>
      err.message.startsWith(`--admin-token-file ${dir}/xxx`) &&
      err.message.endsWith(': cannot write: ENAMETOOLONG: name too long') &&
      !err.message.includes('.tmp'),
  );
  // in a directory that exists, a missing file is still created with a new token
  const fresh = resolveAdminToken({ tokenFile: join(dir, 'fresh'), createDirectory: false });
  assert.equal(fresh.origin, 'generated');
  for (const [name, text] of [
    ['empty', ''],
    ['blank', ' \n\t\n'],
  ]) {
    const file = tokenFile(name, text);
    assert.throws(() => resolveAdminToken({ tokenFile: file }), /--admin-token-file .* is empty/, name);
    assert.equal(readFileSync(file, 'utf8'), text, `${name} is left as it was`);
  }
});
