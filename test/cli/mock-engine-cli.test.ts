import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { BlockHashes } from '../../src/core/hashing.js';
import { VllmBlockHasher } from '../../src/core/vllm-block-hash.js';
import { mockTokenize } from '../../src/engines/mock-engine.js';
import { CLI } from '../helpers/cli-entry.js';

/** Starts `contextforge-router mock-engine` and resolves once it says where it serves. */
async function startMockEngine(args: string[]) {
  const child = spawn(process.execPath, [...CLI, 'mock-engine', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  const url = await new Promise<string>((resolve, reject) => {
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
      const m = /on (http:\/\/[\d.]+:\d+)/.exec(stderr);
      if (m) resolve(m[1]);
    });
    child.once('exit', (code) => reject(new Error(`exited ${code}: ${stderr}`)));
  });
  return { child, url, stderr: () => stderr };
}

test('contextforge-router mock-engine serves until SIGTERM and exits cleanly', async () => {
  const { child, url, stderr: err } = await startMockEngine(['--port', '0', '--events', 'tcp://127.0.0.1:*']);
  const stderr = err();
  assert.match(stderr, /KV events on tcp:\/\/127\.0\.0\.1:\d+/);
  const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: Array<{ id: string }> };
  assert.equal(models.data[0].id, 'mock');
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('mock-engine rejects bad flags', async () => {
  const child = spawn(process.execPath, [...CLI, 'mock-engine', '--replay', 'tcp://127.0.0.1:*'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  assert.notEqual(code, 0);
  assert.match(stderr, /--replay needs --events/);
});

/**
 * startMockEngine with KV events on two consecutive ports from `base`, chosen at random below
 * the kernel's ephemeral range (32768 up), where no test's outgoing connection takes one; a pair
 * that another test's listener holds meanwhile is tried again with another.
 */
async function startMockEngineOnPortPair(args: (base: number) => string[]) {
  for (let attempt = 1; ; attempt++) {
    const base = 10_000 + Math.floor(Math.random() * 20_000);
    try {
      return { base, ...(await startMockEngine(args(base))) };
    } catch (err) {
      if (attempt === 5 || !/Address already in use/.test((err as Error).message)) throw err;
    }
  }
}

test('mock-engine --data-parallel-size and --lora-modules', async () => {
  const {
    base,
    child,
    url,
    stderr: err,
  } = await startMockEngineOnPortPair((base) => [
    '--port',
    '0',
    '--events',
    `tcp://127.0.0.1:${base}`,
    '--data-parallel-size',
    '2',
    '--lora-modules',
    'sql,chat',
  ]);
  const stderr = err();
  assert.match(stderr, new RegExp(`KV events on tcp://127\\.0\\.0\\.1:${base} tcp://127\\.0\\.0\\.1:${base + 1}`));
  const models = (await (await fetch(`${url}/v1/models`)).json()) as {
    data: Array<{ id: string; parent: string | null }>;
  };
  assert.deepEqual(
    models.data.map((m) => [m.id, m.parent]),
    [
      ['mock', null],
      ['sql', 'mock'],
      ['chat', 'mock'],
    ],
  );
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test("mock-engine --prefix-caching-hash-algo takes vLLM's four names, as serve does", async () => {
  const run = (args: string[]) =>
    spawnSync(process.execPath, [...CLI, 'mock-engine', '--port', '0', ...args], {
      encoding: 'utf8',
      timeout: 60_000,
    });
  const bad = run(['--block-hash', 'vllm', '--python-hash-seed', '0', '--prefix-caching-hash-algo', 'md5']);
  assert.equal(bad.status, 2, bad.stderr);
  assert.equal(
    bad.stderr,
    "error: --prefix-caching-hash-algo must be one of sha256, sha256_cbor, xxhash, xxhash_cbor (got 'md5')\n",
  );
  // with the matching algorithm, the engine's cache lists vLLM's xxhash blocks
  const { child, url, stderr } = await startMockEngine([
    '--port',
    '0',
    '--block-size',
    '4',
    '--block-hash',
    'vllm',
    '--python-hash-seed',
    '0',
    '--prefix-caching-hash-algo',
    'xxhash',
  ]);
  assert.doesNotMatch(stderr(), /warning/);
  const prompt = 'one two three four five six seven eight nine';
  await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 1 }),
  });
  const listing = ((await (await fetch(`${url}/debug/cache`)).json()) as { blockHashes: string[] }).blockHashes;
  const expected = new VllmBlockHasher('0', 'xxhash').hashBlocks(mockTokenize(prompt), 4, {}, new BlockHashes());
  assert.ok(expected.length > 0);
  for (let i = 0; i < expected.length; i++) assert.ok(listing.includes(expected.toBigInt(i).toString()), `block ${i}`);
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
  // without --block-hash vllm it keys nothing: said, as serve says it
  const unused = await startMockEngine(['--port', '0', '--prefix-caching-hash-algo', 'sha256']);
  assert.match(unused.stderr(), /^warning: --prefix-caching-hash-algo has no effect without --block-hash vllm$/m);
  assert.doesNotMatch(unused.stderr(), /--python-hash-seed/);
  const done = new Promise<number | null>((r) => unused.child.once('exit', (code) => r(code)));
  unused.child.kill('SIGTERM');
  assert.equal(await done, 0);
});

test('mock-engine --python-hash-seed without --block-hash vllm is said to have no effect', async () => {
  const unused = await startMockEngine(['--port', '0', '--python-hash-seed', '5']);
  const done = new Promise<number | null>((r) => unused.child.once('exit', (code) => r(code)));
  try {
    assert.match(unused.stderr(), /^warning: --python-hash-seed has no effect without --block-hash vllm$/m);
  } finally {
    unused.child.kill('SIGTERM');
  }
  assert.equal(await done, 0);
});

test('mock-engine closes cleanly on a SIGTERM sent as soon as it says where it serves', async () => {
  // the line is the readiness signal a supervisor waits for: stopping it then is a clean close, not a kill
  for (let i = 0; i < 3; i++) {
    const { child } = await startMockEngine(['--port', '0']);
    const exited = new Promise<[number | null, string | null]>((r) =>
      child.once('exit', (code, sig) => r([code, sig])),
    );
    child.kill('SIGTERM');
    assert.deepEqual(await exited, [0, null], `attempt ${i + 1}`);
  }
});
