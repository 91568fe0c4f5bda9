import { createHash } from 'node:crypto';
import { Decoder } from '@msgpack/msgpack';
import { errorText, escapedText, SHOWN_CHARS } from '../../core/shown-text.js';

/**
 * vLLM KV events (vllm/distributed/kv_events.py), decoded from msgpack into one shape
 * whatever the encoding (docs/architecture.md §8): the batch as a map {ts, events, data_parallel_rank}
 * or an array [ts, events] / [ts, events, dp_rank]; each event as a map whose "type" names
 * it (newer releases, fields at their default omitted) or an array whose first element is
 * the type (older releases, trailing fields nil or absent). Block hashes are uint64 (kept as
 * BigInt: plain numbers lose bits) or binary digests (kept as hex strings): 32 bytes, or
 * several such concatenated (up to KV_EVENT_LIMITS.maxBlockHashBytes), which are kept as a
 * 32-byte key (longDigestKey).
 */
export type EngineBlockHash = bigint | string;

/**
 * What keyed a block besides its tokens, one entry per block (null: nothing): vLLM's
 * `extra_keys` (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys) — the LoRA
 * name, multimodal (identifier, offset) pairs, the cache salt on a prompt's first block,
 * prompt-embedding digests. Strings, numbers, nested arrays (and maps, which vLLM does not send
 * but as typed keys of a tag this router does not know), at most
 * KV_EVENT_LIMITS.maxExtraKeyDepth levels deep; bytes as {bytes: hex}. Typed keys
 * (event_version 1, as vllm-project/vllm#55488 proposed; closed without merging, so no release
 * sends them) are read as these bare keys (typedExtraKey).
 */
export type ExtraKeys = ReadonlyArray<unknown> | null;

export interface BlockStoredEvent {
  type: 'BlockStored';
  blockHashes: EngineBlockHash[];
  parentBlockHash: EngineBlockHash | null;
  /** Empty for the offloading connector's copies (medium "CPU"): the block is known by hash. */
  tokenIds: number[];
  /** 0 only for a copy without token ids whose size vLLM does not send (its offloading connector). */
  blockSize: number;
  loraId: number | null;
  medium: string | null;
  loraName: string | null;
  groupIdx: number | null;
  extraKeys?: ExtraKeys[] | null;
  /**
   * The KV group's kind: "full_attention", "mla_attention", "sink_full_attention" (the
   * full-prefix kinds, FULL_PREFIX_KINDS), "sliding_window", "mamba", … (null: not sent).
   */
  kvCacheSpecKind?: string | null;
  kvCacheSpecSlidingWindow?: number | null;
  /**
   * SGLang's cache salt, which namespaces the page chain from its root: a `{cache_salt}` map
   * after `medium` in the positional form (sgl-project/sglang#30827), a field of the tagged
   * map since sgl-project/sglang#37482. Present only when the store is salted.
   */
  cacheSalt?: string;
  /**
   * Where the copy is relative to the engine: "LOCAL" (its own) or "REMOTE" (storage it does not
   * own, which other engines may read too), sent by vLLM's storage tiers since
   * vllm-project/vllm#48281 (v0.26.0). Present only when sent: absent, it is unspecified.
   */
  locality?: string;
}

export interface BlockRemovedEvent {
  type: 'BlockRemoved';
  blockHashes: EngineBlockHash[];
  medium: string | null;
  groupIdx: number | null;
  /** As BlockStoredEvent.locality. */
  locality?: string;
}

export interface AllBlocksClearedEvent {
  type: 'AllBlocksCleared';
}

export type KvEvent = BlockStoredEvent | BlockRemovedEvent | AllBlocksClearedEvent;

/**
 * KV group kinds whose blocks hold the KV of every token of the prefix, as full attention does
 * (vllm/v1/kv_cache_interface.py: MLAAttentionSpec and SinkFullAttentionSpec subclass
 * FullAttentionSpec): a prefix hit needs each of their blocks, so they are the ones indexed.
 * Sliding-window, chunked-local and Mamba groups drop (or never keep) earlier tokens' KV.
 */
export const FULL_PREFIX_KINDS: ReadonlySet<string> = new Set([
  'full_attention',
  'mla_attention',
  'sink_full_attention',
]);

/** Whether a KV group of this kv_cache_spec_kind holds every token of its prefix (FULL_PREFIX_KINDS). */
export function isFullPrefixKind(kind: string): boolean {
  return FULL_PREFIX_KINDS.has(kind);
}

/** Why an event of a batch was skipped (a label of the skip counters in /metrics). */
export type DecodeSkipReason = 'unknown_type' | 'bad_field' | 'token_count' | 'bigram_tokens' | 'too_large';

export interface SkippedEvent {
  /** Position of the event in the batch. */
  index: number;
  reason: DecodeSkipReason;
  message: string;
}

export interface KvEventBatch {
  ts: number;
  events: KvEvent[];
  dataParallelRank: number | null;
  /** Events that could not be decoded; the others of the batch still apply. */
  skipped?: SkippedEvent[];
}

/** A payload that is not a valid event batch at all; the message is skipped, nothing applied. */
export class KvEventFormatError extends Error {
  constructor(
    message: string,
    readonly reason: DecodeSkipReason = 'bad_field',
  ) {
    super(message);
    this.name = 'KvEventFormatError';
  }
}

