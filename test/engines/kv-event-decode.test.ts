import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { encode } from '@msgpack/msgpack';
import { decodeEventBatch, KvEventFormatError, type KvEventBatch } from '../../src/engines/kv-events/decode.js';

// Byte-exact vLLM payloads built by scripts/gen-kv-event-fixtures.py (see its docstring).
const dir = new URL('../fixtures/kv-events/', import.meta.url);
const names = readdirSync(dir).filter((f) => f.endsWith('.bin')).map((f) => f.slice(0, -4));

/** The decoded batch in the fixture's JSON form (hashes as {bigint} or {hex}). */
function normalise(b: KvEventBatch): unknown {
  const h = (x: bigint | string) => (typeof x === 'bigint' ? { bigint: x.toString() } : { hex: x });
  return {
    ts: b.ts,
    dataParallelRank: b.dataParallelRank,
    events: b.events.map((e) =>
      e.type === 'BlockStored'
        ? { ...e, blockHashes: e.blockHashes.map(h), parentBlockHash: e.parentBlockHash === null ? null : h(e.parentBlockHash) }
        : e.type === 'BlockRemoved'
          ? { ...e, blockHashes: e.blockHashes.map(h) }
          : e,
    ),
  };
}

describe('vLLM KV event decoding', () => {
  test('covers every event type in both encodings', () => {
    assert.equal(names.length, 15);
    for (const kind of ['stored-int', 'stored-bytes-lora', 'removed-int', 'removed-bytes', 'cleared']) {
      assert.ok(names.includes(`${kind}-map`) && names.includes(`${kind}-array-norank`) && names.includes(`${kind}-array-rank2`), kind);
    }
  });

  for (const name of names) {
    test(`decodes ${name}`, () => {
      const payload = new Uint8Array(readFileSync(new URL(`${name}.bin`, dir)));
      const expected = JSON.parse(readFileSync(new URL(`${name}.json`, dir), 'utf8'));
      assert.deepEqual(normalise(decodeEventBatch(payload)), expected);
    });
  }

  test('uint64 hashes above 2^53 keep every bit', () => {
    const b = decodeEventBatch(new Uint8Array(readFileSync(new URL('removed-int-map.bin', dir))));
    const e = b.events[0];
    assert.equal(e.type, 'BlockRemoved');
    if (e.type === 'BlockRemoved') assert.equal(e.blockHashes[0], 0xfedcba9876543210n);
  });

  const malformed: Array<[string, Uint8Array, RegExp]> = [
    ['truncated msgpack', new Uint8Array(readFileSync(new URL('stored-int-map.bin', dir))).subarray(0, 40), /not msgpack/],
    ['not a batch', encode('hello'), /array or a map/],
    ['batch array of 4', encode([1.5, [], 0, 'x']), /2 or 3 elements/],
    ['ts not a number', encode({ ts: 'now', events: [] }), /ts must be a number/],
    ['events not an array', encode({ ts: 1.5, events: {} }), /events must be an array/],
    ['unknown event type', encode([1.5, [['BlockMoved', [1]]]]), /unknown event type "BlockMoved"/],
    ['hash of the wrong type', encode([1.5, [['BlockRemoved', ['abc'], 'GPU']]]), /block_hashes\[0\] must be an integer or bytes/],
    ['token ids that do not fill the blocks', encode([1.5, [['BlockStored', [1], null, [1, 2, 3], 16, null, 'GPU', null]]]), /3 token ids for 1 blocks of 16/],
    ['negative token id', encode([1.5, [['BlockStored', [1], null, [-1], 1, null, 'GPU', null]]]), /token_ids\[0\] must be a uint32/],
    ['too many fields', encode([1.5, [['BlockRemoved', [1], 'GPU', 0, 'extra']]]), /at most 3/],
    ['medium not a string', encode({ ts: 1.5, events: [{ type: 'BlockRemoved', block_hashes: [1], medium: 5 }] }), /medium must be a string/],
    // an array header claiming 2^32-1 elements with no data: rejected before allocating
    ['huge array header', Uint8Array.from([0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff]), /not msgpack/],
  ];
  for (const [name, payload, message] of malformed) {
    test(`rejects ${name} with a KvEventFormatError`, () => {
      assert.throws(() => decodeEventBatch(payload), (e: unknown) => e instanceof KvEventFormatError && message.test((e as Error).message));
    });
  }
});
