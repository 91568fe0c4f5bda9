import { createHash } from 'node:crypto';
import { badTokenId, type BlockHashes } from './hashing.js';
import { xxh3_128 } from './xxh3-128.js';

/**
 * vLLM's own prefix-cache block hash, for `serve --block-hash vllm`: with it the router keys
 * its index by the hashes the engine reports, so a request's blocks match an engine's blocks
 * without the router having seen the chain of stores that led to them (a router that joined
 * late, or stores whose parent it missed).
 *
 * vLLM (vllm/v1/core/kv_cache_utils.py, hash_block_tokens and init_none_hash; the hash
 * functions from vllm/utils/hashing.py, chosen by get_hash_fn_by_name from the engine's
 * `--prefix-caching-hash-algo`, vllm/config/cache.py PrefixCachingHashAlgo) computes, for
 * each full block of `block_size` tokens:
 *
 *   hash = hash_fn((parent or NONE_HASH, tuple(block_tokens), extra_keys))
 *   NONE_HASH = hash_fn(os.getenv("PYTHONHASHSEED"))       (random when the variable is unset)
 *
 * where hash_fn is one of
 *
 *   sha256       hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))   vLLM's default
 *   sha256_cbor  hashlib.sha256(cbor2.dumps(obj, canonical=True))
 *   xxhash       xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
 *   xxhash_cbor  xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))
 *
 * The parent is the previous block's digest (32 bytes for sha256, 16 for xxhash). extra_keys
 * (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys) is None or a tuple: the LoRA
 * name, multimodal (identifier, offset) pairs, the cache salt (first block only),
 * prompt-embedding digests. KV events carry the digest, or with
 * VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 its low 64 bits as an integer
 * (`int.from_bytes(digest, "big") & (2**64 - 1)`, maybe_convert_block_hash); the router's key
 * for a block is those low 64 bits either way. llm-d computes the same sha256_cbor hashes for
 * its index (llm-d/llm-d-kv-cache-manager pkg/kvcache/kvblock/token_processor.go).
 *
 * The pickle is protocol 5 (HIGHEST_PROTOCOL on every Python vLLM supports), written here as
 * CPython's C pickler writes it: PROTO 5, then FRAME-delimited opcodes (a frame is closed
 * after the object that takes it to 64 KiB or more; one under 4 bytes has no FRAME header;
 * a bytes or str payload of 64 KiB or more goes unframed), ints as BININT1/BININT2/BININT or
 * LONG1, the digest as SHORT_BINBYTES, strings as SHORT_BINUNICODE/BINUNICODE, each bytes,
 * str and tuple followed by MEMOIZE, tuples as TUPLE1-3 or MARK ... TUPLE, then STOP.
 *
 * Checked against Python's pickle, cbor2, hashlib and xxhash on the cases in
 * test/fixtures/kv-events/vllm-block-hash.json (scripts/gen-kv-event-fixtures.py).
 */
export interface VllmExtraKeys {
  lora?: string | null;
  cacheSalt?: string | null;
}

/** vLLM's `--prefix-caching-hash-algo` values (vllm/config/cache.py PrefixCachingHashAlgo). */
export const VLLM_HASH_ALGOS = Object.freeze(['sha256', 'sha256_cbor', 'xxhash', 'xxhash_cbor'] as const);
export type VllmHashAlgo = (typeof VLLM_HASH_ALGOS)[number];

// pickle opcodes (Lib/pickle.py)
const MARK = 0x28;
const STOP = 0x2e;
const BININT = 0x4a;
const BININT1 = 0x4b;
const BININT2 = 0x4d;
const NONE = 0x4e;
const BINUNICODE = 0x58;
const BINBYTES = 0x42;
const SHORT_BINBYTES = 0x43;
const TUPLE = 0x74;
const PROTO = 0x80;
const LONG1 = 0x8a;
const TUPLE1 = 0x85;
const SHORT_BINUNICODE = 0x8c;
const MEMOIZE = 0x94;
const FRAME = 0x95;
/** _pickle.c FRAME_SIZE_TARGET, FRAME_SIZE_MIN and FRAME_HEADER_SIZE. */
const FRAME_SIZE_TARGET = 64 * 1024;
const FRAME_SIZE_MIN = 4;
const FRAME_HEADER_SIZE = 9;

