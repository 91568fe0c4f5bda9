import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import fc from 'fast-check';
import {
  BlockHashes,
  canonicalChatText,
  hashPrecomputedBlocks,
  hashTextBlocks,
  hashTokenBlocks,
  TokenBlockKeys,
  type HashNamespace,
} from '../../src/core/hashing.js';

function hexes(tokens: number[], blockSize = 4, ns?: HashNamespace): string[] {
  const out = hashTokenBlocks(tokens, blockSize, ns, new BlockHashes(4));
  return Array.from({ length: out.length }, (_, i) => out.toHex(i));
}

describe('block hashing', () => {
  test('is deterministic and covers only full blocks', () => {
    const t = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    assert.deepEqual(hexes(t), hexes(t));
    assert.equal(hexes(t).length, 2);
    assert.equal(hexes(t.slice(0, 3)).length, 0);
    assert.deepEqual(hexes(t), hexes(t.slice(0, 8)));
  });

  test('equal prefixes give equal hashes; after a difference every hash differs', () => {
    fc.assert(
      fc.property(fc.array(fc.nat(200_000), { minLength: 16, maxLength: 64 }), fc.nat(63), (tokens, at) => {
        fc.pre(at < tokens.length);
        const changed = [...tokens];
        changed[at] = (changed[at] + 1) % 200_001;
        const a = hexes(tokens, 4);
        const b = hexes(changed, 4);
        const firstDiff = Math.floor(at / 4);
        for (let i = 0; i < a.length; i++) {
          if (i < firstDiff) assert.equal(a[i], b[i]);
          else assert.notEqual(a[i], b[i]);
        }
      }),
    );
  });

  test('a block hash depends on its whole prefix, not only its own tokens', () => {
    const x = hexes([1, 1, 1, 1, 9, 9, 9, 9]);
    const y = hexes([2, 2, 2, 2, 9, 9, 9, 9]);
    assert.notEqual(x[1], y[1]);
  });

  test('LoRA name, cache salt and CLA group never share a block', () => {
    const t = Array.from({ length: 32 }, (_, i) => i);
    const variants: Array<HashNamespace | undefined> = [
      undefined,
      { lora: 'sql-adapter' },
      { lora: 'chat-adapter' },
      { cacheSalt: 'tenant-a' },
      { cacheSalt: 'tenant-b' },
      { lora: 'sql-adapter', cacheSalt: 'tenant-a' },
      { claGroup: 0 },
      { claGroup: 1 },
    ];
    const all = variants.map((ns) => hexes(t, 16, ns));
    const seen = new Set<string>();
    for (const hs of all) for (const h of hs) seen.add(h);
    assert.equal(seen.size, variants.length * 2);
    assert.deepEqual(hexes(t, 16, {}), hexes(t, 16, undefined)); // empty namespace is the default
    assert.deepEqual(hexes(t, 16, { lora: null, cacheSalt: null }), hexes(t, 16));
  });

  test('rejects token ids that are not uint32, naming the position', () => {
    assert.throws(() => hexes([1, 2, -3, 4]), /tokens\[2\] must be an integer/);
    assert.throws(() => hexes([1, 2.5, 3, 4]), RangeError);
    assert.throws(() => hexes([1, 2, 3, 2 ** 32]), RangeError);
  });

  test('typed-array input hashes like a plain array', () => {
    const t = Array.from({ length: 40 }, (_, i) => i * 7919);
    const a = hashTokenBlocks(t, 8, undefined, new BlockHashes());
    const b = hashTokenBlocks(Uint32Array.from(t), 8, undefined, new BlockHashes());
    assert.deepEqual([...a.hi.subarray(0, a.length)], [...b.hi.subarray(0, b.length)]);
    assert.deepEqual([...a.lo.subarray(0, a.length)], [...b.lo.subarray(0, b.length)]);
  });

  test('has no collisions over a million distinct blocks (64-bit)', () => {
    const out = new BlockHashes(1 << 20);
    const tokens = new Uint32Array((1 << 20) * 2);
    for (let i = 0; i < tokens.length; i++) tokens[i] = (i * 2654435761) >>> 0;
    hashTokenBlocks(tokens, 2, undefined, out);
    const seen = new Set<bigint>();
    for (let i = 0; i < out.length; i++) seen.add(out.toBigInt(i));
    assert.equal(seen.size, out.length);
  });
});

