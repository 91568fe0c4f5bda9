import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { envName, parseWorkerSpec } from '../../src/cli/commands/serve.js';
import { resolveTokenizeMode } from '../../src/cli/commands/serve-run.js';
import { kebab, SERVE_SCHEMA } from '../../src/cli/config/settings.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { serveExit } from '../helpers/serve-exit.js';
import { resolveServe } from '../helpers/serve-config.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { CLI } from '../helpers/cli-entry.js';
import { dropPrefixes } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

test('--worker specs are parsed, and bad ones are refused with the reason', () => {
  assert.deepEqual(parseWorkerSpec('id=w1,url=http://127.0.0.1:9001,events=tcp://127.0.0.1:5557,cla=1;2'), {
    id: 'w1',
    url: 'http://127.0.0.1:9001',
    claGroups: [1, 2],
    events: 'tcp://127.0.0.1:5557',
  });
  assert.deepEqual(parseWorkerSpec('id=w2,url=https://e:8000,models=Qwen/Qwen3-32B;qwen').models, [
    'Qwen/Qwen3-32B',
    'qwen',
  ]);
  assert.throws(() => parseWorkerSpec('url=http://x'), /--worker 'url=http:\/\/x': id is required/);
  assert.throws(() => parseWorkerSpec('id=a,url=x'), /must start with http/);
  assert.throws(() => parseWorkerSpec('id=a,url=http://x,color=red'), /unknown key 'color'/);
  assert.throws(() => parseWorkerSpec('id=a,url=http://x,cla=one'), /claGroups\[0\] must be an integer \(got 'one'\)/);
  assert.throws(() => parseWorkerSpec('id=a,url=http://x,replay=tcp://y:5558'), /replay needs events/);
  const dp = parseWorkerSpec('id=w,url=http://h:8000,events=tcp://h:5557,dp-size=2,block-size=32');
  assert.equal(dp.dpSize, 2);
  assert.equal(dp.blockSize, 32);
  assert.throws(() => parseWorkerSpec('id=a,url=http://x,dp-size=0'), /dpSize must be >= 1 \(got 0\)/);
  assert.throws(
    () => parseWorkerSpec('id=a,url=http://x,block-size=1.5'),
    /blockSize must be an integer \(got '1.5'\)/,
  );
  assert.throws(
    () => parseWorkerSpec('id=a,url=http://x,events=ipc:///tmp/e,dp-size=2'),
    /dpSize needs events as tcp:\/\/host:port/,
  );
});

const engines: MockEngine[] = [];

/** Starts `contextforge-router serve` and resolves once it says where it listens. */
async function startServe(args: string[], env: Record<string, string> = {}) {
  const child = spawn(process.execPath, [...CLI, 'serve', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, ...env },
  });
  let stderr = '';
  const base = await new Promise<string>((resolve, reject) => {
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
      const m = /serving on (http:\/\/[\d.]+:\d+)/.exec(stderr);
      if (m) resolve(m[1]);
    });
    child.once('exit', (code) => reject(new Error(`exited ${code}: ${stderr}`)));
  });
  return { child, base, stderr };
}
after(async () => {
  for (const e of engines) await e.close();
});

test('contextforge-router serve proxies to the workers it was given and stops on SIGTERM', async () => {
  const e = await new MockEngine({ events: 'tcp://127.0.0.1:*' }).start();
  engines.push(e);
  // no --tokenize: auto, which takes token ids from the engine since the worker has events
  const { child, base, stderr } = await startServe([
    '--port',
    '0',
    '--worker',
    `id=m0,url=http://127.0.0.1:${e.port},events=${e.eventsEndpoint}`,
  ]);
  assert.match(stderr, /tokenize engine/);
  assert.match(stderr, /precise index/);
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }),
    headers: { 'content-type': 'application/json' },
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('x-contextforge-worker'), 'm0');
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

/** A serve command line's settings (flags and the given environment), without running it. */
const resolve = (args: string[], env: Record<string, string> = {}) => resolveServe(args, env).config;