export class VllmBlockHasher {
  /** NONE_HASH: the parent of every chain's first block. */
  readonly noneHash: Buffer;
  private readonly pickled: boolean;
  private readonly xxh: boolean;
  private buf = Buffer.alloc(1024);
  private pos = 0;
  /** Where the open pickle frame's header is reserved; -1 when no frame is open. */
  private frameStart = -1;

  /**
   * `pythonHashSeed`: the engine's PYTHONHASHSEED, as the string it is in the environment.
   * `algo`: the engine's `--prefix-caching-hash-algo` (vLLM's default is sha256; this class's
   * is sha256_cbor, the algorithm llm-d's indexer computes and fleets sharing block hashes
   * across processes configure, since it does not depend on Python's pickle).
   */
  constructor(
    readonly pythonHashSeed: string,
    readonly algo: VllmHashAlgo = 'sha256_cbor',
  ) {
    if (typeof pythonHashSeed !== 'string' || pythonHashSeed === '')
      throw new TypeError('pythonHashSeed must be a non-empty string');
    if (!(VLLM_HASH_ALGOS as readonly string[]).includes(algo))
      throw new RangeError(`algo must be one of ${VLLM_HASH_ALGOS.join(', ')}, got '${String(algo)}'`);
    this.pickled = algo === 'sha256' || algo === 'xxhash';
    this.xxh = algo === 'xxhash' || algo === 'xxhash_cbor';
    this.ensure(64 + 3 * pythonHashSeed.length);
    if (this.pickled) {
      this.pickleBegin();
      this.pickleText(pythonHashSeed);
      this.pickleEnd();
    } else {
      this.pos = 0;
      this.text(pythonHashSeed);
    }
    this.noneHash = this.digest();
  }

  /**
   * The digests (32 bytes for sha256, 16 for xxhash) of every full block of `tokens`, chained
   * from `parent` (default: NONE_HASH, a prompt's start).
   */
  digests(
    tokens: ArrayLike<number>,
    blockSize: number,
    extra: VllmExtraKeys = {},
    parent: Buffer | null = null,
  ): Buffer[] {
    const out: Buffer[] = [];
    this.chain(tokens, blockSize, extra, parent, (d) => out.push(d));
    return out;
  }

  /** Low 64 bits of each block's digest into `out` (hi, lo): the index key of each block. */
  hashBlocks(tokens: ArrayLike<number>, blockSize: number, extra: VllmExtraKeys, out: BlockHashes): BlockHashes {
    const n = Math.floor(tokens.length / blockSize);
    out.ensureCapacity(Math.max(1, n));
    out.length = 0;
    out.tokensPerBlock = blockSize;
    this.chain(tokens, blockSize, extra, null, (d) => {
      out.hi[out.length] = d.readUInt32BE(d.length - 8);
      out.lo[out.length] = d.readUInt32BE(d.length - 4);
      out.length++;
    });
    return out;
  }

  private chain(
    tokens: ArrayLike<number>,
    blockSize: number,
    extra: VllmExtraKeys,
    parent: Buffer | null,
    emit: (digest: Buffer) => void,
  ): void {
    if (!Number.isInteger(blockSize) || blockSize < 1)
      throw new RangeError(`blockSize must be a positive integer, got ${blockSize}`);
    const n = Math.floor(tokens.length / blockSize);
    const textBytes = 3 * ((extra.lora?.length ?? 0) + (extra.cacheSalt?.length ?? 0));
    // the largest encoding of one block: tokens at 7 bytes (LONG1), strings, frame headers
    const body = 64 + blockSize * 7 + textBytes;
    this.ensure(body + FRAME_HEADER_SIZE * (3 + Math.ceil(body / FRAME_SIZE_TARGET)));
    let prev = parent ?? this.noneHash;
    for (let b = 0; b < n; b++) {
      const start = b * blockSize;
      for (let i = start, end = start + blockSize; i < end; i++) {
        const t = tokens[i];
        if (typeof t !== 'number' || t !== t >>> 0) throw badTokenId(i, t);
      }
      // extra_keys: LoRA name on every block, the salt on a prompt's first block only
      const salt = b === 0 && parent === null && extra.cacheSalt ? extra.cacheSalt : null;
      if (this.pickled) this.pickleBlock(prev, tokens, start, blockSize, extra.lora || null, salt);
      else this.cborBlock(prev, tokens, start, blockSize, extra.lora || null, salt);
      prev = this.digest();
      emit(prev);
    }
  }

