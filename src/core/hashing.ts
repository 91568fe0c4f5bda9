/**
 * Block hashing (docs/architecture.md §2): a request's tokens are cut into full blocks of `blockSize`;
 * each block gets a local hash (its token ids), and a sequence hash chains it to its parent:
 * seq[i] = mix(seq[i-1], local[i]). Equal sequence hashes mean equal prefixes.
 *
 * Hashes are 64-bit, kept as two uint32 halves (hi, lo) in typed arrays: no BigInt, no
 * strings, no per-block allocation. The block hash is xxHash64-style (four independent
 * 64-bit lanes, avalanche), run in WebAssembly over the whole request in one call: a
 * TypeScript loop is limited to 32-bit multiplies (two dependent lanes, ~2.4 ns per token
 * here) and a native hash pays a call across the N-API boundary per block (node:crypto:
 * ~2 µs per block); one wasm call per request pays the boundary once. `npm run bench:hash`
 * measures all of them (README "Performance"). It is not cryptographic: a collision can
 * only misroute a request; the engine's own cache decides what is reused.
 *
 * The chain's root seed is derived from the LoRA name, the cache salt and the CLA group, the
 * way vLLM folds LoRA and cache_salt into its block keys: requests that differ in any of them
 * never share a sequence hash.
 */

/**
 * Version of every hash this module computes. Router replicas share block hashes (Redis keys,
 * shared decisions) and the index holds hashes derived from engine events, so a change to any
 * output (a constant in wasm/block-hash.wat, the root seed's mixing, the text chunking,
 * hashString32) must bump it; test/core/hash-vectors.test.ts pins known outputs to it.
 */
export const BLOCK_HASH_VERSION = 1;

/** Sequence hashes of a request, reused between calls to avoid allocation. */
export class BlockHashes {
  hi: Uint32Array;
  lo: Uint32Array;
  /** Number of valid hashes. */
  length = 0;
  /** Tokens covered by each block (for cached-token estimates). */
  tokensPerBlock = 0;

  constructor(capacity = 1024) {
    this.hi = new Uint32Array(capacity);
    this.lo = new Uint32Array(capacity);
  }

  ensureCapacity(n: number): void {
    if (n <= this.hi.length) return;
    let cap = this.hi.length;
    while (cap < n) cap *= 2;
    const hi = new Uint32Array(cap);
    const lo = new Uint32Array(cap);
    hi.set(this.hi.subarray(0, this.length));
    lo.set(this.lo.subarray(0, this.length));
    this.hi = hi;
    this.lo = lo;
  }

  /** The i-th hash as an unsigned 64-bit BigInt (for display and tests, not the hot path). */
  toBigInt(i: number): bigint {
    return (BigInt(this.hi[i]) << 32n) | BigInt(this.lo[i]);
  }

  /** The i-th hash as 16 hex digits. */
  toHex(i: number): string {
    return hashHex(this.hi[i], this.lo[i]);
  }
}

/** A 64-bit hash held as (hi, lo) uint32 halves, as 16 hex digits: the one spelling in logs, keys and tests. */
export function hashHex(hi: number, lo: number): string {
  return (hi >>> 0).toString(16).padStart(8, '0') + (lo >>> 0).toString(16).padStart(8, '0');
}

/** What keys a chain besides the tokens: a different value never shares a block. */
export interface HashNamespace {
  lora?: string | null;
  cacheSalt?: string | null;
  claGroup?: number | null;
}

import type { BlockKeySource } from './block-index.js';
import { BLOCK_HASH_WASM } from './wasm/block-hash-wasm.js';
import { contentPartText, contentPartType, contentPartUuid } from './chat-messages.js';
import { typeName } from './validate.js';

const SEED_HI = 0x6a09e667;
const SEED_LO = 0xbb67ae85;

