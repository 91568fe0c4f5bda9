import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { Command } from 'commander';
import { registerSimulateCommand } from '../../src/cli/commands/simulate.js';
import { DynamoPolicy } from '../../src/core/policies/dynamo.js';
import { LlmdPolicy } from '../../src/core/policies/llmd.js';
import { LlmdAffinityPolicy } from '../../src/core/policies/llmd-affinity.js';
import { POLICY_OPTIONS_SCHEMA } from '../../src/core/policies/options-schema.js';
import { SeedPolicy } from '../../src/core/policies/seed.js';
import { SglangPolicy } from '../../src/core/policies/sglang.js';
import { SmgPolicy } from '../../src/core/policies/smg.js';
import { resolveServe } from '../helpers/serve-config.js';
import { CLI } from '../helpers/cli-entry.js';

const cli = (args: string[]) => spawnSync(process.execPath, [...CLI, ...args], { encoding: 'utf8', timeout: 60_000 });

/** What `simulate ARGS` reports when commander refuses a flag (without running anything). */
async function simulateRefusal(args: string[]): Promise<string> {
  let message = '';
  const program = new Command()
    .exitOverride()
    .configureOutput({ writeErr: (text) => (message += text), writeOut: () => {} });
  registerSimulateCommand(program);
  program.commands[0].action(() => assert.fail(`simulate ${args.join(' ')} was not refused`));
  await assert.rejects(program.parseAsync(['node', 'contextforge-router', 'simulate', ...args]));
  return message;
}

/** Each peer policy built from its options alone, as the simulator and the router build it. */
const BUILD: Record<string, (options: Record<string, unknown>) => unknown> = {
  dynamo: (o) => new DynamoPolicy({ random: () => 0.5 }, o),
  sglang: (o) => new SglangPolicy(o),
  smg: (o) => new SmgPolicy(o),
  llmd: (o) => new LlmdPolicy({ random: () => 0.5 }, o),
  'llmd-affinity': (o) => new LlmdAffinityPolicy({ random: () => 0.5 }, o),
  seed: (o) => new SeedPolicy(o as never),
};

test('every peer option the flag check takes, the policy takes too', () => {
  const names = ['kv-usage', 'queue-inclusive', 'text', 'events'];
  const probes: unknown[] = [-1, -1e-9, 0, 1e-3, 0.5, 1, 1.5, 2, 1000, 1e9, ...names, '1', true];
  const shape = POLICY_OPTIONS_SCHEMA.shape;
  assert.deepEqual(Object.keys(shape).sort(), Object.keys(BUILD).sort());
  for (const [peer, schema] of Object.entries(shape)) {
    const peerShape = (schema.unwrap() as { shape: Record<string, unknown> }).shape;
    for (const option of Object.keys(peerShape))
      for (const value of probes) {
        const given = { [peer]: { [option]: value } };
        if (!POLICY_OPTIONS_SCHEMA.safeParse(given).success) continue;
        assert.doesNotThrow(() => BUILD[peer]({ [option]: value }), `${peer}.${option} = ${String(value)}`);
      }
  }
});

