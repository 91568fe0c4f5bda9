import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

const main = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
const trace = fileURLToPath(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url));
const cli = (...args: string[]) =>
  spawnSync(process.execPath, ['--import', 'tsx', main, ...args], { encoding: 'utf8' });

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
