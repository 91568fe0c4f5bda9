/**
 * simulate's (and tune's) limits on what a user controls, past the flags' own ranges: the
 * cluster's KV counted in the trace's blocks. Each is refused before the replay with one line
 * naming the flag or the file and line, exit status 2, no stack trace.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, linkSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { after, test } from 'node:test';
import { CLI } from '../helpers/cli-entry.js';
import { distinctTraceBlocks } from '../../src/sim/trace.js';
import type { TraceRequest } from '../../src/sim/trace.js';

const dir = mkdtempSync(join(tmpdir(), 'cf-sim-input-limits-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const cli = (args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8' });
/** `simulate` of `trace` with round-robin, its result as JSON on stdout. */
const roundRobin = (trace: string, ...args: string[]) =>
  cli(['simulate', '--trace', trace, '--policies', 'round-robin', '--no-progress', '--format', 'json', ...args]);

/** A file of `text` in the test's directory. */
function file(name: string, text: string): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
}

/** Asserts a refusal: exit status 2 and exactly `message` on stderr. */
function refused(r: ReturnType<typeof cli>, message: string): void {
  assert.equal(r.status, 2, r.stderr);
  assert.equal(r.stderr, `error: ${message}\n`);
  assert.equal(r.stdout, '');
}

// two requests of 16 tokens in 1-token blocks
const BS1 = [0, 1]
  .map(
    (t) =>
      `{"timestamp": ${t}, "input_length": 16, "output_length": 1, "block_size": 1, "hash_ids": [${Array.from({ length: 16 }, (_, i) => i + 1).join(', ')}]}`,
  )
  .join('\n');

test("the cluster's KV is bounded in the trace's blocks: the flags that set it and the block size are named", () => {
  const trace = file('bs1.jsonl', BS1);
  const simulate = (...args: string[]) =>
    cli(['simulate', '--trace', trace, '--policies', 'round-robin', '--no-progress', ...args]);
  // 2 engines of 2^24 tokens: 2^25 blocks of 1 token, within the 2^29 tokens a cluster may hold
  refused(
    simulate('--workers', '2', '--kv-tokens', '16777216'),
    "--workers × --kv-tokens: the simulated cluster would hold 33554432 KV blocks of the trace's block size (1 token), more than 16777216 (each engine's blocks are held in memory)",
  );
  // heterogeneous workers: their blocks are summed
  refused(
    simulate('--workers', '2', '--worker-kv-tokens', '16777216,1'),
    "--worker-kv-tokens: the simulated cluster would hold 16777217 KV blocks of the trace's block size (1 token), more than 16777216 (each engine's blocks are held in memory)",
  );
  // the default KV of each engine (300000 tokens) on many workers
  refused(
    simulate('--workers', '64'),
    "--workers × --kv-tokens (default 300000): the simulated cluster would hold 19200000 KV blocks of the trace's block size (1 token), more than 16777216 (each engine's blocks are held in memory)",
  );
  // tune's engines have the default KV
  refused(
    cli(['tune', '--trace', trace, '--workers', '64', '--trials', '1']),
    "--workers (300000 KV tokens each): the simulated cluster would hold 19200000 KV blocks of the trace's block size (1 token), more than 16777216 (each engine's blocks are held in memory)",
  );
  // at the defaults the same trace replays
  const ok = simulate('--format', 'json');
  assert.equal(ok.status, 0, ok.stderr);
  assert.equal(JSON.parse(ok.stdout).requests, 2);
});

test("router replicas are bounded by the trace's blocks they would each hold, naming --replicas", () => {
  // one request of 2^20 blocks: 1 hash id and a content anchor of 2^20 - 1 one-token blocks
  const trace = file(
    'anchor.jsonl',
    '{"timestamp": 0, "input_length": 1048576, "output_length": 1, "block_size": 1, "hash_ids": [1], "anchors": ["doc"], "anchor_lengths": [1048575]}',
  );
  const simulate = (...args: string[]) => roundRobin(trace, ...args);
  refused(
    simulate('--replicas', '33'),
    "--replicas 33: 33 router replicas × the trace's 1048576 distinct blocks (hash ids and content-anchor blocks) is more than 33554432 (each replica holds its own index of the blocks in memory); this trace takes at most 32",
  );
  // at the bound the run goes ahead (the request is over the engines' context: rejected, quickly)
  const ok = simulate('--replicas', '32');
  assert.equal(ok.status, 0, ok.stderr);
  assert.equal(JSON.parse(ok.stdout).requests, 1);
  // a replica indexes each block once, however many requests send it: 40 requests of the same
  // 2^20 blocks take as many replicas as one
  const shared = file(
    'shared.jsonl',
    Array.from(
      { length: 40 },
      (_, i) =>
        `{"timestamp": ${i}, "input_length": 1048576, "output_length": 1, "block_size": 1, "hash_ids": [1], "anchors": ["doc"], "anchor_lengths": [1048575]}`,
    ).join('\n'),
  );
  const many = roundRobin(shared, '--replicas', '32');
  assert.equal(many.status, 0, many.stderr);
  assert.equal(JSON.parse(many.stdout).requests, 40);
});

