import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Client } from 'undici';
import { until } from '../helpers/wait.js';
import {
  childPids,
  clients,
  closeServeProcesses,
  startServe,
  TWO_PROCESSES_QUIET,
} from '../helpers/serve-processes.js';

after(closeServeProcesses);

const dirs: string[] = [];
after(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const security = readFileSync(new URL('../../docs/security.md', import.meta.url), 'utf8');

/** The "The admin token" section of docs/security.md. */
function adminTokenSection(): string {
  const start = security.indexOf('## The admin token');
  assert.ok(start >= 0, 'docs/security.md has a section "The admin token"');
  const end = security.indexOf('\n## ', start + 1);
  return security.slice(start, end < 0 ? undefined : end).replace(/\s+/g, ' ');
}

const FIRST = 'first-admin-token';
const SECOND = 'second-admin-token';

/** A token file (mode 0600) holding FIRST, in a directory removed after the tests. */
function tokenFile(): string {
  const dir = mkdtempSync(join(tmpdir(), 'admin-token-rotation-'));
  dirs.push(dir);
  const file = join(dir, 'token');
  writeFileSync(file, `${FIRST}\n`, { mode: 0o600 });
  return file;
}

/** `serve` taking its admin token from `file` only: the helper's variable is left out (spawn skips an undefined one). */
function serveWithTokenFile(file: string, args: string[]) {
  const noVariable = { CONTEXTFORGE_ADMIN_TOKEN: undefined } as unknown as Record<string, string>;
  return startServe([...args, '--admin-token-file', file], noVariable);
}

/** The status GET /admin/workers gets with `token` on `client` (one connection: one process). */
async function statusWith(client: Client, token: string): Promise<number> {
  const res = await client.request({
    path: '/admin/workers',
    method: 'GET',
    headers: { authorization: `Bearer ${token}` },
  });
  await res.body.text();
  return res.statusCode;
}

/** Which gateway process a connection landed on (its replica id in /admin/stats). */
async function processOf(client: Client, token: string): Promise<string> {
  const res = await client.request({
    path: '/admin/stats',
    method: 'GET',
    headers: { authorization: `Bearer ${token}` },
  });
  assert.equal(res.statusCode, 200);
  const stats = (await res.body.json()) as { state: { replicaId: string } };
  return stats.state.replicaId;
}

/** One kept-alive connection on each of the two processes of `serve --processes 2`. */
async function onEachProcess(base: string, token: string): Promise<Client[]> {
  const byProcess = new Map<string, Client>();
  const deadline = Date.now() + 30_000;
  while (byProcess.size < 2) {
    assert.ok(Date.now() < deadline, 'every connection went to one process');
    const c = new Client(base, { pipelining: 1 });
    clients.push(c);
    const p = await processOf(c, token);
    if (!byProcess.has(p)) byProcess.set(p, c);
  }
  return [...byProcess.values()];
}

/** Waits until every connection accepts `token`, then checks `refused` is refused on each. */
async function rotated(connections: Client[], token: string, refused: string): Promise<void> {
  for (const c of connections) {
    await until(async () => (await statusWith(c, token)) === 200, `the token ${token} to be accepted`);
    assert.equal(await statusWith(c, refused), 401);
  }
}

function hangUp(child: ChildProcess): void {
  assert.ok(child.kill('SIGHUP'));
}

test('serve: SIGHUP re-reads the admin token file; the old token is refused, a bad file keeps the current one', async () => {
  const file = tokenFile();
  const { child, base, output } = await serveWithTokenFile(file, ['--port', '0', '--health-interval-ms', '0']);
  const client = new Client(base);
  clients.push(client);
  assert.equal(await statusWith(client, FIRST), 200);
  assert.equal(await statusWith(client, SECOND), 401);

  writeFileSync(file, `${SECOND}\n`);
  hangUp(child);
  await rotated([client], SECOND, FIRST);
  await until(() => /SIGHUP: admin token reloaded from /.test(output()), 'the reload to be logged');

  // files refused on reload: each logs one line naming the file and why, the current token stays
  const refusals: Array<[() => void, RegExp]> = [
    [() => writeFileSync(file, ''), /is empty/],
    [() => writeFileSync(file, 'short\n'), /at least 8 characters/],
    [
      () => {
        writeFileSync(file, 'third-admin-token\n');
        chmodSync(file, 0o644);
      },
      /is readable by others/,
    ],
    [() => rmSync(file), /does not exist/],
  ];
  for (const [breakFile, reason] of refusals) {
    const before = output()
      .split('\n')
      .filter((l) => l.includes('not reloaded')).length;
    breakFile();
    hangUp(child);
    await until(
      () =>
        output()
          .split('\n')
          .filter((l) => l.includes('not reloaded')).length ===
        before + 1,
      `a refusal (${reason.source}) to be logged`,
    );
    const line = output()
      .split('\n')
      .filter((l) => l.includes('not reloaded'))
      .at(-1)!;
    assert.match(line, reason);
    assert.ok(line.includes(file), line);
    assert.ok(!line.includes(SECOND) && !line.includes('third-admin-token'), line);
    assert.equal(await statusWith(client, SECOND), 200);
    assert.equal(await statusWith(client, 'third-admin-token'), 401);
  }
  assert.equal(child.exitCode, null, 'SIGHUP does not end serve');
  assert.doesNotMatch(output(), new RegExp(`${FIRST}|${SECOND}`), 'no token is logged');
});

test('serve with a token from the environment: SIGHUP says it cannot be re-read, and serve goes on', async () => {
  const { child, base, output } = await startServe(['--port', '0', '--health-interval-ms', '0'], {
    CONTEXTFORGE_ADMIN_TOKEN: FIRST,
  });
  hangUp(child);
  await until(() => /SIGHUP: .*cannot be re-read/.test(output()), 'the line saying so');
  const client = new Client(base);
  clients.push(client);
  assert.equal(await statusWith(client, FIRST), 200);
  assert.equal(child.exitCode, null);
});

test('serve --processes 2: SIGHUP to the primary hands the new token to every process, and to one started later', async () => {
  const file = tokenFile();
  const { child, base, output } = await serveWithTokenFile(file, TWO_PROCESSES_QUIET);
  const connections = await onEachProcess(base, FIRST);

  writeFileSync(file, `${SECOND}\n`);
  hangUp(child);
  await rotated(connections, SECOND, FIRST);
  assert.equal(output().match(/SIGHUP: admin token reloaded/g)?.length, 1, 'the primary logs the reload once');

  // a bad file: every process keeps the current token
  writeFileSync(file, '');
  hangUp(child);
  await until(() => /not reloaded, the current one stays: .*is empty/.test(output()), 'the refusal to be logged');
  for (const c of connections) assert.equal(await statusWith(c, SECOND), 200);

  // a process started after the reload (in place of one killed) gets the current token
  const [victim] = childPids(child);
  process.kill(victim, 'SIGKILL');
  await until(() => /starting another/.test(output()), 'the replacement to start', { timeoutMs: 30_000 });
  await until(() => (output().match(/contextforge-router process /g)?.length ?? 0) >= 3, 'the replacement to serve', {
    timeoutMs: 30_000,
  });
  await rotated(await onEachProcess(base, SECOND), SECOND, FIRST);

  // a SIGHUP sent to a gateway process itself ends nothing
  const [one] = childPids(child);
  process.kill(one, 'SIGHUP');
  await until(() => /a gateway process reloads nothing/.test(output()), 'the process to say so');
  for (const c of await onEachProcess(base, SECOND)) assert.equal(await statusWith(c, SECOND), 200);
  assert.equal(child.exitCode, null);
});

test('docs/security.md says SIGHUP re-reads the token file', () => {
  const section = adminTokenSection();
  assert.match(section, /SIGHUP re-reads the token file/);
  assert.match(section, /only the new token is accepted/);
  assert.match(section, /keeps the current token/);
  assert.doesNotMatch(section, /takes a restart/);
});