/** Root seed (hi, lo) of a chain; the empty namespace has a fixed seed. */
export function chainRoot(ns: HashNamespace | undefined, out: Uint32Array): void {
  out[0] = SEED_HI;
  out[1] = SEED_LO;
  if (ns) {
    if (ns.lora) mixField(out, 'lora:', ns.lora);
    if (ns.cacheSalt) mixField(out, 'salt:', ns.cacheSalt);
    if (ns.claGroup !== undefined && ns.claGroup !== null) mixField(out, 'cla:', ns.claGroup);
  }
}

/**
 * Mixes the string `label + value` into the running hash in `state` (hi, lo), in place. The
 * label and the value are read one after the other, never concatenated, and an integer from
 * 0 to 2^31 − 1 (a CLA group) digit by digit, as String() spells it: a route with a namespace
 * builds no string. Any other number is spelled by String().
 */
function mixField(state: Uint32Array, label: string, value: string | number): void {
  let a = state[0] ^ 0x811c9dc5;
  let b = state[1] ^ 0x01000193;
  for (let i = 0; i < label.length; i++) {
    const c = label.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x5bd1e995);
    b ^= b >>> 15;
  }
  const digits = typeof value === 'number' && Number.isInteger(value) && value >= 0 && value <= 0x7fffffff;
  const text = typeof value === 'number' && !digits ? String(value) : value;
  if (typeof text === 'string') {
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      a = Math.imul(a ^ c, 0x01000193);
      b = Math.imul(b ^ c, 0x5bd1e995);
      b ^= b >>> 15;
    }
  } else {
    // the decimal digits of a non-negative int32, most significant first, as String() spells it
    let unit = 1;
    while (unit <= text / 10) unit *= 10;
    for (; unit >= 1; unit = (unit / 10) | 0) {
      const c = 48 + (((text / unit) | 0) % 10);
      a = Math.imul(a ^ c, 0x01000193);
      b = Math.imul(b ^ c, 0x5bd1e995);
      b ^= b >>> 15;
    }
  }
  state[0] = fmix32(a ^ (b >>> 7));
  state[1] = fmix32(b ^ Math.imul(a, 0x9e3779b1));
}

/** murmur3's 32-bit finalizer: a bijection that spreads every input bit over the output. */
export function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** A 32-bit hash of a short string (FNV-1a, finalized): routing keys, ring points. */
export function hashString32(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return fmix32(h);
}

const root = new Uint32Array(2);

// The block hash runs in WebAssembly (src/core/wasm/block-hash.wat): one call per request,
// i64 arithmetic, four independent lanes. The tokens are copied into its memory (or, for
// text, encoded straight into it) and the hashes read back.
const wasm = new WebAssembly.Instance(
  new WebAssembly.Module(Uint8Array.from(atob(BLOCK_HASH_WASM), (c) => c.charCodeAt(0))),
  {},
);
const wasmMemory = wasm.exports.memory as WebAssembly.Memory;
const wasmHashBlocks = wasm.exports.hash_blocks as (
  words: number,
  n: number,
  bs: number,
  seedHi: number,
  seedLo: number,
  outLo: number,
  outHi: number,
) => number;
let wasmWords = new Uint32Array(wasmMemory.buffer);

/** Makes the wasm memory at least `bytes` long (views are renewed after it grows). */
function reserveWasm(bytes: number): void {
  const have = wasmMemory.buffer.byteLength;
  if (have >= bytes) return;
  wasmMemory.grow(Math.ceil((bytes - have) / 65536));
  wasmWords = new Uint32Array(wasmMemory.buffer);
}

/**
 * Sequence hashes of every full block of `tokens`, written into `out` (resized as needed).
 * Token ids must be integers in [0, 2^32); anything else throws a RangeError (a TypeError for
 * what is no number) naming `tokens`.
 */
export function hashTokenBlocks(
  tokens: ArrayLike<number>,
  blockSize: number,
  ns: HashNamespace | undefined,
  out: BlockHashes,
): BlockHashes {
  const n = loadTokens(tokens, blockSize);
  chainRoot(ns, root);
  return runWasmHash(n, blockSize, out);
}

