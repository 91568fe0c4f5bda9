import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { MAX_TRACE_AGENTIC_SESSIONS, MAX_TRACE_WORKFLOWS } from '../../src/sim/load-trace.js';
import {
  heldBlocks,
  MAX_TRACE_BLOCKS,
  MAX_TRACE_REQUEST_TOKENS,
  MAX_TRACE_REQUESTS,
  parseTraceLine,
} from '../../src/sim/trace.js';
import { MAX_TRACE_BLANK_LINES, traceBlockCounter } from '../../src/sim/trace-lines.js';
import { CLI } from '../helpers/cli-entry.js';

// a command that does not stop at the limit would replay a million requests: the deadline fails it
const cli = (args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8', timeout: 120_000 });

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
    '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}',
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

test('the block limit leaves the generated workloads a margin', () => {
  assert.equal(MAX_TRACE_BLOCKS, 64 * 1024 * 1024);
  // agentic:500 holds 42–46 million hash ids (seeds 1 to 8); workflows:10000 about 2.7 million
  assert.ok(MAX_TRACE_BLOCKS >= 1.4 * 46_000_000);
  assert.ok(MAX_TRACE_BLOCKS >= 20 * 2_700_000);
});

test('the block count adds up hash ids and anchor blocks line by line and names the line that passes it', () => {
  const ids = parseTraceLine('{"timestamp":0,"input_length":1536,"output_length":1,"hash_ids":[1,2,3]}', 0);
  const anchored = parseTraceLine(
    '{"timestamp":0,"input_length":17,"output_length":1,"hash_ids":[1],"block_size":4,"anchors":["a","b"],"anchor_lengths":[9,4]}',
    1,
  );
  // 3 hash ids; 1 hash id, then anchors of ceil(9 / 4) and 4 / 4 blocks
  assert.deepEqual([heldBlocks(ids), heldBlocks(anchored)], [3, 5]);
  const count = traceBlockCounter('t.jsonl');
  count(ids.index, heldBlocks(ids));
  count(anchored.index, heldBlocks(anchored));
  count(2, MAX_TRACE_BLOCKS - 8); // exactly at the limit
  assert.throws(
    () => count(6, 1),
    (e: Error) =>
      e instanceof RangeError &&
      e.message ===
        `t.jsonl line 7: the trace passes ${MAX_TRACE_BLOCKS} blocks (hash ids and content-anchor blocks), the most a trace may hold (each is held in memory)`,
  );
});

test('a trace of more blocks than the limit stops simulate and tune with one line naming the file and line, exit 2', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-trace-blocks-'));
  // a Mooncake trace whose prompts are each one passage of the longest prompt a line may have, in
  // 1-token blocks: the fourth line passes the limit (4 × (2^24 + 1) blocks)
  const mooncake = join(dir, 'anchors.jsonl');
  writeFileSync(
    mooncake,
    Array.from(
      { length: 5 },
      (_, i) =>
        `{"timestamp": ${i}, "input_length": ${MAX_TRACE_REQUEST_TOKENS}, "output_length": 1, "hash_ids": [1], "block_size": 1, "anchors": ["doc"], "anchor_lengths": [${MAX_TRACE_REQUEST_TOKENS}]}`,
    ).join('\n'),
  );
  // RAGPulse: one request listing a passage of MAX_TRACE_REQUEST_TOKENS tokens (in 64-token blocks) enough times
  const ragpulse = join(dir, 'ragpulse');
  mkdirSync(ragpulse);
  for (const side of ['1_sys_prompt', '3_history', '4_user_input', '5_web_search'])
    writeFileSync(join(ragpulse, `${side}.jsonl`), '');
  writeFileSync(join(ragpulse, '2_passages.jsonl'), `{"passage_id": 1, "token_length": ${MAX_TRACE_REQUEST_TOKENS}}\n`);
  const passages = Math.floor(MAX_TRACE_BLOCKS / (MAX_TRACE_REQUEST_TOKENS / 64)) + 1;
  writeFileSync(
    join(ragpulse, '0_trace.jsonl'),
    `{"timestamp": "0", "input_length": 64, "output_length": 1, "hash_ids": {"passages_ids": ${JSON.stringify(new Array<number>(passages).fill(1))}}}\n`,
  );
  const cases: Array<[string[], string]> = [
    [['simulate', '--trace', mooncake, '--policies', 'round-robin', '--no-progress'], `${mooncake} line 4`],
    [['tune', '--trace', mooncake, '--trials', '1'], `${mooncake} line 4`],
    [
      ['simulate', '--trace', ragpulse, '--policies', 'round-robin', '--no-progress'],
      `${join(ragpulse, '0_trace.jsonl')} line 1`,
    ],
  ];
  for (const [args, at] of cases) {
    const r = cli(args);
    assert.equal(r.status, 2, `${args.join(' ')}: ${r.error?.message ?? r.stderr}`);
    assert.equal(r.stderr.split('\n').filter(Boolean).length, 1, r.stderr);
    assert.ok(r.stderr.startsWith(`error: ${at}: the trace passes ${MAX_TRACE_BLOCKS} blocks `), r.stderr);
    assert.match(r.stderr, /the most a trace may hold/);
  }
});

