import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { Command } from 'commander';
import { parse as parseYaml } from 'yaml';
import { registerServeCommand, resolveServeConfig } from '../../src/cli/commands/serve.js';
import { DEFAULT_COST_WEIGHTS, KVAwareRouter } from '../../src/index.js';
import { CLI } from '../helpers/cli-entry.js';

function tune(format: string, trace = 'workflows:30:5'): string {
  const r = spawnSync(
    process.execPath,
    [...CLI, 'tune', '--trace', trace, '--workers', '2', '--trials', '3', '--format', format],
    { encoding: 'utf8' },
  );
  assert.equal(r.status, 0, r.stderr);
  return r.stdout;
}

/** Resolves `serve` settings as the command would, without starting it. */
function serveConfig(args: string[]) {
  const program = new Command().exitOverride().configureOutput({ writeErr: () => {} });
  registerServeCommand(program);
  const serve = program.commands.find((c) => c.name() === 'serve')!;
  let config: ReturnType<typeof resolveServeConfig> | undefined;
  serve.action(() => {
    config = resolveServeConfig(serve, {});
  });
  program.parse(['node', 'contextforge-router', 'serve', ...args]);
  return config!;
}

test('tune output is a serve --config file and the options of new KVAwareRouter()', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-tune-'));
  for (const format of ['yaml', 'options']) {
    const out = tune(format);
    const parsed = parseYaml(out) as { policy: string; costWeights: Record<string, number> };
    assert.equal(parsed.policy, 'cost');
    assert.deepEqual(
      Object.keys(parsed.costWeights).sort(),
      Object.keys(DEFAULT_COST_WEIGHTS).sort(),
      `${format}: every weight is printed`,
    );
    // pasted as it is into router.yaml: with the workers appended (a JSON document takes them as flags)
    const file = join(dir, `router-${format}.yaml`);
    writeFileSync(file, format === 'yaml' ? `${out}\nworkers:\n  - id=w1,url=http://127.0.0.1:9001\n` : out);
    const config = serveConfig([
      '--config',
      file,
      ...(format === 'yaml' ? [] : ['--worker', 'id=w1,url=http://127.0.0.1:9001']),
    ]);
    assert.deepEqual(
      config.workers.map((w) => w.id),
      ['w1'],
    );
    assert.equal(config.policy, 'cost');
    assert.deepEqual(config.costWeights, parsed.costWeights);
    // pasted into the constructor (the `options` format is a JS object literal as printed)
    const options = format === 'options' ? (new Function(`return (${out});`)() as typeof parsed) : parsed;
    const router = new KVAwareRouter(options);
    assert.deepEqual({ ...router.costWeights }, parsed.costWeights);
    // serve builds its router from the same settings
    assert.deepEqual(
      { ...new KVAwareRouter({ policy: config.policy, costWeights: config.costWeights }).costWeights },
      parsed.costWeights,
    );
  }
});

test("a trace's file name with line breaks adds no key to the block tune prints", () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-tune-'));
  // each break followed by a key that serve takes, and a `#` that would close what is left
  const trace = join(
    dir,
    'a\npublic-route-api: true\n#b\rport: 1\r#c\u2028host: 0.0.0.0\u2028#d\u2029num-workers: 3\u2029#e\u0085#\x1b[2K.jsonl',
  );
  const lines = readFileSync(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url), 'utf8')
    .split('\n')
    .slice(0, 20);
  writeFileSync(trace, lines.join('\n') + '\n');
  for (const format of ['yaml', 'options', 'json']) {
    const out = tune(format, trace);
    // eslint-disable-next-line no-control-regex -- the characters that must not be printed
    assert.doesNotMatch(out, /[\r\u2028\u2029\u0085\x1b]/, `${format}: no raw control character or line separator`);
    if (format === 'json') continue;
    assert.deepEqual(Object.keys(parseYaml(out) as object), ['policy', 'costWeights'], format);
    if (format === 'yaml')
      assert.equal(
        out.split('\n')[0],
        '# cost weights tuned by contextforge-router tune on a\\x0apublic-route-api: true\\x0a#b\\x0dport: 1\\x0d#c\\u2028host: 0.0.0.0\\u2028#d\\u2029num-workers: 3\\u2029#e\\x85#\\x1b[2K.jsonl',
      );
    const file = join(dir, `router-${format}.yaml`);
    writeFileSync(file, out);
    const config = serveConfig(['--config', file, '--worker', 'id=w1,url=http://127.0.0.1:9001']);
    assert.equal(config.publicRouteApi, false, format);
    assert.equal(config.port, 8080, format);
    assert.equal(config.host, '127.0.0.1', format);
    assert.equal(config.numWorkers, 1, format);
    assert.equal(config.policy, 'cost', format);
  }
});

test('serve takes cost weights and peer options from flags and the environment, and names a bad key', () => {
  assert.deepEqual(serveConfig(['--cost-weights', '{recompute: 2, workflow: 0}']).costWeights, {
    recompute: 2,
    workflow: 0,
  });
  assert.deepEqual(serveConfig(['--policy-options', '{"dynamo": {"prefillLoadScale": 2}}']).policyOptions, {
    dynamo: { prefillLoadScale: 2 },
  });
  assert.throws(
    () => serveConfig(['--cost-weights', '{bogus: 1}']),
    /--cost-weights: costWeights.bogus is not a cost weight/,
  );
  assert.throws(
    () => serveConfig(['--cost-weights', '{recompute: -1}']),
    /costWeights.recompute must be a finite number >= 0/,
  );
  assert.throws(() => serveConfig(['--cost-weights', '[1, 2]']), /--cost-weights must be a mapping/);
  assert.throws(
    () => serveConfig(['--policy-options', '{vllm: {}}']),
    /--policy-options: policyOptions.vllm is not a policy with options/,
  );
  const dir = mkdtempSync(join(tmpdir(), 'cf-tune-'));
  const both = join(dir, 'both.yaml');
  writeFileSync(both, 'costWeights: {recompute: 2}\ncost-weights: {recompute: 3}\n');
  assert.throws(() => serveConfig(['--config', both]), /give costWeights or cost-weights, not both/);
  const bad = join(dir, 'bad.yaml');
  writeFileSync(bad, 'costWeights:\n  recompute: lots\n');
  assert.throws(() => serveConfig(['--config', bad]), /costWeights.recompute must be a finite number/);
  const saved = process.env.CONTEXTFORGE_COST_WEIGHTS;
  process.env.CONTEXTFORGE_COST_WEIGHTS = '{"load": 0.25}';
  try {
    assert.deepEqual(serveConfig([]).costWeights, { load: 0.25 });
  } finally {
    if (saved === undefined) delete process.env.CONTEXTFORGE_COST_WEIGHTS;
    else process.env.CONTEXTFORGE_COST_WEIGHTS = saved;
  }
});
