/**
 * XXH3-128 with seed 0 and the default secret, as Python's `xxhash.xxh3_128_digest(data)`
 * computes it: the hash vLLM's `--prefix-caching-hash-algo xxhash` and `xxhash_cbor` key
 * their prefix cache by (vllm/utils/hashing.py _xxhash_digest). Written from the reference
 * implementation (Cyan4973/xxHash xxhash.h: XXH3_128bits_internal and the len_0to16,
 * len_17to128, len_129to240 and hashLong paths it dispatches to, scalar variants), with the
 * seed terms dropped since vLLM never passes one.
 *
 * 64-bit words are kept as two uint32 halves in plain numbers and results are returned
 * through module registers: no BigInt and no allocation per hash. On the 100-150 bytes a
 * 16-token block serialises to it takes less time than one node:crypto SHA-256 call; past a
 * few hundred bytes native SHA-256 is faster (`npm run bench:hash` measures the block hash).
 * Checked against Python's xxhash on inputs of every length class (test/core/xxh3-128.test.ts).
 */

// Results of the 64-bit arithmetic below: (rh, rl) a 64-bit value; (qh, ql) a 128-bit product's high half.
let rh = 0;
let rl = 0;
let qh = 0;
let ql = 0;

const TWO32 = 0x1_0000_0000;

// XXH_PRIME64_1..4, XXH_PRIME32_1..3, PRIME_MX1/2 as (high, low) halves
const P64_1H = 0x9e3779b1;
const P64_1L = 0x85ebca87;
const P64_2H = 0xc2b2ae3d;
const P64_2L = 0x27d4eb4f;
const P64_3H = 0x165667b1;
const P64_3L = 0x9e3779f9;
const P64_4H = 0x85ebca77;
const P64_4L = 0xc2b2ae63;
const P64_5H = 0x27d4eb2f;
const P64_5L = 0x165667c5;
const P32_1 = 0x9e3779b1;
const P32_2 = 0x85ebca77;
const P32_3 = 0xc2b2ae3d;
const MX1H = 0x16566791;
const MX1L = 0x9e3779f9;
const MX2H = 0x9fb21c65;
const MX2L = 0x1e98df25;

/** XXH3_kSecret, the default 192-byte secret. */
const SECRET = Uint8Array.from([
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d,
  0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0,
  0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0,
  0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b,
  0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac,
  0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51,
  0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34,
  0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49,
  0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8,
  0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b,
  0x40, 0x7e,
]);
const SECRET_SIZE = 192;
const SECRET_SIZE_MIN = 136;
const MIDSIZE_STARTOFFSET = 3;
const MIDSIZE_LASTOFFSET = 17;
const STRIPE_LEN = 64;
const SECRET_CONSUME_RATE = 8;
const SECRET_LASTACC_START = 7;
const SECRET_MERGEACCS_START = 11;

function r32(b: Uint8Array, o: number): number {
  return (b[o] | (b[o + 1] << 8) | (b[o + 2] << 16) | (b[o + 3] << 24)) >>> 0;
}

/** The secret's little-endian uint32 at every byte offset: its reads are at unaligned offsets. */
const S32 = new Uint32Array(SECRET_SIZE - 3);
for (let o = 0; o < S32.length; o++) S32[o] = r32(SECRET, o);

/** (rh, rl) = a * b, the full 64-bit product of two uint32. */
function mul32(a: number, b: number): void {
  const a0 = a & 0xffff;
  const a1 = a >>> 16;
  const b0 = b & 0xffff;
  const b1 = b >>> 16;
  // 16-bit limbs: every partial sum stays under 2^32, so no step leaves integer arithmetic
  const t = ((a0 * b0) >>> 16) + a1 * b0;
  const w = (t & 0xffff) + a0 * b1;
  rl = Math.imul(a, b) >>> 0;
  rh = (a1 * b1 + (t >>> 16) + (w >>> 16)) >>> 0;
}

/** (rh, rl) = a * b mod 2^64. */
function mul64(ah: number, al: number, bh: number, bl: number): void {
  mul32(al, bl);
  rh = (rh + Math.imul(ah, bl) + Math.imul(al, bh)) >>> 0;
}

