import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { BlockHashes } from '../../src/core/hashing.js';
import { engineHashKey, VllmBlockHasher } from '../../src/core/vllm-block-hash.js';

// Computed by Python (cbor2 canonical + hashlib.sha256, as vllm/v1/core/kv_cache_utils.py
// hash_block_tokens with sha256_cbor) in scripts/gen-kv-event-fixtures.py.
interface Case {
  pythonHashSeed: string;
  blockSize: number;
  tokens: number[];
  lora: string | null;
  cacheSalt: string | null;
  noneHash: string;
  hashes: string[];
  intHashes: string[];
}
const { cases } = JSON.parse(
  readFileSync(new URL('../fixtures/kv-events/vllm-block-hash.json', import.meta.url), 'utf8'),
) as { cases: Case[] };

test('vLLM block hashes equal Python sha256_cbor on every generated case', () => {
  assert.ok(cases.length >= 6);
  for (const c of cases) {
    const h = new VllmBlockHasher(c.pythonHashSeed);
    assert.equal(h.noneHash.toString('hex'), c.noneHash, `NONE_HASH for seed ${c.pythonHashSeed}`);
    const digests = h.digests(c.tokens, c.blockSize, { lora: c.lora, cacheSalt: c.cacheSalt });
    assert.deepEqual(
      digests.map((d) => d.toString('hex')),
      c.hashes,
      JSON.stringify({ seed: c.pythonHashSeed, lora: c.lora, salt: c.cacheSalt }),
    );
    const out = h.hashBlocks(c.tokens, c.blockSize, { lora: c.lora, cacheSalt: c.cacheSalt }, new BlockHashes(4));
    assert.equal(out.length, c.intHashes.length);
    const key = new Uint32Array(2);
    for (let i = 0; i < out.length; i++) {
      assert.equal(out.toBigInt(i).toString(), c.intHashes[i]);
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
});
