/**
 * The first half of the route path: a request's block keys (from tokens, precomputed block
 * ids, chat messages or text) and which workers hold how much of that prefix, including
 * workers whose KV blocks are of another size than the router's. The key and overlap buffers
 * are scratch reused by every route(), so the lookup allocates little.
 */
import { BlockIndex, OverlapResult } from '../block-index.js';
import type { BlockKeying } from '../block-keying.js';
import { checkChatMessages } from '../chat-messages.js';
import {
  BlockHashes,
  canonicalChatText,
  hashPrecomputedBlocks,
  hashTextBlocks,
  TokenBlockKeys,
  type HashNamespace,
} from '../hashing.js';
import type { RequestBlocks } from '../policies/types.js';
import * as check from '../validate.js';
import type { WorkerState } from '../worker-registry.js';
import { PromptTooLongError } from './prompt-too-long.js';
import type { RouteRequest } from './types.js';

export class PrefixLookup {
  /** The request's keys in the router's block size (scratch, valid until the next route()). */
  readonly hashes = new BlockHashes(1024);
  /**
   * Token ids under the router's own keying: keys computed only as far as the route reads
   * them (hashRequest then returns `tokenKeys.computed`, the keys computed so far).
   */
  private readonly tokenKeys = new TokenBlockKeys();
  /** Per worker slot, the blocks of `hashes` it holds (scratch). */
  readonly overlap = new OverlapResult(32);
  /** Workers whose block size is not the router's, by block size (their slots); rebuilt on (un)registration. */
  private otherBlockSizes = new Map<number, number[]>();
  /** Per other block size, the request's keys and overlap (scratch, reused). */
  private readonly sizedHashes = new Map<number, BlockHashes>();
  private readonly sizedOverlap = new OverlapResult(32);

  constructor(
    private readonly index: BlockIndex,
    private readonly keying: BlockKeying,
    private readonly blockSize: number,
    private readonly textChunkBytes: number,
    /** Token ids hashed on demand (tokenKeys); false when the policy reads every key anyway. */
    private readonly keysOnDemand: boolean,
  ) {}

  /** Regroups the workers by block size; call after a worker is registered or removed. */
  groupBlockSizes(workers: Iterable<WorkerState>): void {
    const groups = new Map<number, number[]>();
    for (const w of workers) {
      const bs = w.info.blockSize;
      if (bs === undefined || bs === this.blockSize) continue;
      let slots = groups.get(bs);
      if (!slots) groups.set(bs, (slots = []));
      slots.push(w.slot);
    }
    this.otherBlockSizes = groups;
  }

  /** The request's keys as last computed for workers of `blockSize` (by lookup()), if any. */
  keysInBlockSize(blockSize: number): BlockHashes | undefined {
    return this.sizedHashes.get(blockSize);
  }