test('serve settings: flag over environment over config file over default; every key in all three', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-config-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(
    file,
    [
      'port: 9100',
      'policy: least-loaded',
      'block-size: 32',
      'admin-token: from-file',
      'health-interval-ms: 0',
      'workers:',
      '  - id: w1',
      '    url: http://10.0.0.1:8000',
      '    events: tcp://10.0.0.1:5557',
      '    replay: tcp://10.0.0.1:5558',
      '    models: [Qwen/Qwen3-32B]',
      '    cla: [1, 2]',
      '  - id=w2,url=http://10.0.0.2:8000,metrics=http://10.0.0.2:9090/metrics',
      '',
    ].join('\n'),
  );
  const fromFile = resolve(['--config', file]);
  assert.equal(fromFile.port, 9100);
  assert.equal(fromFile.policy, 'least-loaded');
  assert.equal(fromFile.blockSize, 32);
  assert.equal(fromFile.adminToken, 'from-file');
  assert.equal(fromFile.healthIntervalMs, 0);
  assert.equal(fromFile.host, '127.0.0.1', 'default where nothing says otherwise');
  assert.deepEqual(
    fromFile.workers.map((w) => [w.id, w.models, w.claGroups, w.metrics]),
    [
      ['w1', ['Qwen/Qwen3-32B'], [1, 2], undefined],
      ['w2', undefined, undefined, 'http://10.0.0.2:9090/metrics'],
    ],
  );
  const env = resolve([], {
    CONTEXTFORGE_CONFIG: file,
    CONTEXTFORGE_PORT: '9200',
    CONTEXTFORGE_WORKERS: 'id=e1,url=http://e1:1 id=e2,url=http://e2:1',
  });
  assert.equal(env.port, 9200, 'environment over the file');
  assert.equal(env.policy, 'least-loaded');
  assert.deepEqual(
    env.workers.map((w) => w.id),
    ['e1', 'e2'],
    'CONTEXTFORGE_WORKERS over the file',
  );
  const flags = resolve(['--port', '9300', '--worker', 'id=f1,url=http://f1:1'], {
    CONTEXTFORGE_CONFIG: file,
    CONTEXTFORGE_PORT: '9200',
  });
  assert.equal(flags.port, 9300, 'flag over environment');
  assert.deepEqual(
    flags.workers.map((w) => w.id),
    ['f1'],
  );
  // every setting has its environment variable and its config key
  for (const key of Object.keys(SERVE_SCHEMA.shape)) {
    const flag = kebab(key);
    assert.equal(envName(flag), `CONTEXTFORGE_${flag.toUpperCase().replaceAll('-', '_')}`);
  }
  assert.equal(
    resolve([], {
      CONTEXTFORGE_ADMIN_TOKEN: 'env-admin-token',
      CONTEXTFORGE_TOKENIZE: 'engine',
      CONTEXTFORGE_BREAKER_COOLDOWN_MS: '750',
    }).breakerCooldownMs,
    750,
  );
  // panic routing is on unless a flag, the environment or the file turns it off
  assert.equal(resolve([], {}).panicRouting, true);
  assert.equal(resolve(['--panic-routing', 'false'], {}).panicRouting, false);
  assert.equal(resolve([], { CONTEXTFORGE_PANIC_ROUTING: 'false' }).panicRouting, false);
});

