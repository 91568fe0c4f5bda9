import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { decode, encode } from '@msgpack/msgpack';
import {
  decodeEventBatch,
  KV_EVENT_LIMITS,
  KvEventFormatError,
  type KvEventBatch,
} from '../../src/engines/kv-events/decode.js';

// Payloads encoded by msgspec from structs mirroring vLLM's and SGLang's, in every historical
// shape (scripts/gen-kv-event-fixtures.py); the .json beside each is written from the encoder's input.
const dir = new URL('../fixtures/kv-events/', import.meta.url);
const names = readdirSync(dir)
  .filter((f) => f.endsWith('.bin'))
  .map((f) => f.slice(0, -4))
  .sort();

/** The decoded batch in the fixture's JSON form (hashes as {bigint} or {hex}). */
function normalise(b: KvEventBatch): { events: unknown; [k: string]: unknown } {
  const h = (x: bigint | string) => (typeof x === 'bigint' ? { bigint: x.toString() } : { hex: x });
  return {
    ts: b.ts,
    dataParallelRank: b.dataParallelRank,
    ...(b.skipped ? { skipped: b.skipped.map(({ index, reason }) => ({ index, reason })) } : {}),
    events: b.events.map((e) =>
      e.type === 'BlockStored'
        ? {
            ...e,
            blockHashes: e.blockHashes.map(h),
            parentBlockHash: e.parentBlockHash === null ? null : h(e.parentBlockHash),
          }
        : e.type === 'BlockRemoved'
          ? { ...e, blockHashes: e.blockHashes.map(h) }
          : e,
    ),
  };
}

/** A store of one block of one token on the GPU, in the map form of vLLM's releases (fields of a test's own added after it). */
const ONE_BLOCK_STORED = {
  type: 'BlockStored',
  block_hashes: [1],
  parent_block_hash: null,
  token_ids: [1],
  block_size: 1,
  lora_id: null,
  medium: 'GPU',
  lora_name: null,
} as const;

/** The same store in the array form, up to lora_name (extra_keys, when a test adds them, come next). */
const ONE_BLOCK_STORED_ARRAY = ['BlockStored', [1], null, [1], 1, null, 'GPU', null] as const;