/** (qh, ql, rh, rl) = a * b, the full 128-bit product (XXH_mult64to128's portable form). */
function mul128(ah: number, al: number, bh: number, bl: number): void {
  mul32(al, bl);
  const llh = rh;
  const lll = rl;
  mul32(ah, bl);
  const hlh = rh;
  const hll = rl;
  mul32(al, bh);
  const lhh = rh;
  const lhl = rl;
  mul32(ah, bh);
  // cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFF) + lo_hi, which never overflows 64 bits
  const cl = llh + hll + lhl;
  const ch = lhh + Math.floor(cl / TWO32);
  // upper = (hi_lo >> 32) + (cross >> 32) + hi_hi
  const ul = hlh + ch + rl;
  qh = (rh + Math.floor(ul / TWO32)) >>> 0;
  ql = ul >>> 0;
  rh = cl >>> 0;
  rl = lll;
}

/** (rh, rl) = low 64 bits of a * b xor its high 64 bits (XXH3_mul128_fold64). */
function mulFold(ah: number, al: number, bh: number, bl: number): void {
  mul128(ah, al, bh, bl);
  rh = (rh ^ qh) >>> 0;
  rl = (rl ^ ql) >>> 0;
}

/** (rh, rl) = a + b mod 2^64. */
function add64(ah: number, al: number, bh: number, bl: number): void {
  const l = al + bl;
  rh = (ah + bh + (l >= TWO32 ? 1 : 0)) >>> 0;
  rl = l >>> 0;
}

/** XXH3_avalanche: h ^= h >> 37; h *= PRIME_MX1; h ^= h >> 32. */
function avalanche(h: number, l: number): void {
  l = (l ^ (h >>> 5)) >>> 0;
  mul64(h, l, MX1H, MX1L);
  rl = (rl ^ rh) >>> 0;
}

/** XXH64_avalanche. */
function avalanche64(h: number, l: number): void {
  l = (l ^ (h >>> 1)) >>> 0; // h >> 33
  mul64(h, l, P64_2H, P64_2L);
  l = (rl ^ ((rl >>> 29) | (rh << 3))) >>> 0; // h ^= h >> 29
  h = (rh ^ (rh >>> 29)) >>> 0;
  mul64(h, l, P64_3H, P64_3L);
  rl = (rl ^ rh) >>> 0;
}

/** (rh, rl) = XXH3_mix16B(input + i, secret + s) with seed 0. */
function mix16B(b: Uint8Array, i: number, s: number): void {
  mulFold(
    (r32(b, i + 4) ^ S32[s + 4]) >>> 0,
    (r32(b, i) ^ S32[s]) >>> 0,
    (r32(b, i + 12) ^ S32[s + 12]) >>> 0,
    (r32(b, i + 8) ^ S32[s + 8]) >>> 0,
  );
}

// the 128-bit accumulator of the 17-240 byte paths
let accHh = 0;
let accHl = 0;
let accLh = 0;
let accLl = 0;

/** XXH128_mix32B with seed 0. */
function mix32B(b: Uint8Array, i1: number, i2: number, s: number): void {
  mix16B(b, i1, s);
  add64(accLh, accLl, rh, rl);
  let h = rh;
  let l = rl;
  add64(r32(b, i2 + 4), r32(b, i2), r32(b, i2 + 12), r32(b, i2 + 8));
  accLh = (h ^ rh) >>> 0;
  accLl = (l ^ rl) >>> 0;
  mix16B(b, i2, s + 16);
  add64(accHh, accHl, rh, rl);
  h = rh;
  l = rl;
  add64(r32(b, i1 + 4), r32(b, i1), r32(b, i1 + 12), r32(b, i1 + 8));
  accHh = (h ^ rh) >>> 0;
  accHl = (l ^ rl) >>> 0;
}

function writeBE(out: Uint8Array, o: number, h: number, l: number): void {
  out[o] = h >>> 24;
  out[o + 1] = h >>> 16;
  out[o + 2] = h >>> 8;
  out[o + 3] = h;
  out[o + 4] = l >>> 24;
  out[o + 5] = l >>> 16;
  out[o + 6] = l >>> 8;
  out[o + 7] = l;
}

