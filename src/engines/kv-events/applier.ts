import { BlockHashes, chainRoot, hashHex, hashTokenBlocksFrom, mixIntoChain } from '../../core/hashing.js';
import type { KVAwareRouter } from '../../core/router/index.js';
import { engineHashKey, type VllmHashAlgo } from '../../core/vllm-block-hash.js';
import {
  isFullPrefixKind,
  type BlockStoredEvent,
  type EngineBlockHash,
  type ExtraKeys,
  type KvEvent,
  type KvEventBatch,
} from './decode.js';

/**
 * Applies decoded KV events of one worker to the router's block index. Pure: no I/O; the
 * subscriber (or the gateway's /admin/events) feeds it.
 *
 * Keys. By default (`hashMode: 'router'`) engines hash blocks with seeds the router cannot
 * know, so the router hashes each stored block's token ids itself, chained from its parent's
 * own hash, and keeps engine hash → own hash per worker to apply BlockRemoved (a store whose
 * parent it never saw cannot be chained: it is skipped as an orphan). With `hashMode: 'vllm'`
 * (`serve --block-hash vllm`) the router computes vLLM's own hash for requests
 * (src/core/vllm-block-hash.ts), so an engine hash is itself the key: no chain is needed,
 * orphans apply, and a store's parent_block_hash proves the parent is held too.
 *
 * What upstream sends, and what is done with it:
 * - Duplicate copies: vLLM's block pool (vllm/v1/core/block_pool.py) can cache several
 *   physical blocks under one hash; each emits its own BlockStored and, when evicted, its own
 *   BlockRemoved. Copies are counted per engine hash and tier, so the first removal does not
 *   drop a block the engine still holds.
 * - Offload: vLLM's offloading connector
 *   (vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py) reports its copies
 *   as BlockStored with token_ids [], parent null, medium "CPU" (or "STORAGE") and its own
 *   block size, a multiple of the GPU one — block_size 0 in current releases, which do not
 *   send it — each hash being the GPU hash of the last GPU block it holds. They mark blocks
 *   already known by engine hash (and the ancestors the offload block spans, when its size is
 *   sent) as held in the offload tier; an unknown one is skipped, never the batch. With
 *   self_describing_kv_events (vllm-project/vllm#43468) its copies carry token ids, the parent
 *   and the GPU block size, and apply as stores in the offload tier.
 * - AllBlocksCleared is a reset of the engine's prefix cache: its GPU copies go, and its
 *   offload copies stay where the engine keeps them (vLLM's connector, reset only on request),
 *   not where it drops them too (SGLang HiCache's "CPU_PINNED" host copies): clearPrefixCache.
 * - Hybrid models (sliding window, Mamba): group_idx / kv_cache_spec_kind say which KV
 *   group an event is for. Only groups that hold every token of the prefix are indexed (a
 *   prefix hit needs every block): full attention, and MLA and sink attention, which vLLM
 *   keeps as full attention does (FULL_PREFIX_KINDS); events of other groups are skipped
 *   without error. Without kv_cache_spec_kind (releases before vllm-project/vllm#40984),
 *   group 0 is taken as the full-attention one. A BlockRemoved carries group_idx but no kind:
 *   a group's kind is the one its stores taught, and a group never taught is skipped when the
 *   worker taught kinds of others (its full-prefix groups are among those), group 0's fallback
 *   being only for a worker that taught none. A group of kind `unknown` (vLLM's for a group of
 *   mixed layer kinds) is indexed while the worker has taught no full-prefix group.
 * - extra_keys: the first block's cache salt keys the chain as the request's cache_salt does;
 *   multimodal (identifier, offset) keys and prompt-embedding digests are mixed into their
 *   block's hash, so an image block never matches a text block with the same placeholder
 *   tokens, nor a block of embeddings (token ids 0) a prompt of token 0 or other embeddings.
 * - Block size per worker: a store whose block size differs from the worker's is skipped and
 *   counted ('block_size'); SGLang's page size 1 gives one event per token, which works with
 *   `block-size=1` on that worker.
 * - Position-free hashes (router hash mode): the router chains a block from its parent's own
 *   hash, so an engine hash must name one block at one position. SGLang's first page events
 *   (sgl-project/sglang#6824, until sgl-project/sglang#13488 made them sequence-aware) hash a
 *   page as Python's hash(tuple(page_tokens)) wherever it sits, and some of those releases send
 *   every radix node's first page without a parent: a page stored again after another keeps the
 *   chain of its first position, and a node's first page lands at the root, both false hits. A
 *   worker whose engine hash is stored again under another parent, or whose page stored after
 *   another has CPython's hash of its tokens alone (cpythonTupleHash), has its entries dropped and
 *   its stores refused ('position_free_hash') until they are cleared (a restart, a removal, an
 *   AllBlocksCleared: clearPrefixCache judges its stores afresh).
 * - Locality: vLLM's storage tiers (medium "STORAGE", earlier "FS"/"OBJ") say where a copy is
 *   (`locality`, vllm-project/vllm#48281, v0.26.0): "LOCAL", the engine's own, or "REMOTE",
 *   storage it does not own, which other engines may read too. Only the engine's own copies are
 *   its cache: an event whose locality is sent and is not "LOCAL" is skipped ('remote_locality',
 *   per store, per block for a removal), so a remote copy is never credited to the worker and its
 *   removal never removes the worker's own copy of the block. Absent (unspecified: what every
 *   other tier sends), the event applies as before. Dynamo's router (ai-dynamo/dynamo#11571)
 *   refuses non-local events alike. SGLang says it by the medium: its "EXTERNAL" tier is a shared
 *   pool (SGLANG_SHARED_MEDIUM), skipped the same way.
 * - Bounded: a worker that reports holding more blocks than `maxTrackedBlocks` (by default the
 *   index's capacity shared among the workers, at least MIN_TRACKED_BLOCKS_PER_WORKER: see
 *   trackedBlocksBound) has its entries dropped and rebuilt from its next events
 *   ('over_capacity'), as after a gap. Each tracked engine hash costs some 150 bytes of heap:
 *   bounded per worker by the whole index's capacity, a few workers flooding stores could hold
 *   gigabytes between them.
 *   What else is kept per worker is bounded too (MAX_MEDIA_PER_WORKER offload media of names up
 *   to MAX_MEDIUM_CHARS, MAX_KV_GROUPS_PER_WORKER group kinds), created only for blocks the
 *   worker holds, and freed with its entries (clearWorker: a gap, a restart, its removal).
 */
