import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { MAX_TRACE_AGENTIC_SESSIONS, MAX_TRACE_WORKFLOWS } from '../../src/sim/load-trace.js';
import { MAX_TRACE_REQUESTS } from '../../src/sim/trace.js';

const main = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
// a command that does not stop at the limit would replay a million requests: the deadline fails it
const cli = (args: string[]) =>
  spawnSync(process.execPath, ['--import', 'tsx', main, ...args], { encoding: 'utf8', timeout: 120_000 });

/** A gzipped file of `count` copies of `line`. */
function gzLines(path: string, line: string, count: number): string {
  writeFileSync(path, gzipSync(`${line}\n`.repeat(count)));
  return path;
}

test('the request limit leaves the generated workloads and the public traces a wide margin', () => {
  assert.equal(MAX_TRACE_REQUESTS, 1_000_000);
  // workflows:N makes 4 requests a workflow; agentic:500 makes 28,234; the public traces at most 12,031
  assert.ok(MAX_TRACE_REQUESTS >= 20 * 4 * MAX_TRACE_WORKFLOWS);
  assert.ok(MAX_TRACE_REQUESTS >= 20 * 60 * MAX_TRACE_AGENTIC_SESSIONS);
});

test('a trace of more requests than the limit stops simulate and tune with one line naming the file, exit 2', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-trace-limit-'));
  const over = MAX_TRACE_REQUESTS + 1;
  const mooncake = gzLines(
    join(dir, 'huge.jsonl.gz'),
    '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}',
    over,
  );
  // RAGPulse: the trace file, then a side file, over the limit
  const ragpulse = join(dir, 'ragpulse');
  mkdirSync(ragpulse);
  for (const side of ['1_sys_prompt', '2_passages', '3_history', '4_user_input', '5_web_search'])
    writeFileSync(join(ragpulse, `${side}.jsonl`), '');
  gzLines(
    join(ragpulse, '0_trace.jsonl.gz'),
    '{"timestamp": "0", "input_length": 1, "output_length": 1, "hash_ids": {}}',
    over,
  );
  const sideDir = join(dir, 'ragpulse-side');
  mkdirSync(sideDir);
  for (const side of ['0_trace', '1_sys_prompt', '3_history', '4_user_input', '5_web_search'])
    writeFileSync(join(sideDir, `${side}.jsonl`), '');
  gzLines(join(sideDir, '2_passages.jsonl.gz'), '{"passage_id": 1, "token_length": 1}', over);

  const cases: Array<[string[], string]> = [
    [['simulate', '--trace', mooncake, '--policies', 'round-robin', '--no-progress'], mooncake],
    [['tune', '--trace', mooncake, '--trials', '1'], mooncake],
    [
      ['simulate', '--trace', ragpulse, '--policies', 'round-robin', '--no-progress'],
      join(ragpulse, '0_trace.jsonl.gz'),
    ],
    [
      ['simulate', '--trace', sideDir, '--policies', 'round-robin', '--no-progress'],
      join(sideDir, '2_passages.jsonl.gz'),
    ],
  ];
  for (const [args, file] of cases) {
    const r = cli(args);
    assert.equal(r.status, 2, `${args.join(' ')}: ${r.error?.message ?? r.stderr}`);
    assert.equal(r.stderr.split('\n').filter(Boolean).length, 1, r.stderr);
    assert.ok(r.stderr.startsWith(`error: ${file}: more than 1000000 `), r.stderr);
    assert.match(r.stderr, /the most a trace may hold/);
  }
});