/**
 * Upper bounds that keep a hostile or corrupt payload from exhausting memory or holding the
 * event loop, sized on what engines publish (docs/engines.md):
 * - vLLM publishes one batch per scheduler step (vllm/v1/core/sched/scheduler.py: the block
 *   pool's take_events() and the connector's, as one KVEventBatch). A step stores at most
 *   max_num_batched_tokens / block_size blocks, one BlockStored per request and KV group
 *   (vllm/v1/core/block_pool.py cache_full_blocks), and evicts at most as many blocks as it
 *   allocates, one BlockRemoved per block (_maybe_evict_cached_block): at 131,072 batched
 *   tokens and blocks of 16, about 8,200 stores' worth of 8,192 blocks and 8,192 removals,
 *   ~1 MB. A KV connector that loads a whole prompt caches it in one store: up to
 *   max_model_len tokens in one event.
 * - SGLang (python/sglang/srt/mem_cache, events of python/sglang/srt/disaggregation/kv_events.py)
 *   sends one BlockStored per page and one BlockRemoved per evicted page: at page size 1 a
 *   prefill chunk of 131,072 tokens gives 131,072 stores and as many evictions, 262,144
 *   events in ~9.3 MB — the largest legitimate batches.
 * The batch bounds leave four (events) and three (bytes) times that; such a batch is read
 * and applied in slices (the subscriber yields between them), so it does not hold the loop
 * whole. What is over a bound is refused before it is decoded: a payload over the bytes
 * bound by ZeroMQ as it arrives, a batch over the events bound from its array header.
 */
export const KV_EVENT_LIMITS = {
  maxPayloadBytes: 32 * 1024 * 1024,
  maxEvents: 1_048_576,
  /**
   * Per event: the blocks of one store or removal, and the token ids of one store. One event
   * is decoded and applied at once, so these bound what one event may cost: twice a whole
   * 1M-token prompt in blocks of 16 (131,072 blocks, 2,097,152 token ids). An event over them
   * is skipped (`too_large`); the rest of its batch applies.
   */
  maxBlocksPerEvent: 131_072,
  maxTokensPerEvent: 2_097_152,
  /**
   * Levels an extra_keys entry may nest, the entry itself being the first. vLLM's are a tuple
   * of strings, bytes and (identifier, offset) pairs: two levels, three at most. msgpack
   * decodes any depth without recursion, but reading the keys recurses, so an entry nested
   * 100,000 deep would overflow the stack and cost its whole batch; past this bound only its
   * event is skipped.
   */
  maxExtraKeyDepth: 8,
  /**
   * Levels one event may nest before it is decoded, the event itself being the first: an
   * extra_keys entry is at level 3, so an entry within maxExtraKeyDepth ends at level 10.
   * msgpack's decoder has no depth bound, and builds one array per level: a 32 MiB payload of
   * nested arrays is 33 million of them, gigabytes of heap. The structure pass measures each
   * event's depth on its bytes; what nests deeper is cut (decoded as an empty array at level 11),
   * never built: an extra key so cut is skipped as too deep, a field the router does not read is
   * cut and the event applied.
   */
  maxEventDepth: 10,
  /**
   * msgpack objects (each value, container and map key) one event may hold, counted on its
   * bytes before it is decoded: twice maxTokensPerEvent, room for a store at the token and
   * block bounds with its extra_keys. Each object costs a JS value (an empty array tens of
   * bytes): an event over it is skipped (`too_large`) without being decoded.
   */
  maxElementsPerEvent: 4_194_304,
  /**
   * Bytes of one binary block hash. vLLM's are a 32-byte digest (sha256; 16 for xxhash), or,
   * for a KV group hashed at a step finer than its block (BlockHashListWithBlockSize in
   * vllm/v1/core/kv_cache_utils.py), its sub-blocks' digests concatenated: block size over
   * step times 32 bytes, 4 KiB at a ratio of 128. A longer hash is a `bad_field`.
   */
  maxBlockHashBytes: 4096,
};

/** Binary block hashes up to this long are kept as their hex; longer ones by longDigestKey. */
const HEX_DIGEST_BYTES = 64;

/**
 * The key of a block hash longer than HEX_DIGEST_BYTES (concatenated sub-block digests): the
 * first 24 bytes of its sha256, then its own last 8 bytes, in hex. Every block a worker holds
 * keeps its key, so a 4 KiB digest is not kept whole (8 KiB of hex per block, millions of
 * blocks); it still ends in the digest's low 64 bits, the index key vLLM's int form gives.
 */
function longDigestKey(digest: Uint8Array): string {
  const head = createHash('sha256').update(digest).digest().subarray(0, 24);
  return Buffer.concat([head, digest.subarray(digest.byteLength - 8)]).toString('hex');
}

// Field order of vLLM's structs (vllm/distributed/kv_events.py), which array-like releases
// encode positionally. Older releases send a prefix of these; newer ones may append fields
// this router does not know, which are ignored (as msgspec readers ignore them). `locality`
// (vllm-project/vllm#48281) came after vLLM's events became tagged maps (#42892): it is read
// by name only, never from a position.
const STORED_FIELDS = [
  'block_hashes',
  'parent_block_hash',
  'token_ids',
  'block_size',
  'lora_id',
  'medium',
  'lora_name',
  'extra_keys',
  'group_idx',
  'kv_cache_spec_kind',
  'kv_cache_spec_sliding_window',
] as const;
const REMOVED_FIELDS = ['block_hashes', 'medium', 'group_idx'] as const;
/**
 * Where SGLang's positional BlockStored puts its metadata map (sgl-project/sglang#30827):
 * after the tag and its six fields, the place of vLLM's lora_name.
 */