export type ApplySkipReason =
  | 'remote_locality'
  | 'block_size'
  | 'orphan'
  | 'token_count'
  | 'other_group'
  | 'unknown_offload'
  | 'unknown_removal'
  | 'over_capacity'
  | 'position_free_hash';

/**
 * Most GPU blocks one offload block may span (its block size over the worker's): vLLM's
 * offloading connector uses a few; a store claiming more is skipped as a block-size mismatch
 * rather than walked (and allocated for) block by block.
 */
export const MAX_OFFLOAD_SPAN = 1024;

/**
 * Longest `medium` name an offload copy's span is kept under: vLLM's are "GPU", "CPU" and
 * "STORAGE". A copy of a longer one is skipped ('unknown_offload'), never remembered.
 */
export const MAX_MEDIUM_CHARS = 64;
/**
 * Offload media whose span is kept per worker (vLLM's connectors use one or two): a copy of a
 * medium past them is skipped ('unknown_offload').
 */
export const MAX_MEDIA_PER_WORKER = 16;
/**
 * KV groups whose kind is kept per worker (a hybrid model has a few: one per kind and layer
 * ratio). A store of a group past them is not indexed ('other_group'), and its removals then
 * find nothing to remove.
 */
export const MAX_KV_GROUPS_PER_WORKER = 256;

/**
 * The medium of SGLang HiCache's host copies (StorageMedium.CPU = "CPU_PINNED",
 * python/sglang/srt/disaggregation/kv_events.py): SGLang clears its host pool with its radix
 * tree and announces both with one AllBlocksCleared (KvEventApplier.clearPrefixCache).
 */
export const SGLANG_HOST_MEDIUM = 'CPU_PINNED';

/**
 * The medium of SGLang's fourth tier (StorageMedium.EXTERNAL, "L4: shared / remote pool (e.g.
 * Mooncake)", python/sglang/srt/disaggregation/kv_events.py): a pool every engine attached to it
 * reads, no more this worker's cache than vLLM's "REMOTE" storage is; its events are skipped
 * alike. Its third tier, "DISK" (the engine's own SSD), is the worker's offload tier as "CPU_PINNED" is.
 */
export const SGLANG_SHARED_MEDIUM = 'EXTERNAL';

/**
 * The skip reason of an event on storage that is not the engine's own (a `locality` other than
 * "LOCAL", or SGLang's shared medium).
 */
export const NON_LOCAL_SKIP = 'remote_locality' satisfies ApplySkipReason;

/**
 * Whether an event's copy is the engine's own: its `locality` unspecified or "LOCAL"
 * (vllm-project/vllm#48281), on any medium but SGLang's shared pool (SGLANG_SHARED_MEDIUM).
 */
export function isLocalCopy(e: { locality?: string; medium?: string | null }): boolean {
  return (e.locality === undefined || e.locality === 'LOCAL') && e.medium !== SGLANG_SHARED_MEDIUM;
}

/** vLLM's kv_cache_spec_kind for a group it cannot name (KVCacheSpecKind.UNKNOWN). */
export const UNKNOWN_KIND = 'unknown';

export interface ApplyCounts {
  storedBlocks: number;
  removedBlocks: number;
  cleared: number;
  /** Blocks marked as held in the offload tier by an offload (medium != GPU) store. */
  offloadBlocks: number;
  /** Stores of a hash the worker already held in that tier (another physical copy). */
  duplicateCopies: number;
  /** Parents recorded as held from a store's parent_block_hash (vllm hash mode). */
  parentsProven: number;
  /** Stored events whose parent block the router never saw (e.g. stored before it subscribed). */
  orphanEvents: number;
  /** Removed hashes the router never saw stored. */
  unknownRemovals: number;
  /** Stored events whose block size differs from the worker's (a configuration error). */
  blockSizeMismatches: number;
  /**
   * vllm hash mode: stores whose first block's hash is not the one the router computes from its
   * tokens (the engine hashes with another --prefix-caching-hash-algo or PYTHONHASHSEED, or the
   * prompt was salted by a release that does not send extra_keys), and stores of a worker found
   * to hash otherwise.
   */
  hashMismatches: number;
  /**
   * Router hash mode: workers found to hash blocks without their position (an engine hash stored
   * again under another parent, or SGLang's first page events' hash(tuple(page_tokens))); their
   * stores are then skipped as 'position_free_hash'.
   */
  positionFreeHashes: number;
  /**
   * Stores of a KV group of kind `unknown` indexed as the full prefix: the worker has taught no
   * group of a full-prefix kind (KvEventApplier.fullAttention).
   */
  unknownKindStores: number;
  /** Events (or blocks, for removals) skipped, per reason; decode reasons are added by the subscriber. */
  skipped: Record<string, number>;
}

export function emptyCounts(): ApplyCounts {
  return {
    storedBlocks: 0,
    removedBlocks: 0,
    cleared: 0,
    offloadBlocks: 0,
    duplicateCopies: 0,
    parentsProven: 0,
    orphanEvents: 0,
    unknownRemovals: 0,
    blockSizeMismatches: 0,
    hashMismatches: 0,
    positionFreeHashes: 0,
    unknownKindStores: 0,
    skipped: {},
  };
}

function skip(counts: ApplyCounts, reason: string, n = 1): void {
  counts.skipped[reason] = (counts.skipped[reason] ?? 0) + n;
}

interface OwnBlock {
  hi: number;
  lo: number;
  /** Physical copies the engine reported in each tier. */
  gpu: number;
  offload: number;
  /** Engine hash of the parent block, when known (walks an offload block's span). */
  parent: EngineBlockHash | null;
}

/** First blocks whose hash matched before a worker's stores are taken without checking (vllm hash mode). */
const CONFIRMED_HASHES = 16;

/**
 * vllm hash mode: distinct prompts' first blocks that must differ from the router's hash, none
 * having matched, before a worker whose stores send no extra_keys is taken to hash otherwise.
 * Such a release hashes a salted prompt's first block with its cache_salt without sending the
 * salt (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys), so one mismatch may be
 * one salted prompt; an engine hashing otherwise misses on every prompt and is given up on
 * after this many (its continuations meanwhile land under keys no request matches, and are
 * removed as it evicts them), while a well-configured one is shut out only if its first 8
 * distinct prompts are all salted.
 */
