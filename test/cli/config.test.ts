import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { parse as parseYaml } from 'yaml';
import { parseWorkerSpec } from '../../src/cli/commands/serve.js';
import { EPP_SCHEMA, kebab, SERVE_SCHEMA } from '../../src/cli/config/settings.js';
import { ROUTER_SETTINGS_SCHEMA } from '../../src/core/router/options-schema.js';
import { KVAwareRouter } from '../../src/index.js';
import { resolveServe } from '../helpers/serve-config.js';
import { createGateway } from '../../src/server/gateway.js';
import { CLI } from '../helpers/cli-entry.js';

const dir = mkdtempSync(join(tmpdir(), 'cf-config-schema-'));
let files = 0;
const write = (text: string, ext = 'yaml') => {
  const f = join(dir, `router-${files++}.${ext}`);
  writeFileSync(f, text);
  return f;
};

const resolve = resolveServe;

test('every router option is a serve setting, and the router gets what serve resolved', () => {
  for (const key of Object.keys(ROUTER_SETTINGS_SCHEMA.shape))
    assert.ok(Object.hasOwn(SERVE_SCHEMA.shape, key), `${key} is a serve setting`);
  assert.ok(!Object.hasOwn(SERVE_SCHEMA.shape, 'clock'), 'the clock is given in code only');
  const { config } = resolve([
    '--speculative-blocks',
    '4',
    '--judge-roles',
    'judge,critic',
    '--enable-cla-affinity',
    'false',
    '--index-mode',
    'precise',
  ]);
  assert.equal(config.speculativeBlocks, 4);
  assert.deepEqual(config.judgeRoles, ['judge', 'critic']);
  assert.equal(config.enableClaAffinity, false);
  assert.equal(config.indexMode, 'precise');
});

test('precedence: flag over environment over file over default, for gateway and router settings alike', () => {
  const file = write(
    [
      'max-retries: 5',
      'speculative-blocks: 8',
      'router:',
      '  costWeights: {recompute: 2}',
      '  anchorCapacity: 500',
      'predictedCredit: 0.5',
      '',
    ].join('\n'),
  );
  const fromFile = resolve(['--config', file]);
  assert.equal(fromFile.config.maxRetries, 5);
  assert.equal(fromFile.config.speculativeBlocks, 8);
  assert.deepEqual(fromFile.config.costWeights, { recompute: 2 });
  assert.equal(fromFile.config.anchorCapacity, 500);
  assert.equal(fromFile.config.predictedCredit, 0.5);
  assert.equal(fromFile.config.workflowCapacity, 10_000);
  assert.deepEqual(
    [fromFile.resolved.origins.maxRetries, fromFile.resolved.origins.anchorCapacity, fromFile.resolved.origins.host],
    ['file', 'file', 'default'],
  );
  const env = resolve(['--config', file], {
    CONTEXTFORGE_SPECULATIVE_BLOCKS: '9',
    CONTEXTFORGE_COST_WEIGHTS: '{load: 1}',
    CONTEXTFORGE_MAX_RETRIES: '6',
  });
  assert.equal(env.config.speculativeBlocks, 9);
  assert.deepEqual(env.config.costWeights, { load: 1 }, 'a mapping is replaced whole, not merged');
  assert.equal(env.config.maxRetries, 6);
  assert.equal(env.resolved.origins.speculativeBlocks, 'env');
  const flag = resolve(['--config', file, '--speculative-blocks', '10', '--max-retries', '7'], {
    CONTEXTFORGE_SPECULATIVE_BLOCKS: '9',
  });
  assert.equal(flag.config.speculativeBlocks, 10);
  assert.equal(flag.config.maxRetries, 7);
  assert.equal(flag.resolved.origins.speculativeBlocks, 'flag');
  assert.equal(flag.config.anchorCapacity, 500, 'the file still counts where nothing overrides it');
  // JSON config files are read the same way
  const json = write(JSON.stringify({ router: { blockSize: 32 }, port: 9001 }), 'json');
  assert.deepEqual([resolve(['--config', json]).config.blockSize, resolve(['--config', json]).config.port], [32, 9001]);
});