test('serve settings: bad config files and values are refused with the key named', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-config-'));
  const write = (text: string) => {
    const f = join(dir, `c${Math.random().toString(36).slice(2)}.yaml`);
    writeFileSync(f, text);
    return f;
  };
  assert.throws(() => resolve(['--config', write('colour: red\n')]), /--config .*: unknown key 'colour'/);
  assert.throws(
    () => resolve(['--config', write('port: eighty\n')]),
    /--config .*: port must be an integer \(got 'eighty'\)/,
  );
  assert.throws(
    () => resolve(['--config', write('policy: best\n')]),
    /--config .*: policy must be one of cost, .* \(got 'best'\)/,
  );
  assert.throws(() => resolve(['--config', write('- a\n- b\n')]), /top level must be a mapping/);
  assert.throws(() => resolve(['--config', write('port: [1\n')]), /--config .*yaml/);
  assert.throws(() => resolve(['--config', write('workers:\n  - id: a\n')]), /workers\[0\]: url is required/);
  assert.throws(
    () => resolve(['--config', write('workers:\n  - {id: a, url: "http://a:1", gpu: 3}\n')]),
    /workers\[0\]: gpu is not a known key/,
  );
  // "__proto__" is a key like any other: refused by name, in YAML and JSON, never taken as a prototype
  for (const text of [
    'workers:\n  - {id: a, url: "http://a:1", "__proto__": {dpSize: 99}}\n',
    '{"workers": [{"id": "a", "url": "http://a:1", "__proto__": {"dpSize": 99}}]}\n',
  ])
    assert.throws(() => resolve(['--config', write(text)]), /workers\[0\]: __proto__ is not a known key/);
  assert.throws(() => resolve(['--config', write('workers: {id: a}\n')]), /workers must be a list/);
  assert.throws(
    () => resolve(['--worker', 'id=a,url=http://a:1', '--worker', 'id=a,url=http://b:1']),
    /'a' is given twice/,
  );
  assert.throws(() => resolve(['--tokenize', 'tokenizer']), /needs --tokenizer/);
  assert.throws(() => resolve(['--block-hash', 'vllm'], { PYTHONHASHSEED: '' }), /needs the engines' PYTHONHASHSEED/);
  assert.equal(resolve(['--block-hash', 'vllm'], { PYTHONHASHSEED: '42' }).pythonHashSeed, '42');
  assert.equal(
    resolve(['--block-hash', 'vllm', '--python-hash-seed', '7'], { PYTHONHASHSEED: '42' }).pythonHashSeed,
    '7',
  );
  assert.throws(
    () => resolve(['--block-hash', 'vllm', '--python-hash-seed', '7', '--tokenize', 'text']),
    /needs --tokenize auto, tokenizer or engine/,
  );
  assert.throws(() => resolve(['--block-hash', 'sha1']), /--block-hash must be 'router' or 'vllm' \(got 'sha1'\)/);
  assert.throws(() => resolve(['--config', join(dir, 'missing.yaml')]), /ENOENT|no such file/);
  assert.throws(() => resolve(['--port', '70000']), /<= 65535/);
  assert.throws(() => resolve([], { CONTEXTFORGE_STATE: 'etcd://x' }), /CONTEXTFORGE_STATE must be memory or redis/);
  assert.equal(resolve(['--state', 'redis://127.0.0.1:6379/2']).state, 'redis://127.0.0.1:6379/2');
});

test("--tokenize auto: the engine's tokens when a worker has events (or vLLM block hashes are asked for), else text", () => {
  const withEvents = resolve(['--worker', 'id=a,url=http://a:1,events=tcp://a:5557']);
  assert.equal(withEvents.tokenize, 'auto');
  assert.equal(resolveTokenizeMode(withEvents), 'engine');
  assert.equal(resolveTokenizeMode(resolve(['--worker', 'id=a,url=http://a:1'])), 'text');
  assert.equal(
    resolveTokenizeMode(
      resolve(['--worker', 'id=a,url=http://a:1', '--block-hash', 'vllm', '--python-hash-seed', '0']),
    ),
    'engine',
  );
  assert.equal(
    resolveTokenizeMode(resolve(['--worker', 'id=a,url=http://a:1,events=tcp://a:5557', '--tokenize', 'text'])),
    'text',
  );
});

test('serve runs from a config file with the in-process tokenizer', async () => {
  const tokenizerDir = fileURLToPath(new URL('../fixtures/tokenizer/', import.meta.url));
  const e = await new MockEngine({ model: 'fixture-model' }).start();
  engines.push(e);
  const dir = mkdtempSync(join(tmpdir(), 'cf-config-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(
    file,
    `port: 0\ntokenize: tokenizer\ntokenizer: ${tokenizerDir}\nworkers:\n  - id: m0\n    url: http://127.0.0.1:${e.port}\n    models: [fixture-model]\n`,
  );
  const { child, base, stderr } = await startServe(['--config', file], { CONTEXTFORGE_POLICY: 'round-robin' });
  assert.match(stderr, /policy round-robin/);
  assert.match(stderr, /tokenize tokenizer/);
  const ok = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    body: JSON.stringify({ model: 'fixture-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 }),
    headers: { 'content-type': 'application/json' },
  });
  assert.equal(ok.status, 200);
  const missing = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    body: JSON.stringify({ model: 'other', messages: [{ role: 'user', content: 'hi' }] }),
    headers: { 'content-type': 'application/json' },
  });
  assert.equal(missing.status, 404);
  assert.equal(((await missing.json()) as { error: { code: string } }).error.code, 'model_not_found');
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGINT');
  assert.equal(await exited, 0);
});