export const MISMATCHES_BEFORE_GIVING_UP = 8;

/**
 * The fewest blocks tracked per worker by default, however many workers share the index: more
 * than one engine's GPU cache holds in common deployments (vLLM's num_gpu_blocks is some tens of
 * thousands), so a worker is not dropped for holding its own cache.
 */
export const MIN_TRACKED_BLOCKS_PER_WORKER = 65_536;

/**
 * Blocks tracked per worker by default: the index's capacity over the workers registered, at
 * least MIN_TRACKED_BLOCKS_PER_WORKER, at most the index's capacity (no worker has more of its
 * blocks in the index than the index holds). What the applier keeps for all workers together
 * stays near the index's capacity (the floor times the workers when there are very many) instead
 * of that capacity per worker.
 */
export function trackedBlocksBound(maxIndexEntries: number, workers: number): number {
  return Math.min(
    maxIndexEntries,
    Math.max(MIN_TRACKED_BLOCKS_PER_WORKER, Math.floor(maxIndexEntries / Math.max(1, workers))),
  );
}

export interface WorkerNamespace {
  /** The CLA group the worker's KV is made under (default: the one group it is registered with, if it serves exactly one). */
  claGroup?: number | null;
  /** Tokens per KV block on this worker (default: the router's block size). */
  blockSize?: number;
}

export interface KvEventApplierOptions {
  /** 'router': own hashes from token ids; 'vllm': the engine's hashes are the keys (default: the router's keying). */
  hashMode?: 'router' | 'vllm';
  /** Blocks tracked per worker before its entries are dropped (default: trackedBlocksBound of the router's index capacity and workers). */
  maxTrackedBlocks?: number;
}

export class KvEventApplier {
  readonly hashMode: 'router' | 'vllm';
  /** vllm hash mode: the --prefix-caching-hash-algo the router computes the engines' hashes with. */
  readonly vllmHashAlgo: VllmHashAlgo;
  /** Given: the bound whatever the workers; undefined: trackedBlocksBound. */
  private readonly maxTrackedBlocks: number | undefined;
  /** The bound the tracked workers were last checked against (sweepOverBound). */
  private checkedBound = Infinity;
  /** Per worker dropped by sweepOverBound, the over_capacity drops its next apply() counts. */
  private readonly dropsOwed = new Map<string, number>();
  private readonly maps = new Map<string, Map<EngineBlockHash, OwnBlock>>();
  /** Per worker, KV groups known not to hold the full prefix (learned from kv_cache_spec_kind). */
  private readonly otherGroups = new Map<string, Set<number>>();
  private readonly fullGroups = new Map<string, Set<number>>();
  /** Per worker, KV groups of kind `unknown` (full-prefix only while no fullGroups: fullAttention). */
  private readonly unknownGroups = new Map<string, Set<number>>();
  /** Workers whose entries were stored from an `unknown` group taken as the full prefix. */
  private readonly indexedFromUnknown = new Set<string>();
  /** GPU blocks an offload block spans, per worker and medium (learned from its stores). */
  private readonly offloadSpans = new Map<string, Map<string, number>>();
  /**
   * Workers that sent an offload copy in SGLANG_HOST_MEDIUM since their entries were last
   * cleared: their engine drops its offload copies with its prefix cache (clearPrefixCache).
   */
  private readonly offloadClearedWithCache = new Set<string>();
  /**
   * Workers whose prefix cache was cleared (offload copies kept) with nothing stored or removed
   * since: another clear changes nothing they reported, and is not walked again
   * (clearPrefixCache walks every kept block).
   */
  private readonly clearedSinceChange = new Set<string>();
  private readonly scratch = new BlockHashes(64);
  private readonly root = new Uint32Array(2);
  private readonly key = new Uint32Array(2);
  private readonly one = { hi: new Uint32Array(1024), lo: new Uint32Array(1024), length: 0 };
  /** The blocks one offload walk has passed (reused): hostile parents can make a walk loop. */
  private readonly walked = new Set<EngineBlockHash>();
  /**
   * vllm hash mode: per worker, the prompts' first blocks whose hash has been found to be the
   * router's; -1 once the worker is found to hash otherwise (judgeMismatch). Router hash mode:
   * the blocks stored after a parent found not to be CPython's hash of their tokens alone
   * (hashedByPosition); -1 once the worker is found to hash without position (refusePositionFree).
   */
  private readonly hashesConfirmed = new Map<string, number>();
  /**
   * vllm hash mode: per worker none of whose first blocks has matched yet, the first blocks of
   * stores without extra_keys that did not (at most MISMATCHES_BEFORE_GIVING_UP).
   */
  private readonly unexplainedMismatches = new Map<string, Set<EngineBlockHash>>();
  private readonly checkHashes = new BlockHashes(1);

  constructor(
    private readonly router: KVAwareRouter,
    private readonly namespaces: ReadonlyMap<string, WorkerNamespace> = new Map(),
    options: KvEventApplierOptions = {},
  ) {
    const mode = options.hashMode ?? router.keying.mode;
    if (mode !== 'router' && mode !== 'vllm')
      throw new RangeError(`hashMode must be 'router' or 'vllm', got '${String(mode)}'`);
    this.hashMode = mode;
    this.vllmHashAlgo = router.keying.vllmAlgo ?? 'sha256_cbor';
    this.maxTrackedBlocks = options.maxTrackedBlocks;
  }

  /**
   * The CLA group a worker's stored blocks are keyed under, as a request of that group hashes
   * its prompt: the one given for it, else the one group it serves (none for a worker serving
   * none or several: an engine's events do not say which group a block was made under).
   * Keyed under none, every block of a worker of one group was missed by that group's requests.
   */
  private claGroupOf(workerId: string): number | null {
    const given = this.namespaces.get(workerId)?.claGroup;
    return given !== undefined ? given : this.router.claGroupOf(workerId);
  }

  /** Blocks tracked per worker before its entries are dropped, with the workers registered now. */
  trackedBlocksLimit(): number {
    return this.maxTrackedBlocks ?? trackedBlocksBound(this.router.index.maxEntries, this.router.workerCount);
  }

  /** Blocks the router tracks for a worker from its events. */
  trackedBlocks(workerId: string): number {
    return this.maps.get(workerId)?.size ?? 0;
  }

