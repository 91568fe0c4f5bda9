import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { CLI } from '../helpers/cli-entry.js';

const trace = fileURLToPath(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url));
const cli = (...args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8' });

test('simulate --format json prints the keys of docs/architecture.md §7', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-sim-'));
  const assignments = join(dir, 'a.jsonl');
  const report = join(dir, 'r.html');
  const r = cli(
    'simulate',
    '--trace',
    trace,
    '--workers',
    '4',
    '--policies',
    'cost,round-robin',
    '--format',
    'json',
    '--assignments',
    assignments,
    '--report',
    report,
  );
  assert.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  assert.equal(out.trace, 'mooncake-conversation-head300.jsonl');
  assert.equal(out.requests, 300);
  assert.equal(out.workers, 4);
  assert.deepEqual(Object.keys(out.bounds).sort(), ['idealTtftMean', 'infiniteCacheHitRate']);
  assert.deepEqual(
    out.policies.map((p: { policy: string }) => p.policy),
    ['cost', 'round-robin'],
  );
  for (const p of out.policies) {
    for (const k of ['hitRate', 'throughputTokPerS', 'loadImbalance', 'prefillTokens'])
      assert.equal(typeof p[k], 'number', k);
    assert.deepEqual(Object.keys(p.ttft).sort(), ['mean', 'p50', 'p90', 'p99']);
    assert.deepEqual(Object.keys(p.e2e).sort(), ['mean', 'p99']);
  }
  const lines = readFileSync(assignments, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  assert.equal(lines.length, 600);
  assert.deepEqual(Object.keys(lines[0]).sort(), [
    'cachedTokens',
    'e2e',
    'policy',
    'promptTokens',
    'request',
    'ttft',
    'worker',
  ]);
  assert.ok(lines.every((l) => l.worker >= 0 && l.worker < 4 && l.request >= 0 && l.request < 300));
  const html = readFileSync(report, 'utf8');
  assert.match(html, /<svg/);
  assert.doesNotMatch(html, /<script|src="http/);
  // the page names the settings the run was given, defaults resolved
  assert.match(
    html,
    /<p>Settings: <code>--workers 4<\/code>, <code>--speed 1<\/code>, <code>--kv-tokens 300000<\/code> \(default\)/,
  );
  assert.match(html, /no scenario .*; KV block size 512 tokens \(the trace's\)/);
});

test('simulate prints a table by default', () => {
  const r = cli('simulate', '--trace', trace, '--workers', '2', '--policies', 'cost');
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /bounds: infinite-cache hit rate/);
  assert.match(r.stdout, /^cost\s/m);
});

test("simulate's table shows a trace's file name on its line, control characters escaped", () => {
  const file = join(mkdtempSync(join(tmpdir(), 'cf-sim-')), 'a\n\x1b]0;title\x07\r\u2028b.jsonl');
  writeFileSync(file, readFileSync(trace, 'utf8').split('\n').slice(0, 20).join('\n') + '\n');
  const r = cli('simulate', '--trace', file, '--workers', '2', '--policies', 'cost');
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^a\\x0a\\x1b\]0;title\\x07\\x0d\\u2028b\.jsonl: 20 requests, 2 workers/);
  // eslint-disable-next-line no-control-regex -- the characters that must not be printed
  assert.doesNotMatch(r.stdout, /[\x07\x1b\r\u2028]/);
});

test('simulate rejects bad input with a message and a non-zero exit', () => {
  const cases: Array<[string[], RegExp]> = [
    [['simulate', '--trace', '/nonexistent.jsonl'], /no such file/],
    [['simulate', '--trace', trace, '--policies', 'cost,bogus'], /unknown policy 'bogus'/],
    [['simulate', '--trace', trace, '--format', 'xml'], /--format must be table or json/],
    [['simulate', '--trace', trace, '--speed', '0'], /--speed must be a positive number/],
    [['simulate', '--trace', trace, '--workers', '0'], /--workers must be >= 1/],
    [['simulate'], /--trace/],
  ];
  for (const [args, message] of cases) {
    const r = cli(...args);
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr, message, args.join(' '));
  }
});

test('simulate --trace workflows:N beyond its limit: the message names --trace and the bound, exit 2', () => {
  const r = cli('simulate', '--trace', 'workflows:10001', '--workers', '2', '--policies', 'cost');
  assert.equal(r.status, 2);
  assert.equal(r.stderr, 'error: --trace workflows:N needs N from 1 to 10000, got 10001\n');
  assert.equal(r.stdout, '');
});

test('a --fail or --drain timed after the last request ended is said to have changed nothing', () => {
  const args = ['simulate', '--trace', trace, '--workers', '4', '--policies', 'cost,round-robin', '--format', 'json'];
  const quiet = cli(...args);
  assert.equal(quiet.status, 0, quiet.stderr);
  // the head of the trace spans minutes: 60 minutes later every request has ended
  const late = cli(...args, '--fail', 'w1@60m', '--drain', 'w2@10s', '--drain', 'w3@59m');
  assert.equal(late.status, 0, late.stderr);
  const warnings = late.stderr.split('\n').filter((l) => l.startsWith('warning: '));
  assert.equal(warnings.length, 2, late.stderr);
  assert.match(
    warnings[0],
    /^warning: --fail 'w1@60m' comes after every policy's last request ended \(\d+\.\d s of simulated time\): it changed nothing$/,
  );
  assert.match(warnings[1], /^warning: --drain 'w3@59m' comes after /);
  // a drain in the run's time changes what the policies did; the late failure does not
  assert.equal(
    JSON.stringify(JSON.parse(cli(...args, '--fail', 'w1@60m').stdout)),
    JSON.stringify(JSON.parse(quiet.stdout)),
  );
  assert.notEqual(JSON.stringify(JSON.parse(late.stdout)), JSON.stringify(JSON.parse(quiet.stdout)));
});
