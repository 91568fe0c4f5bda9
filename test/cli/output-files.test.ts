import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  linkSync,
  lstatSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { CLI } from '../helpers/cli-entry.js';

const dir = mkdtempSync(join(tmpdir(), 'cf-output-files-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const cli = (args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8', timeout: 120_000 });

const TRACE = [
  '{"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}',
  '{"timestamp": 100, "input_length": 1024, "output_length": 8, "hash_ids": [1, 3]}',
].join('\n');

/** A file of `text` in the test's directory. */
function file(name: string, text: string): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
}

const run = (trace: string, ...args: string[]) =>
  cli(['simulate', '--trace', trace, '--workers', '2', '--policies', 'cost', '--no-progress', ...args]);

/** Files the runs left in the directory other than `names`: no temporary file may stay behind. */
const others = (...names: string[]) => readdirSync(dir).filter((n) => !names.includes(n));

test('simulate refuses an output that is the trace, naming both flags, and leaves the trace whole', () => {
  const trace = file('victim.jsonl', TRACE);
  for (const flag of ['--assignments', '--report']) {
    const r = run(trace, flag, trace);
    assert.equal(r.status, 2, r.stderr);
    assert.equal(
      r.stderr,
      `error: ${flag} ${trace} is the same file as --trace ${trace}: writing it would destroy the input\n`,
    );
    assert.equal(r.stdout, '');
    assert.equal(readFileSync(trace, 'utf8'), TRACE);
  }
  // another name of the same file: a symbolic link, a hard link, a path with a detour
  const symlink = join(dir, 'victim-link.jsonl');
  symlinkSync(trace, symlink);
  const hard = join(dir, 'victim-hard.jsonl');
  linkSync(trace, hard);
  for (const other of [symlink, hard, join(dir, '.', 'victim.jsonl')]) {
    const r = run(trace, '--assignments', other);
    assert.equal(r.status, 2, r.stderr);
    assert.match(
      r.stderr,
      /^error: --assignments .* is the same file as --trace .*: writing it would destroy the input$/m,
    );
    assert.equal(readFileSync(trace, 'utf8'), TRACE);
  }
  rmSync(symlink);
  rmSync(hard);
  rmSync(trace);
});

test('simulate refuses --report and --assignments naming one file', () => {
  const trace = file('t1.jsonl', TRACE);
  const same = file('same.out', 'old\n');
  const r = run(trace, '--report', same, '--assignments', same);
  assert.equal(r.status, 2, r.stderr);
  assert.equal(
    r.stderr,
    `error: --assignments ${same} is the same file as --report ${same}: one would overwrite the other\n`,
  );
  // not yet there: the paths are compared as they resolve
  const fresh = join(dir, 'fresh.out');
  const f = run(trace, '--report', fresh, '--assignments', join(dir, 'sub', '..', 'fresh.out'));
  assert.equal(f.status, 2, f.stderr);
  assert.match(f.stderr, /is the same file as --report/);
  assert.equal(readFileSync(same, 'utf8'), 'old\n');
  assert.deepEqual(others('t1.jsonl', 'same.out'), []);
  rmSync(trace);
  rmSync(same);
});

test('a simulate run that fails after the trace is read leaves the existing outputs as they were', () => {
  const trace = file('t2.jsonl', TRACE);
  const report = file('old.html', 'old report\n');
  const assignments = file('old.jsonl', 'old assignments\n');
  // refused once the trace gives its block size, after the outputs were checked
  const r = run(trace, '--kv-tokens', '1', '--report', report, '--assignments', assignments);
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, /--kv-tokens 1 is less than one KV block/);
  assert.equal(readFileSync(report, 'utf8'), 'old report\n');
  assert.equal(readFileSync(assignments, 'utf8'), 'old assignments\n');
  // a trace of no request
  const empty = file('empty.jsonl', '\n');
  const e = run(empty, '--report', report, '--assignments', assignments);
  assert.equal(e.status, 2, e.stderr);
  assert.equal(readFileSync(report, 'utf8'), 'old report\n');
  assert.equal(readFileSync(assignments, 'utf8'), 'old assignments\n');
  assert.deepEqual(others('t2.jsonl', 'old.html', 'old.jsonl', 'empty.jsonl'), []);
  for (const f of [trace, report, assignments, empty]) rmSync(f);
});

test('a simulate run that succeeds replaces the outputs whole, keeping their mode, and leaves no other file', () => {
  const trace = file('t3.jsonl', TRACE);
  const report = file('r.html', 'old report\n');
  chmodSync(report, 0o640);
  const assignments = join(dir, 'a.jsonl');
  const r = run(trace, '--report', report, '--assignments', assignments, '--format', 'json');
  assert.equal(r.status, 0, r.stderr);
  assert.match(readFileSync(report, 'utf8'), /^<!doctype html>/i);
  assert.equal(statSync(report).mode & 0o777, 0o640);
  const lines = readFileSync(assignments, 'utf8').trim().split('\n');
  assert.equal(lines.length, 2);
  assert.equal(JSON.parse(lines[0]).policy, 'cost');
  assert.deepEqual(others('t3.jsonl', 'r.html', 'a.jsonl'), []);
  for (const f of [trace, report, assignments]) rmSync(f);
});

test('simulate writes an output that is a device directly, never replacing it (--assignments /dev/null)', () => {
  const trace = file('t4.jsonl', TRACE);
  const r = run(trace, '--assignments', '/dev/null', '--report', '/dev/null', '--format', 'json');
  assert.equal(r.status, 0, r.stderr);
  assert.equal(JSON.parse(r.stdout).requests, 2);
  assert.ok(statSync('/dev/null').isCharacterDevice());
  assert.deepEqual(others('t4.jsonl'), []);
  rmSync(trace);
});

test('a regular file under /dev (a tmpfs such as /dev/shm) is a file like any other: two outputs naming it are refused', () => {
  const trace = file('t5.jsonl', TRACE);
  const shm = mkdtempSync(join('/dev/shm', 'cf-output-files-'));
  try {
    const same = join(shm, 'same.out');
    writeFileSync(same, 'old\n');
    const r = run(trace, '--report', same, '--assignments', same);
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /is the same file as --report/);
    assert.equal(readFileSync(same, 'utf8'), 'old\n');
  } finally {
    rmSync(shm, { recursive: true, force: true });
    rmSync(trace);
  }
});

test('an output that is a symbolic link to a file not yet made is written through the link', () => {
  const trace = file('t6.jsonl', TRACE);
  const real = mkdtempSync(join(dir, 'real-'));
  const link = join(dir, 'link.jsonl');
  symlinkSync(join(real, 'out.jsonl'), link);
  const r = run(trace, '--assignments', link, '--format', 'json');
  assert.equal(r.status, 0, r.stderr);
  assert.equal(readFileSync(join(real, 'out.jsonl'), 'utf8').trim().split('\n').length, 2);
  assert.ok(lstatSync(link).isSymbolicLink(), 'the link stays a link');
  rmSync(link);
  rmSync(real, { recursive: true });
  rmSync(trace);
});