test('a malformed line in the middle of a trace stops simulate and tune with one line naming the file and line, exit 2', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-trace-malformed-'));
  const mooncake = join(dir, 'mid.jsonl');
  const good = (t: number) => `{"timestamp": ${t}, "input_length": 100, "output_length": 1, "hash_ids": [1]}`;
  writeFileSync(mooncake, [good(0), good(1), '{"timestamp": 2, "input_len', good(3)].join('\n'));
  const ragpulse = join(dir, 'ragpulse');
  cpSync(fileURLToPath(new URL('../fixtures/ragpulse-sample', import.meta.url)), ragpulse, { recursive: true });
  const trace = join(ragpulse, '0_trace.jsonl');
  const lines = readFileSync(trace, 'utf8').split('\n');
  lines[2] = lines[2].slice(0, 30);
  writeFileSync(trace, lines.join('\n'));
  for (const [spec, at] of [
    [mooncake, `${mooncake} line 3`],
    [ragpulse, `${trace} line 3`],
  ])
    for (const args of [
      ['simulate', '--trace', spec, '--policies', 'round-robin', '--no-progress'],
      ['tune', '--trace', spec, '--trials', '1'],
    ]) {
      const r = cli(args);
      assert.equal(r.status, 2, `${args.join(' ')}: ${r.error?.message ?? r.stderr}`);
      assert.equal(r.stderr, `error: ${at}: not valid JSON\n`, args.join(' '));
    }
});

test('blank lines past the limit stop simulate with the line that passes it; as many as the limit are skipped', () => {
  assert.equal(MAX_TRACE_BLANK_LINES, MAX_TRACE_REQUESTS);
  const dir = mkdtempSync(join(tmpdir(), 'cf-trace-blank-'));
  const line = '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}';
  // a few kB of gzip that inflate to more line ends than the limit, then a request
  const over = join(dir, 'blank.jsonl.gz');
  writeFileSync(over, gzipSync(`${'\n'.repeat(MAX_TRACE_BLANK_LINES)} \r\n${line}\n`));
  const run = ['--workers', '1', '--policies', 'round-robin', '--no-progress', '--format', 'json'];
  const r = cli(['simulate', '--trace', over, ...run]);
  assert.equal(r.status, 2, r.error?.message ?? r.stderr);
  assert.equal(
    r.stderr,
    `error: ${over} line ${MAX_TRACE_BLANK_LINES + 1}: more than ${MAX_TRACE_BLANK_LINES} blank lines, the most a trace may hold (the file is read no further)\n`,
  );
  const within = join(dir, 'within.jsonl.gz');
  writeFileSync(within, gzipSync(`${'\n'.repeat(MAX_TRACE_BLANK_LINES)}${line}\n`));
  const ok = cli(['simulate', '--trace', within, ...run]);
  assert.equal(ok.status, 0, ok.error?.message ?? ok.stderr);
  assert.equal(JSON.parse(ok.stdout).requests, 1);
});
