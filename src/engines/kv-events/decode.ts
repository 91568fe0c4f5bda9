import { decode as msgpackDecode } from '@msgpack/msgpack';

/**
 * vLLM KV events (vllm/distributed/kv_events.py), decoded from msgpack into one shape
 * whatever the encoding (DESIGN.md §8): the batch as a map {ts, events, data_parallel_rank}
 * or an array [ts, events] / [ts, events, dp_rank]; each event as a map whose "type" names
 * it (newer releases, fields at their default omitted) or an array whose first element is
 * the type (older releases, trailing fields nil or absent). Block hashes are uint64 (kept as
 * BigInt: plain numbers lose bits) or 32-byte binary digests (kept as hex strings).
 */
export type EngineBlockHash = bigint | string;

export interface BlockStoredEvent {
  type: 'BlockStored';
  blockHashes: EngineBlockHash[];
  parentBlockHash: EngineBlockHash | null;
  tokenIds: number[];
  blockSize: number;
  loraId: number | null;
  medium: string | null;
  loraName: string | null;
  groupIdx: number | null;
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

export interface KvEventBatch {
  ts: number;
  events: KvEvent[];
  dataParallelRank: number | null;
}

/** A payload that is not a valid vLLM event batch; the message is skipped, nothing applied. */
export class KvEventFormatError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'KvEventFormatError';
  }
}

/** Upper bounds that keep a hostile or corrupt payload from exhausting memory. */
export const KV_EVENT_LIMITS = { maxPayloadBytes: 64 * 1024 * 1024, maxEvents: 1_000_000, maxBlocksPerEvent: 1_000_000 };

const STORED_FIELDS = ['block_hashes', 'parent_block_hash', 'token_ids', 'block_size', 'lora_id', 'medium', 'lora_name', 'extra_keys', 'group_idx', 'kv_cache_spec_kind', 'kv_cache_spec_sliding_window'] as const;
const REMOVED_FIELDS = ['block_hashes', 'medium', 'group_idx'] as const;

export function decodeEventBatch(payload: Uint8Array): KvEventBatch {
  if (payload.byteLength > KV_EVENT_LIMITS.maxPayloadBytes) throw new KvEventFormatError(`payload of ${payload.byteLength} bytes is over the limit`);
  let raw: unknown;
  try {
    raw = msgpackDecode(payload, { useBigInt64: true, maxArrayLength: KV_EVENT_LIMITS.maxEvents, maxMapLength: 64, maxStrLength: 1 << 20, maxBinLength: 1 << 20 });
  } catch (err) {
    throw new KvEventFormatError(`not msgpack: ${(err as Error).message}`);
  }
  let ts: unknown;
  let events: unknown;
  let rank: unknown = null;
  if (Array.isArray(raw)) {
    if (raw.length < 2 || raw.length > 3) throw new KvEventFormatError(`batch array must have 2 or 3 elements, got ${raw.length}`);
    [ts, events, rank = null] = raw;
  } else if (isMap(raw)) {
    ts = raw.ts;
    events = raw.events;
    rank = raw.data_parallel_rank ?? null;
  } else {
    throw new KvEventFormatError('batch must be an array or a map');
  }
  const tsNumber = typeof ts === 'bigint' ? Number(ts) : ts;
  if (typeof tsNumber !== 'number' || !Number.isFinite(tsNumber)) throw new KvEventFormatError('batch ts must be a number');
  if (!Array.isArray(events)) throw new KvEventFormatError('batch events must be an array');
  return {
    ts: tsNumber,
    events: events.map((e, i) => decodeEvent(e, i)),
    dataParallelRank: rank === null ? null : toInt(rank, 'data_parallel_rank'),
  };
}