test('a switch takes one set of spellings from a flag, the environment and the file: true/false, 1/0', () => {
  const on = ['true', 'TRUE', 'True', '1'];
  const off = ['false', 'FALSE', 'False', '0'];
  const refused = ['yes', 'no', 'on', 'off', 'y', '2', '', ' true'];
  for (const [spellings, expected] of [
    [on, true],
    [off, false],
  ] as const)
    for (const t of spellings) {
      // a flag taking a value, a switch's variable, a file value as written and quoted, under router: too
      assert.equal(resolve(['--enable-cla-affinity', t]).config.enableClaAffinity, expected, `flag ${t}`);
      assert.equal(
        resolve([], { CONTEXTFORGE_PUBLIC_ROUTE_API: t }).config.publicRouteApi,
        expected,
        `environment ${t}`,
      );
      assert.equal(
        resolve(['--config', write(`public-route-api: ${t}\n`)]).config.publicRouteApi,
        expected,
        `file ${t}`,
      );
      assert.equal(
        resolve(['--config', write(`public-route-api: '${t}'\n`)]).config.publicRouteApi,
        expected,
        `file '${t}'`,
      );
      assert.equal(
        resolve(['--config', write(`router:\n  enableClaAffinity: ${t}\n`)]).config.enableClaAffinity,
        expected,
        `file router: ${t}`,
      );
    }
  assert.equal(resolve(['--config', write('{"public-route-api": 1}', 'json')]).config.publicRouteApi, true);
  for (const t of refused) {
    assert.throws(
      () => resolve(['--enable-cla-affinity', t]),
      /--enable-cla-affinity must be true or false/,
      `flag ${t}`,
    );
    if (t !== '')
      assert.throws(
        () => resolve([], { CONTEXTFORGE_PUBLIC_ROUTE_API: t }),
        /CONTEXTFORGE_PUBLIC_ROUTE_API must be true or false/,
        `environment ${t}`,
      );
    assert.throws(
      () => resolve(['--config', write(`public-route-api: '${t}'\n`)]),
      /public-route-api must be true or false/,
      `file '${t}'`,
    );
  }
  for (const t of ['yes', 'off', '2', '-1'])
    assert.throws(
      () => resolve(['--config', write(`public-route-api: ${t}\n`)]),
      /public-route-api must be true or false/,
      `file ${t}`,
    );
});

test('errors name the source and the key, and the value given', () => {
  const bad = (args: string[], env: Record<string, string> = {}) => {
    try {
      resolve(args, env);
    } catch (err) {
      return (err as Error).message;
    }
    assert.fail(`accepted: ${args.join(' ')}`);
  };
  const f = write('router:\n  costWeights:\n    prefillTokensPerSecond: -1\n');
  assert.equal(
    bad(['--config', f]),
    `--config ${f}: router.costWeights.prefillTokensPerSecond must be a finite number >= 0 (got -1)`,
  );
  const g = write('speculative-blocks: -2\n');
  assert.equal(bad(['--config', g]), `--config ${g}: speculative-blocks must be >= 0 (got -2)`);
  const h = write('router:\n  anchorCapacty: 5\n');
  assert.equal(
    bad(['--config', h]),
    `--config ${h}: router.anchorCapacty is not a router option (did you mean anchorCapacity?)`,
  );
  // a router option serve sets as a setting of its own is named where it goes
  const h2 = write('router:\n  maxIdBytes: 512\n');
  assert.equal(
    bad(['--config', h2]),
    `--config ${h2}: router.maxIdBytes is not taken under router: give it as max-id-bytes, a setting of serve`,
  );
  const i = write('max-retrys: 1\n');
  assert.equal(bad(['--config', i]), `--config ${i}: unknown key 'max-retrys' (did you mean max-retries?)`);
  const j = write('policyOptions: {sglang: {cacheThreshold: 2}}\n');
  assert.equal(bad(['--config', j]), `--config ${j}: policyOptions.sglang.cacheThreshold must be <= 1 (got 2)`);
  const k = write('block-size: 16\nblockSize: 32\n');
  assert.match(bad(['--config', k]), /give block-size or blockSize, not both/);
  assert.match(bad(['--offload-credit', '1.5']), /--offload-credit must be <= 1 \(got 1.5\)/);
  // the longest prompt a router takes is bounded (2^27 tokens), from a flag or a variable alike
  assert.match(bad(['--max-prompt-tokens', '134217729']), /--max-prompt-tokens must be <= 134217728 \(got 134217729\)/);
  assert.match(
    bad([], { CONTEXTFORGE_MAX_PROMPT_TOKENS: '999999999999' }),
    /CONTEXTFORGE_MAX_PROMPT_TOKENS.*--max-prompt-tokens must be <= 134217728/,
  );
  assert.match(
    bad([], { CONTEXTFORGE_TEXT_CHUNK_BYTES: '6' }),
    /from env 'CONTEXTFORGE_TEXT_CHUNK_BYTES'.*--text-chunk-bytes must be a multiple of 4 \(got 6\)/,
  );
  assert.match(
    bad(['--index-mode', 'exact']),
    /--index-mode must be one of auto, precise, approximate \(got 'exact'\)/,
  );
  // the CLI exits non-zero with the message
  const r = spawnSync(process.execPath, [...CLI, 'serve', '--config', f], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /router\.costWeights\.prefillTokensPerSecond must be a finite number >= 0 \(got -1\)/);
});

