import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { constants } from 'node:buffer';
import { existsSync, mkdtempSync, readFileSync, truncateSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { Command } from 'commander';
import { registerDemoCommand } from '../../src/cli/commands/demo.js';
import { registerLiveDemoCommand } from '../../src/cli/commands/live-demo.js';
import { registerMockEngineCommand } from '../../src/cli/commands/mock-engine.js';
import { registerSimulateCommand } from '../../src/cli/commands/simulate.js';
import { registerTuneCommand } from '../../src/cli/commands/tune.js';
import { parseWorkerSpec } from '../../src/cli/commands/serve.js';
import { printConfig } from '../../src/cli/config/print-config.js';
import { KVAwareRouter } from '../../src/index.js';
import { parse as parseYaml } from 'yaml';
import { AdminToken } from '../../src/server/admin-auth.js';
import { loadApiKeysFile } from '../../src/server/api-keys.js';
import { checkTimeouts } from '../../src/server/timeouts.js';
import { parseRedisUrl } from '../../src/state/redis-state-store.js';
import { resolveServe } from '../helpers/serve-config.js';
import { CLI } from '../helpers/cli-entry.js';

function cli(args: string[], env: Record<string, string> = {}) {
  return spawnSync(process.execPath, [...CLI, ...args], {
    encoding: 'utf8',
    env: { ...process.env, ...env },
  });
}

test('a bad flag, a bad variable and an unknown flag exit with status 2, as the configuration document says', () => {
  const flag = cli(['serve', '--offload-credit', '1.5', '--print-config']);
  assert.equal(flag.status, 2, flag.stderr);
  assert.match(flag.stderr, /--offload-credit must be <= 1 \(got 1\.5\)/);
  const env = cli(['serve', '--print-config'], { CONTEXTFORGE_PORT: 'x' });
  assert.equal(env.status, 2, env.stderr);
  assert.match(env.stderr, /from env 'CONTEXTFORGE_PORT'.*--port must be an integer/);
  // a switch given a value, as its variable and config key take one: the extra argument is named
  const valued = cli(['serve', '--public-route-api', 'false', '--print-config']);
  assert.equal(valued.status, 2, valued.stderr);
  assert.match(valued.stderr, /too many arguments for 'serve'/);
  assert.match(valued.stderr, /'false' follows --public-route-api, a switch that takes no value/);
  const extra = cli(['serve', '--port', '80', 'extra', '--print-config']);
  assert.equal(extra.status, 2, extra.stderr);
  assert.doesNotMatch(extra.stderr, /a switch that takes no value/);
  const unknown = cli(['serve', '--max-retrys', '1']);
  assert.equal(unknown.status, 2, unknown.stderr);
  assert.match(unknown.stderr, /unknown option '--max-retrys'/);
  const help = cli(['serve', '--help']);
  assert.equal(help.status, 0, help.stderr);
});

test('a delay longer than a timer holds (2^31 - 1 ms) is refused, wherever it is given', () => {
  const bad = (args: string[], env: Record<string, string> = {}) =>
    assert.throws(() => resolveServe(args, env), /must be <= 2147483647 \(got 2147483648\)/, args.join(' '));
  for (const flag of [
    '--health-interval-ms',
    '--health-timeout-ms',
    '--tokenize-timeout-ms',
    '--stall-timeout-ms',
    '--metrics-interval-ms',
    '--breaker-cooldown-ms',
    '--shutdown-grace-ms',
    '--headers-timeout-ms',
    '--request-timeout-ms',
    '--connection-timeout-ms',
    '--first-byte-timeout-ms',
    '--upstream-timeout-ms',
  ])
    bad([flag, '2147483648']);
  bad([], { CONTEXTFORGE_HEALTH_INTERVAL_MS: '2147483648' });
  assert.throws(
    () => resolveServe(['--discover', 'dns=engines,port=8000,interval-ms=2147483648']),
    /interval-ms must be an integer from 100 to 2147483647, got '2147483648'/,
  );
  assert.throws(
    () => checkTimeouts({ interChunkTimeoutMs: 2 ** 31 }),
    /timeouts\.interChunkTimeoutMs must be <= 2147483647/,
  );
  assert.equal(resolveServe(['--health-interval-ms', '2147483647']).config.healthIntervalMs, 2 ** 31 - 1);
});

test('a health-probe and a tokenize timeout are at least a millisecond, 5 s unless given', () => {
  assert.equal(resolveServe([]).config.healthTimeoutMs, 5000);
  assert.equal(resolveServe(['--health-timeout-ms', '1']).config.healthTimeoutMs, 1);
  assert.equal(resolveServe([], { CONTEXTFORGE_HEALTH_TIMEOUT_MS: '20000' }).config.healthTimeoutMs, 20_000);
  assert.throws(() => resolveServe(['--health-timeout-ms', '0']), /--health-timeout-ms must be >= 1 \(got 0\)/);
  assert.equal(resolveServe([]).config.tokenizeTimeoutMs, 5000);
  assert.equal(resolveServe(['--tokenize-timeout-ms', '250']).config.tokenizeTimeoutMs, 250);
  assert.equal(resolveServe([], { CONTEXTFORGE_TOKENIZE_TIMEOUT_MS: '20000' }).config.tokenizeTimeoutMs, 20_000);
  assert.throws(() => resolveServe(['--tokenize-timeout-ms', '0']), /--tokenize-timeout-ms must be >= 1 \(got 0\)/);
  assert.equal(resolveServe([]).config.stallTimeoutMs, 60_000);
  assert.equal(resolveServe(['--stall-timeout-ms', '0']).config.stallTimeoutMs, 0);
  assert.equal(resolveServe([], { CONTEXTFORGE_STALL_TIMEOUT_MS: '120000' }).config.stallTimeoutMs, 120_000);
});

test('a config file is read up to a bound, as text, with every YAML problem an error naming its source', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-config-input-'));
  const write = (name: string, text: string | Buffer) => {
    writeFileSync(join(dir, name), text);
    return join(dir, name);
  };
  const bad = (file: string, message: RegExp, env: Record<string, string> = {}) =>
    assert.throws(() => resolveServe(env.CONTEXTFORGE_CONFIG ? [] : ['--config', file], env), message, file);
  const big = write('big.yaml', `# ${'x'.repeat(4 * 1024 * 1024)}\nport: 1\n`);
  bad(big, new RegExp(`^RangeError: --config ${big}: larger than 4194304 bytes$`));
  // a device or pipe is refused before it is read (a FIFO without a writer would block forever)
  if (existsSync('/dev/zero')) bad('/dev/zero', /--config \/dev\/zero: is not a regular file$/);
  bad(write('nul.yaml', Buffer.from([0x70, 0x6f, 0x72, 0x74, 0x3a, 0x20, 0x31, 0x00, 0x0a])), /holds NUL bytes/);
  bad(write('tag.yaml', 'host: !bogus 0.0.0.0\n'), /tag\.yaml: Unresolved tag: !bogus at line 1/);
  bad(write('two.yaml', 'port: 1\n---\nport: 2\n'), /two\.yaml: holds 2 YAML documents/);
  bad(
    write('deep.yaml', `workers: ${'['.repeat(5000)}${']'.repeat(5000)}\n`),
    /deep\.yaml: nested more than 64 levels deep \(line 1, column 73\)$/,
  );
  // a few megabytes of empty lists took gigabytes to parse: refused before, by their count
  bad(
    write('many.yaml', `judge-roles: [${Array(250_001).fill('[]').join(',')}]\n`),
    /many\.yaml: holds more than 250000 values/,
  );
  const dup = write('dup.yaml', 'port: 1\nport: 2\n');
  bad(dup, new RegExp(`CONTEXTFORGE_CONFIG ${dup}: Map keys must be unique`), { CONTEXTFORGE_CONFIG: dup });
  const ok = write('ok.yaml', '\ufeff# comment\nport: 9001\n');
  assert.equal(resolveServe(['--config', ok]).config.port, 9001);
  assert.equal(resolveServe(['--config', write('empty.yaml', '')]).config.port, 8080);
});

