import { spawn } from 'node:child_process';
import { CLI } from './cli-entry.js';

/**
 * Runs `contextforge-router serve ARGS` for a start that must fail, and resolves with its exit
 * code and stderr. A start that does not fail goes on serving: it is killed after `killAfterMs`
 * (the code is then null), which fails the caller's assertion rather than hanging the test.
 */
export async function serveExit(
  args: string[],
  killAfterMs = 30_000,
): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, [...CLI, 'serve', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((r) => {
    child.once('exit', (c) => r(c));
    setTimeout(() => child.kill('SIGKILL'), killAfterMs).unref();
  });
  return { code, stderr };
}