/** A config file holding a secret of each kind --print-config redacts (admin token, Redis password, worker URL password). */
const SECRETS_CONFIG = [
  'admin-token: file-secret-token',
  'state: redis://:hunter2@127.0.0.1:6379/1',
  'router:',
  '  anchorCapacity: 500',
  'workers:',
  '  - id=w1,url=http://user:pa55word@127.0.0.1:9001',
  '',
].join('\n');

/**
 * `--print-config json`'s output for SECRETS_CONFIG with `--policy least-loaded` and
 * CONTEXTFORGE_MAX_RETRIES=4: parsed, each value's source checked, every secret redacted.
 */
function printedSecretsConfig(stdout: string, defaultPort: number) {
  assert.doesNotMatch(stdout, /file-secret-token|hunter2|pa55word/);
  const printed = JSON.parse(stdout) as {
    settings: Record<string, { value: unknown; from: string }>;
    workers: { value: { id: string; url: string }[]; from: string };
  };
  assert.deepEqual(printed.settings.policy, { value: 'least-loaded', from: 'flag' });
  assert.deepEqual(printed.settings['max-retries'], { value: 4, from: 'env' });
  assert.deepEqual(printed.settings['anchor-capacity'], { value: 500, from: 'file' });
  assert.deepEqual(printed.settings.port, { value: defaultPort, from: 'default' });
  assert.deepEqual(printed.settings['admin-token'], { value: '<redacted>', from: 'file' });
  assert.deepEqual(printed.settings.state, { value: 'redis://***@127.0.0.1:6379/1', from: 'file' });
  assert.deepEqual(printed.workers, { value: [{ id: 'w1', url: 'http://***@127.0.0.1:9001' }], from: 'file' });
  return printed;
}

