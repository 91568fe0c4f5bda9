import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { CLI } from '../helpers/cli-entry.js';

const cli = (args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8', timeout: 120_000 });

/** The one-line error of a refused command line (exit 2, nothing on stdout). */
function refusal(args: string[]): string {
  const r = cli(args);
  assert.equal(r.status, 2, `${args.join(' ')}: ${r.error?.message ?? r.stderr}`);
  assert.equal(r.stdout, '', args.join(' '));
  assert.equal(r.stderr.split('\n').filter(Boolean).length, 1, r.stderr);
  return r.stderr.trimEnd();
}

const simulate = ['simulate', '--trace', 'workflows:1', '--workers', '2', '--policies', 'cost', '--no-progress'];

test('the flags documented as repeatable still take several values', () => {
  const serve = cli([
    'serve',
    '--worker',
    'id=a,url=http://h:1',
    '--worker',
    'id=b,url=http://h:2',
    '--print-config',
    'json',
  ]);
  assert.equal(serve.status, 0, serve.stderr);
  assert.deepEqual(
    JSON.parse(serve.stdout).workers.value.map((w: { id: string }) => w.id),
    ['a', 'b'],
  );
  const sim = cli([...simulate, '--fail', 'w0@1s', '--fail', 'w1@2s', '--format', 'json']);
  assert.equal(sim.status, 0, sim.stderr);
  // a flag may still override its environment variable
  const env = spawnSync(
    process.execPath,
    [...CLI, 'serve', '--worker', 'id=a,url=http://h:1', '--port', '9100', '--print-config', 'json'],
    {
      encoding: 'utf8',
      timeout: 120_000,
      env: { ...process.env, CONTEXTFORGE_PORT: '9000' },
    },
  );
  assert.equal(env.status, 0, env.stderr);
  assert.equal(JSON.parse(env.stdout).settings.port.value, 9100);
});

test('simulate refuses a flag another makes ignored, naming both', () => {
  assert.equal(
    refusal([...simulate, '--worker-kv-tokens', '100000,100000', '--kv-tokens', '1']),
    "error: --kv-tokens and --worker-kv-tokens both set the engines' KV: give one (--worker-kv-tokens sets each worker's, and --kv-tokens would be ignored)",
  );
  assert.equal(
    refusal([...simulate, '--fail', 'w0@1s', '--drain', 'w0@1s']),
    "error: --drain 'w0@1s' comes at or after --fail 'w0@1s': a failed worker has nothing to drain (drain it before it fails, or leave one out)",
  );
  assert.match(
    refusal([...simulate, '--fail', 'w1@1s', '--drain', 'w0@1s,w1@2s']),
    /^error: --drain 'w1@2s' comes at or after --fail 'w1@1s'/,
  );
  assert.match(
    refusal([...simulate, '--scenario-seed', '3']),
    /^error: --scenario-seed needs --event-jitter-ms, --event-loss, --cancel-rate or --non-streaming-share above 0/,
  );
  assert.match(refusal([...simulate, '--scenario-seed', '3', '--event-loss', '0']), /^error: --scenario-seed needs/);
  // a worker drained, then failed, is a scenario of its own; a seed with draws to seed is taken
  const ok = cli([
    ...simulate,
    '--drain',
    'w0@1s',
    '--fail',
    'w0@2s',
    '--scenario-seed',
    '3',
    '--event-loss',
    '0.1',
    '--format',
    'json',
  ]);
  assert.equal(ok.status, 0, ok.stderr);
});

test('an empty path is refused for every path flag', () => {
  const cases: Array<[string[], string]> = [
    [['simulate', '--trace', ''], '--trace'],
    [['tune', '--trace', ''], '--trace'],
    [[...simulate, '--report', ''], '--report'],
    [[...simulate, '--assignments', ''], '--assignments'],
    [['mock-engine', '--port', '0', '--tokenizer', ''], '--tokenizer'],
  ];
  for (const [args, flag] of cases)
    assert.match(
      refusal(args),
      new RegExp(`^error: option '${flag} <\\w+>' argument '' is invalid\\. ${flag} must not be empty$`),
    );
});