/**
 * Like hashTokenBlocks, but the chain continues from a given parent sequence hash instead of
 * a namespace's root: how a KV event's new blocks are hashed after their parent block.
 */
export function hashTokenBlocksFrom(
  parentHi: number,
  parentLo: number,
  tokens: ArrayLike<number>,
  blockSize: number,
  out: BlockHashes,
): BlockHashes {
  const n = loadTokens(tokens, blockSize);
  root[0] = parentHi >>> 0;
  root[1] = parentLo >>> 0;
  return runWasmHash(n, blockSize, out);
}

/** Mixes a string into a chain's running hash (e.g. a block's multimodal identifiers). */
export function mixIntoChain(hi: number, lo: number, s: string, out: Uint32Array): void {
  out[0] = hi >>> 0;
  out[1] = lo >>> 0;
  mixField(out, '', s);
}

/**
 * Validates token ids and copies the full blocks' worth into wasm memory; returns how many.
 * Token ids must be integers in [0, 2^32); anything else throws a RangeError naming `tokens`.
 */
function loadTokens(tokens: ArrayLike<number>, blockSize: number): number {
  const n = Math.floor(tokens.length / blockSize) * blockSize;
  reserveWasm(n * 4 + (n / blockSize) * 8 + 16);
  const words = wasmWords;
  if (tokens instanceof Uint32Array) {
    words.set(n === tokens.length ? tokens : tokens.subarray(0, n), 0);
  } else {
    for (let i = 0; i < tokens.length; i++) {
      const tok = tokens[i];
      if (typeof tok !== 'number' || tok !== tok >>> 0) throw badTokenId(i, tok);
      if (i < n) words[i] = tok;
    }
  }
  return n;
}

/**
 * Hashes the first `n` words in wasm memory in blocks of `blockSize`, chained from `root`,
 * into `out` from position `at` on (what is before `at` is kept).
 */
function runWasmHash(n: number, blockSize: number, out: BlockHashes, at = 0): BlockHashes {
  // the words take [0, 4n) bytes; the blocks' low and high halves follow as two runs of u32
  const loWord = n;
  const hiWord = n + Math.floor(n / blockSize);
  const blocks = wasmHashBlocks(0, n, blockSize, root[0], root[1], loWord * 4, hiWord * 4);
  out.length = Math.min(out.length, at);
  out.ensureCapacity(at + blocks);
  out.length = at + blocks;
  out.tokensPerBlock = blockSize;
  const words = wasmWords;
  out.lo.set(words.subarray(loWord, loWord + blocks), at);
  out.hi.set(words.subarray(hiWord, hiWord + blocks), at);
  return out;
}

/**
 * Tokens a walk's stretch of keys covers at least (4 KB of token ids): the overshoot past
 * where the walk stops stays small next to a prompt of thousands of tokens, and the calls
 * into wasm stay few. Long prompts grow by a quarter of what is computed instead.
 */
const STRETCH_TOKENS = 1024;

/**
 * The block keys of one prompt's token ids, computed in stretches on demand. A route needs
 * keys only as far as the index walk matches and the speculative stretch past it, so the
 * rest of a long prompt is neither copied into wasm memory nor hashed: copying and hashing
 * are most of a route's cost at 8k tokens. Reading `hi`, `lo` or `length` (a policy that
 * keeps its own view of the request's blocks) computes every key first. Keys equal
 * hashTokenBlocks': each stretch continues the chain from the last key computed.
 */
export class TokenBlockKeys implements BlockKeySource {
  /** The keys computed so far (`computed.length` of them), in arrays sized for the whole prompt. */
  readonly computed = new BlockHashes(1024);
  /** Full blocks of the prompt. */
  total = 0;
  private tokens: ArrayLike<number> = new Uint32Array(0);
  private blockSize = 1;
  private readonly root = new Uint32Array(2);