  /** The engine's hashes (decimal, or hex for digests) of what the worker reported holding. */
  trackedEngineHashes(workerId: string): string[] {
    return [...(this.maps.get(workerId)?.keys() ?? [])].map((h) => h.toString());
  }

  /**
   * What the applier keeps for a worker: blocks, offload media whose span it learned, KV groups
   * whose kind it learned. All of it goes with clearWorker().
   */
  trackedState(workerId: string): { blocks: number; media: number; groups: number } {
    return {
      blocks: this.trackedBlocks(workerId),
      media: this.offloadSpans.get(workerId)?.size ?? 0,
      groups: this.groupsKnown(workerId),
    };
  }

  /** Workers the applier keeps anything for. */
  trackedWorkers(): number {
    const ids = new Set<string>();
    for (const m of [
      this.maps,
      this.fullGroups,
      this.otherGroups,
      this.unknownGroups,
      this.offloadSpans,
      this.hashesConfirmed,
      this.unexplainedMismatches,
      this.dropsOwed,
    ])
      for (const id of m.keys()) ids.add(id);
    for (const set of [this.offloadClearedWithCache, this.indexedFromUnknown]) for (const id of set) ids.add(id);
    return ids.size;
  }

  /** Own hashes (hex) of what the worker reported holding, for comparing with the engine. */
  trackedHashes(workerId: string): string[] {
    const m = this.maps.get(workerId);
    if (!m) return [];
    return [...m.values()].map((b) => hashHex(b.hi, b.lo));
  }

  /** Physical copies of one engine hash the worker reported (GPU and offload tiers). */
  copies(workerId: string, engineHash: EngineBlockHash): { gpu: number; offload: number } {
    const b = this.maps
      .get(workerId)
      ?.get(typeof engineHash === 'bigint' ? BigInt.asUintN(64, engineHash) : engineHash);
    return { gpu: b?.gpu ?? 0, offload: b?.offload ?? 0 };
  }

  apply(workerId: string, batch: KvEventBatch, counts: ApplyCounts = emptyCounts()): ApplyCounts {
    const limit = this.trackedBlocksLimit();
    if (limit < this.checkedBound) this.sweepOverBound(limit);
    this.checkedBound = limit;
    const owed = this.dropsOwed.get(workerId);
    if (owed !== undefined) {
      this.dropsOwed.delete(workerId);
      skip(counts, 'over_capacity', owed);
    }
    for (const event of batch.events) {
      this.applyEvent(workerId, event, counts);
      if ((this.maps.get(workerId)?.size ?? 0) > limit) {
        // more than any engine holds: what it said is not what it holds, start over
        this.clearWorker(workerId);
        skip(counts, 'over_capacity');
      }
    }
    return counts;
  }

  /**
   * The bound fell (workers were added): every worker tracking more than it is dropped now,
   * not at its own next batch, so what is kept for all workers stays near the index's capacity
   * whatever order they were added and filled in. Each drop is counted in that worker's next
   * apply().
   */
  private sweepOverBound(limit: number): void {
    const over: string[] = [];
    // (a worker's map exists only while it is registered: its removal clears it first)
    for (const [id, m] of this.maps) if (m.size > limit && this.router.hasWorker(id)) over.push(id);
    for (const id of over) {
      this.clearWorker(id);
      this.dropsOwed.set(id, (this.dropsOwed.get(id) ?? 0) + 1);
    }
  }

  /**
   * Forgets a worker's blocks, in every tier, in the index and in the hash map, and everything
   * else kept for it: its offload spans and KV group kinds (its next stores teach them again).
   * For what the engine's state is no longer known by: a sequence gap, a restart, a worker
   * removed, a worker found to send what it does not hold. (AllBlocksCleared, a reset of the
   * engine's prefix cache, may keep its offload copies: clearPrefixCache.)
   */
  clearWorker(workerId: string): void {
    this.maps.delete(workerId);
    this.dropsOwed.delete(workerId);
    // an engine that started over may hash otherwise now: check it again
    this.hashesConfirmed.delete(workerId);
    this.unexplainedMismatches.delete(workerId);
    this.offloadSpans.delete(workerId);
    this.fullGroups.delete(workerId);
    this.otherGroups.delete(workerId);
    this.unknownGroups.delete(workerId);
    this.indexedFromUnknown.delete(workerId);
    this.offloadClearedWithCache.delete(workerId);
    this.clearedSinceChange.delete(workerId);
    this.router.applyCleared(workerId);
  }

  /**
   * What applying `e` to the worker now costs, in blocks walked (and one per event): a store's
   * or removal's blocks; a clear's, every block it walks (the worker's tracked blocks), none for
   * a clear right after another (`previous`, the event applied just before it in the same
   * apply(), or, with none, what the worker was last sent), which changes nothing. The
   * subscriber weighs a slice by it, so that a run of clears on a worker keeping offload copies
   * is spread over turns of the event loop rather than held in one.
   */
  workOf(workerId: string, e: KvEvent, previous?: KvEvent): number {
    if (e.type !== 'AllBlocksCleared') return 1 + e.blockHashes.length;
    const again = previous ? previous.type === 'AllBlocksCleared' : this.clearedSinceChange.has(workerId);
    return again ? 1 : 1 + (this.maps.get(workerId)?.size ?? 0);
  }