describe('precomputed block hashes', () => {
  test('numbers and bigints; same id → same hash; namespaces separate', () => {
    const out = new BlockHashes();
    hashPrecomputedBlocks([0, 1, 2 ** 40], 512, undefined, out);
    const a = [out.toHex(0), out.toHex(1), out.toHex(2)];
    hashPrecomputedBlocks([0n, 1n, 2n ** 40n], 512, undefined, out);
    assert.deepEqual([out.toHex(0), out.toHex(1), out.toHex(2)], a);
    assert.equal(out.tokensPerBlock, 512);
    hashPrecomputedBlocks([0], 512, { cacheSalt: 'x' }, out);
    assert.notEqual(out.toHex(0), a[0]);
    hashPrecomputedBlocks([0xffff_ffff_ffff_ffffn], 512, undefined, out);
    assert.equal(out.length, 1);
  });

  test('rejects ids that are not safe non-negative integers', () => {
    assert.throws(() => hashPrecomputedBlocks([1, -1], 16, undefined, new BlockHashes()), /blockHashes\[1\]/);
    assert.throws(() => hashPrecomputedBlocks([2 ** 60], 16, undefined, new BlockHashes()), RangeError);
    assert.throws(() => hashPrecomputedBlocks(['7' as never], 16, undefined, new BlockHashes()), TypeError);
  });
});