test('a worker URL with a path or a malformed escape in its credentials exits 2 naming url, before anything starts', () => {
  for (const [url, message] of [
    ['http://127.0.0.1:1/v1', /url must be the engine's origin without a path/],
    ['http://u:p%@127.0.0.1:1', /url has a user name or password with a malformed percent-escape/],
  ] as const) {
    const run = cli(['serve', '--port', '0', '--worker', `id=x,url=${url}`, '--print-config']);
    assert.equal(run.status, 2, run.stderr);
    assert.match(run.stderr, message);
    assert.doesNotMatch(run.stderr, /\n\s+at /, 'no stack trace');
    assert.equal(run.stderr.trim().split('\n').length, 1, run.stderr);
  }
});

test('a worker or discovery spec with a key given twice, or an address nothing listens on, is refused', () => {
  const bad = (spec: string, message: RegExp) => assert.throws(() => parseWorkerSpec(spec), message, spec);
  bad('id=a,url=http://h:8000,id=b', /--worker 'id=a,url=http:\/\/h:8000,id=b': 'id' is given twice/);
  bad('id=a,url=http://h:0', /url must have a port from 1 to 65535/);
  for (const events of ['tcp://h', 'tcp://h:0', 'tcp://h:65536', 'tcp://h:5557x'])
    bad(`id=a,url=http://h:1,events=${events}`, /events must be tcp:\/\/HOST:PORT with a port from 1 to 65535/);
  assert.equal(parseWorkerSpec('id=a,url=http://h:1,events=tcp://[::1]:5557').events, 'tcp://[::1]:5557');
  assert.equal(parseWorkerSpec('id=a,url=http://h:1,events=ipc:///tmp/e').events, 'ipc:///tmp/e');
  assert.throws(
    () => resolveServe(['--discover', 'dns=e,port=1,port=2']),
    /--discover 'dns=e,port=1,port=2': 'port' is given twice$/,
  );
  assert.throws(() => resolveServe(['--discover', 'dns=e,port=1,interval-ms=0x100']), /interval-ms must be an integer/);
  for (const objectives of ['a=', 'a=0x10', 'a=1e3'])
    assert.throws(() => resolveServe(['--objectives', objectives]), /is not NAME=INTEGER/, objectives);
  assert.throws(() => resolveServe(['--objectives', 'a=1,a=2']), /--objectives: 'a' is given twice/);
  assert.deepEqual(
    resolveServe(['--objectives', 'a=-1,b=+2']).config.objectives,
    new Map([
      ['a', -1],
      ['b', 2],
    ]),
  );
});

/** The message a command line is refused with, parsed by the real commands (nothing runs). */
async function refusal(args: string[]): Promise<string> {
  const program = new Command().exitOverride().configureOutput({ writeErr: () => {}, writeOut: () => {} });
  for (const register of [
    registerSimulateCommand,
    registerTuneCommand,
    registerDemoCommand,
    registerLiveDemoCommand,
    registerMockEngineCommand,
  ])
    register(program);
  try {
    await program.parseAsync(['node', 'contextforge-router', ...args]);
  } catch (err) {
    return (err as Error).message;
  }
  return assert.fail(`accepted: ${args.join(' ')}`);
}

test('seeds past 32 bits are refused, naming the flag: they would repeat smaller seeds', async () => {
  const cases: Array<[string[], RegExp]> = [
    [
      ['simulate', '--trace', 'workflows:1', '--scenario-seed', '4294967296'],
      /--scenario-seed must be <= 4294967295, got 4294967296$/,
    ],
    [['tune', '--trace', 'workflows:2', '--seed', '4294967296'], /--seed must be <= 4294967295, got 4294967296$/],
    [['demo', '--seed', '9007199254740991'], /--seed must be <= 4294967295, got 9007199254740991$/],
  ];
  for (const [args, message] of cases) assert.match(await refusal(args), message, args.join(' '));
});

test('simulate, tune, demo and live-demo bound the cluster, the workload and the speed', async () => {
  const cases: Array<[string[], RegExp]> = [
    [['simulate', '--trace', 'workflows:1', '--policies', ''], /--policies lists no policy/],
    [['simulate', '--trace', 'workflows:1', '--policies', ' , '], /--policies lists no policy/],
    [['demo', '--policies', ''], /--policies lists no policy/],
    [['demo', '--policies', 'cost,,seed'], /^--policies has an empty name$/],
    [['demo', '--policies', 'cost,seed,cost'], /^--policies names 'cost' twice$/],
    // refused before any policy's run: the demo's first policy takes seconds
    [['demo', '--policies', 'cost,bogus'], /^--policies: unknown policy 'bogus' \(known: .*cost.*\)$/],
    [['simulate', '--trace', 'workflows:1', '--policies', 'cost,'], /^--policies has an empty name$/],
    [['simulate', '--trace', 'workflows:1', '--policies', 'cost, cost'], /^--policies names 'cost' twice$/],
    [['simulate', '--trace', 'workflows:1', '--workers', '100000'], /--workers must be <= 1024, got 100000/],
    [['tune', '--trace', 'workflows:2', '--workers', '1025'], /--workers must be <= 1024/],
    [['tune', '--trace', 'workflows:2', '--trials', '100000000'], /--trials must be <= 1000/],
    [['simulate', '--trace', 'workflows:1', '--kv-tokens', '9007199254740991'], /--kv-tokens must be <= 16777216/],
    [['simulate', '--trace', 'workflows:1', '--max-model-len', '99999999999'], /--max-model-len must be <= 16777216/],
    [
      ['simulate', '--trace', 'workflows:1', '--workers', '2', '--worker-kv-tokens', '1,99999999999'],
      /--worker-kv-tokens: entry 2 must be an integer from 1 to 16777216/,
    ],
    [
      ['simulate', '--trace', 'workflows:1', '--workers', '64', '--kv-tokens', '16777216'],
      /--workers × --kv-tokens: the simulated cluster would hold 1073741824 KV tokens, more than 536870912/,
    ],
    [['simulate', '--trace', 'workflows:1', '--speed', '1e-300'], /--speed must be from 0\.001 to 1000000, got 1e-300/],
    [['tune', '--trace', 'workflows:2', '--speed', '1e7'], /--speed must be from 0\.001 to 1000000/],
    [['simulate', '--trace', 'workflows:1', '--speed', '0x10'], /--speed must be a positive number, got '0x10'/],
    [['simulate', '--trace', 'workflows:1', '--event-loss', '0x1'], /--event-loss must be a number from 0 to 1/],
    [
      ['simulate', '--trace', 'workflows:1', '--event-delay-ms', '999999999999'],
      /--event-delay-ms must be <= 86400000/,
    ],
    [['demo', '--workflows', '100000000'], /--workflows must be <= 10000/],
    [['demo', '--workers', '100000'], /--workers must be <= 1024/],
    [['live-demo', '--workers', '100000'], /--workers must be <= 64/],
    [['live-demo', '--workflows', '100000000'], /--workflows must be <= 1000/],
    // live-demo takes the speeds simulate takes
    [['live-demo', '--speed', '1e7'], /--speed must be from 0\.001 to 1000000, got 10000000/],
    [['live-demo', '--speed', '0.0001'], /--speed must be from 0\.001 to 1000000/],
    [['live-demo', '--speed', '0x10'], /--speed must be a positive number, got '0x10'/],
    [
      ['simulate', '--trace', 'workflows:1', '--policy-options', '{"llmd":{"scrapeIntervalMs":0}}'],
      /--policy-options: policyOptions\.llmd\.scrapeIntervalMs must be >= 1 \(got 0\)/,
    ],
    [
      ['simulate', '--trace', 'workflows:1', '--policy-options', '{"llmd":{"scrapeIntervalMs":1e12}}'],
      /--policy-options: policyOptions\.llmd\.scrapeIntervalMs must be <= 86400000/,
    ],
  ];
  for (const [args, message] of cases) assert.match(await refusal(args), message, args.join(' '));
});

test('live-demo takes a fractional --speed, as simulate does', () => {
  const program = new Command();
  registerLiveDemoCommand(program);
  const speed = program.commands.find((c) => c.name() === 'live-demo')!.options.find((o) => o.long === '--speed')!;
  assert.equal(speed.parseArg!('0.5', undefined), 0.5);
  assert.equal(speed.parseArg!('2.5', undefined), 2.5);
  assert.equal(speed.parseArg!('1000000', undefined), 1e6);
});

test('mock-engine refuses a port, size, speed, address or name it cannot serve, naming the flag', async () => {
  // (first: a case that fails fast where nothing checks it, the others would start an engine)
  const cases: Array<[string[], RegExp]> = [
    [['--events', 'udp://127.0.0.1:5557'], /--events must be tcp:\/\/HOST:PORT/],
    [['--host', ''], /--host must be 1 to 253 characters, not blank/],
    [['--model', ' '], /--model must be 1 to 512 characters/],
    [['--lora-modules', 'a,,b'], /--lora-modules has an empty name/],
    [['--lora-modules', 'a,a'], /--lora-modules names an adapter twice/],
    [['--lora-modules', 'mock'], /^--lora-modules: 'mock' is the model's name \(--model\), not an adapter's$/],
    [['--model', 'm', '--lora-modules', 'a,m'], /^--lora-modules: 'm' is the model's name \(--model\)/],
    [
      ['--lora-modules', 'a b'],
      /^--lora-modules: 'a b' is not a usable adapter name \(1 to 128 letters, digits or _ \. : \/ -\)$/,
    ],
    [['--port', '70000'], /--port must be <= 65535/],
    [['--kv-blocks', '99999999999'], /--kv-blocks must be <= 16777216/],
    [['--kv-blocks', '16777216', '--data-parallel-size', '2'], /--kv-blocks × --data-parallel-size must be at most/],
    [['--block-size', '100000000'], /--block-size must be <= 65536/],
    [['--max-model-len', '99999999999'], /--max-model-len must be <= 1048576/],
    [['--prefill-tok-s', '1e-300'], /--prefill-tok-s must be from 1 to/],
    [['--decode-tok-s', '0.001'], /--decode-tok-s must be from 1 to/],
    [['--events', 'tcp://127.0.0.1'], /--events must be tcp:\/\/HOST:PORT/],
    [
      ['--events', 'tcp://127.0.0.1:65535', '--data-parallel-size', '2'],
      /--events tcp:\/\/127\.0\.0\.1:65535: rank 1 would publish on port 65536/,
    ],
  ];
  for (const [args, message] of cases)
    assert.match(await refusal(['mock-engine', '--port', '0', ...args]), message, args.join(' '));
});

test('cost weights the router would refuse at start are refused where they are given', () => {
  const cases: Array<[string, RegExp]> = [
    ['{prefillTokensPerSecond: 0}', /--cost-weights: costWeights\.prefillTokensPerSecond must be >= 1 \(got 0\)/],
    ['{attention: 1e308}', /--cost-weights: costWeights\.attention must be <= 1000000 \(got 1e\+308\)/],
    ['{pressureKnee: 1}', /--cost-weights: costWeights\.pressureKnee must be < 1 \(got 1\)/],
    ['{pressureCeiling: 1.5}', /--cost-weights: costWeights\.pressureCeiling must be <= 1 \(got 1\.5\)/],
    ['{pressureKnee: -1}', /costWeights\.pressureKnee must be a finite number >= 0 \(got -1\)/],
  ];
  for (const [weights, message] of cases) {
    assert.throws(() => resolveServe(['--cost-weights', weights]), message, weights);
    // every value the settings take, the router takes
    assert.throws(() => new KVAwareRouter({ costWeights: parseYaml(weights) as never }), RangeError);
  }
  const ok = resolveServe(['--cost-weights', '{pressureKnee: 0.99, pressureCeiling: 1}']).config;
  assert.doesNotThrow(() => new KVAwareRouter({ costWeights: ok.costWeights }));
});

test('a pressure knee at or above the ceiling is refused, with the defaults of the one not given', () => {
  const cases: Array<[string, RegExp]> = [
    [
      '{pressureKnee: 0.9, pressureCeiling: 0.5}',
      /costWeights\.pressureKnee must be below pressureCeiling \(got pressureKnee 0\.9, pressureCeiling 0\.5\)/,
    ],
    ['{pressureKnee: 0.5, pressureCeiling: 0.5}', /pressureKnee must be below pressureCeiling/],
    // the default knee (0.8) is above this ceiling
    [
      '{pressureCeiling: 0.5}',
      /pressureKnee must be below pressureCeiling \(got pressureKnee 0\.8, pressureCeiling 0\.5\)/,
    ],
    // and this knee is above the default ceiling (0.95)
    [
      '{pressureKnee: 0.96}',
      /pressureKnee must be below pressureCeiling \(got pressureKnee 0\.96, pressureCeiling 0\.95\)/,
    ],
  ];
  for (const [weights, message] of cases) {
    assert.throws(
      () => resolveServe(['--cost-weights', weights]),
      (e: Error) => {
        assert.match(e.message, /--cost-weights: /, weights);
        assert.match(e.message, message, weights);
        return true;
      },
    );
    assert.throws(
      () => new KVAwareRouter({ costWeights: parseYaml(weights) as never }),
      (e: Error) => e instanceof RangeError && /^costWeights\./.test(e.message) && message.test(e.message),
      weights,
    );
  }
  const ok = resolveServe(['--cost-weights', '{pressureKnee: 0.4, pressureCeiling: 0.5}']).config;
  assert.doesNotThrow(() => new KVAwareRouter({ costWeights: ok.costWeights }));
});

test('a config key with no value is refused, not read as the default', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-config-null-'));
  const cases: Array<[string, RegExp]> = [
    ['port:\n', /null-0\.yaml: port has no value \(leave the key out for the default\)$/],
    ['router:\n  blockSize: ~\n', /null-1\.yaml: router\.blockSize has no value/],
    ['workers:\n#  - id=w1,url=http://10.0.0.5:8000\n', /null-2\.yaml: workers has no value/],
  ];
  cases.forEach(([text, message], i) => {
    const file = join(dir, `null-${i}.yaml`);
    writeFileSync(file, text);
    assert.throws(() => resolveServe(['--config', file]), message, text);
  });
});

test("a PYTHONHASHSEED no Python process starts with is refused: vLLM's block hashes would match nothing", () => {
  for (const seed of ['abc', ' 42', '4294967296', '-1'])
    assert.throws(
      () => resolveServe(['--block-hash', 'vllm', '--python-hash-seed', seed]),
      /--python-hash-seed must be 'random' or an integer from 0 to 4294967295/,
      seed,
    );
  assert.throws(
    () => resolveServe(['--block-hash', 'vllm'], { PYTHONHASHSEED: '42\n' }),
    /^RangeError: PYTHONHASHSEED \(for --block-hash vllm\) must be 'random' or an integer/,
  );
  assert.equal(resolveServe(['--block-hash', 'vllm', '--python-hash-seed', 'random']).config.pythonHashSeed, 'random');
  const fromEnv = resolveServe(['--block-hash', 'vllm'], { PYTHONHASHSEED: '4294967295' });
  assert.equal(fromEnv.config.pythonHashSeed, '4294967295');
  assert.match(printConfig(fromEnv.resolved, 'yaml'), /^python-hash-seed: "4294967295" # env$/m);
});

test("--prefix-caching-hash-algo takes vLLM's four names, from a flag, the environment or a file", () => {
  const vllm = ['--block-hash', 'vllm', '--python-hash-seed', '0'];
  assert.equal(resolveServe(vllm).config.prefixCachingHashAlgo, 'sha256_cbor');
  for (const algo of ['sha256', 'sha256_cbor', 'xxhash', 'xxhash_cbor'])
    assert.equal(resolveServe([...vllm, '--prefix-caching-hash-algo', algo]).config.prefixCachingHashAlgo, algo);
  const fromEnv = resolveServe(vllm, { CONTEXTFORGE_PREFIX_CACHING_HASH_ALGO: 'xxhash' });
  assert.equal(fromEnv.config.prefixCachingHashAlgo, 'xxhash');
  assert.match(printConfig(fromEnv.resolved, 'yaml'), /^prefix-caching-hash-algo: xxhash # env$/m);
  const file = join(mkdtempSync(join(tmpdir(), 'cf-config-algo-')), 'algo.yaml');
  writeFileSync(file, 'router:\n  prefixCachingHashAlgo: sha256\n');
  assert.equal(resolveServe([...vllm, '--config', file]).config.prefixCachingHashAlgo, 'sha256');
  assert.throws(
    () => resolveServe([...vllm, '--prefix-caching-hash-algo', 'sha1']),
    /--prefix-caching-hash-algo must be one of sha256, sha256_cbor, xxhash, xxhash_cbor \(got 'sha1'\)/,
  );
  // without --block-hash vllm the algorithm keys nothing: said, not fatal
  const unused = resolveServe(['--prefix-caching-hash-algo', 'sha256']);
  assert.deepEqual(
    unused.resolved.warnings.filter((w) => w.includes('--prefix-caching-hash-algo')),
    ['--prefix-caching-hash-algo has no effect without --block-hash vllm'],
  );
  assert.deepEqual(
    resolveServe([...vllm, '--prefix-caching-hash-algo', 'sha256']).resolved.warnings.filter((w) =>
      w.includes('--prefix-caching-hash-algo'),
    ),
    [],
  );
  // the seed likewise; with vllm it is needed, so no warning there
  assert.deepEqual(
    resolveServe(['--python-hash-seed', '5']).resolved.warnings.filter((w) => w.includes('--python-hash-seed')),
    ['--python-hash-seed has no effect without --block-hash vllm'],
  );
  for (const args of [vllm, []])
    assert.deepEqual(
      resolveServe(args).resolved.warnings.filter((w) => w.includes('--python-hash-seed')),
      [],
      args.join(' '),
    );
  const bad = cli([
    'serve',
    '--block-hash',
    'vllm',
    '--python-hash-seed',
    '0',
    '--prefix-caching-hash-algo',
    'md5',
    '--print-config',
  ]);
  assert.equal(bad.status, 2, bad.stderr);
  assert.match(bad.stderr, /--prefix-caching-hash-algo must be/);
});

test('an address serve or epp cannot listen on stops it with the flags named, and nothing left running', async () => {
  assert.throws(() => resolveServe(['--host', ' ']), /--host must be a host name or an IP address/);
  assert.equal(resolveServe(['--host', '::']).config.host, '::');
  const taken = createServer();
  await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
  const port = String((taken.address() as AddressInfo).port);
  try {
    const env = { CONTEXTFORGE_ADMIN_TOKEN: 'usage-errors-admin-token' };
    // the gRPC side starts first: the process must still end when the HTTP side cannot
    const epp = spawnSync(
      process.execPath,
      [
        ...CLI,
        'epp',
        '--port',
        '0',
        '--health-port',
        '0',
        '--metrics-port',
        port,
        '--worker',
        'id=a,url=http://127.0.0.1:9',
      ],
      { encoding: 'utf8', env: { ...process.env, ...env }, timeout: 60_000 },
    );
    assert.equal(epp.status, 2, epp.stderr);
    assert.match(
      epp.stderr,
      new RegExp(`error: --host 127\\.0\\.0\\.1 --metrics-port ${port}: cannot listen: .*EADDRINUSE`),
    );
    assert.doesNotMatch(epp.stderr, /\n\s+at /, 'a message, not a stack trace');
    const serve = cli(['serve', '--port', port], env);
    assert.equal(serve.status, 2, serve.stderr);
    assert.match(serve.stderr, new RegExp(`error: --host 127\\.0\\.0\\.1 --port ${port}: cannot listen: .*EADDRINUSE`));
  } finally {
    taken.close();
  }
});

/** Each state URL is refused, by flag and by environment variable alike, with `${source} ${refusal}` and no password. */
function assertStatesRefused(states: readonly string[], refusal: string): void {
  for (const state of states) {
    for (const [args, env, source] of [
      [['--state', state], {}, '--state'],
      [[], { CONTEXTFORGE_STATE: state }, 'CONTEXTFORGE_STATE'],
    ] as const) {
      assert.throws(
        () => resolveServe([...args], { ...env }),
        (err: Error) => err.message === `${source} ${refusal}` && !err.message.includes('hunter2'),
        `${source} ${state}`,
      );
    }
  }
}

test('a Redis URL the store cannot use is refused before start, without showing its password', () => {
  assertStatesRefused(
    [
      'redis://:hunter2@127.0.0.1:99999',
      'redis://:hunter2@127.0.0.1:0',
      'redis://:hunter2@127.0.0.1:6379/2147483648',
      'redis://:hunter2@127.0.0.1:6379/99999999999',
    ],
    'must be memory or redis://HOST:PORT[/DB] with a port from 1 to 65535 and a database from 0 to 2147483647',
  );
  assert.throws(
    () => resolveServe(['--state', 'redis://:hunter2@h/x']),
    (err: Error) => !err.message.includes('hunter2'),
  );
  assert.equal(resolveServe(['--state', 'redis://:pw@127.0.0.1:6379/1']).config.state, 'redis://:pw@127.0.0.1:6379/1');
  assert.equal(resolveServe(['--state', 'redis://h:1/2147483647']).config.state, 'redis://h:1/2147483647');
});

test('a Redis URL with a query or fragment is refused, saying the database goes in the path', () => {
  const refusal =
    'must not have a query or fragment (the store reads neither): put the database in the path, redis://HOST:PORT/DB';
  assertStatesRefused(
    [
      'redis://:hunter2@127.0.0.1:6379?db=3',
      'redis://127.0.0.1:6379/2?db=3',
      'redis://127.0.0.1:6379#3',
      'redis://127.0.0.1:6379/?password=hunter2',
    ],
    refusal,
  );
  // the store itself, for a program that builds one
  assert.throws(
    () => parseRedisUrl('redis://:hunter2@h:1?db=3'),
    (err: Error) =>
      err instanceof RangeError &&
      /put the database in the path, redis:\/\/HOST:PORT\/DB/.test(err.message) &&
      !err.message.includes('hunter2'),
  );
  assert.equal(parseRedisUrl('redis://h:1/3').db, 3);
  const serve = cli(['serve', '--state', 'redis://127.0.0.1:6379?db=3', '--print-config']);
  assert.equal(serve.status, 2, serve.stderr);
  assert.equal(serve.stderr.trim(), `error: --state ${refusal}`);
});

test('a worker id given twice is refused naming where the workers came from', () => {
  const spec = 'id=a,url=http://h:1';
  assert.throws(
    () => resolveServe(['--worker', spec, '--worker', spec]),
    /^RangeError: --worker: worker id 'a' is given twice$/,
  );
  assert.throws(
    () => resolveServe([], { CONTEXTFORGE_WORKERS: `${spec} ${spec}` }),
    /^RangeError: CONTEXTFORGE_WORKERS: worker id 'a' is given twice$/,
  );
  const file = join(mkdtempSync(join(tmpdir(), 'cf-config-dup-')), 'router.yaml');
  writeFileSync(file, `workers:\n  - ${spec}\n  - {id: a, url: http://h:2}\n`);
  assert.throws(
    () => resolveServe(['--config', file]),
    new RegExp(`^RangeError: --config ${file}: workers: worker id 'a' is given twice$`),
  );
});

test('more workers than a router holds are refused naming where they came from', () => {
  // 65 workers of 64 data-parallel ranks: 4,160 router workers
  const specs = Array.from({ length: 65 }, (_, i) => `id=w${i},url=http://h:1,dp-size=64`);
  const message = /4160 workers \(each data-parallel rank is one\) are more than the 4096 a router holds$/;
  assert.throws(
    () => resolveServe(specs.flatMap((s) => ['--worker', s])),
    (e: Error) => {
      assert.match(e.message, /^--worker: /);
      return message.test(e.message);
    },
  );
  assert.throws(
    () => resolveServe([], { CONTEXTFORGE_WORKERS: specs.join(' ') }),
    /^RangeError: CONTEXTFORGE_WORKERS: 4160/,
  );
  const file = join(mkdtempSync(join(tmpdir(), 'cf-config-many-')), 'router.yaml');
  writeFileSync(file, `workers:\n${specs.map((s) => `  - ${s}\n`).join('')}`);
  assert.throws(() => resolveServe(['--config', file]), new RegExp(`^RangeError: --config ${file}: workers: 4160`));
  // at the limit is fine
  assert.equal(resolveServe(specs.slice(0, 64).flatMap((s) => ['--worker', s])).config.workers.length, 64);
});

test('simulate opens its output files before the run and reports a failed write, naming the flag', async () => {
  const missing = join(tmpdir(), 'cf-no-such-dir', 'out');
  const r = cli([
    'simulate',
    '--trace',
    'workflows:1',
    '--workers',
    '1',
    '--policies',
    'cost',
    '--assignments',
    missing,
  ]);
  assert.equal(r.status, 2, r.stderr);
  assert.match(r.stderr, new RegExp(`^error: --assignments ${missing}: cannot write: ENOENT`));
  assert.equal(r.stdout, '', 'nothing was run');
  const run = ['simulate', '--trace', 'workflows:1', '--workers', '1', '--policies', 'cost', '--format', 'json'];
  assert.match(await refusal([...run, '--report', missing]), /^--report .*: cannot write: ENOENT/);
  if (existsSync('/dev/full'))
    assert.match(
      await refusal([...run, '--assignments', '/dev/full']),
      /^--assignments \/dev\/full: cannot write: ENOSPC/,
    );
});

test('an unknown CONTEXTFORGE_ variable, ignored, is named in a warning with the setting it resembles', () => {
  const { config, resolved } = resolveServe([], {
    CONTEXTFORGE_MAX_RETRYS: '5',
    CONTEXTFORGE_METRICS_PORT: '9090', // epp's: a shared environment is no mistake
    CONTEXTFORGE_SOMETHING_ELSE_ENTIRELY: '1',
  });
  assert.equal(config.maxRetries, 2);
  assert.deepEqual(
    resolved.warnings.filter((w) => /RETRYS|METRICS_PORT|SOMETHING/.test(w)),
    [
      'CONTEXTFORGE_MAX_RETRYS is not a setting and is ignored (did you mean CONTEXTFORGE_MAX_RETRIES?)',
      // as an unknown flag or config key is refused, an unknown variable is at least named
      'CONTEXTFORGE_SOMETHING_ELSE_ENTIRELY is not a setting and is ignored (see serve --help for the settings)',
    ],
  );
  // every variable the Helm chart sets is a setting
  const chart = readFileSync(
    new URL('../../deploy/helm/contextforge-router/templates/deployment.yaml', import.meta.url),
    'utf8',
  );
  // (a value each takes: the admin token has at least 8 characters; the state is a store's URL)
  const valueOf = (name: string) => (name === 'CONTEXTFORGE_STATE' ? 'redis://redis:6379' : 'chart-value');
  const set = Object.fromEntries(
    [...chart.matchAll(/name: (CONTEXTFORGE_[A-Z0-9_]+)/g)].map((m) => [m[1], valueOf(m[1])]),
  );
  assert.ok(Object.keys(set).length > 0);
  assert.deepEqual(
    resolveServe([], set).resolved.warnings.filter((w) => Object.keys(set).some((name) => w.startsWith(name))),
    [],
  );
});

test('an admin token no request can present, and a keys file that is no regular file, are refused', () => {
  assert.throws(() => new AdminToken(' padded-admin-token'), /must not begin or end with whitespace/);
  assert.throws(() => new AdminToken('a'.repeat(4090)), /at most 4089 characters/);
  const longest = new AdminToken('a'.repeat(4089));
  assert.equal(longest.matches(`Bearer ${'a'.repeat(4089)}`), true);
  const dir = mkdtempSync(join(tmpdir(), 'cf-keys-'));
  assert.throws(() => loadApiKeysFile(dir), /--api-keys-file .*: is not a regular file/);
  const big = join(dir, 'keys.yaml');
  writeFileSync(big, `# ${'x'.repeat(16 * 1024 * 1024)}\n`, { mode: 0o600 });
  assert.throws(() => loadApiKeysFile(big), /--api-keys-file .*: is larger than 16777216 bytes/);
});

test('serve refuses an admin token file over 4 KiB, naming the flag, and exits 2', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-token-'));
  const file = join(dir, 'admin-token');
  writeFileSync(file, '', { mode: 0o600 });
  truncateSync(file, 4 * 1024 * 1024 * 1024);
  const run = cli(['serve', '--port', '0', '--admin-token-file', file]);
  assert.equal(run.status, 2, run.stderr);
  assert.match(run.stderr, /^error: --admin-token-file .*admin-token: is larger than 4096 bytes$/m);
});

test('mock-engine stops with the flag named when its HTTP port or its event endpoint is taken', async () => {
  const taken = createServer();
  await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
  const port = String((taken.address() as AddressInfo).port);
  try {
    const http = spawnSync(process.execPath, [...CLI, 'mock-engine', '--port', port], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    assert.equal(http.status, 2, http.stderr);
    assert.match(http.stderr, new RegExp(`^error: --host 127\\.0\\.0\\.1 --port ${port}: cannot listen: .*EADDRINUSE`));
    assert.doesNotMatch(http.stderr, /\n\s+at /, 'a message, not a stack trace');
    const events = `tcp://127.0.0.1:${port}`;
    const zmq = spawnSync(process.execPath, [...CLI, 'mock-engine', '--port', '0', '--events', events], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    assert.equal(zmq.status, 2, zmq.stderr);
    assert.match(zmq.stderr, new RegExp(`^error: --events ${events}: cannot bind ${events}: Address already in use`));
  } finally {
    taken.close();
  }
});

test('--config with an empty name is refused, not read as no config file', () => {
  assert.throws(() => resolveServe(['--config', '']), /^RangeError: --config must name a file \(got ''\)$/);
  assert.throws(
    () => resolveServe([], { CONTEXTFORGE_CONFIG: '' }),
    /^RangeError: CONTEXTFORGE_CONFIG must name a file \(got ''\)$/,
  );
});

test('a config file that is not UTF-8 text is refused naming the line, not read with its bytes replaced', () => {
  const file = join(mkdtempSync(join(tmpdir(), 'cf-config-latin1-')), 'router.yaml');
  writeFileSync(
    file,
    Buffer.concat([Buffer.from('port: 9001\ninstance-id: caf'), Buffer.from([0xe9]), Buffer.from('\n')]),
  );
  assert.throws(
    () => resolveServe(['--config', file]),
    new RegExp(`^RangeError: --config ${file}: not UTF-8 text \\(line 2\\)$`),
  );
});

test("a worker's URL port out of range, or a negative number, is named as such", () => {
  const bad = (spec: string, message: RegExp) => assert.throws(() => parseWorkerSpec(spec), message, spec);
  bad('id=a,url=http://h:99999', /: url must have a port from 1 to 65535$/);
  bad('id=a,url=http://h:1,metrics=http://h:70000/metrics', /: metrics must have a port from 1 to 65535$/);
  bad('id=a,url=http://[::1:1', /: url is not a valid URL$/);
  bad('id=a,url=http://a b:1', /: url must not hold spaces, control characters or backslashes/);
  bad('id=a,url=http://h:1,dp-size=-1', /: dpSize must be >= 1 \(got -1\)$/);
  bad('id=a,url=http://h:1,cla=-1', /: claGroups\[0\] must be >= 0 \(got -1\)$/);
});

test('an empty --fail or --drain is refused, not read as no event', async () => {
  const run = ['simulate', '--trace', 'workflows:1', '--workers', '2', '--policies', 'cost'];
  assert.match(await refusal([...run, '--fail', '']), /--fail: expected WORKER@TIME such as w3@600s, got ''/);
  // an hour is no unit a time takes: the message says which ones it does
  assert.match(
    await refusal([...run, '--fail', 'w1@1h']),
    /--fail: expected WORKER@TIME such as w3@600s, got 'w1@1h' \(TIME in ms, s or m; without a unit, seconds\)/,
  );
  assert.match(await refusal([...run, '--drain', 'w1@1s,']), /--drain: expected WORKER@TIME such as w3@600s, got ''/);
});

test('a --body-limit past the longest text a body is read into is refused, wherever it is given', () => {
  // a body is parsed as one string: V8 makes none longer than this, and a longer body was a 500
  const longest = constants.MAX_STRING_LENGTH;
  assert.equal(resolveServe(['--body-limit', String(longest)]).config.bodyLimit, longest);
  const refused = new RegExp(`--body-limit must be <= ${longest} \\(got ${longest + 1}\\)`);
  assert.throws(() => resolveServe(['--body-limit', String(longest + 1)]), refused);
  assert.throws(
    () => resolveServe([], { CONTEXTFORGE_BODY_LIMIT: String(longest + 1) }),
    /from env 'CONTEXTFORGE_BODY_LIMIT' is invalid\. --body-limit must be <=/,
  );
});
