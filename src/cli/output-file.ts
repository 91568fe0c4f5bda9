import { randomBytes } from 'node:crypto';
import {
  accessSync,
  closeSync,
  constants,
  fchmodSync,
  fstatSync,
  lstatSync,
  openSync,
  readlinkSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { fileErrorMessage, shownText } from '../core/shown-text.js';

/**
 * A file a command writes its results to (`simulate --report`, `--assignments`). It is checked
 * when the command starts, so that a path that cannot be written stops the command before a long
 * run, but nothing is written then: an existing file is left as it is until the results are
 * complete. A regular file (or a new one) is then written to a temporary file in its directory
 * and renamed over it, so that a run that fails, or is stopped, leaves the old file whole (a
 * symbolic link is written through: the file it names is replaced, the link stays); a device or
 * pipe, and a process's own streams by name (`/dev/stdout`, `/dev/fd/N`, anything under /proc),
 * are written directly, as they cannot be replaced.
 */
export interface OutputFile {
  /** The flag that named the file, as messages name it. */
  readonly flag: string;
  /** The path as given. */
  readonly path: string;
  /** What the path writes to: its real path when it exists (a symbolic link is followed), else the path resolved. */
  readonly target: string;
  /** The file's device and inode when it exists. */
  readonly id?: { dev: number; ino: number };
  /** Whether the path is an existing device, pipe or socket, or a process's stream by name (STREAM_PATH): written directly. */
  readonly special: boolean;
}

/** A RangeError naming the flag and the file: `--report out.html: cannot write: …`. */
function cannotWrite(flag: string, path: string, err: unknown): RangeError {
  return new RangeError(`${flag} ${shownText(path)}: cannot write: ${fileErrorMessage(err, path)}`, { cause: err });
}

/**
 * Checks an output path without writing it: not empty; an existing file must be writable and
 * not a directory; a new file's directory must exist and be writable. RangeError naming `flag`.
 */
export function checkOutputFile(flag: string, path: string): OutputFile {
  if (path === '') throw new RangeError(`${flag} needs a file name, got ''`);
  let st;
  try {
    st = statSync(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw cannotWrite(flag, path, err);
  }
  try {
    if (st === undefined) {
      // a new file: its directory must take it (ENOENT for a missing one, ENOTDIR, EACCES); a
      // symbolic link to a file not yet made is written through, to the file it names
      const target = danglingLinkTarget(path) ?? resolve(path);
      const dir = dirname(target);
      if (!statSync(dir).isDirectory()) throw Object.assign(new Error('not a directory'), { code: 'ENOTDIR' });
      accessSync(dir, constants.W_OK);
      return { flag, path, target, special: false };
    }
    if (st.isDirectory()) throw Object.assign(new Error('is a directory'), { code: 'EISDIR' });
    accessSync(path, constants.W_OK);
    const target = realpathSync(path);
    // /dev/stdout is the file the shell redirected the output to: it is written through, not
    // replaced (that would take the file away from the command's own output)
    // (a regular file elsewhere under /dev, such as /dev/shm, is a file like any other)
    const special = !st.isFile() || STREAM_PATH.test(resolve(path)) || /^\/proc\//.test(target);
    // the file is replaced by renaming a new one over it: its directory must take that
    if (!special) accessSync(dirname(target), constants.W_OK);
    return { flag, path, target, id: { dev: st.dev, ino: st.ino }, special };
  } catch (err) {
    throw cannotWrite(flag, path, err);
  }
}

/**
 * Whether a failed write to `out` is the reader of the command's own standard output going away:
 * EPIPE on an output that is the file of descriptor 1 (`--assignments /dev/stdout | head -1`).
 * The command then drops the rest of that output and goes on quietly, as it does for a write to
 * its standard output itself (output.ts): the reader has what it wanted.
 */
export function readerGone(out: OutputFile, err: unknown): boolean {
  if ((err as NodeJS.ErrnoException | undefined)?.code !== 'EPIPE' || !out.special || out.id === undefined)
    return false;
  try {
    const stdout = fstatSync(1);
    return stdout.dev === out.id.dev && stdout.ino === out.id.ino;
  } catch {
    return false;
  }
}

/** A process's own streams by name (/dev/stdout, /dev/fd/1, /proc/self/fd/1): written through, never replaced. */
const STREAM_PATH = /^\/dev\/(stdout|stderr|fd\/\d+)$|^\/proc\//;

/** The file a symbolic link at `path` names when that file does not exist yet (links followed up to 40 deep), else undefined. */
function danglingLinkTarget(path: string): string | undefined {
  let at = resolve(path);
  for (let depth = 0; depth < 40; depth++) {
    let link: string;
    try {
      if (!lstatSync(at).isSymbolicLink()) return depth === 0 ? undefined : at;
      link = readlinkSync(at);
    } catch {
      return depth === 0 ? undefined : at;
    }
    at = resolve(dirname(at), link);
  }
  return undefined;
}

/** Whether two paths name one file: the same path resolved, or the same device and inode. */
function sameFile(a: { target: string; id?: { dev: number; ino: number } }, b: typeof a): boolean {
  if (a.target === b.target) return true;
  return a.id !== undefined && b.id !== undefined && a.id.dev === b.id.dev && a.id.ino === b.id.ino;
}

/**
 * A path with its symbolic links resolved: its real path when it exists, else its directory's
 * real path and its name (a file not yet made in a directory named through a link), else the
 * path resolved.
 */
function canonicalPath(path: string): string {
  try {
    return realpathSync(path);
  } catch {
    try {
      return join(realpathSync(dirname(resolve(path))), basename(path));
    } catch {
      return resolve(path);
    }
  }
}

/**
 * A file an input flag reads (a trace directory's files): `file` itself, or, with `shadows`, a
 * name not there now that the reader would read in place of `shadows` were it made (a trace's
 * `x.jsonl` before `x.jsonl.gz`).
 */
export interface InputFile {
  readonly file: string;
  readonly shadows?: string;
}

/**
 * Refuses an output that is the same file as an input (`inputs`: flag, path, and the files it
 * reads when the path is not the file itself, e.g. a trace directory's), or a name the input's
 * reader would read in its place, or the same file as another output: writing it would destroy
 * (or change) the input, or one output would overwrite the other. Symbolic and hard links count
 * as the file. `/dev/stdout` and other devices may be named by several outputs. RangeError
 * naming both flags.
 */
export function checkDistinctOutputs(
  outputs: readonly OutputFile[],
  inputs: ReadonlyArray<readonly [flag: string, path: string, files?: readonly InputFile[]]>,
): void {
  for (const [flag, path, files = [{ file: path }]] of inputs) {
    for (const { file, shadows } of files) {
      let st;
      try {
        st = statSync(file);
      } catch {
        if (shadows === undefined) continue; // not a file (a generated trace's spec, say): no output can be it
      }
      const input = { target: canonicalPath(file), id: st && { dev: st.dev, ino: st.ino } };
      for (const out of outputs) {
        if (!sameFile({ target: canonicalPath(out.target), id: out.id }, input)) continue;
        if (shadows !== undefined)
          throw new RangeError(
            `${out.flag} ${shownText(out.path)} would be read by ${flag} ${shownText(path)} in place of ${shownText(shadows)}: writing it would change the input`,
          );
        throw new RangeError(
          file === path
            ? `${out.flag} ${shownText(out.path)} is the same file as ${flag} ${shownText(path)}: writing it would destroy the input`
            : `${out.flag} ${shownText(out.path)} is the same file as ${shownText(file)}, which ${flag} ${shownText(path)} reads: writing it would destroy the input`,
        );
      }
    }
  }
  outputs.forEach((a, i) => {
    for (const b of outputs.slice(i + 1))
      if (!a.special && !b.special && sameFile(a, b))
        throw new RangeError(
          `${b.flag} ${shownText(b.path)} is the same file as ${a.flag} ${shownText(a.path)}: one would overwrite the other`,
        );
  });
}

/** An output being written: `commit` puts it in place, `discard` drops it (the old file stays). */
export interface PendingOutput {
  /** The path to write to (a temporary file, or the device itself). */
  readonly writePath: string;
  commit(): void;
  discard(): void;
}

/**
 * Starts writing an output checked by checkOutputFile: a new temporary file next to the target
 * (with the existing file's mode), or the device itself. RangeError naming the flag.
 */
export function pendingOutput(out: OutputFile): PendingOutput {
  if (out.special) return { writePath: out.path, commit: () => {}, discard: () => {} };
  const dir = dirname(out.target);
  const tmp = join(dir, `.${basename(out.target)}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`);
  try {
    const fd = openSync(tmp, 'wx', 0o666);
    try {
      if (out.id !== undefined) fchmodSync(fd, statSync(out.target).mode & 0o7777);
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    rmSync(tmp, { force: true });
    throw cannotWrite(out.flag, out.path, err);
  }
  return {
    writePath: tmp,
    commit: () => {
      try {
        renameSync(tmp, out.target);
      } catch (err) {
        rmSync(tmp, { force: true });
        throw cannotWrite(out.flag, out.path, err);
      }
    },
    discard: () => rmSync(tmp, { force: true }),
  };
}

/** Writes `text` whole to an output at once (write, then rename into place). RangeError naming the flag. */
export function writeOutputFile(out: OutputFile, text: string): void {
  const pending = pendingOutput(out);
  try {
    const fd = openSync(pending.writePath, 'w');
    try {
      writeFileSync(fd, text);
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    pending.discard();
    throw cannotWrite(out.flag, out.path, err);
  }
  pending.commit();
}