const SGLANG_METADATA_INDEX = 7;

/** Decodes the small fields of a batch (ts, data_parallel_rank, map keys). */
const fieldDecoder = new Decoder({
  useBigInt64: true,
  maxArrayLength: 64,
  maxMapLength: 64,
  maxStrLength: 1024,
  maxBinLength: 1024,
});
/**
 * Decodes one event: its arrays may reach the per-event bounds (token ids, block hashes),
 * which the event's own checks then enforce field by field.
 */
const eventDecoder = new Decoder({
  useBigInt64: true,
  maxArrayLength: Math.max(KV_EVENT_LIMITS.maxTokensPerEvent, KV_EVENT_LIMITS.maxBlocksPerEvent) + 1,
  maxMapLength: 64,
  maxStrLength: 1 << 20,
  maxBinLength: 1 << 20,
});

/**
 * A batch whose structure has been checked, its events not yet decoded: `read` decodes the
 * events of a range, so that a large batch can be decoded and applied in slices.
 */
export interface EventBatchReader {
  ts: number;
  dataParallelRank: number | null;
  /** Events in the batch. */
  count: number;
  /** Encoded size of the events [from, to), in bytes (to weigh a slice). */
  bytes(from: number, to: number): number;
  /** The events [from, to) decoded; `skipped` indexes count from the batch's start. */
  read(from: number, to: number): KvEventBatch;
}

/**
 * Checks a payload's structure and reads its header fields without decoding its events: one
 * pass over its bytes, allocating nothing per element. A payload that is not a batch throws a
 * KvEventFormatError: over the byte or event bound (`too_large`, the event count being read
 * from the events array's header), not msgpack, or not shaped as a batch.
 */
export function readEventBatch(payload: Uint8Array): EventBatchReader {
  if (payload.byteLength > KV_EVENT_LIMITS.maxPayloadBytes)
    throw new KvEventFormatError(`payload of ${payload.byteLength} bytes is over the limit`, 'too_large');
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const field = (from: number, to: number): unknown => {
    // a header field is a number or a string: a container is none, and is not built (its
    // nesting is unbounded; a map key of one is no field this router reads)
    if (header(payload, view, from).kind !== 'other') return NOT_A_FIELD;
    try {
      return fieldDecoder.decode(payload.subarray(from, to));
    } catch (err) {
      throw new KvEventFormatError(`not msgpack: ${(err as Error).message}`);
    }
  };
  let ts: unknown;
  let rank: unknown = null;
  let events: number | undefined;
  // the events count is checked from its header, before the events are walked
  // the events array: its count checked from its header before anything is walked, then each
  // event's start noted and what it would cost decoded (walkEvent), in the one pass over its
  // bytes: one nested past the depth bound is decoded cut (cutDeep), one of too many objects
  // not at all. Anything else is skipped, and refused below
  let starts = new Uint32Array(1);
  let shapes = new Uint8Array(0);
  const readEvents = (at: number): number => {
    const h = header(payload, view, at);
    if (h.kind !== 'array') return skip(payload, view, at);
    if (h.count > KV_EVENT_LIMITS.maxEvents)
      throw new KvEventFormatError(
        `batch has ${h.count} events, over the limit of ${KV_EVENT_LIMITS.maxEvents}`,
        'too_large',
      );
    // (every event takes a byte: a count past the bytes left is cut short, not allocated for)
    if (h.count > payload.length - h.next) throw truncated();
    starts = new Uint32Array(h.count + 1);
    shapes = new Uint8Array(h.count);
    let next = h.next;
    for (let i = 0; i < h.count; i++) {
      starts[i] = next;
      next = walkEvent(payload, view, next);
      if (walkedElements > KV_EVENT_LIMITS.maxElementsPerEvent) shapes[i] = TOO_MANY;
      else if (walkedDeep) shapes[i] = TOO_DEEP;
    }
    starts[h.count] = next;
    return next;
  };
  const top = header(payload, view, 0);
  let pos = top.next;
  if (top.kind === 'array') {
    if (top.count < 2)
      throw new KvEventFormatError(`batch array must have at least 2 elements (ts, events), got ${top.count}`);
    // [ts, events] or [ts, events, data_parallel_rank]; later fields are ignored
    for (let i = 0; i < top.count; i++) {
      const end = i === 1 ? readEvents(pos) : skip(payload, view, pos);
      if (i === 0) ts = field(pos, end);
      else if (i === 1) events = pos;
      else if (i === 2) rank = field(pos, end);
      pos = end;
    }
  } else if (top.kind === 'map') {
    for (let i = 0; i < top.count; i++) {
      const keyEnd = skip(payload, view, pos);
      const key = field(pos, keyEnd);
      const end = key === 'events' ? readEvents(keyEnd) : skip(payload, view, keyEnd);
      if (key === 'ts') ts = field(keyEnd, end);
      else if (key === 'events') events = keyEnd;
      else if (key === 'data_parallel_rank') rank = field(keyEnd, end);
      pos = end;
    }
  } else {
    skip(payload, view, 0);
    throw new KvEventFormatError('batch must be an array or a map');
  }
  if (pos !== payload.length)
    throw new KvEventFormatError(`not msgpack: ${payload.length - pos} extra bytes after the batch`);
  const tsNumber = typeof ts === 'bigint' ? Number(ts) : ts;
  if (typeof tsNumber !== 'number' || !Number.isFinite(tsNumber))
    throw new KvEventFormatError('batch ts must be a number');
  const list = events === undefined ? undefined : header(payload, view, events);
  if (!list || list.kind !== 'array') throw new KvEventFormatError('batch events must be an array');
  const dataParallelRank = rank === null || rank === undefined ? null : toInt(rank, 'data_parallel_rank');
  return {
    ts: tsNumber,
    dataParallelRank,
    count: list.count,
    bytes: (from, to) => starts[to] - starts[from],
    read(from, to) {
      const raw = new Array<unknown>(to - from);
      const failed = new Map<number, KvEventFormatError>();
      for (let i = from; i < to; i++) {
        if (shapes[i] === TOO_MANY) {
          failed.set(
            i,
            new KvEventFormatError(
              `events[${i}] holds more than ${KV_EVENT_LIMITS.maxElementsPerEvent} msgpack objects, over the limit`,
              'too_large',
            ),
          );
          continue;
        }
        try {
          const bytes =
            shapes[i] === TOO_DEEP
              ? cutDeep(payload, view, starts[i], starts[i + 1])
              : payload.subarray(starts[i], starts[i + 1]);
          raw[i - from] = eventDecoder.decode(bytes);
        } catch (err) {
          // the structure is sound: what fails is an array, a string or a map over its bound
          const message = (err as Error).message;
          failed.set(
            i,
            new KvEventFormatError(
              `events[${i}]: ${message}`,
              /length exceeded/i.test(message) ? 'too_large' : 'bad_field',
            ),
          );
        }
      }
      return decodeEvents(
        tsNumber,
        raw,
        dataParallelRank,
        (e, k) => {
          const err = failed.get(k + from);
          if (err) throw err;
          return e;
        },
        from,
      );
    },
  };
}

