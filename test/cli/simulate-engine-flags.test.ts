import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { CLI } from '../helpers/cli-entry.js';

const trace = fileURLToPath(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url));
const cli = (...args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8' });

test('simulate --max-model-len rejects longer requests and counts them per policy', () => {
  const r = cli(
    'simulate',
    '--trace',
    trace,
    '--workers',
    '2',
    '--policies',
    'cost,round-robin',
    '--max-model-len',
    '8192',
    '--format',
    'json',
  );
  assert.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  const [cost, rr] = out.policies;
  assert.ok(cost.rejected > 0 && cost.rejected < 300);
  assert.equal(rr.rejected, cost.rejected);
  const table = cli('simulate', '--trace', trace, '--workers', '2', '--policies', 'cost', '--max-model-len', '8192');
  assert.match(table.stdout, /rejected/);
  assert.match(table.stdout, new RegExp(`^cost\\s.*\\s${cost.rejected}\\s*$`, 'm'));
});

test('simulate --trace agentic:N[:SEED] and --blend-recompute run; bad values exit with a message', () => {
  const r = cli(
    'simulate',
    '--trace',
    'agentic:2:1',
    '--workers',
    '2',
    '--policies',
    'cost',
    '--blend-recompute',
    '0.3',
    '--kv-tokens',
    '600000',
    '--max-model-len',
    '262144',
    '--format',
    'json',
  );
  assert.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  assert.equal(out.trace, 'agentic:2:1');
  assert.ok(out.requests > 20);
  for (const [args, message] of [
    [['--blend-recompute', '1.5'], /--blend-recompute must be a number from 0 to 1/],
    [['--max-model-len', '0'], /--max-model-len must be >= 1/],
    [['--trace', 'agentic:0'], /agentic:N needs N/],
  ] as Array<[string[], RegExp]>) {
    const bad = cli('simulate', '--trace', trace, ...args);
    assert.notEqual(bad.status, 0, args.join(' '));
    assert.match(bad.stderr, message, args.join(' '));
  }
});

test('simulate bounds count only the requests a worker of --worker-kv-tokens can hold', () => {
  const simulate = (...capacity: string[]) =>
    cli(
      'simulate',
      '--trace',
      'workflows:40',
      '--workers',
      '2',
      '--policies',
      'cost',
      ...capacity,
      '--format',
      'json',
      '--no-progress',
    );
  // 2,000 tokens per worker: all but one of the generated requests need more KV blocks
  const r = simulate('--worker-kv-tokens', '2000,2000');
  assert.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  const [cost] = out.policies;
  assert.ok(cost.rejected > 0, 'the small workers reject requests');
  assert.ok(out.bounds.idealTtftMean <= cost.ttft.mean + 1e-9, `ideal ${out.bounds.idealTtftMean} > ${cost.ttft.mean}`);
  assert.ok(out.bounds.infiniteCacheHitRate >= cost.hitRate - 1e-9);
  // the same capacity given as --kv-tokens gives the same bounds
  const same = simulate('--kv-tokens', '2000');
  assert.equal(same.status, 0, same.stderr);
  assert.deepEqual(JSON.parse(same.stdout).bounds, out.bounds);
});

test('simulate refuses a flag whose companion is missing, and an engine smaller than one KV block', () => {
  const run = (...args: string[]) =>
    cli('simulate', '--trace', 'workflows:2', '--policies', 'cost', '--no-progress', ...args);
  const cases: Array<[string[], string]> = [
    [
      ['--state-lag-ms', '5'],
      '--state-lag-ms needs --replicas 2 or more: it delays the state router replicas share, and one router shares none',
    ],
    [
      ['--replicas', '1', '--state-lag-ms', '5'],
      '--state-lag-ms needs --replicas 2 or more: it delays the state router replicas share, and one router shares none',
    ],
    [
      ['--cancel-within-ms', '5'],
      '--cancel-within-ms needs --cancel-rate above 0: it times the cancellations that rate draws',
    ],
    [
      ['--kv-tokens', '1'],
      "--kv-tokens 1 is less than one KV block (64 tokens, the trace's block size): the engine could hold no request",
    ],
    [
      ['--max-model-len', '63'],
      "--max-model-len 63 is less than one KV block (64 tokens, the trace's block size): the engine could hold no request",
    ],
    [
      ['--workers', '2', '--worker-kv-tokens', '600,63'],
      "--worker-kv-tokens: entry 2 (63) is less than one KV block (64 tokens, the trace's block size): the engine could hold no request",
    ],
  ];
  for (const [args, message] of cases) {
    const r = run(...args);
    assert.equal(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.equal(r.stderr, `error: ${message}\n`);
    assert.equal(r.stdout, '');
  }
  // with their companions (and a block's worth of KV) they run
  for (const args of [
    ['--replicas', '2', '--state-lag-ms', '5'],
    ['--cancel-rate', '0.5', '--cancel-within-ms', '5'],
    ['--kv-tokens', '64'],
    ['--max-model-len', '64'],
  ]) {
    const r = run(...args);
    assert.equal(r.status, 0, `${args.join(' ')}: ${r.stderr}`);
  }
});

test('simulate warns on stderr when policies rejected different requests, and when one answered none', () => {
  // long prompts between short ones; round-robin sends some to the worker too small for them
  const dir = mkdtempSync(join(tmpdir(), 'cf-sim-rejections-'));
  const file = join(dir, 'hetero.jsonl');
  writeFileSync(
    file,
    Array.from({ length: 24 }, (_, i) => {
      const long = i % 4 === 0;
      const ids = Array.from({ length: long ? 24 : 5 }, (_, k) => (long ? k + 1 : 1000 * i + k));
      return JSON.stringify({
        timestamp: i * 200,
        input_length: long ? 1500 : 300,
        output_length: 10,
        hash_ids: ids,
        block_size: 64,
      });
    }).join('\n'),
  );
  const run = (...args: string[]) =>
    cli('simulate', '--trace', file, '--policies', 'cost,round-robin', '--no-progress', ...args);
  const json = run('--workers', '2', '--worker-kv-tokens', '1000,2000000', '--format', 'json');
  assert.equal(json.status, 0, json.stderr);
  const [cost, rr] = JSON.parse(json.stdout).policies;
  assert.equal(rr.rejected, 6);
  assert.match(
    json.stderr,
    new RegExp(`^warning: .*different requests.*\\(cost ${cost.rejected}, round-robin 6\\)`, 'm'),
  );
  const table = run('--workers', '2', '--worker-kv-tokens', '1000,2000000');
  assert.match(table.stdout, /^warning: .*different requests/m);
  // one worker, failed from the start: nothing is answered
  const none = run('--workers', '1', '--fail', 'w0@0s', '--format', 'json');
  assert.equal(none.status, 0, none.stderr);
  assert.match(none.stderr, /^warning: cost answered no request/m);
  assert.match(none.stderr, /^warning: round-robin answered no request/m);
  assert.doesNotMatch(none.stdout, /null|NaN/);
});
