import { createHash } from 'node:crypto';
import type { BlockHashes } from './hashing.js';

/**
 * vLLM's own prefix-cache block hash, for `serve --block-hash vllm`: with it the router keys
 * its index by the hashes the engine reports, so a request's blocks match an engine's blocks
 * without the router having seen the chain of stores that led to them (a router that joined
 * late, or stores whose parent it missed).
 *
 * vLLM (vllm/v1/core/kv_cache_utils.py, hash_block_tokens and init_none_hash; the hash
 * function from vllm/utils/hashing.py) computes, for each full block of `block_size` tokens:
 *
 *   hash = sha256(cbor2.dumps((parent or NONE_HASH, tuple(block_tokens), extra_keys), canonical=True))
 *   NONE_HASH = sha256_cbor(os.getenv("PYTHONHASHSEED"))       (random when the variable is unset)
 *
 * with `--prefix-caching-hash-algo sha256_cbor`. The parent is the previous block's 32-byte
 * digest. extra_keys (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys) is None
 * or a tuple: the LoRA name, multimodal (identifier, offset) pairs, the cache salt (first
 * block only), prompt-embedding digests. KV events carry the digest, or with
 * VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 its low 64 bits as an integer
 * (`int.from_bytes(digest, "big") & (2**64 - 1)`, maybe_convert_block_hash); the router's key
 * for a block is those low 64 bits either way. llm-d computes the same hashes for its index
 * (llm-d/llm-d-kv-cache-manager pkg/kvcache/kvblock/token_processor.go).
 *
 * Checked against Python's cbor2 + hashlib on the cases in
 * test/fixtures/kv-events/vllm-block-hash.json (scripts/gen-kv-event-fixtures.py).
 */
export interface VllmExtraKeys {
  lora?: string | null;
  cacheSalt?: string | null;
}

export class VllmBlockHasher {
  /** NONE_HASH: the parent of every chain's first block. */
  readonly noneHash: Buffer;
  private buf = Buffer.alloc(1024);
  private pos = 0;

  /** `pythonHashSeed`: the engine's PYTHONHASHSEED, as the string it is in the environment. */
  constructor(readonly pythonHashSeed: string) {
    if (typeof pythonHashSeed !== 'string' || pythonHashSeed === '')
      throw new TypeError('pythonHashSeed must be a non-empty string');
    this.pos = 0;
    this.text(pythonHashSeed);
    this.noneHash = createHash('sha256').update(this.buf.subarray(0, this.pos)).digest();
  }

  /**
   * The 32-byte digests of every full block of `tokens`, chained from `parent` (default:
   * NONE_HASH, a prompt's start).
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
      out.hi[out.length] = d.readUInt32BE(24);
      out.lo[out.length] = d.readUInt32BE(28);
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
    let prev = parent ?? this.noneHash;
    for (let b = 0; b < n; b++) {
      this.pos = 0;
      this.ensure(64 + blockSize * 5 + 2 * ((extra.lora?.length ?? 0) + (extra.cacheSalt?.length ?? 0)) * 3);
      this.head(4, 3); // (parent, tokens, extra_keys)
      this.head(2, prev.length);
      prev.copy(this.buf, this.pos);
      this.pos += prev.length;
      this.head(4, blockSize);
      for (let i = b * blockSize, end = i + blockSize; i < end; i++) {
        const t = tokens[i];
        if (t !== t >>> 0) throw new RangeError(`tokens[${i}] must be an integer in [0, 2^32), got ${t}`);
        this.head(0, t);
      }
      // extra_keys: LoRA name on every block, the salt on a prompt's first block only
      const salt = b === 0 && parent === null && extra.cacheSalt ? extra.cacheSalt : null;
      const keys = (extra.lora ? 1 : 0) + (salt !== null ? 1 : 0);
      if (keys === 0)
        this.buf[this.pos++] = 0xf6; // None
      else {
        this.head(4, keys);
        if (extra.lora) this.text(extra.lora);
        if (salt !== null) this.text(salt);
      }
      prev = createHash('sha256').update(this.buf.subarray(0, this.pos)).digest();
      emit(prev);
    }
  }

  private ensure(bytes: number): void {
    if (this.buf.length >= bytes) return;
    const grown = Buffer.alloc(Math.max(bytes, this.buf.length * 2));
    this.buf.copy(grown, 0, 0, this.pos);
    this.buf = grown;
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
