/**
 * bench:hash — the block-hash choice, measured: µs to hash one 8,192-token request into
 * 512 chained 64-bit block hashes of 16 tokens, for
 *  - the chosen xxHash64-style hash in WebAssembly, one call per request (src/core/hashing.ts),
 *    from a Uint32Array and from a plain array (checked and copied),
 *  - a TypeScript two-lane 32-bit multiply-xor loop (the pure-JS alternative),
 *  - node:crypto (OpenSSL) md5 and sha256, one native call per block, chained by hashing
 *    the parent digest with the block,
 *  - FNV-1a 64 in BigInt arithmetic (pure JS, exact 64-bit),
 *  - vLLM's own block hash under each --prefix-caching-hash-algo (`--block-hash vllm`,
 *    src/core/vllm-block-hash.ts: pickle or canonical CBOR, then SHA-256 or XXH3-128), whose
 *    cost per block is also printed as `vllmUsPerBlock`.
 *
 *   npm run bench:hash -- --json
 */
import { createHash } from 'node:crypto';
import { BlockHashes, fmix32, hashTokenBlocks } from '../src/core/hashing.js';
import { VLLM_HASH_ALGOS, VllmBlockHasher } from '../src/core/vllm-block-hash.js';
import { benchFlags, round } from './stats.js';

const flags = benchFlags(process.argv.slice(2), { json: 'switch' });
const TOKENS = 8192;
const BLOCK = 16;
const tokens = new Uint32Array(TOKENS);
for (let i = 0; i < TOKENS; i++) tokens[i] = (Math.imul(i + 1, 2654435761) >>> 0) % 151_000;
const plainArray = Array.from(tokens);
const bytes = Buffer.from(tokens.buffer);
const out = new BlockHashes(TOKENS / BLOCK);

/** The TypeScript hash this project used before the wasm one: two dependent 32-bit lanes. */
const jsHi = new Uint32Array(TOKENS / BLOCK);
const jsLo = new Uint32Array(TOKENS / BLOCK);
function viaTypeScriptLoop(): void {
  let ph = 0x6a09e667;
  let pl = 0xbb67ae85;
  for (let b = 0, t = 0; b < TOKENS / BLOCK; b++) {
    let a = 0x9e3779b9;
    let c = 0x7f4a7c15;
    for (const end = t + BLOCK; t < end; t++) {
      const tok = tokens[t];
      a = Math.imul(a ^ tok, 0x01000193);
      a ^= a >>> 15;
      c = Math.imul((c + tok) | 0, 0x85ebca77);
      c ^= c >>> 13;
    }
    jsHi[b] = ph = fmix32(ph ^ fmix32(a ^ Math.imul(c, 0xcc9e2d51)));
    jsLo[b] = pl = fmix32(pl ^ fmix32((c + Math.imul(a ^ (a >>> 16), 0x1b873593)) | 0) ^ Math.imul(ph, 0x9e3779b1));
  }
}

function viaCrypto(algorithm: string): void {
  let parent = Buffer.alloc(8);
  for (let b = 0; b < TOKENS / BLOCK; b++) {
    const digest = createHash(algorithm)
      .update(parent)
      .update(bytes.subarray(b * BLOCK * 4, (b + 1) * BLOCK * 4))
      .digest();
    parent = digest.subarray(0, 8);
  }
}

const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;
const MASK = 0xffffffffffffffffn;
function viaBigInt(): void {
  let parent = FNV_OFFSET;
  for (let b = 0; b < TOKENS / BLOCK; b++) {
    let h = parent;
    for (let t = b * BLOCK; t < (b + 1) * BLOCK; t++) h = ((h ^ BigInt(tokens[t])) * FNV_PRIME) & MASK;
    parent = h;
  }
}

function time(fn: () => void, iterations: number): number {
  for (let i = 0; i < Math.max(5, iterations / 10); i++) fn();
  const t0 = performance.now();
  for (let i = 0; i < iterations; i++) fn();
  return ((performance.now() - t0) / iterations) * 1000; // µs per request
}

const candidates: Record<string, number> = {
  wasmXxh64StyleUint32Array: time(() => hashTokenBlocks(tokens, BLOCK, undefined, out), 4000),
  wasmXxh64StylePlainArray: time(() => hashTokenBlocks(plainArray, BLOCK, undefined, out), 4000),
  typescriptTwoLane32Bit: time(viaTypeScriptLoop, 4000),
  cryptoMd5PerBlock: time(() => viaCrypto('md5'), 100),
  cryptoSha256PerBlock: time(() => viaCrypto('sha256'), 100),
  bigintFnv1a64: time(viaBigInt, 50),
  ...Object.fromEntries(
    VLLM_HASH_ALGOS.map((algo) => {
      const hasher = new VllmBlockHasher('0', algo);
      return [`vllm_${algo}`, time(() => hasher.hashBlocks(tokens, BLOCK, {}, out), 200)];
    }),
  ),
};
const result = {
  requestTokens: TOKENS,
  blockSize: BLOCK,
  usPerRequest: Object.fromEntries(Object.entries(candidates).map(([k, v]) => [k, round(v, 2)])),
  nsPerToken: Object.fromEntries(Object.entries(candidates).map(([k, v]) => [k, round((v * 1000) / TOKENS, 2)])),
  vllmUsPerBlock: Object.fromEntries(
    VLLM_HASH_ALGOS.map((algo) => [algo, round(candidates[`vllm_${algo}`] / (TOKENS / BLOCK), 3)]),
  ),
  node: process.version,
};
if (flags.has('json')) process.stdout.write(`${JSON.stringify(result)}\n`);
else console.log(result);