function decodeEvent(e: unknown, i: number): KvEvent {
  let type: unknown;
  let fields: Record<string, unknown>;
  if (Array.isArray(e)) {
    type = e[0];
    if (type !== 'BlockStored' && type !== 'BlockRemoved' && type !== 'AllBlocksCleared') {
      throw new KvEventFormatError(`events[${i}]: unknown event type ${JSON.stringify(type)}`);
    }
    const names = type === 'BlockStored' ? STORED_FIELDS : type === 'BlockRemoved' ? REMOVED_FIELDS : [];
    if (e.length - 1 > names.length) throw new KvEventFormatError(`events[${i}]: ${String(type)} has ${e.length - 1} fields, at most ${names.length}`);
    fields = {};
    names.forEach((name, k) => (fields[name] = e[k + 1] ?? null));
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
      if (!Array.isArray(tokenIds) || tokenIds.length > KV_EVENT_LIMITS.maxBlocksPerEvent * 1024) throw new KvEventFormatError(`${at}.token_ids must be an array`);
      const tokens = tokenIds.map((t, k) => {
        const n = typeof t === 'bigint' ? Number(t) : t;
        if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 0xffffffff) throw new KvEventFormatError(`${at}.token_ids[${k}] must be a uint32`);
        return n;
      });
      const blockSize = toInt(fields.block_size, `${at}.block_size`);
      if (blockSize < 1) throw new KvEventFormatError(`${at}.block_size must be >= 1`);
      if (tokens.length !== blockHashes.length * blockSize) {
        throw new KvEventFormatError(`${at}: ${tokens.length} token ids for ${blockHashes.length} blocks of ${blockSize}`);
      }
      return {
        type,
        blockHashes,
        parentBlockHash: fields.parent_block_hash === null || fields.parent_block_hash === undefined ? null : hash(fields.parent_block_hash, `${at}.parent_block_hash`),
        tokenIds: tokens,
        blockSize,
        loraId: optionalInt(fields.lora_id, `${at}.lora_id`),
        medium: optionalString(fields.medium, `${at}.medium`),
        loraName: optionalString(fields.lora_name, `${at}.lora_name`),
        groupIdx: optionalInt(fields.group_idx, `${at}.group_idx`),
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
      throw new KvEventFormatError(`events[${i}]: unknown event type ${JSON.stringify(type)}`);
  }
}

function isMap(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof Uint8Array);
}

function hashList(v: unknown, at: string): EngineBlockHash[] {
  if (!Array.isArray(v)) throw new KvEventFormatError(`${at} must be an array`);
  if (v.length > KV_EVENT_LIMITS.maxBlocksPerEvent) throw new KvEventFormatError(`${at} has ${v.length} hashes, over the limit`);
  return v.map((h, k) => hash(h, `${at}[${k}]`));
}

function hash(v: unknown, at: string): EngineBlockHash {
  if (typeof v === 'bigint') return BigInt.asUintN(64, v);
  if (typeof v === 'number' && Number.isInteger(v)) return BigInt.asUintN(64, BigInt(v));
  if (v instanceof Uint8Array) {
    if (v.byteLength === 0 || v.byteLength > 64) throw new KvEventFormatError(`${at} must be 1-64 bytes, got ${v.byteLength}`);
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
 * (JSON numbers lose bits above 2^53, so large hashes must be strings).
 */
export function decodeJsonEvents(events: unknown): KvEventBatch {
  if (!Array.isArray(events)) throw new KvEventFormatError('events must be an array');
  if (events.length > 100_000) throw new KvEventFormatError('too many events in one call');
  const toHash = (v: unknown, at: string): unknown => {
    if (typeof v === 'string') {
      if (!/^(0x[0-9a-fA-F]{1,16}|[0-9]{1,20})$/.test(v)) throw new KvEventFormatError(`${at} must be an integer or a decimal/0x-hex string`);
      return BigInt(v);
    }
    return v;
  };
  const converted = events.map((e, i) => {
    if (e === null || typeof e !== 'object' || Array.isArray(e)) throw new KvEventFormatError(`events[${i}] must be an object`);
    const m = { ...(e as Record<string, unknown>) };
    if (Array.isArray(m.block_hashes)) m.block_hashes = m.block_hashes.map((h, k) => toHash(h, `events[${i}].block_hashes[${k}]`));
    if (m.parent_block_hash !== undefined && m.parent_block_hash !== null) m.parent_block_hash = toHash(m.parent_block_hash, `events[${i}].parent_block_hash`);
    return m;
  });
  return { ts: Date.now() / 1000, events: converted.map((e, i) => decodeEvent(e, i)), dataParallelRank: null };
}
