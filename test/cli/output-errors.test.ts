import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { closeSync, existsSync, openSync } from 'node:fs';
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
  'an output that cannot be written is one line naming the cause, status 1',
  { skip: !existsSync('/dev/full') },
  async () => {
    for (const args of commands) {
      const full = openSync('/dev/full', 'w');
      try {
        const r = await run(args, full);
        assert.equal(r.signal, null, `${args[0]}: ${r.stderr}`);
        assert.equal(r.stderr, 'error: cannot write the output: ENOSPC: no space left on device, write\n', args[0]);
        assert.equal(r.code, 1, args[0]);
      } finally {
        closeSync(full);
      }
    }
  },
);
