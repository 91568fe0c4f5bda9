import { decode as msgpackDecode } from '@msgpack/msgpack';

/**
 * vLLM KV events (vllm/distributed/kv_events.py), decoded from msgpack into one shape
 * whatever the encoding (docs/architecture.md §8): the batch as a map {ts, events, data_parallel_rank}
 * or an array [ts, events] / [ts, events, dp_rank]; each event as a map whose "type" names
 * it (newer releases, fields at their default omitted) or an array whose first element is
 * the type (older releases, trailing fields nil or absent). Block hashes are uint64 (kept as
 * BigInt: plain numbers lose bits) or 32-byte binary digests (kept as hex strings).
 */
export type EngineBlockHash = bigint | string;

/**
 * What keyed a block besides its tokens, one entry per block (null: nothing): vLLM's
 * `extra_keys` (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys) — the LoRA
 * name, multimodal (identifier, offset) pairs, the cache salt on a prompt's first block,
 * prompt-embedding digests. Strings, numbers, nested arrays (and maps, which vLLM does not send),
 * at most KV_EVENT_LIMITS.maxExtraKeyDepth levels deep; bytes as {bytes: hex}.
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
  /** The KV group's kind: "full_attention", "sliding_window", "mamba", … (null: not sent). */
  kvCacheSpecKind?: string | null;
  kvCacheSpecSlidingWindow?: number | null;
  /**
   * SGLang's cache salt, which namespaces the page chain from its root: a `{cache_salt}` map
   * after `medium` in the positional form (sgl-project/sglang#30827), a field of the tagged
   * map since sgl-project/sglang#37482. Present only when the store is salted.
   */
  cacheSalt?: string;
}

export interface BlockRemovedEvent {
  type: 'BlockRemoved';
  blockHashes: EngineBlockHash[];
  medium: string | null;
  groupIdx: number | null;
}

export interface AllBlocksClearedEvent {
  type: 'AllBlocksCleared';
}

export type KvEvent = BlockStoredEvent | BlockRemovedEvent | AllBlocksClearedEvent;

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

/** Upper bounds that keep a hostile or corrupt payload from exhausting memory. */
export const KV_EVENT_LIMITS = {
  maxPayloadBytes: 64 * 1024 * 1024,
  maxEvents: 1_000_000,
  maxBlocksPerEvent: 1_000_000,
  /**
   * Levels an extra_keys entry may nest, the entry itself being the first. vLLM's are a tuple
   * of strings, bytes and (identifier, offset) pairs: two levels, three at most. msgpack
   * decodes any depth without recursion, but reading the keys recurses, so an entry nested
   * 100,000 deep would overflow the stack and cost its whole batch; past this bound only its
   * event is skipped.
   */
  maxExtraKeyDepth: 8,
};

// Field order of vLLM's structs (vllm/distributed/kv_events.py), which array-like releases
// encode positionally. Older releases send a prefix of these; newer ones may append fields
// this router does not know, which are ignored (as msgspec readers ignore them).
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

/**
 * Decodes one batch. A payload that is not a batch throws a KvEventFormatError; an event that
 * cannot be read is left out and listed in `skipped`, and the rest of the batch still applies.
 */
export function decodeEventBatch(payload: Uint8Array): KvEventBatch {
  if (payload.byteLength > KV_EVENT_LIMITS.maxPayloadBytes)
    throw new KvEventFormatError(`payload of ${payload.byteLength} bytes is over the limit`, 'too_large');
  let raw: unknown;
  try {
    raw = msgpackDecode(payload, {
      useBigInt64: true,
      maxArrayLength: KV_EVENT_LIMITS.maxEvents,
      maxMapLength: 64,
      maxStrLength: 1 << 20,
      maxBinLength: 1 << 20,
    });
  } catch (err) {
    throw new KvEventFormatError(`not msgpack: ${(err as Error).message}`);
  }
  let ts: unknown;
  let events: unknown;
  let rank: unknown;
  if (Array.isArray(raw)) {
    if (raw.length < 2)
      throw new KvEventFormatError(`batch array must have at least 2 elements (ts, events), got ${raw.length}`);
    // [ts, events] or [ts, events, data_parallel_rank]; later fields are ignored
    [ts, events, rank = null] = raw;
  } else if (isMap(raw)) {
    ts = raw.ts;
    events = raw.events;
    rank = raw.data_parallel_rank ?? null;
  } else {
    throw new KvEventFormatError('batch must be an array or a map');
  }
  const tsNumber = typeof ts === 'bigint' ? Number(ts) : ts;
  if (typeof tsNumber !== 'number' || !Number.isFinite(tsNumber))
    throw new KvEventFormatError('batch ts must be a number');
  if (!Array.isArray(events)) throw new KvEventFormatError('batch events must be an array');
  return decodeEvents(tsNumber, events, rank === null ? null : toInt(rank, 'data_parallel_rank'));
}