/** The 17-240 byte paths' last step, into `out` as the canonical digest. */
function finishMid(len: number, out: Uint8Array): void {
  add64(accLh, accLl, accHh, accHl);
  avalanche(rh, rl);
  const lowH = rh;
  const lowL = rl;
  mul64(accLh, accLl, P64_1H, P64_1L);
  let h = rh;
  let l = rl;
  mul64(accHh, accHl, P64_4H, P64_4L);
  add64(h, l, rh, rl);
  h = rh;
  l = rl;
  mul64(0, len, P64_2H, P64_2L);
  add64(h, l, rh, rl);
  avalanche(rh, rl);
  // high64 = 0 - avalanche(...)
  const nl = (~rl + 1) >>> 0;
  const nh = (~rh + (nl === 0 ? 1 : 0)) >>> 0;
  writeBE(out, 0, nh, nl);
  writeBE(out, 8, lowH, lowL);
}

function len0to16(b: Uint8Array, len: number, out: Uint8Array): void {
  if (len > 8) {
    // XXH3_len_9to16_128b
    const flipLh = (S32[36] ^ S32[44]) >>> 0;
    const flipLl = (S32[32] ^ S32[40]) >>> 0;
    const flipHh = (S32[52] ^ S32[60]) >>> 0;
    const flipHl = (S32[48] ^ S32[56]) >>> 0;
    let inHh = r32(b, len - 4);
    let inHl = r32(b, len - 8);
    mul128((r32(b, 4) ^ inHh ^ flipLh) >>> 0, (r32(b, 0) ^ inHl ^ flipLl) >>> 0, P64_1H, P64_1L);
    let mHh = qh;
    let mHl = ql;
    // m128.low64 += (len - 1) << 54
    let mLh = (rh + ((len - 1) << 22)) >>> 0;
    let mLl = rl;
    inHh = (inHh ^ flipHh) >>> 0;
    inHl = (inHl ^ flipHl) >>> 0;
    // m128.high64 += input_hi + mult32to64(input_hi.lo, PRIME32_2 - 1)
    add64(mHh, mHl, inHh, inHl);
    const h = rh;
    const l = rl;
    mul32(inHl, P32_2 - 1);
    add64(h, l, rh, rl);
    mHh = rh;
    mHl = rl;
    // m128.low64 ^= swap64(m128.high64)
    const sw = (x: number) => ((x >>> 24) | ((x >>> 8) & 0xff00) | ((x << 8) & 0xff0000) | (x << 24)) >>> 0;
    mLh = (mLh ^ sw(mHl)) >>> 0;
    mLl = (mLl ^ sw(mHh)) >>> 0;
    // h128 = m128 * PRIME64_2 (128 x 64)
    mul128(mLh, mLl, P64_2H, P64_2L);
    const lowH = rh;
    const lowL = rl;
    const hiH = qh;
    const hiL = ql;
    mul64(mHh, mHl, P64_2H, P64_2L);
    add64(hiH, hiL, rh, rl);
    avalanche(rh, rl);
    writeBE(out, 0, rh, rl);
    avalanche(lowH, lowL);
    writeBE(out, 8, rh, rl);
    return;
  }
  if (len >= 4) {
    // XXH3_len_4to8_128b
    const kh = (r32(b, len - 4) ^ S32[20] ^ S32[28]) >>> 0;
    const kl = (r32(b, 0) ^ S32[16] ^ S32[24]) >>> 0;
    add64(P64_1H, P64_1L, 0, len << 2);
    mul128(kh, kl, rh, rl);
    let hiH = qh;
    let hiL = ql;
    let loH = rh;
    let loL = rl;
    // high64 += low64 << 1
    add64(hiH, hiL, ((loH << 1) | (loL >>> 31)) >>> 0, (loL << 1) >>> 0);
    hiH = rh;
    hiL = rl;
    // low64 ^= high64 >> 3
    loL = (loL ^ ((hiL >>> 3) | (hiH << 29))) >>> 0;
    loH = (loH ^ (hiH >>> 3)) >>> 0;
    // low64 = xorshift(low64, 35) * PRIME_MX2, then xorshift 28
    loL = (loL ^ (loH >>> 3)) >>> 0;
    mul64(loH, loL, MX2H, MX2L);
    loL = (rl ^ ((rl >>> 28) | (rh << 4))) >>> 0;
    loH = (rh ^ (rh >>> 28)) >>> 0;
    avalanche(hiH, hiL);
    writeBE(out, 0, rh, rl);
    writeBE(out, 8, loH, loL);
    return;
  }
  if (len > 0) {
    // XXH3_len_1to3_128b
    const c1 = b[0];
    const c2 = b[len >> 1];
    const c3 = b[len - 1];
    const combinedl = ((c1 << 16) | (c2 << 24) | c3 | (len << 8)) >>> 0;
    const swapped =
      ((combinedl >>> 24) | ((combinedl >>> 8) & 0xff00) | ((combinedl << 8) & 0xff0000) | (combinedl << 24)) >>> 0;
    const combinedh = ((swapped << 13) | (swapped >>> 19)) >>> 0;
    const flipL = (S32[0] ^ S32[4]) >>> 0;
    const flipH = (S32[8] ^ S32[12]) >>> 0;
    avalanche64(0, (combinedh ^ flipH) >>> 0);
    writeBE(out, 0, rh, rl);
    avalanche64(0, (combinedl ^ flipL) >>> 0);
    writeBE(out, 8, rh, rl);
    return;
  }
  avalanche64((S32[84] ^ S32[92]) >>> 0, (S32[80] ^ S32[88]) >>> 0);
  writeBE(out, 0, rh, rl);
  avalanche64((S32[68] ^ S32[76]) >>> 0, (S32[64] ^ S32[72]) >>> 0);
  writeBE(out, 8, rh, rl);
}

