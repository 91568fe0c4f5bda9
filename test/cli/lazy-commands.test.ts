import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const main = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
const preload = fileURLToPath(new URL('../helpers/loaded-packages.ts', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'cf-lazy-'));

/** The gateway's, the shared state's, the KV events' and the endpoint picker's packages. */
const RUNTIME = ['fastify', 'ioredis', 'zeromq', '@grpc/grpc-js', 'prom-client', 'undici'];

/** Runs the CLI; its exit status, its output and the packages it loaded. */
function cli(args: string[]) {
  const file = join(dir, `${args.join('_').replace(/[^\w-]/g, '')}.txt`);
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--import', preload, main, ...args], {
    encoding: 'utf8',
    env: { ...process.env, LOADED_PACKAGES_FILE: file },
    timeout: 120_000,
  });
  return { ...r, packages: readFileSync(file, 'utf8').split('\n') };
}

test('help, a command that prints its settings and a usage error load none of the runtime the commands run on', () => {
  for (const args of [
    ['--help'],
    ['simulate', '--help'],
    ['serve', '--help'],
    ['serve', '--print-config'],
    ['epp', '--print-config'],
    ['mock-engine', '--port', 'x'],
  ]) {
    const r = cli(args);
    assert.equal(r.status, args[1] === '--port' ? 2 : 0, r.stderr);
    assert.deepEqual(
      RUNTIME.filter((p) => r.packages.includes(p)),
      [],
      args.join(' '),
    );
  }
});

test('a command loads what it runs on when it runs', () => {
  // the gateway's settings resolved, then the gateway started: a port that cannot be taken stops it
  const r = cli(['serve', '--host', '256.0.0.1', '--port', '1']);
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /--host 256\.0\.0\.1 --port 1: cannot listen/);
  assert.ok(r.packages.includes('fastify'), r.packages.join(' '));
});