/**
 * Decodes one batch. A payload that is not a batch throws a KvEventFormatError; an event that
 * cannot be read is left out and listed in `skipped`, and the rest of the batch still applies.
 */
export function decodeEventBatch(payload: Uint8Array): KvEventBatch {
  const reader = readEventBatch(payload);
  return reader.read(0, reader.count);
}

/** A batch's header field that is an array or a map, left undecoded (no valid field is one). */
const NOT_A_FIELD: unknown = Object.freeze({ notAField: true });

/** Shapes of an event the structure pass found (readEventBatch): nested too deep, or of too many objects. */
const TOO_DEEP = 1;
const TOO_MANY = 2;

type Header = { kind: 'array' | 'map' | 'other'; count: number; next: number };

function header(b: Uint8Array, view: DataView, pos: number): Header {
  if (pos >= b.length) throw truncated();
  const t = b[pos];
  if (t >= 0x90 && t <= 0x9f) return { kind: 'array', count: t & 0x0f, next: pos + 1 };
  if (t >= 0x80 && t <= 0x8f) return { kind: 'map', count: t & 0x0f, next: pos + 1 };
  if (t === 0xdc || t === 0xde) {
    if (pos + 3 > b.length) throw truncated();
    return { kind: t === 0xdc ? 'array' : 'map', count: view.getUint16(pos + 1), next: pos + 3 };
  }
  if (t === 0xdd || t === 0xdf) {
    if (pos + 5 > b.length) throw truncated();
    return { kind: t === 0xdd ? 'array' : 'map', count: view.getUint32(pos + 1), next: pos + 5 };
  }
  return { kind: 'other', count: 0, next: pos };
}

const truncated = () => new KvEventFormatError('not msgpack: the payload ends inside an object');

/**
 * The offset just past the msgpack object at `pos`, found without decoding it: iterative
 * (any nesting depth), and bounded by the payload's length (every element takes a byte, so a
 * count larger than the bytes left is refused at once).
 */
function skip(b: Uint8Array, view: DataView, pos: number): number {
  return walk(b, view, pos, false);
}

/**
 * What the last walkEvent found: the event's msgpack objects (a container cut for its depth
 * counting as one), and whether it nests deeper than KV_EVENT_LIMITS.maxEventDepth.
 */
let walkedElements = 0;
let walkedDeep = false;
/** Per open container of walkEvent, the count of objects still to read at which it ends. */
const levelEnds = new Float64Array(KV_EVENT_LIMITS.maxEventDepth);

/**
 * The offset just past the event at `pos`, as skip finds it, measuring it on the way
 * (walkedElements, walkedDeep) with no allocation. With `cuts`, the [start, end) of each
 * container past KV_EVENT_LIMITS.maxEventDepth is pushed there (cutDeep).
 */
function walkEvent(b: Uint8Array, view: DataView, pos: number, cuts?: number[]): number {
  return walk(b, view, pos, true, cuts);
}