function len17to128(b: Uint8Array, len: number, out: Uint8Array): void {
  mul64(0, len, P64_1H, P64_1L);
  accLh = rh;
  accLl = rl;
  accHh = 0;
  accHl = 0;
  if (len > 32) {
    if (len > 64) {
      if (len > 96) mix32B(b, 48, len - 64, 96);
      mix32B(b, 32, len - 48, 64);
    }
    mix32B(b, 16, len - 32, 32);
  }
  mix32B(b, 0, len - 16, 0);
  finishMid(len, out);
}

function len129to240(b: Uint8Array, len: number, out: Uint8Array): void {
  mul64(0, len, P64_1H, P64_1L);
  accLh = rh;
  accLl = rl;
  accHh = 0;
  accHl = 0;
  for (let i = 32; i < 160; i += 32) mix32B(b, i - 32, i - 16, i - 32);
  avalanche(accLh, accLl);
  accLh = rh;
  accLl = rl;
  avalanche(accHh, accHl);
  accHh = rh;
  accHl = rl;
  for (let i = 160; i <= len; i += 32) mix32B(b, i - 32, i - 16, MIDSIZE_STARTOFFSET + i - 160);
  mix32B(b, len - 16, len - 32, SECRET_SIZE_MIN - MIDSIZE_LASTOFFSET - 16);
  finishMid(len, out);
}

/** The long path's eight 64-bit accumulators, (high, low) interleaved. */
const acc = new Uint32Array(16);

/** XXH3_accumulate_512 (scalar) of the stripe at input + i with the secret at s. */
function accumulate512(b: Uint8Array, i: number, s: number): void {
  for (let lane = 0; lane < 8; lane++) {
    const dh = r32(b, i + lane * 8 + 4);
    const dl = r32(b, i + lane * 8);
    const kh = (dh ^ S32[s + lane * 8 + 4]) >>> 0;
    const kl = (dl ^ S32[s + lane * 8]) >>> 0;
    // acc[lane ^ 1] += data_val
    const o = (lane ^ 1) * 2;
    add64(acc[o], acc[o + 1], dh, dl);
    acc[o] = rh;
    acc[o + 1] = rl;
    // acc[lane] += (data_key & 0xFFFFFFFF) * (data_key >> 32)
    mul32(kl, kh);
    add64(acc[lane * 2], acc[lane * 2 + 1], rh, rl);
    acc[lane * 2] = rh;
    acc[lane * 2 + 1] = rl;
  }
}