  /** The digest of buf[0, pos). */
  private digest(): Buffer {
    const bytes = this.buf.subarray(0, this.pos);
    return this.xxh ? (xxh3_128(bytes) as Buffer) : createHash('sha256').update(bytes).digest();
  }

  private ensure(bytes: number): void {
    if (this.buf.length >= bytes) return;
    const grown = Buffer.alloc(Math.max(bytes, this.buf.length * 2));
    this.buf.copy(grown, 0, 0, this.pos);
    this.buf = grown;
  }

  // ------------------------------------------------------------------ canonical CBOR

  /** (parent, tuple(tokens), extra_keys) as cbor2.dumps(..., canonical=True). */
  private cborBlock(
    prev: Buffer,
    tokens: ArrayLike<number>,
    start: number,
    blockSize: number,
    lora: string | null,
    salt: string | null,
  ): void {
    this.pos = 0;
    this.head(4, 3); // (parent, tokens, extra_keys)
    this.head(2, prev.length);
    prev.copy(this.buf, this.pos);
    this.pos += prev.length;
    this.head(4, blockSize);
    for (let i = start, end = start + blockSize; i < end; i++) this.head(0, tokens[i]);
    const keys = (lora ? 1 : 0) + (salt !== null ? 1 : 0);
    if (keys === 0)
      this.buf[this.pos++] = 0xf6; // None
    else {
      this.head(4, keys);
      if (lora) this.text(lora);
      if (salt !== null) this.text(salt);
    }
  }

  /** A CBOR head in its shortest form (canonical): major type and argument. */
  private head(major: number, arg: number): void {
    const m = major << 5;
    const b = this.buf;
    if (arg < 24) b[this.pos++] = m | arg;
    else if (arg < 0x100) {
      b[this.pos++] = m | 24;
      b[this.pos++] = arg;
    } else if (arg < 0x10000) {
      b[this.pos++] = m | 25;
      b.writeUInt16BE(arg, this.pos);
      this.pos += 2;
    } else {
      b[this.pos++] = m | 26;
      b.writeUInt32BE(arg, this.pos);
      this.pos += 4;
    }
  }

  private text(s: string): void {
    const len = Buffer.byteLength(s, 'utf8');
    this.ensure(this.pos + len + 9);
    this.head(3, len);
    this.buf.write(s, this.pos, 'utf8');
    this.pos += len;
  }

  // ------------------------------------------------------------------ pickle protocol 5

  /** (parent, tuple(tokens), extra_keys) as pickle.dumps(..., protocol=5). */
  private pickleBlock(
    prev: Buffer,
    tokens: ArrayLike<number>,
    start: number,
    blockSize: number,
    lora: string | null,
    salt: string | null,
  ): void {
    this.pickleBegin();
    this.pickleBinary(SHORT_BINBYTES, BINBYTES, prev.length);
    prev.copy(this.buf, this.pos);
    this.pos += prev.length;
    this.pickleMemoize();
    this.pickleTupleStart(blockSize);
    for (let i = start, end = start + blockSize; i < end; i++) this.pickleInt(tokens[i]);
    this.pickleTupleEnd(blockSize);
    const keys = (lora ? 1 : 0) + (salt !== null ? 1 : 0);
    if (keys === 0) {
      this.pickleOp(NONE);
      this.pickleBoundary();
    } else {
      this.pickleTupleStart(keys);
      if (lora) this.pickleText(lora);
      if (salt !== null) this.pickleText(salt);
      this.pickleTupleEnd(keys);
    }
    this.pickleTupleEnd(3);
    this.pickleEnd();
  }

  private pickleBegin(): void {
    this.pos = 0;
    this.buf[this.pos++] = PROTO;
    this.buf[this.pos++] = 5;
    this.frameStart = -1;
  }

  /** STOP, and the last frame closed. */
  private pickleEnd(): void {
    this.pickleOp(STOP);
    this.commitFrame();
  }

  /** One opcode byte, in the open frame (opened if none is). */
  private pickleOp(op: number): void {
    if (this.frameStart < 0) {
      this.frameStart = this.pos;
      this.pos += FRAME_HEADER_SIZE;
    }
    this.buf[this.pos++] = op;
  }