test('serve --state naming a database Redis does not have exits 2 naming --state and the database', async () => {
  const e = await new MockEngine().start();
  engines.push(e);
  const prefix = `cf-test-serve-db-${randomBytes(4).toString('hex')}:`;
  const { code, stderr } = await serveExit([
    '--port',
    '0',
    '--worker',
    `id=e0,url=http://127.0.0.1:${e.port}`,
    '--state',
    `${REDIS_URL}/16`,
    '--state-prefix',
    prefix,
  ]);
  assert.equal(code, 2, stderr);
  assert.match(stderr, /^error: state: .*refused database 16 of the --state URL \(ERR DB index is out of range\)/m);
  const r = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
  await r.connect();
  try {
    assert.deepEqual(await r.keys(`${prefix}*`), [], 'nothing written to database 0');
  } finally {
    r.disconnect();
  }
});

test('serve refuses a bad config with a message and exit code 2', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-config-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(file, 'colour: red\n');
  const r = spawnSync(process.execPath, [...CLI, 'serve', '--config', file], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /^error: --config .*unknown key 'colour'/m);
});

test('the fields removed from forwarded bodies: each setting off by default, on by flag, environment or file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-config-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(file, 'forward-custom-logit-processor: true\n');
  const d = resolve([]);
  assert.deepEqual([d.forwardCustomLogitProcessor, d.forwardKvTransferParams], [false, false]);
  const flag = resolve(['--forward-custom-logit-processor', 'true']);
  // one setting does not turn on the other
  assert.deepEqual([flag.forwardCustomLogitProcessor, flag.forwardKvTransferParams], [true, false]);
  const env = resolve([], { CONTEXTFORGE_FORWARD_CUSTOM_LOGIT_PROCESSOR: 'true' });
  assert.equal(env.forwardCustomLogitProcessor, true);
  assert.equal(resolve(['--config', file]).forwardCustomLogitProcessor, true);
  // the flag wins over the file
  assert.equal(
    resolve(['--config', file, '--forward-custom-logit-processor', 'false']).forwardCustomLogitProcessor,
    false,
  );
  assert.equal(resolve(['--forward-kv-transfer-params', 'true']).forwardCustomLogitProcessor, false);
  assert.throws(
    () => resolve([], { CONTEXTFORGE_FORWARD_CUSTOM_LOGIT_PROCESSOR: 'maybe' }),
    /'CONTEXTFORGE_FORWARD_CUSTOM_LOGIT_PROCESSOR' is invalid\. --forward-custom-logit-processor must be true or false \(got 'maybe'\)/,
  );
});

test('serve security settings: switches, token file, keys file, limits, timeouts, engine key variables', () => {
  const c = resolve([
    '--public-route-api',
    '--cached-tokens-header',
    '--admin-token-file',
    '/run/cf/token',
    '--api-keys-file',
    '/etc/cf/keys.yaml',
    '--max-id-bytes',
    '64',
    '--first-byte-timeout-ms',
    '3000',
    '--worker',
    'id=w1,url=http://10.0.0.1:8000,api-key-env=VLLM_KEY',
  ]);
  assert.deepEqual(
    [c.publicRouteApi, c.cachedTokensHeader, c.adminTokenFile, c.apiKeysFile, c.maxIdBytes, c.firstByteTimeoutMs],
    [true, true, '/run/cf/token', '/etc/cf/keys.yaml', 64, 3000],
  );
  assert.equal(c.workers[0].apiKeyEnv, 'VLLM_KEY');
  const d = resolve([]);
  assert.deepEqual(
    [
      d.publicRouteApi,
      d.cachedTokensHeader,
      d.maxIdBytes,
      d.maxAnchors,
      d.maxJsonDepth,
      d.headersTimeoutMs,
      d.requestTimeoutMs,
    ],
    [false, false, 256, 128, 64, 10_000, 60_000],
  );
  assert.equal(
    resolve([], { CONTEXTFORGE_PUBLIC_ROUTE_API: 'false' }).publicRouteApi,
    false,
    'a switch set to false in the environment is off',
  );
  assert.equal(resolve([], { CONTEXTFORGE_PUBLIC_ROUTE_API: '1' }).publicRouteApi, true);
  assert.throws(
    () => resolve([], { CONTEXTFORGE_PUBLIC_ROUTE_API: 'maybe' }),
    /CONTEXTFORGE_PUBLIC_ROUTE_API must be true or false \(got 'maybe'\)/,
  );
  assert.throws(() => parseWorkerSpec('id=w1,url=http://x,api-key-env=CONTEXTFORGE_ADMIN_TOKEN'), /may not name/);
  assert.throws(() => parseWorkerSpec('id=w 1,url=http://x'), /id must match/);
  assert.throws(() => parseWorkerSpec('id=w1,url=http://x/?q=1'), /query/);
});