describe('vLLM KV event decoding', () => {
  test('covers every event type in every historical shape', () => {
    for (const shape of ['v0.9', 'dp', 'medium', 'lora', 'extra', 'group', 'spec', 'mapev', 'map']) {
      for (const kind of ['stored-int', 'removed-int', 'cleared'])
        assert.ok(names.includes(`${shape}-${kind}`), `${shape}-${kind}`);
    }
    for (const n of [
      'future-stored-int',
      'offload-cpu',
      'offload-cpu-unsized',
      'offload-cpu-described',
      'placement-fields',
      'storage-locality',
      'hybrid',
      'hybrid-array',
      'extra-keys-mm-salt',
      'typed-extra-keys-mm-salt',
      'typed-extra-keys-all',
      'sglang-page1',
      'sglang-page16',
      'sglang-salt-array',
      'sglang-salt-map',
      'sglang-lora-map',
      'sglang-position-free',
      'mixed-bad',
    ])
      assert.ok(names.includes(n), n);
  });

  test('array-like releases keep trailing defaults on the wire; map releases omit them', () => {
    const spec = new Uint8Array(readFileSync(new URL('spec-stored-int.bin', dir)));
    const map = new Uint8Array(readFileSync(new URL('map-stored-int.bin', dir)));
    const rawSpec = decode(spec, { useBigInt64: true }) as [number, Array<unknown[]>];
    const rawMap = decode(map, { useBigInt64: true }) as { events: Array<Record<string, unknown>> };
    assert.equal(rawSpec[1][0].length, 12); // the tag and all 11 fields, 4 trailing nils included
    assert.deepEqual(rawSpec[1][0].slice(8), [null, null, null, null]);
    assert.equal(Object.keys(rawMap.events[0]).length, 8); // the tag and the 7 fields without defaults
    assert.deepEqual(normalise(decodeEventBatch(spec)).events, normalise(decodeEventBatch(map)).events);
  });

  for (const name of names) {
    test(`decodes ${name}`, () => {
      const payload = new Uint8Array(readFileSync(new URL(`${name}.bin`, dir)));
      const expected = JSON.parse(readFileSync(new URL(`${name}.json`, dir), 'utf8'));
      assert.deepEqual(normalise(decodeEventBatch(payload)), expected);
    });
  }

  test('digests longer than 64 bytes (concatenated sub-block digests) are kept under a bounded key ending in their low 64 bits', () => {
    // vLLM hashing a KV group at a step finer than its block publishes each block's sub-block
    // digests concatenated: 4 x 32 bytes here
    const long = (i: number) =>
      Buffer.alloc(128, i)
        .fill(0xab, 120)
        .fill(i + 1, 127);
    const b = decodeEventBatch(
      encode([
        1.5,
        [
          ['BlockStored', [long(1), long(2)], null, Array.from({ length: 32 }, (_, k) => k), 16, null, 'GPU'],
          ['BlockRemoved', [long(2)], 'GPU'],
          ['BlockRemoved', [new Uint8Array(KV_EVENT_LIMITS.maxBlockHashBytes)], 'GPU'],
          ['BlockRemoved', [new Uint8Array(KV_EVENT_LIMITS.maxBlockHashBytes + 1)], 'GPU'],
        ],
      ]),
    );
    assert.deepEqual(
      b.skipped?.map(({ index, reason }) => ({ index, reason })),
      [{ index: 3, reason: 'bad_field' }],
    );
    const [stored, removed, largest] = b.events as Array<{ blockHashes: string[] }>;
    const [k1, k2] = stored.blockHashes;
    assert.equal(k1.length, 64);
    assert.notEqual(k1, k2);
    // the digest's last 8 bytes, as vLLM's int form takes them, end the key
    assert.ok(k1.endsWith(long(1).subarray(120).toString('hex')), k1);
    // the same digest gets the same key wherever it is sent
    assert.deepEqual(removed.blockHashes, [k2]);
    assert.equal(largest.blockHashes[0].length, 64);
    // digests of up to 64 bytes stay their hex, as before
    const short = decodeEventBatch(encode([1.5, [['BlockRemoved', [Buffer.alloc(64, 7)], 'GPU']]]));
    assert.deepEqual((short.events[0] as { blockHashes: string[] }).blockHashes, ['07'.repeat(64)]);
  });

  test('uint64 hashes above 2^53 keep every bit', () => {
    const b = decodeEventBatch(new Uint8Array(readFileSync(new URL('map-removed-int.bin', dir))));
    const e = b.events[0];
    assert.equal(e.type, 'BlockRemoved');
    if (e.type === 'BlockRemoved') assert.equal(e.blockHashes[0], 0xfedcba9876543210n);
  });

  const malformed: Array<[string, Uint8Array, RegExp]> = [
    [
      'truncated msgpack',
      new Uint8Array(readFileSync(new URL('map-stored-int.bin', dir))).subarray(0, 40),
      /not msgpack/,
    ],
    ['not a batch', encode('hello'), /array or a map/],
    ['batch array of 1', encode([1.5]), /at least 2 elements/],
    ['ts not a number', encode({ ts: 'now', events: [] }), /ts must be a number/],
    ['events not an array', encode({ ts: 1.5, events: {} }), /events must be an array/],
    // an array header claiming 2^32-1 elements with no data: rejected before allocating,
    // for the events it claims, or for the bytes it lacks when it is not the events list
    [
      'huge array header',
      Uint8Array.from([0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff]),
      /batch has 4294967295 events, over the limit/,
    ],
    [
      'huge nested array header',
      Uint8Array.from([0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0xdd, 0xff, 0xff, 0xff, 0xff]),
      /not msgpack/,
    ],
  ];
  for (const [name, payload, message] of malformed) {
    test(`rejects ${name} with a KvEventFormatError`, () => {
      assert.throws(
        () => decodeEventBatch(payload),
        (e: unknown) => e instanceof KvEventFormatError && message.test((e as Error).message),
      );
    });
  }

  const badEvents: Array<[string, unknown, string, RegExp]> = [
    ['unknown event type', ['BlockMoved', [1]], 'unknown_type', /unknown event type "BlockMoved"/],
    [
      'hash of the wrong type',
      ['BlockRemoved', ['abc'], 'GPU'],
      'bad_field',
      /block_hashes\[0\] must be an integer or bytes/,
    ],
    [
      'token ids that do not fill the blocks',
      ['BlockStored', [1], null, [1, 2, 3], 16, null, 'GPU', null],
      'token_count',
      /3 token ids for 1 blocks of 16/,
    ],
    [
      'negative token id',
      ['BlockStored', [1], null, [-1], 1, null, 'GPU', null],
      'bad_field',
      /token_ids\[0\] must be a uint32/,
    ],
    // MLA and sink attention keep every token's KV as full attention does: their token ids fill their blocks
    ...(['mla_attention', 'sink_full_attention'] as const).map((kind): [string, unknown, string, RegExp] => [
      `token ids that do not fill the blocks of a ${kind} group`,
      {
        type: 'BlockStored',
        block_hashes: [1],
        parent_block_hash: null,
        token_ids: [1, 2, 3],
        block_size: 16,
        lora_id: null,
        medium: 'GPU',
        lora_name: null,
        group_idx: 0,
        kv_cache_spec_kind: kind,
      },
      'token_count',
      /3 token ids for 1 blocks of 16/,
    ]),
    ['SGLang token pairs', ['BlockStored', [1], null, [[5, 6]], 1, null], 'bigram_tokens', /token pair/],
    [
      'medium not a string',
      { type: 'BlockRemoved', block_hashes: [1], medium: 5 },
      'bad_field',
      /medium must be a string/,
    ],
    [
      'extra_keys not per block',
      {
        ...ONE_BLOCK_STORED,
        extra_keys: [null, null],
      },
      'bad_field',
      /2 entries for 1 blocks/,
    ],
    // vLLM's typed extra keys (event_version 1) missing a field, or with one of the wrong type
    ...(
      [
        [{ type: 'cache_salt' }, /extra_keys\[0\]\[0\] \(cache_salt\) must have a string salt/],
        [{ type: 'cache_salt', salt: 5 }, /\(cache_salt\) must have a string salt/],
        [{ type: 'lora', name: null }, /\(lora\) must have a string name/],
        [{ type: 'mm', modality: 'image', hash: 'img', block_offset: 'x' }, /\(mm\) must have an integer block_offset/],
        [{ type: 'mm', modality: 'image', block_offset: 0 }, /\(mm\) must have a string hash/],
        [{ type: 'mm', hash: 'img', block_offset: 0 }, /\(mm\) must have a string modality/],
        [{ type: 'prompt_embeds', hash: 'abc' }, /\(prompt_embeds\) must have a bytes hash/],
        [{ type: 'legacy' }, /\(legacy\) must have a value/],
      ] as const
    ).map(([key, message]): [string, unknown, string, RegExp] => [
      `a malformed typed extra key ${JSON.stringify(key)}`,
      {
        ...ONE_BLOCK_STORED,
        event_version: 1,
        extra_keys: [[key]],
      },
      'bad_field',
      message,
    ]),
  ];
  for (const [name, bad, reason, message] of badEvents) {
    test(`skips an event with ${name} and keeps the rest of its batch`, () => {
      const b = decodeEventBatch(encode([1.5, [['AllBlocksCleared'], bad, ['BlockRemoved', [7], 'GPU']]]));
      assert.deepEqual(
        b.events.map((e) => e.type),
        ['AllBlocksCleared', 'BlockRemoved'],
      );
      assert.equal(b.skipped?.length, 1);
      assert.equal(b.skipped![0].index, 1);
      assert.equal(b.skipped![0].reason, reason);
      assert.match(b.skipped![0].message, message);
    });
  }

  test('reads extra_keys nested to the depth limit, and skips an event nested one level deeper', () => {
    const limit = KV_EVENT_LIMITS.maxExtraKeyDepth;
    assert.equal(limit, 8);
    // an extra_keys entry of `levels` arrays, each the only element of the one around it
    const nested = (levels: number): unknown => {
      let v: unknown = 'salt';
      for (let d = 0; d < levels; d++) v = [v];
      return v;
    };
    const storedWith = (hash: number, levels: number) => [
      'BlockStored',
      [hash],
      null,
      [1],
      1,
      null,
      'GPU',
      null,
      [nested(levels)],
    ];
    const b = decodeEventBatch(
      encode([1.5, [storedWith(1, limit), storedWith(2, limit + 1), ['BlockRemoved', [7], 'GPU']]]),
    );
    assert.deepEqual(
      b.events.map((e) => e.type),
      ['BlockStored', 'BlockRemoved'],
    );
    const e = b.events[0];
    assert.ok(e.type === 'BlockStored');
    assert.deepEqual(e.blockHashes, [1n]);
    assert.deepEqual(e.extraKeys, [nested(limit)], 'the entry at the limit is read whole');
    assert.deepEqual(b.skipped, [
      {
        index: 1,
        reason: 'bad_field',
        message: 'events[1] (BlockStored).extra_keys[0] nests deeper than 8 levels',
      },
    ]);
  });

  test('a map in extra_keys counts as a level, and its bytes and uint64s become plain data', () => {
    const stored = (entry: unknown) => [...ONE_BLOCK_STORED_ARRAY, [entry]];
    const b = decodeEventBatch(
      encode([1.5, [stored(['img', { n: 2n ** 63n, d: new Uint8Array([1, 2]) }])]], { useBigInt64: true }),
    );
    assert.equal(b.skipped, undefined);
    assert.ok(b.events[0].type === 'BlockStored');
    assert.deepEqual(b.events[0].extraKeys, [['img', { n: '9223372036854775808', d: { bytes: '0102' } }]]);
    // a map nested 100,000 deep (written by hand: msgpack's encoder recurses) costs its event only
    const deep = Buffer.concat([
      Buffer.from([0x92]), // [ts, events]
      encode(1.5),
      Buffer.from([0x92, 0x99]), // events: two, the first of nine fields
      ...ONE_BLOCK_STORED_ARRAY.map((v) => encode(v)),
      Buffer.from([0x91, 0x92]), // extra_keys: one entry of two keys
      encode('img'),
      ...Array.from({ length: 100_000 }, () => Buffer.from([0x81, 0xa1, 0x61])), // {a: {a: …
      encode(1),
      encode(['BlockRemoved', [7], 'GPU']),
    ]);
    const d = decodeEventBatch(deep);
    assert.deepEqual(
      d.events.map((e) => e.type),
      ['BlockRemoved'],
    );
    assert.equal(d.skipped?.[0].reason, 'bad_field');
    assert.match(d.skipped![0].message, /extra_keys\[0\] nests deeper than 8 levels/);
  });

  test('an event nested millions deep is cut at the depth bound before it is built: skipped alone, the rest applies', () => {
    // [ts, [[[[…4M deep…]]], BlockRemoved], nil]: msgpack's decoder would build one array per
    // level (gigabytes at 33M); the structure pass cuts it at KV_EVENT_LIMITS.maxEventDepth
    const levels = 4_000_000;
    const deep = Buffer.concat([
      Buffer.from([0x93]),
      encode(1.5),
      Buffer.from([0x92]),
      Buffer.alloc(levels, 0x91),
      Buffer.from([0x90]),
      encode(['BlockRemoved', [7], 'GPU']),
      Buffer.from([0xc0]),
    ]);
    const b = decodeEventBatch(deep);
    assert.deepEqual(
      b.events.map((e) => e.type),
      ['BlockRemoved'],
    );
    assert.equal(b.skipped?.length, 1);
    assert.equal(b.skipped![0].index, 0);
    assert.equal(b.skipped![0].reason, 'unknown_type');
    // the type shown is what was decoded: arrays down to the bound, never the millions of levels
    assert.ok(b.skipped![0].message.length < 200, b.skipped![0].message);
    // a deep extra_keys entry reads as before: its event skipped for its depth
    const entry = Buffer.concat([Buffer.alloc(levels, 0x91), encode('salt')]);
    const stored = Buffer.concat([
      Buffer.from([0x99]),
      ...ONE_BLOCK_STORED_ARRAY.map((v) => encode(v)),
      Buffer.from([0x91]),
      entry,
    ]);
    const s = decodeEventBatch(Buffer.concat([Buffer.from([0x92]), encode(1.5), Buffer.from([0x91]), stored]));
    assert.deepEqual(s.events, []);
    assert.equal(s.skipped?.[0].reason, 'bad_field');
    assert.match(s.skipped![0].message, /extra_keys\[0\] nests deeper than 8 levels/);
    // a ts or data_parallel_rank nested deep is no number: the batch is refused, nothing built
    const deepField = (at: 0 | 2) => {
      const fields = [encode(1.5), encode([]), encode(0)];
      fields[at] = Buffer.concat([Buffer.alloc(levels, 0x91), Buffer.from([0x90])]);
      return Buffer.concat([Buffer.from([0x93]), ...fields]);
    };
    assert.throws(() => decodeEventBatch(deepField(0)), /batch ts must be a number/);
    assert.throws(() => decodeEventBatch(deepField(2)), /data_parallel_rank must be an integer/);
  });

  test('an event of more msgpack objects than its bound is skipped (too_large) without being decoded', () => {
    // three arrays of 1.5M nils each: every array within the decoder's length bound, the
    // event past KV_EVENT_LIMITS.maxElementsPerEvent
    const third = 1_400_000;
    assert.ok(3 * third > KV_EVENT_LIMITS.maxElementsPerEvent && third < KV_EVENT_LIMITS.maxTokensPerEvent);
    const nils = () => {
      const h = Buffer.alloc(5);
      h[0] = 0xdd;
      h.writeUInt32BE(third, 1);
      return Buffer.concat([h, Buffer.alloc(third, 0xc0)]);
    };
    const big = Buffer.concat([Buffer.from([0x94]), encode('BlockStored'), nils(), nils(), nils()]);
    const b = decodeEventBatch(
      Buffer.concat([Buffer.from([0x92]), encode(1.5), Buffer.from([0x92]), big, encode(['BlockRemoved', [7], 'GPU'])]),
    );
    assert.deepEqual(
      b.events.map((e) => e.type),
      ['BlockRemoved'],
    );
    assert.deepEqual(
      b.skipped?.map(({ index, reason }) => ({ index, reason })),
      [{ index: 0, reason: 'too_large' }],
    );
    assert.match(b.skipped![0].message, /more than \d+ msgpack objects/);
  });

  test('an event whose type is a uint64, a long string or a large array is skipped alone, shown bounded', () => {
    const removal = ['BlockRemoved', [7], 'GPU'];
    const longType = 'x'.repeat(1 << 20);
    const types: unknown[] = [2n ** 64n - 1n, longType, new Array(2_000_000).fill(1), { type: 2n ** 63n }];
    for (const type of types) {
      for (const event of [[type], { type }]) {
        const b = decodeEventBatch(encode([1.5, [removal, event, removal]], { useBigInt64: true }));
        assert.deepEqual(
          b.events.map((e) => e.type),
          ['BlockRemoved', 'BlockRemoved'],
        );
        assert.deepEqual(
          b.skipped?.map(({ index, reason }) => ({ index, reason })),
          [{ index: 1, reason: 'unknown_type' }],
        );
        assert.ok(b.skipped![0].message.length < 300, b.skipped![0].message.slice(0, 300));
      }
    }
    const shown = (type: unknown) =>
      decodeEventBatch(encode([1.5, [[type]]], { useBigInt64: true })).skipped![0].message;
    assert.match(shown(2n ** 64n - 1n), /unknown event type 18446744073709551615$/);
    assert.match(shown(longType), /unknown event type "x{80}… \(1048576 characters\)"$/);
    assert.match(shown('Block\nInactive'), /unknown event type "Block\\x0aInactive"$/);
  });

  test("vLLM's typed extra keys read as the bare keys of earlier releases; a tag it does not know stays a map", () => {
    const typed = new Uint8Array(readFileSync(new URL('typed-extra-keys-mm-salt.bin', dir)));
    const legacy = new Uint8Array(readFileSync(new URL('extra-keys-mm-salt.bin', dir)));
    const raw = decode(typed, { useBigInt64: true }) as [number, Array<Record<string, unknown>>];
    assert.equal(raw[1][0].event_version, 1);
    assert.deepEqual(raw[1][0].extra_keys, [
      [{ type: 'cache_salt', salt: 'salt-a' }],
      [{ type: 'mm', modality: 'image', hash: 'img-sha', block_offset: 3 }],
    ]);
    assert.deepEqual(normalise(decodeEventBatch(typed)), normalise(decodeEventBatch(legacy)));
    const all = decodeEventBatch(new Uint8Array(readFileSync(new URL('typed-extra-keys-all.bin', dir))));
    assert.ok(all.events[0].type === 'BlockStored');
    assert.deepEqual(all.events[0].extraKeys, [
      ['sql-adapter', ['img-a', 5], 'tenant-a', { bytes: '010203' }],
      ['sql-adapter', ['future', 'key']],
    ]);
    const future = { type: 'audio_span', start: 2n ** 63n };
    const b = decodeEventBatch(encode([1.5, [[...ONE_BLOCK_STORED_ARRAY, [[future]]]]], { useBigInt64: true }));
    assert.equal(b.skipped, undefined);
    assert.ok(b.events[0].type === 'BlockStored');
    assert.deepEqual(b.events[0].extraKeys, [[{ type: 'audio_span', start: '9223372036854775808' }]]);
  });

  test('ignores fields a newer release appends to the array form', () => {
    const b = decodeEventBatch(encode([1.5, [['BlockRemoved', [7], 'GPU', 0, 'new-field', 42]], 0, 'batch-extra']));
    assert.equal(b.events.length, 1);
    assert.equal(b.skipped, undefined);
  });
});