  /**
   * Starts a new prompt. Token ids must be integers in [0, 2^32); anything else throws a
   * RangeError naming `tokens` (every token is checked here, as hashTokenBlocks does).
   */
  reset(tokens: ArrayLike<number>, blockSize: number, ns: HashNamespace | undefined): void {
    if (!(tokens instanceof Uint32Array)) checkTokens(tokens);
    this.tokens = tokens;
    this.blockSize = blockSize;
    this.total = Math.floor(tokens.length / blockSize);
    chainRoot(ns, this.root);
    const keys = this.computed;
    keys.length = 0;
    keys.tokensPerBlock = blockSize;
    // sized once for the whole prompt: a walk holds on to the arrays while keys are added
    keys.ensureCapacity(this.total);
  }

  /** Computes keys up to block `n` exactly (capped at the prompt's end); returns how many are computed. */
  ensure(n: number): number {
    const keys = this.computed;
    const have = keys.length;
    const to = Math.min(n, this.total);
    if (to <= have) return have;
    const bs = this.blockSize;
    const words = (to - have) * bs;
    reserveWasm(words * 4 + (to - have) * 8 + 16);
    const tokens = this.tokens;
    const first = have * bs;
    if (tokens instanceof Uint32Array) wasmWords.set(tokens.subarray(first, first + words), 0);
    else for (let i = 0; i < words; i++) wasmWords[i] = tokens[first + i];
    if (have === 0) {
      root[0] = this.root[0];
      root[1] = this.root[1];
    } else {
      root[0] = keys.hi[have - 1];
      root[1] = keys.lo[have - 1];
    }
    runWasmHash(words, bs, keys, have);
    return keys.length;
  }

  /** For a walk: at least up to `need`, in stretches of STRETCH_TOKENS or a quarter of what is computed. */
  extend(need: number): number {
    const have = this.computed.length;
    return this.ensure(Math.max(need, have + Math.max(Math.ceil(STRETCH_TOKENS / this.blockSize), have >>> 2)));
  }

  // policies read these per block in their loops: the check stays one comparison once all are computed
  get hi(): Uint32Array {
    if (this.computed.length < this.total) this.ensure(this.total);
    return this.computed.hi;
  }

  get lo(): Uint32Array {
    if (this.computed.length < this.total) this.ensure(this.total);
    return this.computed.lo;
  }

  get length(): number {
    return this.total;
  }
}

function checkTokens(tokens: ArrayLike<number>): void {
  for (let i = 0; i < tokens.length; i++) {
    const tok = tokens[i];
    if (typeof tok !== 'number' || tok !== tok >>> 0) throw badTokenId(i, tok);
  }
}

/**
 * The error for `tokens[i]`, which is no token id: a RangeError for a number out of [0, 2^32),
 * a TypeError naming its type for anything else (a bigint, as a BigUint64Array holds, cannot
 * even be compared with one: the check would throw the engine's own "Cannot mix BigInt").
 */
export function badTokenId(i: number, tok: unknown): Error {
  if (typeof tok === 'number') return new RangeError(`tokens[${i}] must be an integer in [0, 2^32), got ${tok}`);
  return new TypeError(`tokens[${i}] must be a number (a token id), got ${typeName(tok)}`);
}

/**
 * Sequence hashes of caller-supplied block ids (a trace's hash_ids, an engine's own chained
 * hashes). The ids are assumed chained already (equal id ⇒ equal prefix); they are mixed with
 * the namespace's root so LoRA, salt and CLA group still separate them. Numbers must be
 * integers in [0, 2^53), bigints in [0, 2^64): anything else is refused, not wrapped onto another id.
 */
