import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));

/** A bench script (a path from the repository's root) run with `args`; the deadline stops one that would run. */
export const benchScript = (path: string, ...args: string[]) =>
  spawnSync(process.execPath, ['--import', 'tsx', path, ...args], { cwd: root, encoding: 'utf8', timeout: 60_000 });

/** Runs `check` with a new temporary directory (its name starting `prefix`), removed after. */
export function inTempDir(prefix: string, check: (dir: string) => void): void {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  try {
    check(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
