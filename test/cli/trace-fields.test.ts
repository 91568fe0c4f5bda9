import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { CLI } from '../helpers/cli-entry.js';

const cli = (args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8', timeout: 120_000 });

/** 3000 good requests of two workflows, then `bad` as line 3001. */
function traceEndingWith(dir: string, name: string, bad: string): string {
  const lines: string[] = [];
  for (let i = 0; i < 3000; i++)
    lines.push(
      JSON.stringify({
        timestamp: i * 10,
        input_length: 1024,
        output_length: 8,
        hash_ids: [i % 7, 100 + i],
        session_id: `s${i % 2}`,
        step: Math.floor(i / 2),
      }),
    );
  lines.push(bad);
  const path = join(dir, name);
  writeFileSync(path, `${lines.join('\n')}\n`);
  return path;
}

test('a late trace line the router would refuse stops simulate and tune as the trace is read, naming line and field', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-trace-fields-'));
  const head = '"timestamp":30000,"input_length":10,"output_length":1,"hash_ids":[1]';
  const cases: Array<[string, string, string]> = [
    ['step.jsonl', `{${head},"session_id":"s","step":1.5}`, '"step" must be a non-negative integer'],
    ['session.jsonl', `{${head},"session_id":""}`, '"session_id" must be a non-empty string or a number'],
    [
      'anchor.jsonl',
      `{${head},"anchors":[""],"anchor_lengths":[10]}`,
      '"anchors[0]" must be a non-empty string or a number',
    ],
  ];
  for (const [name, bad, message] of cases) {
    const trace = traceEndingWith(dir, name, bad);
    for (const args of [
      ['simulate', '--trace', trace, '--workers', '4', '--no-progress'],
      ['tune', '--trace', trace, '--trials', '1'],
    ]) {
      const r = cli(args);
      assert.equal(r.error, undefined, `${args[0]} ${name}: ${r.error?.message}`);
      assert.equal(r.status, 2, `${args[0]} ${name}: ${r.stderr}`);
      assert.equal(r.stderr, `error: ${trace} line 3001: ${message}\n`, `${args[0]} ${name}`);
      assert.equal(r.stdout, '', 'nothing was run');
    }
  }
});

test('a trace whose hash_ids do not fit its block size stops simulate with one line naming the file, line and fit, exit 2', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-trace-blocks-fit-'));
  // written in 16-token blocks without "block_size": read as 512-token blocks it would replay wrong
  const trace = join(dir, 'sixteen.jsonl');
  const ids = (n: number) => Array.from({ length: n }, (_, i) => i);
  writeFileSync(
    trace,
    [
      JSON.stringify({ timestamp: 0, input_length: 1000, output_length: 8, hash_ids: ids(2) }),
      JSON.stringify({ timestamp: 10, input_length: 1000, output_length: 8, hash_ids: ids(63) }),
    ].join('\n'),
  );
  const r = cli(['simulate', '--trace', trace, '--workers', '2', '--no-progress']);
  assert.equal(r.error, undefined, r.error?.message);
  assert.equal(r.status, 2, r.stderr);
  assert.equal(
    r.stderr,
    `error: ${trace} line 2: "hash_ids" has 63 entries but "input_length" 1000 at the default block size 512 needs 2 ` +
      '(a block size of 16 would fit: set "block_size" on every line)\n',
  );
  assert.equal(r.stdout, '');
});
