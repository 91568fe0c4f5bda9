import type { BlockHashes } from '../../core/hashing.js';
import { blockKey, EngineModel, type EngineConfig, type EngineRequest } from '../../engine-model/index.js';
import type { BlockStoredEvent, KvEvent } from '../kv-events/decode.js';
import { KvEventPublisher } from '../kv-events/publisher.js';

/**
 * One engine core (a data-parallel rank): its KV cache, the metadata of the blocks it caches
 * and its event stream. vLLM publishes rank r's events on the events port + r
 * (vllm/distributed/kv_events.py offset_endpoint_port) with `data_parallel_rank` set.
 */
export interface RankCore {
  rank: number;
  engine: EngineModel;
  publisher: KvEventPublisher | undefined;
  /** Engine block hash (uint64) per cache key, with what BlockStored must carry. */
  blocks: Map<number, EngineBlock>;
  /** Requests in the core per block key: a block's metadata outlives them only while cached. */
  liveKeys: Map<number, number>;
  stored: number[];
  removed: bigint[];
  stepping: boolean;
  prefixQueries: number;
  prefixHits: number;
  inFlight: number;
}

interface EngineBlock {
  hash: bigint;
  parent: bigint | null;
  tokens: number[];
  lora: string | null;
  loraId: number | null;
  /** vLLM's extra_keys of the block (LoRA name, the salt on a prompt's first block). */
  extraKeys: string[] | null;
}

/** Where rank r publishes: the event endpoints, offset by r. */
export interface RankEndpoints {
  events?: string;
  replay?: string;
}

export function createRankCore(
  rank: number,
  engine: Partial<EngineConfig> & { blockTokens: number },
  endpoints: RankEndpoints,
): RankCore {
  const core: RankCore = {
    rank,
    engine: undefined as unknown as EngineModel,
    publisher: undefined,
    blocks: new Map(),
    liveKeys: new Map(),
    stored: [],
    removed: [],
    stepping: false,
    prefixQueries: 0,
    prefixHits: 0,
    inFlight: 0,
  };
  core.engine = new EngineModel(
    engine,
    (hi, lo) => core.stored.push(blockKey(hi, lo)),
    (hi, lo) => onRemoved(core, blockKey(hi, lo)),
  );
  if (endpoints.events) {
    core.publisher = new KvEventPublisher({
      endpoint: offsetEndpointPort(endpoints.events, rank),
      replayEndpoint: endpoints.replay ? offsetEndpointPort(endpoints.replay, rank) : undefined,
    });
  }
  return core;
}

/**
 * Rank r's endpoint: the port + r (`*` stays `*`), as vLLM's ZmqEventPublisher.offset_endpoint_port.
 */
export function offsetEndpointPort(endpoint: string, rank: number): string {
  if (rank === 0) return endpoint;
  if (endpoint.startsWith('inproc')) return `${endpoint}_dp${rank}`;
  const m = /^(tcp:\/\/.+):(\d+|\*)$/.exec(endpoint);
  if (!m) throw new RangeError(`endpoint '${endpoint}' must be tcp://host:port or inproc://name`);
  return m[2] === '*' ? endpoint : `${m[1]}:${Number(m[2]) + rank}`;
}

/**
 * Records what BlockStored will carry for each block of a prompt (its hash, parent, tokens,
 * adapter and extra keys) and returns the blocks' cache keys.
 */
export function rememberBlocks(
  core: RankCore,
  h: BlockHashes,
  tokens: readonly number[],
  blockSize: number,
  lora: string | null,
  loraId: number | null,
  salt: string | undefined,
): Float64Array {
  const keys = new Float64Array(h.length);
  let parent: bigint | null = null;
  for (let i = 0; i < h.length; i++) {
    keys[i] = blockKey(h.hi[i], h.lo[i]);
    const hash = (BigInt(h.hi[i]) << 32n) | BigInt(h.lo[i]);
    const extra = [...(lora ? [lora] : []), ...(i === 0 && typeof salt === 'string' ? [salt] : [])];
    if (!core.blocks.has(keys[i]))
      core.blocks.set(keys[i], {
        hash,
        parent,
        tokens: tokens.slice(i * blockSize, (i + 1) * blockSize),
        lora,
        loraId,
        extraKeys: extra.length > 0 ? extra : null,
      });
    parent = hash;
  }
  return keys;
}

/**
 * A request left a core: the metadata of blocks no other request there shares and the core
 * does not cache (never computed, or computed twice) goes too. Blocks the core caches keep
 * theirs until BlockRemoved.
 */
export function forget(core: RankCore, request: EngineRequest): void {
  for (const key of request.keys) {
    const n = (core.liveKeys.get(key) ?? 1) - 1;
    if (n > 0) {
      core.liveKeys.set(key, n);
      continue;
    }
    core.liveKeys.delete(key);
    if (!core.engine.holds(key)) core.blocks.delete(key);
  }
}

function onRemoved(core: RankCore, key: number): void {
  const b = core.blocks.get(key);
  if (b) core.removed.push(b.hash);
  // a request still in the core may compute the block again and must announce it then
  if (!core.liveKeys.has(key)) core.blocks.delete(key);
}

/**
 * One batch per step: its removals, then consecutive stored blocks of a chain in one BlockStored.
 * Removals first, as the engine made them: a step evicts while it schedules, and may cache again
 * a block it evicted for a later request of the same step (never the other way round: a block
 * cached in a step is held by the request computing it until the step ends).
 */
export function flushEvents(core: RankCore, blockSize: number): void {
  const events: KvEvent[] = [];
  if (core.removed.length > 0)
    events.push({ type: 'BlockRemoved', blockHashes: [...core.removed], medium: 'GPU', groupIdx: 0 });
  let current: BlockStoredEvent | undefined;
  for (const key of core.stored) {
    const b = core.blocks.get(key);
    if (!b) continue;
    const last = current?.blockHashes[current.blockHashes.length - 1];
    if (current && b.parent === last && current.loraName === b.lora) {
      current.blockHashes.push(b.hash);
      current.tokenIds.push(...b.tokens);
      current.extraKeys!.push(b.extraKeys);
    } else {
      current = {
        type: 'BlockStored',
        blockHashes: [b.hash],
        parentBlockHash: b.parent,
        tokenIds: [...b.tokens],
        blockSize,
        loraId: b.loraId,
        medium: 'GPU',
        loraName: b.lora,
        extraKeys: [b.extraKeys],
        groupIdx: 0,
        kvCacheSpecKind: 'full_attention',
        kvCacheSpecSlidingWindow: null,
      };
      events.push(current);
    }
  }
  for (const e of events) if (e.type === 'BlockStored' && e.extraKeys!.every((k) => k === null)) e.extraKeys = null;
  core.stored.length = 0;
  core.removed.length = 0;
  // a batch that fails to send is still numbered and kept for replay: the subscribers see the
  // gap and ask for it again, and the engine keeps serving
  if (events.length > 0 && core.publisher)
    core.publisher.publish({ ts: Date.now() / 1000, events, dataParallelRank: core.rank }).catch(() => {});
}