describe('KV event batch size limits', () => {
  const small = ['BlockStored', [1], null, [1, 2, 3, 4], 4] as const;

  test('a store of more than a million token ids (a long prompt in one event) decodes with its batch', () => {
    const blocks = 62_501; // 1,000,016 token ids of block size 16
    const big = [
      'BlockStored',
      Array.from({ length: blocks }, (_, i) => i + 1),
      null,
      new Array(blocks * 16).fill(3),
      16,
    ];
    const b = decodeEventBatch(encode([1.5, [small, big]]));
    assert.equal(b.skipped, undefined, JSON.stringify(b.skipped));
    assert.deepEqual(
      b.events.map((e) => (e.type === 'BlockStored' ? e.tokenIds.length : -1)),
      [4, blocks * 16],
    );
  });

  test('an event over a per-event limit is skipped alone (too_large); the rest of its batch decodes', () => {
    const tokensOver = KV_EVENT_LIMITS.maxTokensPerEvent + 1;
    const hashesOver = KV_EVENT_LIMITS.maxBlocksPerEvent + 1;
    const b = decodeEventBatch(
      encode([
        1.5,
        [
          small,
          ['BlockStored', [1], null, new Array(tokensOver).fill(3), tokensOver],
          ['BlockRemoved', new Array(hashesOver).fill(9), 'GPU'],
          ['BlockRemoved', [7], 'GPU'],
        ],
      ]),
    );
    assert.deepEqual(
      b.events.map((e) => e.type),
      ['BlockStored', 'BlockRemoved'],
    );
    assert.deepEqual(
      b.skipped?.map(({ index, reason }) => ({ index, reason })),
      [
        { index: 1, reason: 'too_large' },
        { index: 2, reason: 'too_large' },
      ],
    );
    assert.match(b.skipped![0].message, /token_ids has \d+ ids, over the limit/);
    assert.match(b.skipped![1].message, /block_hashes has \d+ hashes, over the limit/);
  });

  test('a batch with more events than the limit is refused from its header, before any event is read', () => {
    // {ts: 1, events: array32 of maxEvents + 1} and not one event after it: refused for the
    // count the header claims, not for the bytes missing (which decoding would have reached)
    const header = Buffer.alloc(5);
    header[0] = 0xdd;
    header.writeUInt32BE(KV_EVENT_LIMITS.maxEvents + 1, 1);
    const payload = Buffer.concat([Buffer.from([0x82]), encode('ts'), encode(1), encode('events'), header]);
    assert.throws(
      () => decodeEventBatch(payload),
      (err: unknown) =>
        err instanceof KvEventFormatError &&
        err.reason === 'too_large' &&
        /batch has \d+ events, over the limit of \d+/.test(err.message),
    );
    // at the limit, the count is taken and the payload is read: here it is cut short
    header.writeUInt32BE(KV_EVENT_LIMITS.maxEvents, 1);
    assert.throws(
      () => decodeEventBatch(Buffer.concat([Buffer.from([0x82]), encode('ts'), encode(1), encode('events'), header])),
      (err: unknown) => err instanceof KvEventFormatError && err.reason === 'bad_field',
    );
  });

  test('limits leave room for the largest batches engines publish', () => {
    // vLLM: one batch per scheduler step, at most max_num_batched_tokens / block_size stored
    // blocks plus as many evictions; SGLang at page size 1: one event per token and page
    const sglangPage1 = 2 * 131_072;
    assert.ok(KV_EVENT_LIMITS.maxEvents >= 2 * sglangPage1, 'events per batch');
    assert.ok(KV_EVENT_LIMITS.maxPayloadBytes >= 2 * 9_400_000, 'bytes per batch');
    assert.ok(KV_EVENT_LIMITS.maxTokensPerEvent >= 1_048_576, 'token ids per event');
  });
});