function walk(b: Uint8Array, view: DataView, pos: number, measured: boolean, cuts?: number[]): number {
  const n = b.length;
  const maxDepth = KV_EVENT_LIMITS.maxEventDepth;
  let pending = 1;
  // containers open around the next object (measured only)
  let depth = 0;
  let elements = 0;
  let deep = false;
  while (pending > 0) {
    if (pos >= n) throw truncated();
    if (measured) {
      while (depth > 0 && levelEnds[depth - 1] === pending) depth--;
      elements++;
    }
    const at = pos;
    const t = b[pos++];
    pending--;
    if (t <= 0x7f || t >= 0xe0) continue; // fixint
    /** Objects in the container at `at` (-1: not a container). */
    let children = -1;
    if (t <= 0x8f)
      children = 2 * (t & 0x0f); // fixmap
    else if (t <= 0x9f)
      children = t & 0x0f; // fixarray
    else if (t <= 0xbf)
      pos += t & 0x1f; // fixstr
    else {
      switch (t) {
        case 0xc0: // nil
        case 0xc2: // false
        case 0xc3: // true
          break;
        case 0xcc: // uint8
        case 0xd0: // int8
          pos += 1;
          break;
        case 0xcd: // uint16
        case 0xd1: // int16
          pos += 2;
          break;
        case 0xca: // float32
        case 0xce: // uint32
        case 0xd2: // int32
          pos += 4;
          break;
        case 0xcb: // float64
        case 0xcf: // uint64
        case 0xd3: // int64
          pos += 8;
          break;
        case 0xd4: // fixext 1, 2, 4, 8, 16: a type byte and the data
        case 0xd5:
        case 0xd6:
        case 0xd7:
        case 0xd8:
          pos += 1 + (1 << (t - 0xd4));
          break;
        case 0xc4: // bin 8
        case 0xd9: // str 8
          if (pos + 1 > n) throw truncated();
          pos += 1 + b[pos];
          break;
        case 0xc5: // bin 16
        case 0xda: // str 16
          if (pos + 2 > n) throw truncated();
          pos += 2 + view.getUint16(pos);
          break;
        case 0xc6: // bin 32
        case 0xdb: // str 32
          if (pos + 4 > n) throw truncated();
          pos += 4 + view.getUint32(pos);
          break;
        case 0xc7: // ext 8, 16, 32: a length, a type byte and the data
          if (pos + 1 > n) throw truncated();
          pos += 2 + b[pos];
          break;
        case 0xc8:
          if (pos + 2 > n) throw truncated();
          pos += 3 + view.getUint16(pos);
          break;
        case 0xc9:
          if (pos + 4 > n) throw truncated();
          pos += 5 + view.getUint32(pos);
          break;
        case 0xdc: // array 16
          if (pos + 2 > n) throw truncated();
          children = view.getUint16(pos);
          pos += 2;
          break;
        case 0xdd: // array 32
          if (pos + 4 > n) throw truncated();
          children = view.getUint32(pos);
          pos += 4;
          break;
        case 0xde: // map 16
          if (pos + 2 > n) throw truncated();
          children = 2 * view.getUint16(pos);
          pos += 2;
          break;
        case 0xdf: // map 32
          if (pos + 4 > n) throw truncated();
          children = 2 * view.getUint32(pos);
          pos += 4;
          break;
        default: // 0xc1, never used
          throw new KvEventFormatError(`not msgpack: invalid byte 0x${t.toString(16)} at ${pos - 1}`);
      }
    }
    if (children > 0) {
      if (measured && depth >= maxDepth) {
        // a container past the depth bound (at level depth + 1): passed over whole, uncounted
        const end = walk(b, view, at, false);
        deep = true;
        cuts?.push(at, end);
        pos = end;
        continue;
      }
      if (measured) levelEnds[depth++] = pending;
      pending += children;
    }
    if (pending > n - pos) throw truncated();
  }
  if (pos > n) throw truncated();
  if (measured) {
    walkedElements = elements;
    walkedDeep = deep;
  }
  return pos;
}

/**
 * The event b[from, to) with each container past KV_EVENT_LIMITS.maxEventDepth replaced by an
 * empty array (one byte), at the same level: the event decodes to what it would be read as
 * (its extra key too deep, its type no known one), with nothing deeper built.
 */
function cutDeep(b: Uint8Array, view: DataView, from: number, to: number): Uint8Array {
  const cuts: number[] = [];
  walkEvent(b, view, from, cuts);
  const parts: Uint8Array[] = [];
  let at = from;
  for (let k = 0; k < cuts.length; k += 2) {
    parts.push(b.subarray(at, cuts[k]), EMPTY_ARRAY);
    at = cuts[k + 1];
  }
  parts.push(b.subarray(at, to));
  return Buffer.concat(parts);
}

const EMPTY_ARRAY = Uint8Array.of(0x90);

/** `prepare` rewrites an event before it is decoded; a KvEventFormatError of it skips the event. */
function decodeEvents(
  ts: number,
  events: unknown[],
  dataParallelRank: number | null,
  prepare: (e: unknown, i: number) => unknown = (e) => e,
  /** Index in its batch of the first of `events` (when read in slices). */
  first = 0,
): KvEventBatch {
  const out: KvEvent[] = [];
  let skipped: SkippedEvent[] | undefined;
  for (let i = 0; i < events.length; i++) {
    try {
      out.push(decodeEvent(prepare(events[i], i), first + i));
    } catch (err) {
      // an error no check foresaw is still this event's alone: it is skipped, the rest applies
      const e =
        err instanceof KvEventFormatError
          ? err
          : new KvEventFormatError(`events[${first + i}] could not be read: ${errorText(err)}`);
      (skipped ??= []).push({ index: first + i, reason: e.reason, message: e.message });
    }
  }
  const batch: KvEventBatch = { ts, events: out, dataParallelRank };
  if (skipped) batch.skipped = skipped;
  return batch;
}