test("a replica's blocks are counted as its index keys them: per model and CLA group, an isolated request's every time, an anchor at its largest", () => {
  const req = (over: Partial<TraceRequest>): TraceRequest => ({
    index: 0,
    timestamp: 0,
    inputLength: 1,
    outputLength: 1,
    hashIds: [1, 2, 3],
    blockSize: 1,
    ...over,
  });
  // the same three ids under two models, two CLA groups and none: three namespaces
  assert.equal(distinctTraceBlocks([req({}), req({ model: 'a' }), req({ claGroup: 2 }), req({})], 100), 9);
  // an isolated request is salted for itself alone
  assert.equal(distinctTraceBlocks([req({ isolate: true }), req({ isolate: true }), req({})], 100), 9);
  // an anchor counts its largest size, whichever comes first
  const small = req({ hashIds: [], anchors: [{ id: 'doc', tokens: 16 }] });
  const large = req({ hashIds: [], anchors: [{ id: 'doc', tokens: 1000 }] });
  assert.equal(distinctTraceBlocks([small, large], 10_000), 1000);
  assert.equal(distinctTraceBlocks([large, small], 10_000), 1000);
  // and the count stops past `most`
  assert.equal(distinctTraceBlocks([req({ isolate: true }), req({ isolate: true })], 5), 6);
  // isolated requests of the same 2^20 blocks: twice the blocks, half the replicas
  const isolated = file(
    'isolated.jsonl',
    [0, 1]
      .map(
        (i) =>
          `{"timestamp": ${i}, "input_length": 1048576, "output_length": 1, "block_size": 1, "hash_ids": [1], "anchors": ["doc"], "anchor_lengths": [1048575], "isolate": true}`,
      )
      .join('\n'),
  );
  const run = (replicas: string) => roundRobin(isolated, '--replicas', replicas);
  refused(
    run('17'),
    "--replicas 17: 17 router replicas × the trace's 2097152 distinct blocks (hash ids and content-anchor blocks) is more than 33554432 (each replica holds its own index of the blocks in memory); this trace takes at most 16",
  );
  assert.equal(run('16').status, 0);
});

test('an output that is a file a RAGPulse directory is read from is refused, through links too, and the file stays whole', () => {
  const rag = join(dir, 'rag');
  cpSync(fileURLToPath(new URL('../fixtures/ragpulse-sample', import.meta.url)), rag, { recursive: true });
  // one side file only gzipped: the .gz is read, and a plain one made next to it would be read instead
  writeFileSync(join(rag, '4_user_input.jsonl.gz'), gzipSync(readFileSync(join(rag, '4_user_input.jsonl'))));
  rmSync(join(rag, '4_user_input.jsonl'));
  const before = new Map(readdirSync(rag).map((n) => [n, readFileSync(join(rag, n))]));
  const link = join(dir, 'rag-link');
  symlinkSync(rag, link);
  const passages = join(dir, 'passages-link.jsonl');
  symlinkSync(join(rag, '2_passages.jsonl'), passages);
  const history = join(dir, 'history-hard.jsonl');
  linkSync(join(rag, '3_history.jsonl'), history);
  const simulate = (trace: string, ...args: string[]) =>
    cli(['simulate', '--trace', trace, '--workers', '2', '--policies', 'cost', '--no-progress', ...args]);
  const cases: Array<[string, string, string, string]> = [
    [rag, '--assignments', join(rag, '0_trace.jsonl'), join(rag, '0_trace.jsonl')],
    [rag, '--report', join(rag, '5_web_search.jsonl'), join(rag, '5_web_search.jsonl')],
    [rag, '--report', passages, join(rag, '2_passages.jsonl')],
    [rag, '--assignments', history, join(rag, '3_history.jsonl')],
    [rag, '--assignments', join(rag, '4_user_input.jsonl.gz'), join(rag, '4_user_input.jsonl.gz')],
    // the directory named through a link
    [link, '--assignments', join(rag, '1_sys_prompt.jsonl'), join(link, '1_sys_prompt.jsonl')],
  ];
  for (const [trace, flag, out, read] of cases)
    refused(
      simulate(trace, flag, out),
      `${flag} ${out} is the same file as ${read}, which --trace ${trace} reads: writing it would destroy the input`,
    );
  refused(
    simulate(rag, '--assignments', join(rag, '4_user_input.jsonl')),
    `--assignments ${join(rag, '4_user_input.jsonl')} would be read by --trace ${rag} in place of ${join(rag, '4_user_input.jsonl.gz')}: writing it would change the input`,
  );
  for (const [n, bytes] of before) assert.deepEqual(readFileSync(join(rag, n)), bytes, n);
  assert.deepEqual(readdirSync(rag).sort(), [...before.keys()].sort());
  // another file in the directory is no input
  const ok = simulate(rag, '--assignments', join(rag, 'assignments.jsonl'));
  assert.equal(ok.status, 0, ok.stderr);
  assert.ok(readFileSync(join(rag, 'assignments.jsonl'), 'utf8').length > 0);
});

test('--fail and --drain refuse a worker index with leading zeros, naming the flag and the name to write', () => {
  const simulate = (...args: string[]) =>
    cli([
      'simulate',
      '--trace',
      'workflows:1',
      '--workers',
      '4',
      '--policies',
      'round-robin',
      '--no-progress',
      ...args,
    ]);
  refused(
    simulate('--fail', 'w01@10s'),
    "--fail: 'w01' is no worker name: write w1 (w and the index, without leading zeros)",
  );
  refused(
    simulate('--drain', '00@1s'),
    "--drain: '00' is no worker name: write w0 (w and the index, without leading zeros)",
  );
  refused(
    simulate('--fail', `w0${'9'.repeat(400)}@1s`),
    `--fail: 'w0${'9'.repeat(78)}…' (402 characters) is no worker name: the workers are w0..w3 (w and the index, without leading zeros)`,
  );
  // the names as the simulator gives them, and the bare index, are taken
  for (const spec of ['w0@1s', 'w3@1s', '2@1s']) {
    const ok = simulate('--fail', spec, '--format', 'json');
    assert.equal(ok.status, 0, `${spec}: ${ok.stderr}`);
  }
});