test('--print-config: every value with its source, secrets redacted; the YAML loads back as a config', () => {
  const file = write(SECRETS_CONFIG);
  const run = (...args: string[]) =>
    spawnSync(process.execPath, [...CLI, 'serve', '--config', file, ...args], {
      encoding: 'utf8',
      env: { ...process.env, CONTEXTFORGE_MAX_RETRIES: '4' },
    });
  const json = run('--print-config', 'json', '--policy', 'least-loaded');
  assert.equal(json.status, 0, json.stderr);
  const printed = printedSecretsConfig(json.stdout, 8080);
  // every setting with a value is listed under its flag name
  for (const key of Object.keys(SERVE_SCHEMA.shape))
    if (SERVE_SCHEMA.shape[key as keyof typeof SERVE_SCHEMA.shape].safeParse(undefined).data !== undefined)
      assert.ok(printed.settings[kebab(key)], `${kebab(key)} is printed`);
  const yaml = run('--print-config');
  assert.equal(yaml.status, 0, yaml.stderr);
  assert.doesNotMatch(yaml.stdout, /file-secret-token|hunter2|pa55word/);
  assert.match(yaml.stdout, /^policy: cost # default$/m);
  assert.match(yaml.stdout, /^max-retries: 4 # env$/m);
  assert.match(yaml.stdout, /^anchor-capacity: 500 # file$/m);
  // the printed YAML is itself a config file (with the secrets removed)
  const printedYaml = parseYaml(yaml.stdout) as Record<string, unknown>;
  delete printedYaml['admin-token'];
  delete printedYaml.state;
  const again = resolve(['--config', write(JSON.stringify(printedYaml), 'json')]);
  assert.equal(again.config.anchorCapacity, 500);
  assert.equal(again.config.maxRetries, 4);
});

test('--print-config read back as the config file: no warning, and the same configuration printed', () => {
  // only the variables given: serve warns of CONTEXTFORGE_ variables it does not know
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CONTEXTFORGE_')));
  const print = (...args: string[]) => {
    const r = spawnSync(process.execPath, [...CLI, 'serve', '--print-config', ...args], { encoding: 'utf8', env });
    assert.equal(r.status, 0, r.stderr);
    return r;
  };
  // every value a default (the settings that warn when they have no effect among them)
  const first = print();
  const one = write(first.stdout);
  const second = print('--config', one);
  assert.equal(second.stderr, '', 'reading back the defaults warns of nothing');
  assert.deepEqual(parseYaml(second.stdout), parseYaml(first.stdout));
  assert.match(second.stdout, /^prefix-caching-hash-algo: sha256_cbor # file$/m);
  // printed again from its own output: the same text but for the file's name
  const two = write(second.stdout);
  const third = print('--config', two);
  assert.equal(third.stderr, '');
  assert.equal(third.stdout.replace(two, 'FILE'), second.stdout.replace(one, 'FILE'));
  // a value other than the default, read back, still warns that it does nothing
  const changed = print(
    '--config',
    write(`${second.stdout}\nepp-secure-serving: true\n`.replace(/^epp-secure-serving: false.*$/m, '')),
  );
  assert.match(changed.stderr, /^warning: --epp-secure-serving has no effect without --epp-port$/m);
  const algo = print('--prefix-caching-hash-algo', 'sha256', '--config', one);
  assert.match(algo.stderr, /^warning: --prefix-caching-hash-algo has no effect without --block-hash vllm$/m);
});

test('epp --print-config: its settings, secrets redacted; read back as epp --config, no warning and the same configuration', () => {
  // only the variables given: epp warns of CONTEXTFORGE_ variables it does not know
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CONTEXTFORGE_')));
  const print = (args: string[], extra: NodeJS.ProcessEnv = {}) => {
    const r = spawnSync(process.execPath, [...CLI, 'epp', '--print-config', ...args], {
      encoding: 'utf8',
      env: { ...env, ...extra },
      timeout: 120_000,
    });
    assert.equal(r.status, 0, r.stderr);
    return r;
  };
  const file = write(SECRETS_CONFIG);
  const json = print(['json', '--config', file, '--policy', 'least-loaded'], { CONTEXTFORGE_MAX_RETRIES: '4' });
  assert.equal(json.stderr, '');
  const printed = printedSecretsConfig(json.stdout, 9002);
  assert.deepEqual(printed.settings['secure-serving'], { value: true, from: 'default' });
  // epp's settings, each with a value listed under its flag name, and none of serve's own
  for (const key of Object.keys(EPP_SCHEMA.shape))
    if (EPP_SCHEMA.shape[key as keyof typeof EPP_SCHEMA.shape].safeParse(undefined).data !== undefined)
      assert.ok(printed.settings[kebab(key)], `${kebab(key)} is printed`);
  const eppFlags = Object.keys(EPP_SCHEMA.shape).map(kebab);
  for (const flag of Object.keys(printed.settings)) assert.ok(eppFlags.includes(flag), `${flag} is an epp setting`);
  // every value a default: read back, the same values and no warning
  const first = print([]);
  assert.match(first.stdout, /^port: 9002 # default$/m);
  const one = write(first.stdout);
  const second = print(['--config', one]);
  assert.equal(second.stderr, '', 'reading back the defaults warns of nothing');
  assert.deepEqual(parseYaml(second.stdout), parseYaml(first.stdout));
  assert.match(second.stdout, /^prefix-caching-hash-algo: sha256_cbor # file$/m);
  const two = write(second.stdout);
  const third = print(['--config', two]);
  assert.equal(third.stderr, '');
  assert.equal(third.stdout.replace(two, 'FILE'), second.stdout.replace(one, 'FILE'));
  // --processes above 1 is named once and printed as what epp runs: 1
  const many = print([], { CONTEXTFORGE_PROCESSES: '4' });
  assert.match(many.stderr, /^warning: --processes 4 has no effect on epp/m);
  assert.match(many.stdout, /^processes: 1 # env$/m);
  const back = print(['--config', write(many.stdout)]);
  assert.equal(back.stderr, '', 'reading back what was printed warns of nothing');
  assert.deepEqual(parseYaml(back.stdout), parseYaml(second.stdout));
  // a value other than the default, read back, still warns that it does nothing
  const changed = print(['--secure-serving', 'false', '--cert-path', '/nonexistent', '--config', one]);
  assert.match(changed.stderr, /^warning: --cert-path has no effect with --secure-serving false$/m);
});

const gateways: { close(): Promise<void> }[] = [];
after(async () => {
  for (const g of gateways) await g.close();
});

test('a worker record is refused the same way from the command line, the config file and the admin API', async () => {
  const gw = await createGateway({
    router: new KVAwareRouter(),
    workers: [],
    adminToken: 'config-test-admin',
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    log: () => {},
  });
  gateways.push(gw);
  const base = await gw.app.listen({ host: '127.0.0.1', port: 0 });
  const cases: [string, Record<string, unknown>, string][] = [
    ['id=w1,url=ftp://h:1', { id: 'w1', url: 'ftp://h:1' }, 'url'],
    ['id=w1,url=http://h:1,dp-size=0', { id: 'w1', url: 'http://h:1', dpSize: 0 }, 'dpSize'],
    ['id=w1,url=http://h:1,dp-start-rank=4', { id: 'w1', url: 'http://h:1', dpStartRank: 4 }, 'dpStartRank'],
    [
      'id=w1,url=http://h:1,dp-size=2,dp-start-rank=1024',
      { id: 'w1', url: 'http://h:1', dpSize: 2, dpStartRank: 1024 },
      'dpStartRank',
    ],
    ['id=w1,url=http://h:1,replay=tcp://h:2', { id: 'w1', url: 'http://h:1', replay: 'tcp://h:2' }, 'replay'],
    ['id=w 1,url=http://h:1', { id: 'w 1', url: 'http://h:1' }, 'id'],
    ['id=w1,url=http://h:1,cla=x', { id: 'w1', url: 'http://h:1', claGroups: ['x'] }, 'claGroups'],
  ];
  for (const [spec, body, field] of cases) {
    let cli = '';
    assert.throws(
      () => parseWorkerSpec(spec),
      (e: Error) => ((cli = e.message), true),
    );
    const reason = cli.slice(cli.indexOf(': ') + 2);
    assert.ok(reason.startsWith(field), `${spec}: ${cli}`);
    const f = write(`workers:\n  - ${JSON.stringify(body)}\n`);
    assert.throws(
      () => resolve(['--config', f]),
      (e: Error) => e.message === `--config ${f}: workers[0]: ${reason}`,
    );
    const res = await fetch(`${base}/admin/workers`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer config-test-admin' },
      body: JSON.stringify(body),
    });
    assert.equal(res.status, 400);
    const { error } = (await res.json()) as { error: { message: string; param: string | null } };
    assert.equal(error.message, `worker: ${reason}`);
    assert.equal(error.param, field);
  }
});

test('dp-start-rank: a node of a multi-node data-parallel engine, from a SPEC and from the config file', () => {
  const spec = 'id=n1,url=http://h:8000,events=tcp://h:5557,dp-size=4,dp-start-rank=4';
  assert.deepEqual(parseWorkerSpec(spec), {
    id: 'n1',
    url: 'http://h:8000',
    events: 'tcp://h:5557',
    dpSize: 4,
    dpStartRank: 4,
  });
  const f = write(
    'workers:\n  - {id: n1, url: "http://h:8000", dp-size: 4, dp-start-rank: 4}\n  - {id: n0, url: "http://g:8000", dpSize: 4, dpStartRank: 0}\n',
  );
  const { config } = resolve(['--config', f]);
  assert.deepEqual(
    config.workers.map((w) => [w.id, w.dpSize, w.dpStartRank]),
    [
      ['n1', 4, 4],
      ['n0', 4, 0],
    ],
  );
  assert.throws(() => parseWorkerSpec('id=a,url=http://h:1,dp-size=2,dp-start-rank=-1'), /: dpStartRank must be >= 0/);
  assert.throws(
    () => parseWorkerSpec('id=a,url=http://h:1,dp-size=1,dp-start-rank=3'),
    /: dpStartRank needs dpSize above 1/,
  );
});