test('--max-json-object-members: 4096 by default, from a flag, the environment or the config file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-config-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(file, 'max-json-object-members: 300\n');
  assert.equal(resolve([]).maxJsonObjectMembers, 4096);
  assert.equal(resolve(['--max-json-object-members', '100']).maxJsonObjectMembers, 100);
  assert.equal(resolve([], { CONTEXTFORGE_MAX_JSON_OBJECT_MEMBERS: '200' }).maxJsonObjectMembers, 200);
  assert.equal(resolve(['--config', file]).maxJsonObjectMembers, 300);
  assert.equal(resolve(['--config', file, '--max-json-object-members', '100']).maxJsonObjectMembers, 100);
  assert.throws(() => resolve(['--max-json-object-members', '0']), /--max-json-object-members must be >= 1/);
});

test('serve --block-hash vllm with PYTHONHASHSEED from the environment, and a dp-size worker', async () => {
  const e = await new MockEngine({ blockHash: 'vllm', pythonHashSeed: '5' }).start();
  engines.push(e);
  const { child, base, stderr } = await startServe(
    ['--port', '0', '--block-hash', 'vllm', '--worker', `id=m0,url=http://127.0.0.1:${e.port},dp-size=1,block-size=16`],
    { PYTHONHASHSEED: '5', CONTEXTFORGE_ADMIN_TOKEN: 'serve-test-admin-token' },
  );
  assert.match(stderr, /block hash vllm/);
  assert.match(stderr, /tokenize engine/);
  const res = await fetch(`${base}/v1/route`, {
    method: 'POST',
    body: JSON.stringify({ prompt: 'hello there' }),
    headers: { 'content-type': 'application/json', authorization: 'Bearer serve-test-admin-token' },
  });
  assert.equal(((await res.json()) as { worker: string }).worker, 'm0');
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
  // without a seed it refuses to start, naming what to set
  const refused = spawnSync(process.execPath, [...CLI, 'serve', '--port', '0', '--block-hash', 'vllm'], {
    env: { ...process.env, PYTHONHASHSEED: '' },
    encoding: 'utf8',
  });
  assert.notEqual(refused.status, 0);
  assert.match(refused.stderr, /PYTHONHASHSEED/);
});

