import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { BlockHashes } from '../../src/core/hashing.js';
import { engineHashKey, VLLM_HASH_ALGOS, VllmBlockHasher, type VllmHashAlgo } from '../../src/core/vllm-block-hash.js';

// Computed by Python (pickle / cbor2 canonical, then hashlib.sha256 / xxhash.xxh3_128_digest, as
// vllm/v1/core/kv_cache_utils.py hash_block_tokens with vllm/utils/hashing.py's functions) in
// scripts/gen-kv-event-fixtures.py. Long inputs are written compactly: tokens as runs
// [start, count], a salt as [text, times].
interface Case {
  algo?: VllmHashAlgo;
  pythonHashSeed: string;
  blockSize: number;
  tokens?: number[];
  tokenRuns?: [number, number][];
  lora: string | null;
  cacheSalt?: string | null;
  cacheSaltRepeat?: [string, number];
  noneHash: string;
  hashes: string[];
  intHashes: string[];
}
const { cases } = JSON.parse(
  readFileSync(new URL('../fixtures/kv-events/vllm-block-hash.json', import.meta.url), 'utf8'),
) as { cases: Case[] };

function tokensOf(c: Case): number[] {
  if (c.tokens) return c.tokens;
  const out: number[] = [];
  for (const [start, count] of c.tokenRuns ?? []) for (let i = 0; i < count; i++) out.push(start + i);
  return out;
}

test('vLLM block hashes equal Python on every generated case of every --prefix-caching-hash-algo', () => {
  const algos = new Set(cases.map((c) => c.algo));
  assert.deepEqual([...algos].sort(), [...VLLM_HASH_ALGOS].sort());
  assert.ok(cases.length >= 40);
  for (const c of cases) {
    const algo = c.algo ?? 'sha256_cbor';
    const tokens = tokensOf(c);
    const cacheSalt = c.cacheSaltRepeat ? c.cacheSaltRepeat[0].repeat(c.cacheSaltRepeat[1]) : (c.cacheSalt ?? null);
    const what = JSON.stringify({
      algo,
      seed: c.pythonHashSeed,
      blockSize: c.blockSize,
      lora: c.lora,
      salt: cacheSalt?.slice(0, 20),
    });
    const h = new VllmBlockHasher(c.pythonHashSeed, algo);
    assert.equal(h.noneHash.toString('hex'), c.noneHash, `NONE_HASH ${what}`);
    const digests = h.digests(tokens, c.blockSize, { lora: c.lora, cacheSalt });
    assert.deepEqual(
      digests.map((d) => d.toString('hex')),
      c.hashes,
      what,
    );
    const out = h.hashBlocks(tokens, c.blockSize, { lora: c.lora, cacheSalt }, new BlockHashes(4));
    assert.equal(out.length, c.intHashes.length);
    const key = new Uint32Array(2);
    for (let i = 0; i < out.length; i++) {
      assert.equal(out.toBigInt(i).toString(), c.intHashes[i], what);
      // the int form and the digest form of the same block give the same index key
      engineHashKey(BigInt(c.intHashes[i]), key);
      assert.deepEqual([key[0], key[1]], [out.hi[i], out.lo[i]]);
      engineHashKey(c.hashes[i], key);
      assert.deepEqual([key[0], key[1]], [out.hi[i], out.lo[i]]);
    }
  }
});

test('a different PYTHONHASHSEED gives different hashes; bad arguments throw', () => {
  const a = new VllmBlockHasher('0').digests([1, 2, 3, 4], 4)[0];
  const b = new VllmBlockHasher('1').digests([1, 2, 3, 4], 4)[0];
  assert.notDeepEqual(a, b);
  assert.throws(() => new VllmBlockHasher(''), TypeError);
  assert.throws(() => new VllmBlockHasher('0').digests([1, -2], 2), /tokens\[1\]/);
  assert.throws(() => new VllmBlockHasher('0').digests([1, 2], 0), /blockSize/);
  assert.throws(
    () => new VllmBlockHasher('0', 'md5' as VllmHashAlgo),
    /algo must be one of sha256, sha256_cbor, xxhash, xxhash_cbor/,
  );
});

test('the algorithms disagree with each other, and the default is sha256_cbor', () => {
  const tokens = [1, 2, 3, 4];
  const byAlgo = VLLM_HASH_ALGOS.map((a) => new VllmBlockHasher('0', a).digests(tokens, 4)[0].toString('hex'));
  assert.equal(new Set(byAlgo).size, 4);
  assert.equal(new VllmBlockHasher('0').digests(tokens, 4)[0].toString('hex'), byAlgo[1]);
  assert.deepEqual(
    VLLM_HASH_ALGOS.map((a) => new VllmBlockHasher('0', a).noneHash.length),
    [32, 32, 16, 16],
  );
});