export function hashPrecomputedBlocks(
  ids: ArrayLike<number | bigint>,
  tokensPerBlock: number,
  ns: HashNamespace | undefined,
  out: BlockHashes,
): BlockHashes {
  const n = ids.length;
  out.ensureCapacity(n);
  out.length = n;
  out.tokensPerBlock = tokensPerBlock;
  chainRoot(ns, root);
  const rh = root[0];
  const rl = root[1];
  for (let i = 0; i < n; i++) {
    const id = ids[i];
    let hi: number;
    let lo: number;
    if (typeof id === 'number') {
      if (!Number.isSafeInteger(id) || id < 0)
        throw new RangeError(`blockHashes[${i}] must be an integer in [0, 2^53), got ${id}`);
      hi = Math.floor(id / 4294967296) >>> 0;
      lo = id >>> 0;
    } else if (typeof id === 'bigint') {
      // a 64-bit id is unsigned (vLLM's and Dynamo's block hashes): -1n is no id, not 2^64 - 1
      if (id < 0n || id > 0xffff_ffff_ffff_ffffn)
        throw new RangeError(
          `blockHashes[${i}] must be a bigint in [0, 2^64), got ${id > -(1n << 128n) && id < 1n << 128n ? String(id) : 'one of more than 128 bits'}`,
        );
      hi = Number((id >> 32n) & 0xffffffffn);
      lo = Number(id & 0xffffffffn);
    } else {
      throw new TypeError(`blockHashes[${i}] must be a number or bigint`);
    }
    const h = fmix32(hi ^ rh ^ Math.imul(lo, 0x9e3779b1));
    out.hi[i] = h;
    out.lo[i] = fmix32(lo ^ rl ^ Math.imul(h, 0x85ebca77));
  }
  return out;
}

const encoder = new TextEncoder();

/**
 * Text mode, for engines the router cannot tokenize for: the text's UTF-8 bytes cut into
 * fixed chunks of `chunkBytes` (a multiple of 4), each chunk hashed and chained like a block.
 * Only full chunks are hashed, as only full token blocks are.
 */
export function hashTextBlocks(
  text: string,
  chunkBytes: number,
  ns: HashNamespace | undefined,
  out: BlockHashes,
): BlockHashes {
  if (chunkBytes % 4 !== 0 || chunkBytes <= 0)
    throw new RangeError(`chunkBytes must be a positive multiple of 4, got ${chunkBytes}`);
  // UTF-8 needs at most 3 bytes per UTF-16 code unit; encode straight into wasm memory
  const maxBytes = text.length * 3 + 4;
  reserveWasm(maxBytes + Math.ceil(maxBytes / chunkBytes) * 8 + 16);
  const { written } = encoder.encodeInto(text, new Uint8Array(wasmMemory.buffer, 0, maxBytes));
  // each 4-byte word is one "token" of the chain; a chunk is chunkBytes/4 of them
  const blockWords = chunkBytes / 4;
  chainRoot(ns, root);
  return runWasmHash(Math.floor(written / chunkBytes) * blockWords, blockWords, out);
}

/**
 * A chat content part as the OpenAI API and vLLM send it (checked by checkChatMessages): a
 * `type` with its field (`text`, `image_url`, …), or, without a type or with a `uuid`, a
 * media field that says what it is.
 */
export interface ChatContentPart {
  type?: string | null;
  text?: string | null;
  image_url?: { url: string | null } | string | null;
  uuid?: string | null;
  [field: string]: unknown;
}

/** A chat message as the OpenAI API sends it. */
export interface ChatMessage {
  role: string;
  content?: string | null | ReadonlyArray<ChatContentPart | string>;
  name?: string;
}

/**
 * The canonical text of a whole chat request: every message with its role, in order (a peer
 * hashes only the first message, so every conversation sharing a system prompt collides).
 */
export function canonicalChatText(messages: readonly ChatMessage[]): string {
  let s = '';
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i];
    s += `<|${m.role}${m.name ? ':' + m.name : ''}|>\n`;
    const c = m.content;
    if (typeof c === 'string') s += c;
    else if (Array.isArray(c)) {
      const parts = c as ReadonlyArray<ChatContentPart | string>;
      for (let j = 0; j < parts.length; j++) s += canonicalPartText(parts[j], i, j);
    }
    s += '\n';
  }
  return s;
}