function decodeEvent(e: unknown, i: number): KvEvent {
  let type: unknown;
  let fields: Record<string, unknown>;
  if (Array.isArray(e)) {
    type = e[0];
    if (!isEventType(type))
      throw new KvEventFormatError(`events[${i}]: unknown event type ${shownValue(type)}`, 'unknown_type');
    const names = type === 'BlockStored' ? STORED_FIELDS : type === 'BlockRemoved' ? REMOVED_FIELDS : [];
    fields = {};
    names.forEach((name, k) => (fields[name] = e[k + 1] ?? null));
    // SGLang's salted store: its metadata map where vLLM has lora_name, and nothing after it
    const sglangMetadata = type === 'BlockStored' ? e[SGLANG_METADATA_INDEX] : undefined;
    if (isMap(sglangMetadata)) {
      for (const name of STORED_FIELDS.slice(SGLANG_METADATA_INDEX - 1)) fields[name] = null;
      fields.cache_salt = sglangMetadata.cache_salt ?? null;
    }
  } else if (isMap(e)) {
    type = e.type;
    if (!isEventType(type))
      throw new KvEventFormatError(`events[${i}]: unknown event type ${shownValue(type)}`, 'unknown_type');
    fields = e;
  } else {
    throw new KvEventFormatError(`events[${i}] must be an array or a map`);
  }
  const at = `events[${i}] (${type})`;
  switch (type) {
    case 'BlockStored': {
      const blockHashes = hashList(fields.block_hashes, `${at}.block_hashes`);
      const tokenIds = fields.token_ids;
      if (!Array.isArray(tokenIds)) throw new KvEventFormatError(`${at}.token_ids must be an array`);
      if (tokenIds.length > KV_EVENT_LIMITS.maxTokensPerEvent)
        throw new KvEventFormatError(`${at}.token_ids has ${tokenIds.length} ids, over the limit`, 'too_large');
      const tokens = new Array<number>(tokenIds.length);
      for (let k = 0; k < tokenIds.length; k++) {
        const t = tokenIds[k];
        const n = typeof t === 'bigint' ? Number(t) : t;
        if (typeof n === 'number' && Number.isInteger(n) && n >= 0 && n <= 0xffffffff) {
          tokens[k] = n;
          continue;
        }
        // SGLang with EAGLE speculative decoding sends (token, next token) pairs
        if (Array.isArray(t))
          throw new KvEventFormatError(
            `${at}.token_ids[${k}] is a token pair (SGLang bigram keys), which this router does not index`,
            'bigram_tokens',
          );
        throw new KvEventFormatError(`${at}.token_ids[${k}] must be a uint32`);
      }
      const blockSize = toInt(fields.block_size, `${at}.block_size`);
      // vLLM's offloading connector sends its tokenless copies with block_size 0 (the chunk's
      // size is not sent); a store with tokens needs its real block size
      if (blockSize < (tokens.length === 0 ? 0 : 1))
        throw new KvEventFormatError(`${at}.block_size must be >= 1 (0 only without token ids)`);
      const kind = optionalString(fields.kv_cache_spec_kind, `${at}.kv_cache_spec_kind`);
      const groupIdx = optionalInt(fields.group_idx, `${at}.group_idx`);
      // token_ids covers every block (empty for an offloaded copy). A sliding-window or Mamba
      // group leaves its null blocks out of block_hashes while token_ids spans the range, so
      // only a full-prefix (or unlabelled first) group must match exactly.
      const fullAttention = kind === null ? groupIdx === null || groupIdx === 0 : isFullPrefixKind(kind);
      if (tokens.length !== 0 && tokens.length !== blockHashes.length * blockSize && fullAttention) {
        throw new KvEventFormatError(
          `${at}: ${tokens.length} token ids for ${blockHashes.length} blocks of ${blockSize}`,
          'token_count',
        );
      }
      const cacheSalt = optionalString(fields.cache_salt, `${at}.cache_salt`);
      const locality = optionalString(fields.locality, `${at}.locality`);
      const extraKeys = extraKeyList(fields.extra_keys, `${at}.extra_keys`);
      if (extraKeys !== null && extraKeys.length !== blockHashes.length)
        throw new KvEventFormatError(
          `${at}.extra_keys has ${extraKeys.length} entries for ${blockHashes.length} blocks`,
        );
      return {
        type,
        blockHashes,
        parentBlockHash:
          fields.parent_block_hash === null || fields.parent_block_hash === undefined
            ? null
            : hash(fields.parent_block_hash, `${at}.parent_block_hash`),
        tokenIds: tokens,
        blockSize,
        loraId: optionalInt(fields.lora_id, `${at}.lora_id`),
        medium: optionalString(fields.medium, `${at}.medium`),
        loraName: optionalString(fields.lora_name, `${at}.lora_name`),
        extraKeys,
        groupIdx,
        kvCacheSpecKind: kind,
        kvCacheSpecSlidingWindow: optionalInt(
          fields.kv_cache_spec_sliding_window,
          `${at}.kv_cache_spec_sliding_window`,
        ),
        // an empty salt is no salt, as both engines take it
        ...(cacheSalt ? { cacheSalt } : {}),
        ...(locality !== null ? { locality } : {}),
      };
    }
    case 'BlockRemoved': {
      const locality = optionalString(fields.locality, `${at}.locality`);
      return {
        type,
        blockHashes: hashList(fields.block_hashes, `${at}.block_hashes`),
        medium: optionalString(fields.medium, `${at}.medium`),
        groupIdx: optionalInt(fields.group_idx, `${at}.group_idx`),
        ...(locality !== null ? { locality } : {}),
      };
    }
    case 'AllBlocksCleared':
      return { type };
  }
}

