/**
 * What every command does when its standard output cannot be written (installed once, by
 * main.ts, before any command runs; each command writes its result there as its last act):
 *
 * - EPIPE: the reader went away (`… | head -1`, `… | true`). The process ends quietly with the
 *   status it had (0 for a command that did its work). That is what a reader like `head` expects:
 *   it stops reading once it has what it wants, and a failing status would fail a `set -o
 *   pipefail` script for a pipeline that did what it was asked. (A C program would be killed by
 *   SIGPIPE; Node ignores SIGPIPE, so the write fails instead, by default with a stack trace.)
 * - anything else (ENOSPC on a full disk, EIO): the output is lost, so one line on stderr naming
 *   the output and the cause, as a file output (--report) that cannot be written is named, and
 *   status 2, as for every error the user can act on (a file the output was redirected to).
 *
 * Only the first error is reported: a stream that failed is destroyed and writes nothing more.
 */
export function reportOutputErrors(stream: NodeJS.WritableStream = process.stdout, name = 'standard output'): void {
  let failed = false;
  stream.on('error', (err: NodeJS.ErrnoException) => {
    if (failed) return;
    failed = true;
    if (err.code === 'EPIPE') return;
    process.stderr.write(`error: ${name}: cannot write: ${err.message}\n`);
    process.exitCode = 2;
  });
}
