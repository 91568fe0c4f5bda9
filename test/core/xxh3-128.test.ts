import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { xxh3_128 } from '../../src/core/xxh3-128.js';

// xxhash.xxh3_128_digest (Python's xxhash) of lcgBytes(length) for lengths in every path of
// XXH3-128: 0, 1-3, 4-8, 9-16, 17-128, 129-240, and over 240 (one stripe, several stripes,
// several 1 KiB blocks); written by scripts/gen-kv-event-fixtures.py.
const { cases } = JSON.parse(readFileSync(new URL('../fixtures/kv-events/xxh3-128.json', import.meta.url), 'utf8')) as {
  cases: [number, string][];
};

/** The generator's lcg_bytes: n bytes from an LCG seeded with n. */
function lcgBytes(n: number): Buffer {
  let x = n;
  const out = Buffer.alloc(n);
  for (let i = 0; i < n; i++) {
    x = Number((BigInt(x) * 1103515245n + 12345n) & 0x7fffffffn);
    out[i] = (x >>> 16) & 0xff;
  }
  return out;
}

test('XXH3-128 equals Python xxhash.xxh3_128_digest for every length class', () => {
  const lengths = new Set(cases.map(([n]) => n));
  for (let n = 0; n <= 256; n++) assert.ok(lengths.has(n), `length ${n} covered`);
  assert.ok(cases.some(([n]) => n > 4096));
  for (const [n, digest] of cases)
    assert.equal(Buffer.from(xxh3_128(lcgBytes(n))).toString('hex'), digest, `length ${n}`);
});

test('xxh3_128 writes into a given buffer and reads a subarray at its offset', () => {
  const data = lcgBytes(300);
  const whole = Buffer.from(xxh3_128(data.subarray(7, 207))).toString('hex');
  const out = new Uint8Array(20);
  assert.equal(xxh3_128(Buffer.from(data.subarray(7, 207)), out), out);
  assert.equal(Buffer.from(out.subarray(0, 16)).toString('hex'), whole);
  assert.throws(() => xxh3_128('text' as unknown as Uint8Array), /data must be a Uint8Array/);
  assert.throws(() => xxh3_128(data, new Uint8Array(8)), /out must be a Uint8Array of 16 bytes/);
});