  /** After each object saved: a frame that reached 64 KiB is closed (_Pickler_OpcodeBoundary). */
  private pickleBoundary(): void {
    if (this.frameStart >= 0 && this.pos - this.frameStart - FRAME_HEADER_SIZE >= FRAME_SIZE_TARGET) this.commitFrame();
  }

  /** _Pickler_CommitFrame: the FRAME header written, or dropped for a frame under 4 bytes. */
  private commitFrame(): void {
    if (this.frameStart < 0) return;
    const len = this.pos - this.frameStart - FRAME_HEADER_SIZE;
    if (len >= FRAME_SIZE_MIN) {
      this.buf[this.frameStart] = FRAME;
      this.buf.writeUInt32LE(len, this.frameStart + 1);
      this.buf.writeUInt32LE(0, this.frameStart + 5);
    } else {
      this.buf.copyWithin(this.frameStart, this.frameStart + FRAME_HEADER_SIZE, this.pos);
      this.pos -= FRAME_HEADER_SIZE;
    }
    this.frameStart = -1;
  }

  private pickleMemoize(): void {
    this.pickleOp(MEMOIZE);
    this.pickleBoundary();
  }

  /** save_long: the smallest of BININT1, BININT2, BININT (signed 32-bit) or LONG1. */
  private pickleInt(t: number): void {
    const b = this.buf;
    if (t < 0x100) {
      this.pickleOp(BININT1);
      b[this.pos++] = t;
    } else if (t < 0x10000) {
      this.pickleOp(BININT2);
      b.writeUInt16LE(t, this.pos);
      this.pos += 2;
    } else if (t < 0x8000_0000) {
      this.pickleOp(BININT);
      b.writeUInt32LE(t, this.pos);
      this.pos += 4;
    } else {
      // 2^31 to 2^32 - 1: five bytes of little-endian two's complement
      this.pickleOp(LONG1);
      b[this.pos++] = 5;
      b.writeUInt32LE(t, this.pos);
      b[this.pos + 4] = 0;
      this.pos += 5;
    }
    this.pickleBoundary();
  }

  /**
   * The opcode and length of a bytes or str payload of `len` bytes, which the caller writes
   * next; one of 64 KiB or more goes outside any frame (_Pickler_write_bytes).
   */
  private pickleBinary(shortOp: number, longOp: number, len: number): void {
    const b = this.buf;
    if (len >= FRAME_SIZE_TARGET) {
      this.commitFrame();
      b[this.pos++] = longOp;
      b.writeUInt32LE(len, this.pos);
      this.pos += 4;
    } else if (len < 0x100) {
      this.pickleOp(shortOp);
      b[this.pos++] = len;
    } else {
      this.pickleOp(longOp);
      b.writeUInt32LE(len, this.pos);
      this.pos += 4;
    }
  }

  private pickleText(s: string): void {
    const len = Buffer.byteLength(s, 'utf8');
    this.ensure(this.pos + len + 2 * FRAME_HEADER_SIZE + 8);
    this.pickleBinary(SHORT_BINUNICODE, BINUNICODE, len);
    this.buf.write(s, this.pos, 'utf8');
    this.pos += len;
    this.pickleMemoize();
  }

  /** save_tuple: MARK before the items of a tuple of more than 3. */
  private pickleTupleStart(n: number): void {
    if (n > 3) this.pickleOp(MARK);
  }

  /** save_tuple: TUPLE1-3 or TUPLE, then MEMOIZE. */
  private pickleTupleEnd(n: number): void {
    this.pickleOp(n > 3 ? TUPLE : TUPLE1 + n - 1);
    this.pickleMemoize();
  }
}

/** The index key (low 64 bits, as hi/lo) of an engine hash as KV events carry it. */
export function engineHashKey(h: bigint | string, out: Uint32Array): void {
  if (typeof h === 'bigint') {
    out[0] = Number((h >> 32n) & 0xffffffffn);
    out[1] = Number(h & 0xffffffffn);
    return;
  }
  // a digest (hex): its last 8 bytes, big-endian, as vLLM's int form takes them
  const tail = h.length >= 16 ? h.slice(-16) : h.padStart(16, '0');
  out[0] = parseInt(tail.slice(0, 8), 16) >>> 0;
  out[1] = parseInt(tail.slice(8), 16) >>> 0;
}
