/**
 * Replicas that hash prompts otherwise (block size, text chunk bytes, block hash kind, vLLM's
 * PYTHONHASHSEED and hash algorithm, text or token ids) never match each other's block entries:
 * they must not share one prefix. The first replica writes its settings to `{prefix}settings`; a
 * replica whose settings differ refuses to start (exit 2, one line naming them), and one that
 * finds them differing at a resynchronisation stops sharing until they agree. Real Redis.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter, type KVAwareRouterOptions } from '../../src/core/router/index.js';
import { RedisStateStore } from '../../src/state/redis-state-store.js';
import { hashingFingerprint } from '../../src/state/redis-wire.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { REDIS_URL } from '../helpers/redis-routers.js';
import { serveExit } from '../helpers/serve-exit.js';
import { channelOf, fixedWorkersHost, sharedStateScope } from '../helpers/state-host.js';
import { until } from '../helpers/wait.js';

const { prefixes, stores, redis } = sharedStateScope('settings');

async function replica(
  prefix: string,
  id: string,
  options: KVAwareRouterOptions = {},
  tokenize?: 'text' | 'tokenizer' | 'engine',
) {
  const router = new KVAwareRouter({ blockSize: 16, ...options });
  const { host, logs } = fixedWorkersHost(router, ['e0']);
  const store = new RedisStateStore({ url: REDIS_URL, prefix, replicaId: id, syncIntervalMs: 50, tokenize });
  stores.push(store);
  await store.attach(host);
  return { router, store, logs };
}

const vllm = (seed: string, algo: 'sha256' | 'sha256_cbor' = 'sha256_cbor'): KVAwareRouterOptions => ({
  blockHash: 'vllm',
  pythonHashSeed: seed,
  prefixCachingHashAlgo: algo,
});

test("a replica whose hashing settings differ from the fleet's refuses to start, naming them", async () => {
  await redis.connect().catch(() => {});
  const cases: Array<[KVAwareRouterOptions, KVAwareRouterOptions, RegExp, string?]> = [
    [{}, { blockSize: 32 }, /blockSize 32 \(stored: 16\)/],
    [{}, { textChunkBytes: 128 }, /textChunkBytes 128 \(stored: 64\)/],
    [{}, vllm('0'), /blockHash vllm \(stored: router\).*prefixCachingHashAlgo sha256_cbor \(stored: unset\)/],
    [vllm('0'), vllm('1'), /pythonHashSeed/],
    [vllm('0'), vllm('0', 'sha256'), /prefixCachingHashAlgo sha256 \(stored: sha256_cbor\)/],
    [{}, {}, /tokenize tokens \(stored: text\)/, 'engine'],
  ];
  for (const [first, second, named, tokenize] of cases) {
    const prefix = prefixes.fresh();
    const a = await replica(prefix, 'A', first, tokenize === undefined ? undefined : 'text');
    assert.equal(a.store.stats().connected, true, a.logs.join('\n'));
    const stored = await redis.get(`${prefix}settings`);
    assert.ok(stored, 'the first replica writes its settings');
    await assert.rejects(replica(prefix, 'B', second, tokenize as 'engine' | undefined), (err: Error) => {
      assert.ok(err instanceof RangeError, String(err));
      assert.match(err.message, named);
      assert.match(err.message, new RegExp(`${prefix}settings`));
      assert.doesNotMatch(err.message, /\n/, 'one line');
      return true;
    });
    assert.equal(await redis.get(`${prefix}settings`), stored, 'the stored settings stay');
    // nothing of the refused replica was written
    assert.equal(await redis.zscore(`${prefix}replicas`, 'B'), null);
  }
  // the same settings, and a field only one side knows (tokenize unset), share
  const prefix = prefixes.fresh();
  await replica(prefix, 'A', {}, 'tokenizer');
  const b = await replica(prefix, 'B', {}, 'engine');
  const c = await replica(prefix, 'C');
  assert.equal(b.store.stats().connected, true);
  assert.equal(c.store.stats().connected, true);
});

test('under --tokenize tokenizer the chat rendering is a hashing setting; elsewhere it is none', async () => {
  await redis.connect().catch(() => {});
  const withRendering = async (
    prefix: string,
    id: string,
    tokenize: 'tokenizer' | 'engine',
    rendering: 'vllm' | 'sglang',
  ) => {
    const router = new KVAwareRouter({ blockSize: 16 });
    const { host } = fixedWorkersHost(router, ['e0']);
    const store = new RedisStateStore({
      url: REDIS_URL,
      prefix,
      replicaId: id,
      syncIntervalMs: 50,
      tokenize,
      chatRendering: rendering,
    });
    stores.push(store);
    await store.attach(host);
    return store;
  };
  const prefix = prefixes.fresh();
  await withRendering(prefix, 'A', 'tokenizer', 'vllm');
  await assert.rejects(withRendering(prefix, 'B', 'tokenizer', 'sglang'), /chatRendering sglang \(stored: vllm\)/);
  // an engine's /tokenize renders chats its own way: the gateway's setting changes no hash there
  const engines = prefixes.fresh();
  await withRendering(engines, 'A', 'engine', 'vllm');
  assert.equal((await withRendering(engines, 'B', 'engine', 'sglang')).stats().connected, true);
  assert.equal(hashingFingerprint(new KVAwareRouter({}), 'engine', 'sglang').chatRendering, undefined);
});

test('the fingerprint tells vLLM hash seeds apart without writing the seed', () => {
  const a = hashingFingerprint(new KVAwareRouter(vllm('12345')));
  const b = hashingFingerprint(new KVAwareRouter(vllm('12346')));
  assert.notEqual(a.probe, b.probe);
  assert.doesNotMatch(JSON.stringify(a), /12345/);
  assert.equal(hashingFingerprint(new KVAwareRouter({})).probe, hashingFingerprint(new KVAwareRouter({})).probe);
});

test('serve with other hashing settings than the fleet on its prefix exits 2 with one line', async () => {
  await redis.connect().catch(() => {});
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'A');
  assert.equal(a.store.stats().connected, true);
  const e = await new MockEngine().start();
  try {
    const { code, stderr } = await serveExit([
      '--port',
      '0',
      '--worker',
      `id=e0,url=http://127.0.0.1:${e.port}`,
      '--block-size',
      '32',
      '--state',
      REDIS_URL,
      '--state-prefix',
      prefix,
    ]);
    assert.equal(code, 2, stderr);
    const lines = stderr.split('\n').filter((l) => l.startsWith('error:'));
    assert.equal(lines.length, 1, stderr);
    assert.match(lines[0], /^error: state: .*settings .*blockSize 32 \(stored: 16\)/);
  } finally {
    await e.close();
  }
});

test('settings lost with Redis are written again; other settings found at a resynchronisation stop the sharing until they agree', async () => {
  await redis.connect().catch(() => {});
  const prefix = prefixes.fresh();
  const a = await replica(prefix, 'A');
  const mine = await redis.get(`${prefix}settings`);
  assert.ok(mine);
  // Redis lost its data: the epoch and the settings go; A writes both again as it writes back
  await redis.del(`${prefix}settings`, `${prefix}epoch`);
  await until(() => a.store.stats().stateLost === 1 && a.store.stats().resyncs === 2, 'the write-back');
  assert.equal(await redis.get(`${prefix}settings`), mine);

  // a replica of another block size got there first after a loss
  const other = JSON.stringify(hashingFingerprint(new KVAwareRouter({ blockSize: 64 })));
  await redis.set(`${prefix}settings`, other);
  await redis.del(`${prefix}epoch`);
  await until(() => a.store.stats().connected === false, 'A to stop sharing');
  assert.ok((a.store.stats().settingsMismatches as number) >= 1);
  assert.equal(await redis.get(`${prefix}settings`), other, 'not overwritten');
  const entries = a.router.getStats().index.entries;
  // what the others publish is not applied meanwhile
  await redis.publish(
    channelOf(a.store),
    JSON.stringify({ r: 'X', k: 'd', w: 'e0', h: Buffer.alloc(64, 9).toString('base64') }),
  );
  await until(() => (a.store.stats().settingsMismatches as number) >= 2, 'a second try to find them differing', {
    timeoutMs: 15_000,
  });
  assert.equal(a.router.getStats().index.entries, entries, 'nothing applied');
  assert.equal(a.logs.filter((l) => /holds other block-hashing settings/.test(l)).length, 1, a.logs.join('\n'));
  // the operator puts the fleet's settings back: A shares again
  await redis.set(`${prefix}settings`, mine);
  await until(() => a.store.stats().connected === true, 'A to share again', { timeoutMs: 15_000 });
  assert.ok(
    a.logs.some((l) => /agrees with this replica's settings again/.test(l)),
    a.logs.join('\n'),
  );
});
