import type { EngineBlockHash, KvEvent, KvEventBatch } from '../../src/engines/kv-events/decode.js';

/** Token ids from, from + 1, …: n of them. */
export const tokenRange = (from: number, n: number): number[] => Array.from({ length: n }, (_, i) => from + i);

/** A GPU BlockStored event for `hashes`, whose token ids run from `firstToken`, blocks of `blockSize`. */
export const storedEvent = (
  hashes: bigint[],
  parent: bigint | null,
  firstToken: number,
  blockSize: number,
): KvEvent => ({
  type: 'BlockStored',
  blockHashes: hashes,
  parentBlockHash: parent,
  tokenIds: tokenRange(firstToken, hashes.length * blockSize),
  blockSize,
  loraId: null,
  medium: 'GPU',
  loraName: null,
  groupIdx: null,
});

/** A GPU BlockStored event for `hashes` with the given token ids; `extra` overrides any field. */
export const storedTokens = (
  hashes: EngineBlockHash[],
  parent: EngineBlockHash | null,
  tokenIds: number[],
  blockSize: number,
  extra: Partial<KvEvent> = {},
): KvEvent =>
  ({
    type: 'BlockStored',
    blockHashes: hashes,
    parentBlockHash: parent,
    tokenIds,
    blockSize,
    loraId: null,
    medium: 'GPU',
    loraName: null,
    groupIdx: null,
    ...extra,
  }) as KvEvent;

/** A batch stamped now, of one data-parallel rank (or none). */
export const eventBatch = (rank: number | null, ...events: KvEvent[]): KvEventBatch => ({
  ts: Date.now() / 1000,
  events,
  dataParallelRank: rank,
});

/** A sequence-number frame as the publisher and its replay socket send it: 8 bytes, big-endian, signed (-1 ends a replay). */
export const sequenceFrame = (n: bigint): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(n);
  return b;
};