function isEventType(v: unknown): v is KvEvent['type'] {
  return v === 'BlockStored' || v === 'BlockRemoved' || v === 'AllBlocksCleared';
}

/** Items of an array (or entries of a map) shownValue shows, and the levels it goes down. */
const SHOWN_ITEMS = 4;
const SHOWN_LEVELS = 3;

/**
 * A decoded value from a payload as a message shows it, on one line: strings quoted, cut and
 * escaped (escapedText), numbers and BigInts as digits, bytes by their length, arrays and maps
 * by their first items down a few levels, with their length. Bounded whatever the value (a
 * 1 MB string, an array of millions, a BigInt, a deep nesting) and never throws, as a message
 * about a foreign payload must not (JSON.stringify throws on a BigInt and on a deep nesting).
 */
export function shownValue(v: unknown, levels = SHOWN_LEVELS): string {
  if (typeof v === 'string') return `"${escapedText(v, SHOWN_CHARS)}"`;
  if (typeof v === 'bigint' || typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (v === null || v === undefined) return String(v);
  if (v instanceof Uint8Array) return `<${v.byteLength} bytes>`;
  if (Array.isArray(v)) {
    if (v.length === 0) return '[]';
    if (levels <= 0) return `[… (${v.length} items)]`;
    const items = v.slice(0, SHOWN_ITEMS).map((x) => shownValue(x, levels - 1));
    return `[${items.join(', ')}${v.length > SHOWN_ITEMS ? `, … (${v.length} items)` : ''}]`;
  }
  if (isMap(v)) {
    const keys = Object.keys(v);
    if (keys.length === 0) return '{}';
    if (levels <= 0) return `{… (${keys.length} entries)}`;
    const entries = keys.slice(0, SHOWN_ITEMS).map((k) => `${shownValue(k, 0)}: ${shownValue(v[k], levels - 1)}`);
    return `{${entries.join(', ')}${keys.length > SHOWN_ITEMS ? `, … (${keys.length} entries)` : ''}}`;
  }
  return `<${typeof v}>`;
}

function extraKeyList(v: unknown, at: string): ExtraKeys[] | null {
  if (v === null || v === undefined) return null;
  if (!Array.isArray(v)) throw new KvEventFormatError(`${at} must be an array`);
  return v.map((k, i) => {
    if (k === null || k === undefined) return null;
    if (!Array.isArray(k)) throw new KvEventFormatError(`${at}[${i}] must be an array or null`);
    return k.map((key, j) => typedExtraKey(key, `${at}[${i}]`, j));
  });
}

/**
 * Key `j` of the extra_keys entry at `at` (the entry being level 1, the key level 2). An event
 * of event_version 1, as vllm-project/vllm#55488 proposed it (closed without merging: no release
 * sends it), sends each key as a tagged map (ExtraKey, built by extra_keys_to_typed): it is read as the bare key of earlier releases it stands for, the
 * form the applier reads — {type: "lora", name} as the name, {type: "cache_salt", salt} as the
 * salt, {type: "mm", modality, hash, block_offset} as the pair [hash, block_offset],
 * {type: "prompt_embeds", hash} as the digest ({bytes: hex}), {type: "legacy", value} as the
 * value. A map of one of these tags without its fields (or with one of the wrong type) skips
 * its event; a map of another tag (a newer kind of key) is kept as it is.
 */
function typedExtraKey(key: unknown, at: string, j: number): unknown {
  const tag = isMap(key) ? key.type : undefined;
  if (!isMap(key) || typeof tag !== 'string') return plainKey(key, 2, at);
  const field = (name: string, valid: (v: unknown) => boolean, what: string): unknown => {
    const v = Object.hasOwn(key, name) ? key[name] : undefined;
    if (!valid(v)) throw new KvEventFormatError(`${at}[${j}] (${tag}) must have ${what} ${name}`);
    return v;
  };
  const isString = (v: unknown) => typeof v === 'string';
  switch (tag) {
    case 'lora':
      return field('name', isString, 'a string');
    case 'cache_salt':
      return field('salt', isString, 'a string');
    case 'mm': {
      field('modality', isString, 'a string');
      const hash = field('hash', isString, 'a string');
      const offset = field('block_offset', (v) => typeof v === 'bigint' || Number.isSafeInteger(v), 'an integer');
      return [hash, toInt(offset, `${at}[${j}].block_offset`)];
    }
    case 'prompt_embeds': {
      const digest = field('hash', (v) => v instanceof Uint8Array, 'a bytes');
      return plainKey(digest, 2, at);
    }
    case 'legacy': {
      // the key as vLLM had it, of any shape; it is within the map, so a level deeper
      const value = field('value', (v) => v !== undefined, 'a');
      return plainKey(value, 3, at);
    }
    default:
      return plainKey(key, 2, at);
  }
}

/**
 * An extra key as plain data: bytes become {bytes: hex} (never mistaken for a salt string),
 * safe integers numbers, inside arrays and maps alike (the applier serialises multimodal keys,
 * which a BigInt or a nesting too deep for the stack would break). `depth` is the level `v`
 * is at if it is an array or a map; past KV_EVENT_LIMITS.maxExtraKeyDepth the event is
 * skipped, which also bounds this recursion whatever the payload nests.
 */
function plainKey(v: unknown, depth: number, at: string): unknown {
  if (v instanceof Uint8Array) return { bytes: Buffer.from(v).toString('hex') };
  if (typeof v === 'bigint') return Number.isSafeInteger(Number(v)) ? Number(v) : v.toString();
  const array = Array.isArray(v);
  if (!array && !isMap(v)) return v;
  if (depth > KV_EVENT_LIMITS.maxExtraKeyDepth)
    throw new KvEventFormatError(`${at} nests deeper than ${KV_EVENT_LIMITS.maxExtraKeyDepth} levels`);
  if (array) return v.map((x) => plainKey(x, depth + 1, at));
  return Object.fromEntries(Object.entries(v).map(([key, x]) => [key, plainKey(x, depth + 1, at)]));
}

function isMap(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof Uint8Array);
}