/** XXH3_scrambleAcc (scalar) with the secret at s. */
function scramble(s: number): void {
  for (let lane = 0; lane < 8; lane++) {
    let h = acc[lane * 2];
    let l = acc[lane * 2 + 1];
    l = (l ^ (h >>> 15)) >>> 0; // xorshift 47
    h = (h ^ S32[s + lane * 8 + 4]) >>> 0;
    l = (l ^ S32[s + lane * 8]) >>> 0;
    mul64(h, l, 0, P32_1);
    acc[lane * 2] = rh;
    acc[lane * 2 + 1] = rl;
  }
}

/** XXH3_mergeAccs into (rh, rl). */
function mergeAccs(s: number, startH: number, startL: number): void {
  let h = startH;
  let l = startL;
  for (let i = 0; i < 4; i++) {
    mulFold(
      (acc[i * 4] ^ S32[s + 16 * i + 4]) >>> 0,
      (acc[i * 4 + 1] ^ S32[s + 16 * i]) >>> 0,
      (acc[i * 4 + 2] ^ S32[s + 16 * i + 12]) >>> 0,
      (acc[i * 4 + 3] ^ S32[s + 16 * i + 8]) >>> 0,
    );
    add64(h, l, rh, rl);
    h = rh;
    l = rl;
  }
  avalanche(h, l);
}

function hashLong(b: Uint8Array, len: number, out: Uint8Array): void {
  // XXH3_INIT_ACC
  acc.set([
    0,
    P32_3,
    P64_1H,
    P64_1L,
    P64_2H,
    P64_2L,
    P64_3H,
    P64_3L,
    P64_4H,
    P64_4L,
    0,
    P32_2,
    P64_5H,
    P64_5L,
    0,
    P32_1,
  ]);
  const stripesPerBlock = (SECRET_SIZE - STRIPE_LEN) / SECRET_CONSUME_RATE;
  const blockLen = STRIPE_LEN * stripesPerBlock;
  const blocks = Math.floor((len - 1) / blockLen);
  for (let n = 0; n < blocks; n++) {
    for (let k = 0; k < stripesPerBlock; k++) accumulate512(b, n * blockLen + k * STRIPE_LEN, k * SECRET_CONSUME_RATE);
    scramble(SECRET_SIZE - STRIPE_LEN);
  }
  const stripes = Math.floor((len - 1 - blockLen * blocks) / STRIPE_LEN);
  for (let k = 0; k < stripes; k++) accumulate512(b, blocks * blockLen + k * STRIPE_LEN, k * SECRET_CONSUME_RATE);
  accumulate512(b, len - STRIPE_LEN, SECRET_SIZE - STRIPE_LEN - SECRET_LASTACC_START);
  mul64(0, len, P64_1H, P64_1L);
  mergeAccs(SECRET_MERGEACCS_START, rh, rl);
  const lowH = rh;
  const lowL = rl;
  mul64(0, len, P64_2H, P64_2L);
  mergeAccs(SECRET_SIZE - 64 - SECRET_MERGEACCS_START, ~rh >>> 0, ~rl >>> 0);
  writeBE(out, 0, rh, rl);
  writeBE(out, 8, lowH, lowL);
}

/**
 * The 16-byte canonical (big-endian: high 64 bits, then low 64 bits) XXH3-128 digest of
 * `data` with seed 0, as `xxhash.xxh3_128_digest(data)`, written into `out` (default: a new
 * Buffer).
 */
export function xxh3_128(data: Uint8Array, out: Uint8Array = Buffer.allocUnsafe(16)): Uint8Array {
  if (!(data instanceof Uint8Array)) throw new TypeError('data must be a Uint8Array');
  if (!(out instanceof Uint8Array) || out.length < 16)
    throw new TypeError('out must be a Uint8Array of 16 bytes or more');
  const len = data.length;
  if (len <= 16) len0to16(data, len, out);
  else if (len <= 128) len17to128(data, len, out);
  else if (len <= 240) len129to240(data, len, out);
  else hashLong(data, len, out);
  return out;
}