test('a replica started after a fleet says which workers come from the shared registry, and counts them', async () => {
  const prefix = `cf-test-serve-registry-${randomBytes(4).toString('hex')}:`;
  const env = { CONTEXTFORGE_ADMIN_TOKEN: 'registry-test-token' };
  const common = ['--port', '0', '--state', REDIS_URL, '--state-prefix', prefix, '--health-interval-ms', '600000'];
  /** Starts serve; resolves once `ready` matches its stderr, which `stderr()` reads as it grows. */
  const start = async (args: string[], ready: RegExp) => {
    const child = spawn(process.execPath, [...CLI, 'serve', ...common, ...args], {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, ...env },
    });
    let stderr = '';
    const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    await until(() => ready.test(stderr) || child.exitCode !== null, `serve to start: ${ready}`, { timeoutMs: 30_000 });
    assert.match(stderr, ready);
    return {
      stderr: () => stderr,
      stop: async () => {
        child.kill('SIGTERM');
        assert.equal(await exited, 0, stderr);
      },
    };
  };
  try {
    // a fleet registered a and b, and stopped (the registry keeps them)
    const fleet = await start(
      ['--worker', 'id=a,url=http://127.0.0.1:18798', '--worker', 'id=b,url=http://127.0.0.1:18799'],
      /serving on .*\(policy cost, 2 workers, /,
    );
    await fleet.stop();
    // one replica alone, configured with c: a and b are the registry's, not another replica's
    const alone = await start(['--worker', 'id=c,url=http://127.0.0.1:18797'], /serving on /);
    await alone.stop();
    assert.match(alone.stderr(), /^worker 'a' from the shared registry$/m);
    assert.match(alone.stderr(), /^worker 'b' from the shared registry$/m);
    assert.doesNotMatch(alone.stderr(), /another replica/);
    assert.match(
      alone.stderr(),
      /serving on .*\(policy cost, 3 workers \(1 configured, 2 from the shared registry\), /,
    );
    // with --processes 2: each process says so; the primary counts what it was configured with
    const processes = await start(
      ['--processes', '2', '--worker', 'id=c,url=http://127.0.0.1:18797'],
      /serving on .*\(2 processes, /,
    );
    await until(
      () => (processes.stderr().match(/contextforge-router process /g) ?? []).length === 2,
      'both processes to say where they serve',
    );
    await processes.stop();
    const out = processes.stderr();
    assert.equal(out.match(/^\[process \d+\] worker 'a' from the shared registry$/gm)?.length, 2, out);
    assert.equal(
      out.match(
        /^\[process \d+\] contextforge-router process .*3 workers \(1 configured, 2 from the shared registry\)/gm,
      )?.length,
      2,
      out,
    );
    assert.match(
      out,
      /serving on .*\(2 processes, policy cost, 1 workers configured \(each process counts those of the shared registry too\), /,
    );
    assert.doesNotMatch(out, /another replica/);
  } finally {
    await dropPrefixes([prefix]);
  }
});

test("--max-anchors is the router's bound too: up to 4096, and a request naming more than 128 is served under it", async () => {
  assert.throws(() => resolve(['--max-anchors', '4097']), /--max-anchors must be <= 4096/);
  const e = await new MockEngine().start();
  engines.push(e);
  const { child, base } = await startServe([
    '--port',
    '0',
    '--tokenize',
    'text',
    '--max-anchors',
    '200',
    '--worker',
    `id=m0,url=http://127.0.0.1:${e.port}`,
  ]);
  const send = (count: number) =>
    fetch(`${base}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }),
      headers: {
        'content-type': 'application/json',
        'x-anchor-ids': Array.from({ length: count }, (_, i) => `doc${i}`).join(', '),
      },
    });
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  try {
    // past the router's own default (128) and within the gateway's: the router takes what the gateway let through
    assert.equal((await send(150)).status, 200);
    const refused = await send(201);
    assert.equal(refused.status, 400);
    assert.equal(((await refused.json()) as { error: { param: string } }).error.param, 'x-anchor-ids');
  } finally {
    child.kill('SIGTERM');
  }
  assert.equal(await exited, 0);
});

test("serve's log writes each message on one line, what a terminal acts on escaped (a worker id from Redis)", async () => {
  const prefix = `cf-test-serve-log-line-${randomBytes(4).toString('hex')}:`;
  // a record another writer left in the shared registry: its id holds a line break and a
  // sequence setting the terminal's title (the router's own rule takes any well-formed text;
  // the gateway refuses it and says so, repeating the id)
  const id = 'w\n\u001b]0;pwned\u0007\u009b2J';
  const redis = new Redis(REDIS_URL);
  try {
    await redis.hset(`${prefix}workers`, id, JSON.stringify({ id, url: 'http://127.0.0.1:1' }));
    const started = await startServe(['--port', '0', '--state', REDIS_URL, '--state-prefix', prefix]);
    const child = started.child;
    let stderr = started.stderr;
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    try {
      await until(() => /not added here/.test(stderr), 'the refused worker to be logged', { timeoutMs: 30_000 });
      await until(() => stderr.endsWith('\n'), 'the line to end');
    } finally {
      child.kill('SIGTERM');
      assert.equal(await exited, 0, stderr);
    }
    const line = stderr.split('\n').find((l) => l.includes('not added here'));
    assert.match(line ?? '', /^worker 'w\\x0a\\x1b\]0;pwned\\x07\\x9b2J' from the shared registry not added here: /);
    // eslint-disable-next-line no-control-regex -- the characters that must not reach the log raw
    assert.doesNotMatch(stderr, /[\u0007\u001b\u009b]/);
    // and no line starts with what followed the id's line break
    assert.doesNotMatch(stderr, /^.?\]0;pwned/m);
  } finally {
    redis.disconnect();
    await dropPrefixes([prefix]);
  }
});
