import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  BLOCK_HASH_VERSION,
  BlockHashes,
  hashHex,
  hashPrecomputedBlocks,
  hashString32,
  hashTextBlocks,
  hashTokenBlocks,
  hashTokenBlocksFrom,
  type HashNamespace,
} from '../../src/core/hashing.js';

// Fixed outputs of every hash the router shares with other replicas (Redis keys, shared
// decisions) and derives from engine events. Any change to an output, a constant in
// src/core/wasm/block-hash.wat included, fails here: then bump BLOCK_HASH_VERSION and
// regenerate these values in the same change, so replicas of different versions are told apart.
const VECTORS_VERSION = 1;

const tokens = Array.from({ length: 70 }, (_, i) => (i * 2654435761) % 151_936); // 4 full blocks of 16, 6 left over
const hex = (h: BlockHashes) => Array.from({ length: h.length }, (_, i) => h.toHex(i));

const TOKEN_VECTORS: Array<[string, HashNamespace | undefined, string[]]> = [
  ['no namespace', undefined, ['0f25e88a04db8214', 'a2d6df455a6ff628', '9f2495765e6f454d', '57c22e1e0f2b6ba3']],
  ['LoRA', { lora: 'adapter-a' }, ['95785829cac7b2f2', '9c6e85599d905533', '10a1620095a06151', '0102b42cbbf3b78f']],
  [
    'cache salt',
    { cacheSalt: 'tenant-1' },
    ['13cc33aa574713ac', '227b24f26e281133', 'e11e1ca4dcda8e0b', 'b3f5e647996007c1'],
  ],
  ['CLA group root', { claGroup: 3 }, ['93bc69c76ca82c15', '7941a7921d242dec', '7e2a1bd270234795', 'fe4ec58e1f46ff44']],
  [
    'LoRA, salt and CLA',
    { lora: 'adapter-a', cacheSalt: 'tenant-1', claGroup: 3 },
    ['4ce3b2c90b6b80fa', '50f997f32faf6a73', 'b6a67a652c37a95d', '074f5415ba869570'],
  ],
];

test(`block hashes of known inputs are fixed (hash version ${VECTORS_VERSION})`, () => {
  assert.equal(BLOCK_HASH_VERSION, VECTORS_VERSION, 'the hash version changed: regenerate the vectors below with it');
  for (const [what, ns, expected] of TOKEN_VECTORS) {
    assert.deepEqual(hex(hashTokenBlocks(tokens, 16, ns, new BlockHashes())), expected, `token ids, ${what}`);
  }
  // a KV event's blocks chained from their parent: the same hashes as the whole prompt's tail
  const head = hashTokenBlocks(tokens.slice(0, 32), 16, undefined, new BlockHashes());
  assert.deepEqual(
    hex(hashTokenBlocksFrom(head.hi[1], head.lo[1], tokens.slice(32, 64), 16, new BlockHashes())),
    TOKEN_VECTORS[0][2].slice(2),
  );

  const text = 'The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs! 🦊 ünïcödé';
  assert.deepEqual(
    hex(hashTextBlocks(text, 16, undefined, new BlockHashes())),
    [
      'b3f704d3b8fe59a4',
      'd308c8a8a11a2bd8',
      '485b698441a27c11',
      '3c536c79dc290cd7',
      'aecb1051b2bc6d7d',
      '1e581030d73b8a6c',
    ],
    'text (UTF-8 chunks)',
  );
  assert.deepEqual(
    hex(hashTextBlocks(text, 16, { cacheSalt: 'tenant-1' }, new BlockHashes())),
    [
      'b2bb9c43a0ce7acd',
      'f25815ccb4043f20',
      '304503f1f536a420',
      '517bd0fcb5fb7415',
      'a2d39522b4088746',
      '63276d77be77889e',
    ],
    'text with a cache salt',
  );
  assert.deepEqual(
    hex(hashPrecomputedBlocks([0, 1, 2 ** 40 + 7, 18446744073709551615n], 16, { claGroup: 3 }, new BlockHashes())),
    ['0ff5b75e3b5754e2', '92601be771c059ea', 'b1bf8a82d0e61be9', 'bf3ee87b1f5a6643'],
    'precomputed block ids (trace hash_ids)',
  );
  assert.deepEqual(
    ['', 'anchor-1', 'système'].map((s) => hashString32(s).toString(16).padStart(8, '0')),
    ['ab3e7c0b', '5cd5ce9a', '7e2da43b'],
    'routing keys',
  );
});

test('hashHex spells a (hi, lo) pair as 16 hex digits', () => {
  assert.equal(hashHex(0, 0), '0000000000000000');
  assert.equal(hashHex(0xdeadbeef, 0x1), 'deadbeef00000001');
  assert.equal(hashHex(-1, -2), 'fffffffffffffffe', 'int32 views of the halves read as unsigned');
  const h = hashTokenBlocks(tokens, 16, undefined, new BlockHashes());
  assert.equal(hashHex(h.hi[3], h.lo[3]), h.toHex(3));
});