describe('text mode', () => {
  test('chunks UTF-8 bytes; shared text prefixes share chunks', () => {
    const out = new BlockHashes();
    const base = 'You are a careful assistant. '.repeat(10);
    hashTextBlocks(base + 'Question one?', 32, undefined, out);
    const a = Array.from({ length: out.length }, (_, i) => out.toHex(i));
    hashTextBlocks(base + 'Another question entirely', 32, undefined, out);
    const b = Array.from({ length: out.length }, (_, i) => out.toHex(i));
    const shared = Math.floor(Buffer.byteLength(base) / 32);
    assert.deepEqual(a.slice(0, shared), b.slice(0, shared));
    assert.ok(a.length >= shared);
  });

  test('multi-byte characters are hashed by their bytes', () => {
    const out = new BlockHashes();
    hashTextBlocks('日本語のテキスト'.repeat(8), 16, undefined, out);
    assert.equal(out.length, Math.floor(Buffer.byteLength('日本語のテキスト'.repeat(8)) / 16));
  });

  test('the canonical chat text includes every message with its role', () => {
    const sys = { role: 'system', content: 'You are helpful.' };
    const a = canonicalChatText([sys, { role: 'user', content: 'Hi' }]);
    const b = canonicalChatText([sys, { role: 'user', content: 'Bye' }]);
    const c = canonicalChatText([sys, { role: 'assistant', content: 'Hi' }]);
    assert.notEqual(a, b); // a peer hashing only the first message would call these equal
    assert.notEqual(a, c);
    assert.ok(a.startsWith(canonicalChatText([sys])));
    const parts = canonicalChatText([
      {
        role: 'user',
        content: [
          { type: 'text', text: 'look' },
          { type: 'image_url', image_url: { url: 'http://x/img.png' } },
        ],
      },
    ]);
    assert.match(parts, /look\[image_url:http:\/\/x\/img.png\]/);
  });

  test('content parts vLLM reads alike have the same canonical text', () => {
    const text = (...content: unknown[]) => canonicalChatText([{ role: 'user', content: content as never }]);
    // a plain string and each text-like part are text, as vLLM renders them
    const hi = text({ type: 'text', text: 'hi' });
    for (const part of [
      'hi',
      { type: 'input_text', text: 'hi' },
      { type: 'output_text', text: 'hi' },
      { type: 'refusal', refusal: 'hi' },
      { type: 'thinking', thinking: 'hi' },
    ])
      assert.equal(text(part), hi, JSON.stringify(part));
    // a text part with no text is skipped
    assert.equal(text({ type: 'text', text: null }, 'hi'), hi);
    assert.equal(text({ type: 'refusal' }, 'hi'), hi);
    // a part without a type is the part its media field names
    const image = text({ type: 'image_url', image_url: { url: 'http://x/a.png' } });
    assert.equal(text({ image_url: 'http://x/a.png' }), image);
    assert.equal(text({ type: null, image_url: { url: 'http://x/a.png' } }), image);
    assert.equal(
      text({ type: 'video_url', video_url: 'http://x/v.mp4' }),
      text({ video_url: { url: 'http://x/v.mp4' } }),
    );
    assert.notEqual(text({ audio_url: 'http://x/a.png' }), image);
    // media named by a uuid is that media, whatever else the part says
    const cached = text({ type: 'image_url', image_url: null, uuid: 'img-1' });
    assert.equal(text({ image_url: { url: 'http://x/a.png' }, uuid: 'img-1' }), cached);
    assert.notEqual(text({ type: 'image_url', image_url: null, uuid: 'img-2' }), cached);
    assert.notEqual(cached, image);
    assert.notEqual(text({ audio_url: null, uuid: 'img-1' }), cached);
    // a null uuid is no uuid
    assert.equal(text({ type: 'image_url', image_url: 'http://x/a.png', uuid: null }), image);
    // media with different data differ; the same data in a different key order does not
    assert.notEqual(
      text({ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }),
      text({ type: 'input_audio', input_audio: { data: 'BBBB', format: 'wav' } }),
    );
    assert.equal(
      text({ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }),
      text({ input_audio: { format: 'wav', data: 'AAAA' } }),
    );
    assert.notEqual(text({ type: 'tool_reference', name: 'f' }), text({ type: 'tool_reference', name: 'g' }));
  });

  test('inline data nested deeper than the call stack goes has its digest, the same as before', () => {
    const text = (value: unknown) =>
      canonicalChatText([{ role: 'user', content: [{ type: 'image_embeds', image_embeds: value }] as never }]);
    // digests as they were written before the walk kept a stack of its own: the media's cached
    // blocks keep their keys across router versions and replicas
    const before: [unknown, string][] = [
      ['abc', '3:29af3dafd13a1598'],
      [[1, 2, [3, 'x'], null, true], '14:e4a657e69792b33c'],
      [{ b: [1, { d: 'e', c: 2 }], a: 'z' }, '9:366f173c63afb200'],
      [{ data: 'QUJD', format: 'wav' }, '17:a43307fcd734513a'],
      [[[[]], {}, '', 0, -1.5], '8:606875375423dbe0'],
    ];
    for (const [value, digest] of before) assert.equal(text(value), `<|user|>\n[image_embeds:${digest}]\n`);
    const nest = (depth: number) => {
      let v: unknown = 'x';
      for (let i = 0; i < depth; i++) v = i % 2 ? [v] : { k: v };
      return v;
    };
    assert.equal(text(nest(5000)), '<|user|>\n[image_embeds:5001:6c25f82489fbdb8a]\n');
    // 200,000 levels: a recursive walk overflowed the stack here
    assert.match(text(nest(200_000)), /^<\|user\|>\n\[image_embeds:\d+:[0-9a-f]+\]\n$/);
  });

  test('inline data holding one object twice is refused, naming its field, before any walk explodes', () => {
    const chat = (content: unknown[]) => [
      { role: 'system', content: 'be brief' },
      { role: 'user', content: content as never },
    ];
    const cyclic: Record<string, unknown> = { data: 'AAAA', format: 'wav' };
    cyclic.self = cyclic;
    assert.throws(
      () => canonicalChatText(chat(['look', { type: 'input_audio', input_audio: cyclic }])),
      (e: unknown) =>
        e instanceof TypeError && /^messages\[1\]\.content\[1\]\.input_audio holds one object twice/.test(e.message),
    );
    // forty objects, each holding the next one twice: 2^40 leaves for a walk that does not remember
    let shared: unknown = [0.5];
    for (let i = 0; i < 40; i++) shared = { a: shared, b: shared };
    assert.throws(
      () => canonicalChatText(chat([{ type: 'image_embeds', image_embeds: shared }])),
      (e: unknown) =>
        e instanceof TypeError && e.message.startsWith('messages[1].content[0].image_embeds holds one object twice'),
    );
    assert.throws(
      () => canonicalChatText(chat([{ type: 'prompt_embeds', data: shared }])),
      (e: unknown) =>
        e instanceof TypeError && e.message.startsWith('messages[1].content[0].data holds one object twice'),
    );
    // equal values that are distinct objects are a tree, as JSON.parse makes them
    const twice = { a: [0.5], b: [0.5] };
    assert.match(
      canonicalChatText(chat([{ type: 'image_embeds', image_embeds: twice }])),
      /\[image_embeds:\d+:[0-9a-f]+\]/,
    );
  });

  test('inline media in a data: URL is written by a short digest of it, not its bytes', () => {
    const text = (...content: unknown[]) => canonicalChatText([{ role: 'user', content: content as never }]);
    const png = 'data:image/png;base64,' + 'iVBO'.repeat(1_075_000); // a 3 MB PNG, 4.3 MB of base64
    const other = png.slice(0, -4) + 'iVBP';
    for (const type of ['image_url', 'audio_url', 'video_url']) {
      const a = text({ type, [type]: { url: png } });
      assert.ok(a.length < 100, `${type}: ${a.length} characters`);
      assert.match(a, new RegExp(`^<\\|user\\|>\n\\[${type}:data:\\d+:[0-9a-f]+\\]\n$`));
      // the same data is the same text, whichever way the part says it; other data is not
      assert.equal(text({ [type]: png }), a);
      assert.equal(text({ type, [type]: png }), a);
      assert.notEqual(text({ type, [type]: { url: other } }), a);
      // a URL scheme is read without regard to case, as the engine reads it
      assert.ok(text({ type, [type]: 'DATA:' + png.slice(5) }).length < 100);
      assert.notEqual(text({ type, [type]: 'data:,a' }), text({ type, [type]: 'data:,b' }));
    }
    // the Responses API's image part, its image_url a string
    const input = text({ type: 'input_image', image_url: png });
    assert.ok(input.length < 100);
    assert.notEqual(text({ type: 'input_image', image_url: other }), input);
    // media types stay apart, and a URL the engine fetches is still written as it is
    assert.notEqual(text({ image_url: png }), text({ video_url: png }));
    assert.equal(text({ image_url: 'http://x/a.png' }), '<|user|>\n[image_url:http://x/a.png]\n');
    // a data: URL is never written as a URL that merely looks like its digest
    const short = text({ image_url: 'data:,x' });
    assert.notEqual(text({ image_url: short.slice('<|user|>\n[image_url:'.length, -2) }), short);
  });

  test('rejects a chunk size that is not a positive multiple of 4', () => {
    assert.throws(() => hashTextBlocks('abc', 6, undefined, new BlockHashes()), /chunkBytes/);
  });
});