  /**
   * The request's block keys. A prompt whose blocks are past `maxPromptTokens` throws
   * PromptTooLongError before it is hashed, whatever `promptTokens` it gives (the blocks are
   * what the index records): precomputed blocks by their count times `blockTokens`, a text or
   * chat by the estimate promptTokensOf makes without a length given. The estimate needs its
   * UTF-8 length alone, where hashing a prompt the router refuses anyway (megabytes of it, as a
   * body may hold) would cost the event loop its encoding and hashing.
   */
  hashRequest(request: RouteRequest, ns: HashNamespace, maxPromptTokens = Infinity): BlockHashes {
    const hashes = this.hashes;
    if (request.tokens !== undefined) {
      if (
        typeof request.tokens !== 'object' ||
        request.tokens === null ||
        !Number.isSafeInteger(request.tokens.length) ||
        request.tokens.length < 0
      )
        throw new TypeError('tokens must be an array of token ids');
      if (this.keying.mode === 'router' && this.keysOnDemand) {
        this.tokenKeys.reset(request.tokens, this.blockSize, ns);
        return this.tokenKeys.computed;
      }
      this.keying.hashTokens(request.tokens, this.blockSize, ns, hashes);
    } else if (request.blockHashes !== undefined) {
      const ids = request.blockHashes;
      if (typeof ids !== 'object' || ids === null) throw new TypeError('blockHashes must be an array');
      // a length that is no count (NaN, -5, 2.5) would be taken as the prompt's blocks: a
      // NaN length left the worker's queued tokens NaN for good, and no route found a worker
      const length: unknown = ids.length;
      if (!(Number.isSafeInteger(length) && (length as number) >= 0))
        throw new TypeError(
          `blockHashes must be an array of block ids (its length a count), got length ${typeof length === 'number' ? length : typeof length}`,
        );
      // the blocks are what the index records, whatever length is given with them: a
      // promptTokens of 1 does not make ten million blocks a short prompt
      const blockTokens = check.positiveInt(request.blockTokens, 'blockTokens', this.blockSize);
      const tokens = (length as number) * blockTokens;
      if (tokens > maxPromptTokens)
        throw new PromptTooLongError(
          tokens,
          maxPromptTokens,
          undefined,
          `blockHashes: ${length as number} blocks of ${blockTokens}`,
        );
      hashPrecomputedBlocks(ids, blockTokens, ns, hashes);
    } else if (request.messages !== undefined) {
      const messages = checkChatMessages(request.messages, undefined, true);
      const text = canonicalChatText(messages);
      this.checkTextLength(text, maxPromptTokens);
      hashTextBlocks(text, this.textChunkBytes, ns, hashes);
      hashes.tokensPerBlock = this.textChunkBytes / 4;
    } else if (request.text !== undefined) {
      if (typeof request.text !== 'string') throw new TypeError('text must be a string');
      this.checkTextLength(request.text, maxPromptTokens);
      hashTextBlocks(request.text, this.textChunkBytes, ns, hashes);
      hashes.tokensPerBlock = this.textChunkBytes / 4;
    } else {
      hashes.length = 0;
      hashes.tokensPerBlock = this.blockSize;
    }
    return hashes;
  }

  /**
   * Throws PromptTooLongError when the estimate promptTokensOf would make of `text` (given no
   * length) is past `maxPromptTokens`, the same count in the same message. A length given
   * (`promptTokens`) does not change what the text's chunks record, so it does not spare the
   * text this check (route() judges that length on its own). A UTF-16 unit is 1 to 3 bytes of
   * UTF-8 (hashTextBlocks encodes a lone surrogate as U+FFFD, 3 bytes, as Buffer.byteLength
   * counts it), so a text within the bound at 3 bytes a unit costs no byte count.
   */
  private checkTextLength(text: string, maxPromptTokens: number): void {
    if (this.textTokens(text.length * 3) <= maxPromptTokens) return;
    const tokens = this.textTokens(Buffer.byteLength(text, 'utf8'));
    if (tokens > maxPromptTokens) throw new PromptTooLongError(tokens, maxPromptTokens);
  }

  /** promptTokensOf's estimate for a text of `bytes` UTF-8 bytes: the full chunks it is hashed in. */
  private textTokens(bytes: number): number {
    return estimatedTokens(Math.floor(bytes / this.textChunkBytes), this.textChunkBytes / 4, true);
  }

  /** The keys of `hashes` computed on demand, if they are (see tokenKeys). */
  private lazyKeys(hashes: BlockHashes): TokenBlockKeys | undefined {
    return hashes === this.tokenKeys.computed ? this.tokenKeys : undefined;
  }

  /** Full blocks of the request whose keys hashRequest returned (computed or not yet). */
  blockCount(hashes: BlockHashes): number {
    return this.lazyKeys(hashes)?.total ?? hashes.length;
  }

  /** Makes sure `hashes` holds the first `n` keys (capped at the request's blocks). */
  ensureKeys(hashes: BlockHashes, n: number): void {
    this.lazyKeys(hashes)?.ensure(n);
  }