/**
 * A content part in the canonical text, the same for parts vLLM reads alike: a text-like part
 * (a plain string, text, input_text, output_text, refusal, thinking) is its text, one vLLM
 * skips is nothing; media named by a uuid is `[type#uuid]` (the engine's cache knows it by
 * that id, whatever URL or data comes with it); a URL part is `[type:url]`, or
 * `[type:data:digest]` for a `data:` URL; other inline data is `[type:digest]`, the digest
 * independent of the order of an object's fields. Inline media thus counts as a few tokens of
 * the text's estimate, not as its base64: the engine makes the media's tokens.
 */
function canonicalPartText(part: ChatContentPart | string, message: number, index: number): string {
  const text = contentPartText(part);
  if (text !== undefined) return text ?? '';
  const type = contentPartType(part);
  const uuid = contentPartUuid(part);
  if (uuid !== undefined) return `[${type}#${uuid}]`;
  const p = part as Record<string, unknown>;
  switch (type) {
    case 'image_url':
    case 'audio_url':
    case 'video_url':
    case 'input_image': {
      const media = p[type === 'input_image' ? 'image_url' : type];
      const url = typeof media === 'string' ? media : (media as { url?: unknown } | null | undefined)?.url;
      if (typeof url !== 'string') return `[${type}]`;
      // inline data (megabytes of base64) is the engine's to make tokens of: a digest of it,
      // behind the scheme so that it is never the text of a URL the engine fetches
      return DATA_URL.test(url) ? `[${type}:data:${dataDigest(url, 'url')}]` : `[${type}:${url}]`;
    }
    case 'input_audio':
    case 'image_embeds':
    case 'audio_embeds':
      return `[${type}:${dataDigest(p[type], `messages[${message}].content[${index}].${type}`)}]`;
    case 'prompt_embeds':
      return `[${type}:${dataDigest(p.data, `messages[${message}].content[${index}].data`)}]`;
    case 'tool_reference':
      return `[${type}:${typeof p.name === 'string' ? p.name : ''}]`;
    default:
      return `[${type}]`;
  }
}

/** A `data:` URL, its scheme in any case (as the engine's URL parser reads it). */
const DATA_URL = /^data:/i;

/**
 * A short digest of inline media (a string, or an object of them), its fields in sorted order.
 * Throws a TypeError naming `field` for a value that holds one object twice: JSON is a tree, and
 * a cycle would never end the walk, an object shared level after level double it at each.
 */
function dataDigest(data: unknown, field: string): string {
  let h1 = 0x811c9dc5;
  let h2 = 0x01000193;
  let n = 0;
  const mix = (s: string) => {
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i);
      h1 = Math.imul(h1 ^ c, 0x01000193);
      h2 = Math.imul(h2 ^ c, 0x5bd1e995);
    }
    n += s.length;
    h1 = Math.imul(h1 ^ 0xff, 0x01000193);
    h2 = Math.imul(h2 ^ 0xff, 0x5bd1e995);
  };
  // depth first, in order, on a stack of its own: a caller's value may nest deeper than the call
  // stack goes (the gateway bounds a body's depth, route() takes any object)
  const stack: unknown[] = [data];
  // the objects walked: a JSON body's media holds each once (a string has none to remember)
  let seen: Set<object> | undefined;
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v === 'string') mix(v);
    else if (v !== null && typeof v === 'object') {
      seen ??= new Set();
      if (seen.has(v))
        throw new TypeError(
          `${field} holds one object twice (a cycle or a shared reference): inline data must be a tree`,
        );
      seen.add(v);
      if (Array.isArray(v)) {
        mix('[');
        for (let i = v.length - 1; i >= 0; i--) stack.push(v[i]);
      } else {
        // each key is mixed before its value, the keys in sorted order
        const keys = Object.keys(v).sort();
        for (let i = keys.length - 1; i >= 0; i--) stack.push((v as Record<string, unknown>)[keys[i]], keys[i]);
      }
    } else mix(String(v));
  }
  return `${n}:${fmix32(h1).toString(16)}${fmix32(h2).toString(16)}`;
}