describe('TokenBlockKeys (keys computed on demand)', () => {
  const hexOf = (hi: ArrayLike<number>, lo: ArrayLike<number>, n: number) =>
    Array.from({ length: n }, (_, i) => (hi[i] >>> 0).toString(16) + ':' + (lo[i] >>> 0).toString(16));

  test('keys computed in stretches equal those of one hashTokenBlocks call', () => {
    fc.assert(
      fc.property(
        fc.array(fc.nat(200_000), { minLength: 0, maxLength: 300 }),
        fc.array(fc.nat(40), { maxLength: 6 }),
        fc.boolean(),
        (tokens, stops, typed) => {
          const ns: HashNamespace = { lora: 'a', cacheSalt: 's', claGroup: 2 };
          const whole = hashTokenBlocks(tokens, 4, ns, new BlockHashes(4));
          const keys = new TokenBlockKeys();
          keys.reset(typed ? Uint32Array.from(tokens) : tokens, 4, ns);
          assert.equal(keys.total, whole.length);
          let computed = 0;
          for (const s of stops) {
            computed = Math.max(computed, Math.min(s, keys.total));
            assert.equal(keys.ensure(s), computed);
          }
          const part = keys.computed;
          assert.deepEqual(hexOf(part.hi, part.lo, part.length), hexOf(whole.hi, whole.lo, part.length));
          // reading the keys as a sequence computes all of them
          assert.equal(keys.length, whole.length);
          assert.deepEqual(hexOf(keys.hi, keys.lo, keys.length), hexOf(whole.hi, whole.lo, whole.length));
          assert.equal(part.length, whole.length);
        },
      ),
    );
  });

  test('a walk asking for more gets at least what it needs', () => {
    const keys = new TokenBlockKeys();
    keys.reset(new Uint32Array(16 * 100), 16, undefined);
    assert.ok(keys.extend(1) >= 1);
    const had = keys.computed.length;
    assert.ok(keys.extend(had + 1) > had);
    assert.equal(keys.extend(1000), 100, 'capped at the prompt');
  });

  test('every token id is checked up front, also those no key is computed for yet', () => {
    const keys = new TokenBlockKeys();
    const tokens = [...Array(64).fill(1), 2 ** 32];
    assert.throws(() => keys.reset(tokens, 16, undefined), /tokens\[64\] must be an integer in \[0, 2\^32\)/);
    assert.throws(() => keys.reset([1, 2, 1.5], 16, undefined), /tokens\[2\]/);
  });
});