test('a peer option out of its policy range is refused where the flag or the config file gives it', async () => {
  const cases: Array<[string, RegExp]> = [
    ['{"dynamo":{"gpuCredit":2}}', /policyOptions\.dynamo\.gpuCredit must be <= 1 \(got 2\)/],
    ['{"dynamo":{"offloadCredit":-0.5}}', /policyOptions\.dynamo\.offloadCredit must be .*\(got -0\.5\)/],
    ['{"dynamo":{"predictedCredit":1.5}}', /policyOptions\.dynamo\.predictedCredit must be <= 1 \(got 1\.5\)/],
    ['{"dynamo":{"prefillLoadScale":-1}}', /policyOptions\.dynamo\.prefillLoadScale must be .*>= 0 \(got -1\)/],
    ['{"dynamo":{"activeRequestWeight":-1}}', /policyOptions\.dynamo\.activeRequestWeight must be .*>= 0/],
    ['{"llmd":{"kvWeight":-1}}', /policyOptions\.llmd\.kvWeight must be .*>= 0 \(got -1\)/],
    ['{"llmd":{"prefixWeight":-2}}', /policyOptions\.llmd\.prefixWeight must be .*>= 0/],
    ['{"llmd":{"queueWeight":-3}}', /policyOptions\.llmd\.queueWeight must be .*>= 0/],
    ['{"llmd":{"scrapeIntervalMs":"5"}}', /policyOptions\.llmd\.scrapeIntervalMs must be a finite number/],
    ['{"llmd-affinity":{"affinityThreshold":1.2}}', /policyOptions\.llmd-affinity\.affinityThreshold must be <= 1/],
    ['{"llmd-affinity":{"tokenLoadCapacity":0}}', /policyOptions\.llmd-affinity\.tokenLoadCapacity must be >= 1/],
    [
      '{"sglang":{"evictionIntervalSecs":1e300}}',
      /policyOptions\.sglang\.evictionIntervalSecs must be <= 4294967295 \(got 1e\+300\)/,
    ],
    ['{"smg":{"mode":"grpc"}}', /policyOptions\.smg\.mode must be one of text, tokens, events \(got .grpc.\)/],
    ['{"smg":{"balanceRelThreshold":0.5}}', /policyOptions\.smg\.balanceRelThreshold must be >= 1 \(got 0\.5\)/],
    ['{"smg":{"balanceTokenUsageThreshold":0}}', /policyOptions\.smg\.balanceTokenUsageThreshold must be > 0/],
    ['{"smg":{"maxTreeSize":1.5}}', /policyOptions\.smg\.maxTreeSize must be an integer \(got 1\.5\)/],
    ['{"sglang":{"evictionIntervalSecs":0}}', /policyOptions\.sglang\.evictionIntervalSecs must be >= 1 \(got 0\)/],
    [
      '{"sglang":{"evictionIntervalSecs":2.5}}',
      /policyOptions\.sglang\.evictionIntervalSecs must be a whole number of seconds \(got 2\.5\)/,
    ],
  ];
  const dir = mkdtempSync(join(tmpdir(), 'cf-policy-options-'));
  for (const [i, [options, message]] of cases.entries()) {
    // simulate: commander stops at the flag
    const sim = await simulateRefusal(['--trace', 'workflows:1', '--policy-options', options]);
    assert.match(sim, /--policy-options: /, options);
    assert.match(sim, message, options);
    // serve (and epp, which reads the same settings): the flag and the config file
    assert.throws(
      () => resolveServe(['--policy-options', options]),
      (e: Error) => /--policy-options: /.test(e.message) && message.test(e.message),
      options,
    );
    const file = join(dir, `router-${i}.json`);
    writeFileSync(file, JSON.stringify({ policyOptions: JSON.parse(options) as unknown }));
    assert.throws(
      () => resolveServe(['--config', file]),
      (e: Error) => e.message.startsWith(`--config ${file}: policyOptions.`) && message.test(e.message),
      options,
    );
  }
  // the whole command: one line, exit 2
  const sim = cli(['simulate', '--trace', 'workflows:1', '--policies', 'dynamo', '--policy-options', cases[0][0]]);
  assert.equal(sim.status, 2, sim.stderr);
  assert.match(sim.stderr, /^error: .*--policy-options: policyOptions\.dynamo\.gpuCredit must be <= 1 \(got 2\)\n$/);
  const epp = cli(['epp', '--port', '0', '--policy-options', cases[0][0]]);
  assert.equal(epp.status, 2, epp.stderr);
  assert.match(epp.stderr, /--policy-options: policyOptions\.dynamo\.gpuCredit must be <= 1/);
});

test("sglang's eviction interval takes SGLang's whole seconds from 1, up to 2^32 - 1, in the constructor too", () => {
  assert.equal(new SglangPolicy({ evictionIntervalSecs: 1 }).evictionIntervalMs, 1000);
  assert.equal(new SglangPolicy({ evictionIntervalSecs: 4_294_967_295 }).evictionIntervalMs, 4_294_967_295_000);
  for (const bad of [0, 2.5, 4_294_967_296, 1e300, Infinity, Number.NaN])
    assert.throws(
      () => new SglangPolicy({ evictionIntervalSecs: bad }),
      (e: Error) =>
        e instanceof RangeError &&
        e.message === `sglang.evictionIntervalSecs must be a whole number of seconds from 1 to 4294967295, got ${bad}`,
      String(bad),
    );
});