/** `prepare` rewrites an event before it is decoded; a KvEventFormatError of it skips the event. */
function decodeEvents(
  ts: number,
  events: unknown[],
  dataParallelRank: number | null,
  prepare: (e: unknown, i: number) => unknown = (e) => e,
): KvEventBatch {
  const out: KvEvent[] = [];
  let skipped: SkippedEvent[] | undefined;
  for (let i = 0; i < events.length; i++) {
    try {
      out.push(decodeEvent(prepare(events[i], i), i));
    } catch (err) {
      if (!(err instanceof KvEventFormatError)) throw err;
      (skipped ??= []).push({ index: i, reason: err.reason, message: err.message });
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
    if (type !== 'BlockStored' && type !== 'BlockRemoved' && type !== 'AllBlocksCleared') {
      throw new KvEventFormatError(`events[${i}]: unknown event type ${JSON.stringify(type)}`, 'unknown_type');
    }
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
    fields = e;
  } else {
    throw new KvEventFormatError(`events[${i}] must be an array or a map`);
  }
  const at = `events[${i}] (${String(type)})`;
  switch (type) {
    case 'BlockStored': {
      const blockHashes = hashList(fields.block_hashes, `${at}.block_hashes`);
      const tokenIds = fields.token_ids;
      if (!Array.isArray(tokenIds)) throw new KvEventFormatError(`${at}.token_ids must be an array`);
      if (tokenIds.length > KV_EVENT_LIMITS.maxBlocksPerEvent * 64)
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
      // only a full-attention (or unlabelled first) group must match exactly.
      const fullAttention = kind === null ? groupIdx === null || groupIdx === 0 : kind === 'full_attention';
      if (tokens.length !== 0 && tokens.length !== blockHashes.length * blockSize && fullAttention) {
        throw new KvEventFormatError(
          `${at}: ${tokens.length} token ids for ${blockHashes.length} blocks of ${blockSize}`,
          'token_count',
        );
      }
      const cacheSalt = optionalString(fields.cache_salt, `${at}.cache_salt`);
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
      };
    }
    case 'BlockRemoved':
      return {
        type,
        blockHashes: hashList(fields.block_hashes, `${at}.block_hashes`),
        medium: optionalString(fields.medium, `${at}.medium`),
        groupIdx: optionalInt(fields.group_idx, `${at}.group_idx`),
      };
    case 'AllBlocksCleared':
      return { type };
    default:
      throw new KvEventFormatError(`events[${i}]: unknown event type ${JSON.stringify(type)}`, 'unknown_type');
  }
}

function extraKeyList(v: unknown, at: string): ExtraKeys[] | null {
  if (v === null || v === undefined) return null;
  if (!Array.isArray(v)) throw new KvEventFormatError(`${at} must be an array`);
  return v.map((k, i) => {
    if (k === null || k === undefined) return null;
    if (!Array.isArray(k)) throw new KvEventFormatError(`${at}[${i}] must be an array or null`);
    return plainKey(k, 1, `${at}[${i}]`) as unknown[];
  });
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
    throw new KvEventFormatError(`${at} has ${v.length} hashes, over the limit`);
  return v.map((h, k) => hash(h, `${at}[${k}]`));
}

function hash(v: unknown, at: string): EngineBlockHash {
  if (typeof v === 'bigint') return BigInt.asUintN(64, v);
  // a number past 2^53 has lost bits (msgpack sends integers as such; only floats get here)
  if (typeof v === 'number' && Number.isSafeInteger(v)) return BigInt.asUintN(64, BigInt(v));
  if (typeof v === 'number' && Number.isInteger(v))
    throw new KvEventFormatError(`${at} is a number past 2^53, which has lost bits: send it as an integer or string`);
  if (v instanceof Uint8Array) {
    if (v.byteLength === 0 || v.byteLength > 64)
      throw new KvEventFormatError(`${at} must be 1-64 bytes, got ${v.byteLength}`);
    return Buffer.from(v).toString('hex');
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
  // a bad hash string skips its own event (a bad_field), as a bad number does
  return decodeEvents(Date.now() / 1000, events, null, (e, i) => {
    const m = { ...(e as Record<string, unknown>) };
    if (Array.isArray(m.block_hashes))
      m.block_hashes = m.block_hashes.map((h, k) => toHash(h, `events[${i}].block_hashes[${k}]`));
    if (m.parent_block_hash !== undefined && m.parent_block_hash !== null)
      m.parent_block_hash = toHash(m.parent_block_hash, `events[${i}].parent_block_hash`);
    return m;
  });
}