  /** All the request's keys, for policies that read them (computed on their first read). */
  sequence(hashes: BlockHashes): RequestBlocks {
    return this.lazyKeys(hashes) ?? hashes;
  }

  /** Prompt length: counted from tokens, else as given, else estimated from the blocks. */
  promptTokensOf(request: RouteRequest, hashes: BlockHashes): number {
    if (request.tokens !== undefined) return request.tokens.length;
    const given = check.nonNegativeInt(request.promptTokens, 'promptTokens', 0);
    if (given > 0 || hashes.length === 0) return given;
    return estimatedTokens(
      hashes.length,
      hashes.tokensPerBlock,
      request.text !== undefined || request.messages !== undefined,
    );
  }

  /**
   * Fills `overlap` with each worker's share of the request's prefix. `matching` false (an
   * isolated request, anchor locality off) or no keys: every worker holds nothing.
   */
  lookup(
    request: RouteRequest,
    hashes: BlockHashes,
    ns: HashNamespace,
    matching: boolean,
    slotCount: number,
    now: number,
  ): OverlapResult {
    const overlap = this.overlap;
    const blocks = this.blockCount(hashes);
    if (matching && blocks > 0) {
      // the walk asks for keys past those computed as it gets there
      this.index.overlaps(hashes.hi, hashes.lo, blocks, overlap, now, this.lazyKeys(hashes), hashes.length);
      // engine-native keys: a block held deeper in the chain implies its prefix (vLLM caches
      // prefixes), even where the router never saw those ancestors stored
      if (this.keying.mode === 'vllm' && request.tokens !== undefined && overlap.maxBlocks < hashes.length)
        this.index.extendToDeepestHeld(hashes.hi, hashes.lo, hashes.length, overlap);
      if (this.otherBlockSizes.size > 0 && request.tokens !== undefined)
        this.overlapOtherBlockSizes(request.tokens, ns, overlap, now);
    } else {
      overlap.ensureSlots(slotCount);
      overlap.blocks.fill(0);
      overlap.offloadBlocks.fill(0);
      overlap.predictedBlocks.fill(0);
      overlap.maxBlocks = 0;
    }
    return overlap;
  }

  /**
   * Workers whose KV blocks are of another size (a worker's `blockSize`, e.g. SGLang with page
   * size 1): the prompt's keys in that size, looked up in the index, give those workers'
   * overlaps, which replace what the router-size lookup found for them.
   */
  private overlapOtherBlockSizes(
    tokens: ArrayLike<number>,
    ns: HashNamespace,
    overlap: OverlapResult,
    now: number,
  ): void {
    const o = this.sizedOverlap;
    for (const [blockSize, slots] of this.otherBlockSizes) {
      let h = this.sizedHashes.get(blockSize);
      if (!h) this.sizedHashes.set(blockSize, (h = new BlockHashes(64)));
      this.keying.hashTokens(tokens, blockSize, ns, h);
      if (h.length > 0) this.index.overlaps(h.hi, h.lo, h.length, o, now);
      if (h.length > 0 && this.keying.mode === 'vllm' && o.maxBlocks < h.length)
        this.index.extendToDeepestHeld(h.hi, h.lo, h.length, o);
      for (const slot of slots) {
        const found = h.length > 0 && slot < o.blocks.length;
        overlap.blocks[slot] = found ? o.blocks[slot] : 0;
        overlap.offloadBlocks[slot] = found ? o.offloadBlocks[slot] : 0;
        overlap.predictedBlocks[slot] = found ? o.predictedBlocks[slot] : 0;
      }
    }
  }
}

/**
 * A prompt's tokens from the blocks it is cut into, when no length is given: `tokensPerBlock`
 * each, and for a text (about 4 bytes of UTF-8 a token) half a chunk for its unhashed tail; a
 * prompt of no block has none.
 */
function estimatedTokens(blocks: number, tokensPerBlock: number, text: boolean): number {
  return blocks === 0 ? 0 : Math.round(blocks * tokensPerBlock + (text ? tokensPerBlock / 2 : 0));
}
