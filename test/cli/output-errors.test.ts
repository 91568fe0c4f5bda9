import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { CLI } from '../helpers/cli-entry.js';

/** A command whose standard output is `stdout`: a pipe closed at once (no reader), or a file descriptor. */
async function run(
  args: string[],
  stdout: 'closed-pipe' | number,
): Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }> {
  const child = spawn(process.execPath, [...CLI, ...args], {
    stdio: ['ignore', stdout === 'closed-pipe' ? 'pipe' : stdout, 'pipe'],
  });
  // the reader goes away before the command writes, as `| true` or `| head -0` does
  if (stdout === 'closed-pipe') child.stdout!.destroy();
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const deadline = setTimeout(() => child.kill('SIGKILL'), 120_000);
  try {
    const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
      child.once('close', (c, s) => resolve([c, s])),
    );
    return { code, signal, stderr };
  } finally {
    clearTimeout(deadline);
  }
}

const commands: string[][] = [
  ['demo', '--workflows', '2'],
  ['simulate', '--trace', 'workflows:3', '--workers', '2', '--policies', 'cost', '--no-progress'],
  ['tune', '--trace', 'workflows:2', '--workers', '2', '--trials', '1'],
  ['serve', '--print-config'],
];

test('a reader that went away ends every command quietly, status 0', async () => {
  for (const args of commands) {
    const r = await run(args, 'closed-pipe');
    assert.equal(r.signal, null, `${args[0]}: ${r.stderr}`);
    assert.equal(r.stderr, '', `${args[0]}: nothing on stderr`);
    assert.equal(r.code, 0, args[0]);
  }
});

test(
  'an output that cannot be written is one line naming it and the cause, status 2',
  { skip: !existsSync('/dev/full') },
  async () => {
    for (const args of commands) {
      const full = openSync('/dev/full', 'w');
      try {
        const r = await run(args, full);
        assert.equal(r.signal, null, `${args[0]}: ${r.stderr}`);
        assert.equal(
          r.stderr,
          'error: standard output: cannot write: ENOSPC: no space left on device, write\n',
          args[0],
        );
        assert.equal(r.code, 2, args[0]);
      } finally {
        closeSync(full);
      }
    }
  },
);

/**
 * A command whose standard output is a pipe (the shell's: Node's own stdio pipes are sockets,
 * which /dev/stdout cannot open) read by `head -c1`, which closes it after one byte while the
 * command still writes. Its status and stderr are kept in files, as a pipeline shows neither.
 */
function underHead(args: string[], dir: string): { code: number; stderr: string; read: string } {
  const status = join(dir, 'status');
  const errors = join(dir, 'stderr');
  const r = spawnSync(
    'sh',
    ['-c', '{ "$0" "$@" 2>"$ERRORS"; echo $? >"$STATUS"; } | head -c1', process.execPath, ...CLI, ...args],
    { encoding: 'utf8', env: { ...process.env, STATUS: status, ERRORS: errors }, timeout: 120_000 },
  );
  return { code: Number(readFileSync(status, 'utf8')), stderr: readFileSync(errors, 'utf8'), read: r.stdout };
}

test('a reader that stops part way through an output written to /dev/stdout by name ends the command quietly, status 0', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cfr-head-'));
  try {
    const report = join(dir, 'report.html');
    const r = underHead(
      [
        'simulate',
        '--trace',
        'workflows:300',
        '--workers',
        '4',
        '--no-progress',
        '--assignments',
        '/dev/stdout',
        '--report',
        report,
      ],
      dir,
    );
    assert.equal(r.read, '{');
    assert.equal(r.stderr, '');
    assert.equal(r.code, 0);
    // the other output is written all the same
    assert.match(readFileSync(report, 'utf8'), /^<!doctype html>/i);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  'an output named by path that cannot be written is named, status 2',
  { skip: !existsSync('/dev/full') },
  async () => {
    const r = await run(
      ['simulate', '--trace', 'workflows:3', '--workers', '2', '--no-progress', '--assignments', '/dev/full'],
      'closed-pipe',
    );
    assert.equal(r.stderr, 'error: --assignments /dev/full: cannot write: ENOSPC: no space left on device, write\n');
    assert.equal(r.code, 2);
  },
);
