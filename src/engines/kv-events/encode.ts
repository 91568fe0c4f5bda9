import { encode } from '@msgpack/msgpack';
import type { KvEvent, KvEventBatch } from './decode.js';

/**
 * Encodes a batch the way vLLM's msgspec structs do (vllm/distributed/kv_events.py): events
 * tagged by "type"; as maps (current releases: fields left at their default, None, are
 * omitted; fields without a default always written) or as positional arrays (older releases,
 * array_like: msgspec writes every field, trailing defaults included). Hashes are written as
 * uint64 (BigInt) or bytes (hex strings in, bin out). `locality` (vllm-project/vllm#48281) is
 * written in the map form only: vLLM added it after its events became maps.
 */
export function encodeEventBatch(batch: KvEventBatch, encoding: 'map' | 'array' = 'map'): Uint8Array {
  const events = batch.events.map((e) => encodeEvent(e, encoding));
  const body =
    encoding === 'array'
      ? batch.dataParallelRank === null
        ? [batch.ts, events]
        : [batch.ts, events, batch.dataParallelRank]
      : {
          ts: batch.ts,
          events,
          ...(batch.dataParallelRank === null ? {} : { data_parallel_rank: batch.dataParallelRank }),
        };
  return encode(body, { useBigInt64: true, forceFloat32: false });
}

function hash(h: bigint | string): bigint | Uint8Array {
  return typeof h === 'bigint' ? h : Uint8Array.from(Buffer.from(h, 'hex'));
}

/** [name, value, has a default] in declaration order. */
type Field = [string, unknown, boolean];

function encodeEvent(e: KvEvent, encoding: 'map' | 'array'): unknown {
  if (e.type === 'AllBlocksCleared') return encoding === 'array' ? ['AllBlocksCleared'] : { type: 'AllBlocksCleared' };
  if (e.type === 'BlockRemoved') {
    return shape(
      'BlockRemoved',
      [
        ['block_hashes', e.blockHashes.map(hash), false],
        ['medium', e.medium, false],
        ['group_idx', e.groupIdx, true],
        ...locality(e, encoding),
      ],
      encoding,
    );
  }
  return shape(
    'BlockStored',
    [
      ['block_hashes', e.blockHashes.map(hash), false],
      ['parent_block_hash', e.parentBlockHash === null ? null : hash(e.parentBlockHash), false],
      ['token_ids', e.tokenIds, false],
      ['block_size', e.blockSize, false],
      ['lora_id', e.loraId, false],
      ['medium', e.medium, false],
      ['lora_name', e.loraName, false],
      ['extra_keys', e.extraKeys ?? null, true],
      ['group_idx', e.groupIdx, true],
      ['kv_cache_spec_kind', e.kvCacheSpecKind ?? null, true],
      ['kv_cache_spec_sliding_window', e.kvCacheSpecSlidingWindow ?? null, true],
      ...locality(e, encoding),
    ],
    encoding,
  );
}

function locality(e: { locality?: string }, encoding: 'map' | 'array'): Field[] {
  return encoding === 'map' ? [['locality', e.locality ?? null, true]] : [];
}

function shape(type: string, fields: Field[], encoding: 'map' | 'array'): unknown {
  if (encoding === 'array') return [type, ...fields.map(([, v]) => v)];
  return Object.fromEntries([
    ['type', type],
    ...fields.filter(([, v, hasDefault]) => !(hasDefault && v === null)).map(([k, v]) => [k, v]),
  ]);
}
