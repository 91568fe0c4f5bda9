import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { serveAdminToken } from '../../src/cli/commands/serve-processes.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';

const security = readFileSync(new URL('../../docs/security.md', import.meta.url), 'utf8');

/** The "The admin token" section of docs/security.md. */
function adminTokenSection(): string {
  const start = security.indexOf('## The admin token');
  assert.ok(start >= 0, 'docs/security.md has a section "The admin token"');
  const end = security.indexOf('\n## ', start + 1);
  return security.slice(start, end < 0 ? undefined : end).replace(/\s+/g, ' ');
}

test('the admin token file is read once, at start, and docs/security.md says rotating it takes a restart', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'admin-token-rotation-'));
  const file = join(dir, 'token');
  writeFileSync(file, 'first-admin-token\n', { mode: 0o600 });
  const admin = serveAdminToken({ adminTokenFile: file });
  assert.equal(admin.token, 'first-admin-token');
  const gateway = await createGateway({ router: new KVAwareRouter(), adminToken: admin.token, tokenize: 'text' });
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const workers = (token: string) =>
      fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${token}` } }).then((r) => r.status);
    writeFileSync(file, 'second-admin-token\n', { mode: 0o600 });
    // what the documentation below describes: the running gateway keeps the token it started with
    assert.equal(await workers('first-admin-token'), 200);
    assert.equal(await workers('second-admin-token'), 401);
  } finally {
    await gateway.close();
    rmSync(dir, { recursive: true, force: true });
  }
  const section = adminTokenSection();
  assert.match(section, /The token is read once, at start/);
  assert.match(section, /Rotating the token — revoking a leaked one — takes a restart/);
  assert.match(section, /--processes N` the primary reads the token/);
  assert.match(section, /SIGHUP reloads nothing/);
});