  /**
   * AllBlocksCleared: the engine reset its prefix cache. Its GPU copies go; its offload copies
   * stay when its engine keeps them through the reset, and leave with their own BlockRemoved.
   *
   * vLLM: Scheduler.reset_prefix_cache(reset_running_requests, reset_connector=False)
   * (vllm/v1/core/sched/scheduler.py) resets the block pool, whose
   * BlockPool.reset_prefix_cache (vllm/v1/core/block_pool.py) publishes a bare
   * AllBlocksCleared, and resets the KV connector (the OffloadingConnector's CPU tier, its
   * copies sent with medium "CPU" or "STORAGE": CPULoadStoreSpec.medium() in
   * vllm/v1/kv_offload/cpu/common.py) only with reset_connector=True, which /reset_prefix_cache
   * does not pass by default: vllm-project/vllm#57296 (closed unmerged) proposed clearing both
   * on one event, vllm-project/vllm#57727 shows the CPU tier still serving after the reset.
   *
   * SGLang: HiRadixCache.reset (python/sglang/srt/mem_cache/hiradix_cache.py) clears its host
   * pool (token_to_kv_pool_host.clear()) and then RadixCache.reset publishes the same bare
   * AllBlocksCleared (_record_all_cleared_event): its host copies go with it. They are told
   * apart by their medium: SGLang sends them as "CPU_PINNED" (StorageMedium.CPU in
   * python/sglang/srt/disaggregation/kv_events.py), which vLLM never sends. A worker that has
   * sent such a copy since its entries were last cleared has them all forgotten.
   *
   * What else the worker taught stays (KV group kinds, offload spans: the kept copies' removals
   * need them), but for its hashes, checked again as after clearWorker.
   */
  private clearPrefixCache(workerId: string): void {
    // nothing stored or removed since the last clear: this one changes nothing the worker
    // reported (what the router predicted for requests sent since stays, as for requests the
    // engine takes after its reset)
    if (this.clearedSinceChange.has(workerId)) return;
    const map = this.maps.get(workerId);
    let kept = false;
    if (map && !this.offloadClearedWithCache.has(workerId)) {
      for (const [h, b] of map) {
        if (b.offload > 0) {
          b.gpu = 0;
          kept = true;
        } else map.delete(h);
      }
    }
    if (!kept) return this.clearWorker(workerId);
    this.hashesConfirmed.delete(workerId);
    this.unexplainedMismatches.delete(workerId);
    this.router.applyCleared(workerId, 'offload');
    this.clearedSinceChange.add(workerId);
  }

  private mapFor(workerId: string): Map<EngineBlockHash, OwnBlock> {
    let m = this.maps.get(workerId);
    if (!m) this.maps.set(workerId, (m = new Map()));
    return m;
  }

  private blockSizeOf(workerId: string): number {
    return this.namespaces.get(workerId)?.blockSize ?? this.router.blockSizeOf(workerId);
  }

  /** KV groups whose kind the worker has taught (full-prefix, other and `unknown` ones). */
  private groupsKnown(workerId: string): number {
    return (
      (this.fullGroups.get(workerId)?.size ?? 0) +
      (this.otherGroups.get(workerId)?.size ?? 0) +
      (this.unknownGroups.get(workerId)?.size ?? 0)
    );
  }

  /**
   * Whether an event's KV group holds the full prefix (the only kinds indexed). A store of a
   * group past MAX_KV_GROUPS_PER_WORKER is not: its kind could not be kept for its removals.
   *
   * A group of kind `unknown` is taken as the full prefix while the worker has taught no group
   * of a full-prefix kind: vLLM's get_kv_cache_spec_kind (vllm/v1/kv_cache_interface.py, the
   * kinds of vllm-project/vllm#40984) sends `unknown` for a UniformTypeKVCacheSpecs group whose
   * layers are of several kinds (MLA with full attention) or for a spec class its mapping does
   * not know, and such a worker's prefix hits come from that group. Once a full-prefix group is
   * taught, `unknown` groups are skipped, and what was indexed from them is dropped (their
   * removals would no longer reach it).
   */
  private fullAttention(workerId: string, groupIdx: number | null, kind: string | null | undefined): boolean {
    if (groupIdx === null && (kind === null || kind === undefined)) return true;
    if (kind !== null && kind !== undefined) {
      const full = isFullPrefixKind(kind);
      const unknown = kind === UNKNOWN_KIND;
      if (groupIdx !== null) {
        const sets = full ? this.fullGroups : unknown ? this.unknownGroups : this.otherGroups;
        const s = sets.get(workerId);
        if (!s?.has(groupIdx)) {
          if (this.groupsKnown(workerId) >= MAX_KV_GROUPS_PER_WORKER) return false;
          if (full && !this.fullGroups.has(workerId) && this.indexedFromUnknown.delete(workerId)) {
            // the worker's full-prefix group is known now: what its `unknown` group stored goes
            this.maps.delete(workerId);
            this.router.applyCleared(workerId);
          }
          if (s) s.add(groupIdx);
          else sets.set(workerId, new Set([groupIdx]));
        }
      }
      if (unknown) return !this.fullGroups.has(workerId);
      return full;
    }
    // a removal, or a release without kinds: what the worker's stores said about the group
    const full = this.fullGroups.get(workerId);
    const other = this.otherGroups.get(workerId);
    if (full?.has(groupIdx!)) return true;
    if (other?.has(groupIdx!)) return false;
    if (this.unknownGroups.get(workerId)?.has(groupIdx!)) return full === undefined;
    // a group whose kind was never learned. A worker that sent kinds for other groups has its
    // full-prefix group(s) among them (their stores were indexed under what they taught), so
    // this one is not: a sliding-window group whose store came before the router subscribed or
    // before the last clear would otherwise delete the full group's block under the same hash.
    // Only a worker that taught no kind (a release without them) keeps group 0 as the full one.
    if (this.groupsKnown(workerId) > 0) return false;
    return groupIdx === 0;
  }

