import { encode } from '@msgpack/msgpack';
import type { KvEvent, KvEventBatch } from './decode.js';

/**
 * Encodes a batch the way vLLM does: msgspec structs as maps (newer releases) or positional
 * arrays (older ones), events tagged by "type", fields at their default omitted. Hashes are
 * written as uint64 (BigInt) or bytes (hex strings in, bin out).
 */
export function encodeEventBatch(batch: KvEventBatch, encoding: 'map' | 'array' = 'map'): Uint8Array {
  const events = batch.events.map((e) => encodeEvent(e, encoding));
  const body =
    encoding === 'array'
      ? batch.dataParallelRank === null
        ? [batch.ts, events]
        : [batch.ts, events, batch.dataParallelRank]
      : { ts: batch.ts, events, ...(batch.dataParallelRank === null ? {} : { data_parallel_rank: batch.dataParallelRank }) };
  return encode(body, { useBigInt64: true, forceFloat32: false });
}

function hash(h: bigint | string): bigint | Uint8Array {
  return typeof h === 'bigint' ? h : Uint8Array.from(Buffer.from(h, 'hex'));
}

function encodeEvent(e: KvEvent, encoding: 'map' | 'array'): unknown {
  if (e.type === 'AllBlocksCleared') return encoding === 'array' ? ['AllBlocksCleared'] : { type: 'AllBlocksCleared' };
  if (e.type === 'BlockRemoved') {
    const fields: Array<[string, unknown]> = [['block_hashes', e.blockHashes.map(hash)], ['medium', e.medium]];
    if (e.groupIdx !== null) fields.push(['group_idx', e.groupIdx]);
    return shape('BlockRemoved', fields, encoding);
  }
  const fields: Array<[string, unknown]> = [
    ['block_hashes', e.blockHashes.map(hash)],
    ['parent_block_hash', e.parentBlockHash === null ? null : hash(e.parentBlockHash)],
    ['token_ids', e.tokenIds],
    ['block_size', e.blockSize],
    ['lora_id', e.loraId],
    ['medium', e.medium],
    ['lora_name', e.loraName],
  ];
  if (e.groupIdx !== null) fields.push(['extra_keys', null], ['group_idx', e.groupIdx]);
  return shape('BlockStored', fields, encoding);
}

function shape(type: string, fields: Array<[string, unknown]>, encoding: 'map' | 'array'): unknown {
  if (encoding === 'array') return [type, ...fields.map(([, v]) => v)];
  return Object.fromEntries([['type', type], ...fields.filter(([k, v]) => !(k === 'extra_keys' && v === null))]);
}