function hashList(v: unknown, at: string): EngineBlockHash[] {
  if (!Array.isArray(v)) throw new KvEventFormatError(`${at} must be an array`);
  if (v.length > KV_EVENT_LIMITS.maxBlocksPerEvent)
    throw new KvEventFormatError(`${at} has ${v.length} hashes, over the limit`, 'too_large');
  return v.map((h, k) => hash(h, `${at}[${k}]`));
}

function hash(v: unknown, at: string): EngineBlockHash {
  if (typeof v === 'bigint') return BigInt.asUintN(64, v);
  // a number past 2^53 has lost bits (msgpack sends integers as such; only floats get here)
  if (typeof v === 'number' && Number.isSafeInteger(v)) return BigInt.asUintN(64, BigInt(v));
  if (typeof v === 'number' && Number.isInteger(v))
    throw new KvEventFormatError(`${at} is a number past 2^53, which has lost bits: send it as an integer or string`);
  if (v instanceof Uint8Array) {
    if (v.byteLength === 0 || v.byteLength > KV_EVENT_LIMITS.maxBlockHashBytes)
      throw new KvEventFormatError(`${at} must be 1-${KV_EVENT_LIMITS.maxBlockHashBytes} bytes, got ${v.byteLength}`);
    return v.byteLength > HEX_DIGEST_BYTES ? longDigestKey(v) : Buffer.from(v).toString('hex');
  }
  throw new KvEventFormatError(`${at} must be an integer or bytes`);
}

function toInt(v: unknown, at: string): number {
  const n = typeof v === 'bigint' ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isSafeInteger(n)) throw new KvEventFormatError(`${at} must be an integer`);
  return n;
}

function optionalInt(v: unknown, at: string): number | null {
  return v === null || v === undefined ? null : toInt(v, at);
}

function optionalString(v: unknown, at: string): string | null {
  if (v === null || v === undefined) return null;
  if (typeof v !== 'string') throw new KvEventFormatError(`${at} must be a string`);
  return v;
}

/**
 * KV events given as JSON (the gateway's /admin/events, for engines without ZeroMQ): a list
 * of events with vLLM's field names; hashes as integers or as decimal or 0x-hex strings
 * (JSON numbers lose bits above 2^53, so large hashes must be strings). A list that is not
 * one of objects throws; an event with a bad field, a bad hash string among them, is skipped.
 */
export function decodeJsonEvents(events: unknown): KvEventBatch {
  const reader = readJsonEvents(events);
  return reader.read(0, reader.count);
}

/** KV events given as JSON, checked as a list and read in slices (decodeJsonEvents reads them at once). */
export interface JsonEventsReader {
  /** Events in the list. */
  count: number;
  /** Token ids and block hashes of event `i` as given (what decoding and applying it costs); 0 when it has none. */
  size(i: number): number;
  /** The events [from, to) decoded; `skipped` indexes count from the list's start. */
  read(from: number, to: number): KvEventBatch;
}

/**
 * Checks a list of KV events given as JSON (decodeJsonEvents): throws a KvEventFormatError when
 * it is not a list of at most 100,000 objects; its events are decoded as they are read.
 */
export function readJsonEvents(events: unknown): JsonEventsReader {
  if (!Array.isArray(events)) throw new KvEventFormatError('events must be an array');
  if (events.length > 100_000) throw new KvEventFormatError('too many events in one call');
  const toHash = (v: unknown, at: string): unknown => {
    if (typeof v === 'string') {
      if (!/^(0x[0-9a-fA-F]{1,16}|[0-9]{1,20})$/.test(v) || BigInt(v) >= 1n << 64n)
        throw new KvEventFormatError(`${at} must be an integer or a decimal/0x-hex string below 2^64`);
      return BigInt(v);
    }
    return v;
  };
  events.forEach((e, i) => {
    if (e === null || typeof e !== 'object' || Array.isArray(e))
      throw new KvEventFormatError(`events[${i}] must be an object`);
  });
  const ts = Date.now() / 1000;
  const lengthOf = (v: unknown) => (Array.isArray(v) ? v.length : 0);
  return {
    count: events.length,
    size: (i) => {
      const e = events[i] as Record<string, unknown>;
      return lengthOf(e.token_ids) + lengthOf(e.block_hashes);
    },
    // a bad hash string skips its own event (a bad_field), as a bad number does
    read: (from, to) =>
      decodeEvents(
        ts,
        events.slice(from, to),
        null,
        (e, i) => {
          const m = { ...(e as Record<string, unknown>) };
          if (Array.isArray(m.block_hashes))
            m.block_hashes = m.block_hashes.map((h, k) => toHash(h, `events[${from + i}].block_hashes[${k}]`));
          if (m.parent_block_hash !== undefined && m.parent_block_hash !== null)
            m.parent_block_hash = toHash(m.parent_block_hash, `events[${from + i}].parent_block_hash`);
          return m;
        },
        from,
      ),
  };
}