  private applyEvent(workerId: string, e: KvEvent, counts: ApplyCounts): void {
    if (e.type === 'AllBlocksCleared') {
      this.clearPrefixCache(workerId);
      counts.cleared++;
      return;
    }
    this.clearedSinceChange.delete(workerId);
    // a copy on storage the engine does not own is not its cache: it teaches nothing either
    if (!isLocalCopy(e)) return skip(counts, NON_LOCAL_SKIP, e.type === 'BlockRemoved' ? e.blockHashes.length : 1);
    if (e.type === 'BlockStored') {
      if (!this.fullAttention(workerId, e.groupIdx, e.kvCacheSpecKind)) return skip(counts, 'other_group');
      if (e.kvCacheSpecKind === UNKNOWN_KIND) {
        this.indexedFromUnknown.add(workerId);
        counts.unknownKindStores++;
      }
      const gpu = e.medium === null || e.medium === 'GPU';
      if (e.medium === SGLANG_HOST_MEDIUM) this.offloadClearedWithCache.add(workerId);
      if (e.tokenIds.length === 0) return this.applyOffloadCopies(workerId, e, gpu, counts);
      const blockSize = this.blockSizeOf(workerId);
      if (e.blockSize !== blockSize) {
        counts.blockSizeMismatches++;
        return skip(counts, 'block_size');
      }
      if (e.tokenIds.length !== e.blockHashes.length * e.blockSize) return skip(counts, 'token_count');
      return this.applyStore(workerId, e, gpu, counts);
    }
    // BlockRemoved
    if (!this.fullAttention(workerId, e.groupIdx, undefined)) return skip(counts, 'other_group', e.blockHashes.length);
    const gpu = e.medium === null || e.medium === 'GPU';
    const map = this.maps.get(workerId);
    if (!map) {
      // nothing stored: nothing to remove, and nothing is created for it
      counts.unknownRemovals += e.blockHashes.length;
      return skip(counts, 'unknown_removal', e.blockHashes.length);
    }
    // an offload copy spans several GPU blocks, walked through their parents as when stored
    const span = gpu ? 1 : (this.offloadSpans.get(workerId)?.get(e.medium!) ?? 1);
    const seq = this.scratchSeq(e.blockHashes.length);
    let n = 0;
    const walked = this.walked;
    for (const first of e.blockHashes) {
      let h: EngineBlockHash | null = first;
      walked.clear();
      // parents form a chain; hostile stores can make them loop, so a walk stops at a repeat
      for (let k = 0; k < span && h !== null && !walked.has(h); k++) {
        if (span > 1) walked.add(h);
        const b = map.get(h);
        if (!b || (gpu ? b.gpu : b.offload) === 0) {
          if (k === 0) {
            counts.unknownRemovals++;
            skip(counts, 'unknown_removal');
          }
          break;
        }
        if (gpu) b.gpu--;
        else b.offload--;
        // the tier goes only with its last copy
        if ((gpu ? b.gpu : b.offload) === 0) {
          this.ensureSeq(n + 1);
          seq.hi[n] = b.hi;
          seq.lo[n] = b.lo;
          n++;
        }
        if (b.gpu === 0 && b.offload === 0) map.delete(h);
        h = b.parent;
      }
    }
    seq.length = n;
    if (n > 0) this.router.applyRemoved(workerId, seq, gpu ? 'gpu' : 'offload');
    counts.removedBlocks += n;
  }

  private applyStore(workerId: string, e: BlockStoredEvent, gpu: boolean, counts: ApplyCounts): void {
    const map = this.mapFor(workerId);
    const own = this.scratch;
    if (this.hashMode === 'vllm') {
      if (!this.hashIsRouters(workerId, e)) {
        counts.hashMismatches++;
        return skip(counts, 'hash_mismatch');
      }
      own.ensureCapacity(e.blockHashes.length);
      own.length = e.blockHashes.length;
      own.tokensPerBlock = e.blockSize;
      for (let i = 0; i < e.blockHashes.length; i++) {
        engineHashKey(e.blockHashes[i], this.key);
        own.hi[i] = this.key[0];
        own.lo[i] = this.key[1];
      }
      if (e.parentBlockHash !== null && !map.has(e.parentBlockHash)) {
        // the engine only caches a block after its parent: the parent is held there too
        engineHashKey(e.parentBlockHash, this.key);
        map.set(e.parentBlockHash, { hi: this.key[0], lo: this.key[1], gpu: 1, offload: 0, parent: null });
        this.one.hi[0] = this.key[0];
        this.one.lo[0] = this.key[1];
        this.one.length = 1;
        this.router.applyStored(workerId, this.one, 'gpu');
        counts.parentsProven++;
      }
    } else {
      if (this.hashesConfirmed.get(workerId) === -1) return skip(counts, 'position_free_hash');
      if (!this.hashedByPosition(workerId, e)) return this.refusePositionFree(workerId, counts);
      let parentHi: number;
      let parentLo: number;
      if (e.parentBlockHash === null) {
        chainRoot({ lora: loraOf(e), cacheSalt: saltOf(e), claGroup: this.claGroupOf(workerId) }, this.root);
        parentHi = this.root[0];
        parentLo = this.root[1];
      } else {
        const parent = map.get(e.parentBlockHash);
        if (!parent) {
          counts.orphanEvents++;
          return skip(counts, 'orphan');
        }
        parentHi = parent.hi;
        parentLo = parent.lo;
      }
      if (e.extraKeys && e.extraKeys.some(hasBlockContentKeys)) this.hashWithContentKeys(parentHi, parentLo, e, own);
      else hashTokenBlocksFrom(parentHi, parentLo, e.tokenIds, e.blockSize, own);
    }
    let parent = e.parentBlockHash;
    for (let i = 0; i < own.length; i++) {
      const h = e.blockHashes[i];
      const prev = map.get(h);
      if (prev) {
        // a chained hash names one block at one position: under another parent, it does not
        // (in vllm hash mode a parent proven from a store is recorded without its own parent).
        // Judged on the engine's own (GPU) stores: a KV connector's copy is not its hashing
        if (this.hashMode === 'router' && gpu && prev.parent !== parent)
          return this.refusePositionFree(workerId, counts);
        if ((gpu ? prev.gpu : prev.offload) > 0) counts.duplicateCopies++;
        if (gpu) prev.gpu++;
        else prev.offload++;
        prev.parent ??= parent;
      } else {
        map.set(h, { hi: own.hi[i], lo: own.lo[i], gpu: gpu ? 1 : 0, offload: gpu ? 0 : 1, parent });
      }
      parent = h;
    }
    this.router.applyStored(workerId, own, gpu ? 'gpu' : 'offload');
    counts.storedBlocks += own.length;
  }

  /**
   * Router hash mode: false when a store's block that follows a parent has, as its engine hash,
   * CPython's hash(tuple(page_tokens)) of its own tokens, the hash of SGLang's first page events
   * (python/sglang/srt/mem_cache/radix_cache.py _record_store_event, sgl-project/sglang#6824):
   * a chained hash of a block after another depends on that other. Only the first block after a
   * parent is looked at, and only until CONFIRMED_HASHES such blocks were not (then the worker
   * is taken to chain its hashes; an engine hash stored again under another parent still refuses
   * it). A prompt's first block is not looked at: an engine may start its chain from that hash.
   */
  private hashedByPosition(workerId: string, e: BlockStoredEvent): boolean {
    const confirmed = this.hashesConfirmed.get(workerId) ?? 0;
    if (confirmed >= CONFIRMED_HASHES) return true;
    const i = e.parentBlockHash !== null ? 0 : 1;
    const h = e.blockHashes[i];
    if (typeof h !== 'bigint' || e.blockSize < 1 || e.tokenIds.length < (i + 1) * e.blockSize) return true;
    const page = e.tokenIds.slice(i * e.blockSize, (i + 1) * e.blockSize);
    if (BigInt.asUintN(64, cpythonTupleHash(page)) === BigInt.asUintN(64, h)) return false;
    this.hashesConfirmed.set(workerId, confirmed + 1);
    return true;
  }

  /**
   * Router hash mode: the worker's engine hashes blocks without their position. What it stored
   * may be chained under the wrong prefix, so its entries go (clearWorker), and its stores are
   * refused until they are cleared again (a restart, a removal, an AllBlocksCleared).
   */
  private refusePositionFree(workerId: string, counts: ApplyCounts): void {
    this.clearWorker(workerId);
    this.hashesConfirmed.set(workerId, -1);
    counts.positionFreeHashes++;
    skip(counts, 'position_free_hash');
  }

  /**
   * Blocks hashed one by one, the content keys of each block (multimodal identifiers, prompt
   * embedding digests: blockContentKeys) mixed into its chain.
   */
  private hashWithContentKeys(parentHi: number, parentLo: number, e: BlockStoredEvent, out: BlockHashes): void {
    const n = e.blockHashes.length;
    out.ensureCapacity(n);
    const one = new BlockHashes(1);
    let hi = parentHi;
    let lo = parentLo;
    for (let i = 0; i < n; i++) {
      const keys = e.extraKeys![i];
      if (keys && hasBlockContentKeys(keys)) {
        mixIntoChain(hi, lo, JSON.stringify(keys.filter(isBlockContentKey)), this.root);
        hi = this.root[0];
        lo = this.root[1];
      }
      hashTokenBlocksFrom(hi, lo, e.tokenIds.slice(i * e.blockSize, (i + 1) * e.blockSize), e.blockSize, one);
      out.hi[i] = hi = one.hi[0];
      out.lo[i] = lo = one.lo[0];
    }
    out.length = n;
    out.tokensPerBlock = e.blockSize;
  }

  /**
   * An offload copy (no token ids): each hash names the last GPU block it holds; the offload
   * block spans `blockSize / gpu block size` GPU blocks ending there. vLLM now sends these with
   * block_size 0, the chunk's size unknown: only the named block is marked, never a guessed
   * span (a prefix hit on blocks the engine cannot load alone would be a false one).
   */
  private applyOffloadCopies(workerId: string, e: BlockStoredEvent, gpu: boolean, counts: ApplyCounts): void {
    // made only for a block it creates (vllm hash mode): copies of unknown blocks leave nothing
    let map = this.maps.get(workerId);
    const gpuBlockSize = this.blockSizeOf(workerId);
    const span = e.blockSize > 0 && e.blockSize % gpuBlockSize === 0 ? e.blockSize / gpuBlockSize : 1;
    if (span > MAX_OFFLOAD_SPAN) {
      counts.blockSizeMismatches++;
      return skip(counts, 'block_size');
    }
    let spans = gpu ? undefined : this.offloadSpans.get(workerId);
    if (!gpu && !spans?.has(e.medium!)) {
      // a medium whose span cannot be kept: its copies are not marked, or their removals would
      // walk another span than they were stored with
      if (e.medium!.length > MAX_MEDIUM_CHARS || (spans?.size ?? 0) >= MAX_MEDIA_PER_WORKER)
        return skip(counts, 'unknown_offload', e.blockHashes.length);
    }
    const seq = this.scratchSeq(e.blockHashes.length);
    let n = 0;
    const walked = this.walked;
    for (const h of e.blockHashes) {
      let b = map?.get(h);
      if (!b && this.hashMode === 'vllm') {
        engineHashKey(h, this.key);
        map ??= this.mapFor(workerId);
        map.set(h, (b = { hi: this.key[0], lo: this.key[1], gpu: 0, offload: 0, parent: null }));
      }
      if (!b) {
        skip(counts, 'unknown_offload');
        continue;
      }
      // the span is learned from a copy of a block the worker holds, never from an unknown one
      if (!gpu && spans?.get(e.medium!) !== span) {
        if (!spans) this.offloadSpans.set(workerId, (spans = new Map()));
        spans.set(e.medium!, span);
      }
      let cur: OwnBlock | undefined = b;
      let curHash: EngineBlockHash | null = h;
      walked.clear();
      for (let k = 0; k < span && cur && curHash !== null && !walked.has(curHash); k++) {
        if (span > 1) walked.add(curHash);
        if (gpu) cur.gpu++;
        else if (cur.offload++ > 0) counts.duplicateCopies++;
        this.ensureSeq(n + 1);
        seq.hi[n] = cur.hi;
        seq.lo[n] = cur.lo;
        n++;
        curHash = cur.parent;
        cur = curHash === null ? undefined : map!.get(curHash);
      }
    }
    seq.length = n;
    if (n > 0) this.router.applyStored(workerId, seq, gpu ? 'gpu' : 'offload');
    counts.offloadBlocks += n;
  }

  /** Room for `n` entries in the scratch sequence, keeping those written (grows by doubling). */
  private ensureSeq(n: number): void {
    const seq = this.one;
    if (seq.hi.length >= n) return;
    const size = Math.max(n, seq.hi.length * 2);
    const hi = new Uint32Array(size);
    const lo = new Uint32Array(size);
    hi.set(seq.hi);
    lo.set(seq.lo);
    seq.hi = hi;
    seq.lo = lo;
  }

  /**
   * vllm hash mode: whether a store's hashes are the ones the router computes. A prompt's first
   * block (no parent) is hashed from its tokens, LoRA name and cache salt and compared with the
   * engine's; an engine whose hashes are not the router's (another --prefix-caching-hash-algo:
   * vLLM's default is sha256, or a PYTHONHASHSEED of its own) would otherwise fill the
   * index with keys no request ever matches. Once CONFIRMED_HASHES first blocks of a worker
   * have matched, its stores are taken without the check (its cost is one block hash each); a
   * store the check cannot judge (no tokens, a parent, multimodal or embedding keys, a LoRA known
   * only by id) is taken as it is, unless the worker has been found to hash otherwise: then none
   * of its stores is taken until its entries are cleared (it restarted, or was removed).
   * A worker hashes otherwise when, none of its first blocks having matched, one that sent its
   * extra_keys differs (the salt, if any, was in them), or MISMATCHES_BEFORE_GIVING_UP distinct
   * ones without extra_keys differ (each may be a salted prompt of a release that does not send
   * them). A store that differs is skipped either way.
   */
  private hashIsRouters(workerId: string, e: BlockStoredEvent): boolean {
    const confirmed = this.hashesConfirmed.get(workerId) ?? 0;
    if (confirmed >= CONFIRMED_HASHES) return true;
    // an engine whose first block did not match, and none ever did, hashes otherwise: its
    // continuations (stores with a parent, which the check cannot judge) are no better
    if (confirmed < 0) return false;
    if (e.parentBlockHash !== null || e.blockSize < 1 || e.tokenIds.length < e.blockSize) return true;
    if (e.loraName === null && e.loraId !== null) return true;
    const first = e.extraKeys?.[0];
    if (first && first.some((k) => typeof k !== 'string')) return true;
    const keys = this.router.keying.hashTokens(
      e.tokenIds.slice(0, e.blockSize),
      e.blockSize,
      { lora: e.loraName, cacheSalt: saltOf(e) },
      this.checkHashes,
    );
    engineHashKey(e.blockHashes[0], this.key);
    if (keys.length !== 1 || keys.hi[0] !== this.key[0] || keys.lo[0] !== this.key[1]) {
      // once one has matched, a mismatch is that prompt's own, never the worker's
      if (confirmed === 0) this.judgeMismatch(workerId, e);
      return false;
    }
    this.hashesConfirmed.set(workerId, confirmed + 1);
    this.unexplainedMismatches.delete(workerId);
    return true;
  }

  /** A first block differed and none of the worker's has matched: whether it now hashes otherwise. */
  private judgeMismatch(workerId: string, e: BlockStoredEvent): void {
    if (e.extraKeys !== null && e.extraKeys !== undefined) {
      // its keys were sent, the salt among them: the router hashed what the engine hashed
      this.hashesConfirmed.set(workerId, -1);
      this.unexplainedMismatches.delete(workerId);
      return;
    }
    // a release without extra_keys: the prompt may be salted with a cache_salt not sent
    let seen = this.unexplainedMismatches.get(workerId);
    if (!seen) this.unexplainedMismatches.set(workerId, (seen = new Set()));
    seen.add(e.blockHashes[0]);
    if (seen.size >= MISMATCHES_BEFORE_GIVING_UP) {
      this.hashesConfirmed.set(workerId, -1);
      this.unexplainedMismatches.delete(workerId);
    }
  }

  private scratchSeq(n: number): { hi: Uint32Array; lo: Uint32Array; length: number } {
    const seq = this.one;
    if (seq.hi.length < n) {
      seq.hi = new Uint32Array(n);
      seq.lo = new Uint32Array(n);
    }
    seq.length = 0;
    return seq;
  }
}

/** The adapter keying a store: its lora_name, or (releases before lora_name) its lora_id. */
function loraOf(e: BlockStoredEvent): string | null {
  return e.loraName ?? (e.loraId !== null ? `#${e.loraId}` : null);
}

/**
 * The cache salt of a prompt's first block: SGLang's cache_salt, which salts the whole page
 * chain from its root, or vLLM's, read from the block's extra_keys: vLLM lists the LoRA name
 * first, then multimodal (identifier, offset) pairs, then the salt, then prompt-embedding
 * digests (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys); keys sent typed
 * (event_version 1, proposed in vllm-project/vllm#55488 and not merged) keep that order, and the
 * decoder reads them as these.
 */
function saltOf(e: BlockStoredEvent): string | null {
  if (e.cacheSalt !== undefined) return e.cacheSalt;
  const keys = e.extraKeys?.[0];
  if (!keys) return null;
  let i = 0;
  if (e.loraName !== null && keys[0] === e.loraName) i = 1;
  for (; i < keys.length; i++) if (typeof keys[i] === 'string') return keys[i] as string;
  return null;
}

/**
 * Whether an extra key stands for what a block's KV was computed from besides its token ids:
 * a multimodal (identifier, offset) pair, whose placeholder tokens are the same for every
 * image, or a prompt-embedding digest (bytes: vLLM sends token ids 0 for a prompt given as
 * embeddings). Requests the router hashes are token ids alone, so a block keyed by these never
 * matches one, nor one of other content. A map that is no digest is a typed key of a kind the
 * decoder does not know (a newer vLLM's): taken for content too, which may cost a hit on the
 * block, never give one that its content does not have.
 */
function isBlockContentKey(k: unknown): boolean {
  return k !== null && typeof k === 'object';
}

function hasBlockContentKeys(keys: ExtraKeys): boolean {
  return keys !== null && keys.some(isBlockContentKey);
}

const U64 = (1n << 64n) - 1n;
const XXPRIME_1 = 11400714785074694791n;
const XXPRIME_2 = 14029467366897019727n;
const XXPRIME_5 = 2870177450012600261n;
/** Python's hash modulus for ints (sys.hash_info.modulus, 64-bit builds). */
const HASH_MODULUS = (1n << 61n) - 1n;

/**
 * CPython's hash(tuple(ints)) (3.8 and later, 64-bit builds: tuplehash in Objects/tupleobject.c,
 * an xxHash-like mix of each item's hash; an int's hash is the int modulo 2^61 − 1, with its sign,
 * −1 being −2), as a signed 64-bit value. Ints hash the same under any PYTHONHASHSEED. SGLang's
 * first page events hash a page as hash(tuple(page_tokens)) (KvEventApplier.hashedByPosition).
 */
export function cpythonTupleHash(items: ArrayLike<number>): bigint {
  let acc = XXPRIME_5;
  for (let i = 0; i < items.length; i++) {
    const n = BigInt(items[i]);
    let lane = n < 0n ? -(-n % HASH_MODULUS) : n % HASH_MODULUS;
    if (lane === -1n) lane = -2n;
    acc = (acc + ((BigInt.asUintN(64, lane) * XXPRIME_2) & U64)) & U64;
    acc = ((acc << 31n) | (acc >> 33n)) & U64;
    acc = (acc * XXPRIME_1) & U64;
  }
  acc = (acc + (BigInt(items.length) ^ (XXPRIME_5 ^ 3527539n))) & U64;
  if (acc === U64) return 1546275796n;
  return BigInt.asIntN(64, acc);
}
