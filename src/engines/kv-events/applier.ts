import { BlockHashes, chainRoot, hashTokenBlocksFrom } from '../../core/hashing.js';
import type { KVAwareRouter } from '../../core/router/index.js';
import type { EngineBlockHash, KvEvent, KvEventBatch } from './decode.js';

/**
 * Applies decoded KV events of one worker to the router's block index. Engines hash blocks
 * with seeds the router cannot know, so the router hashes each stored block's token ids
 * itself, chained from its parent's own hash, and keeps engine hash → own hash per worker to
 * apply BlockRemoved (DESIGN.md §8). Pure: no I/O; the subscriber feeds it.
 */
export interface ApplyCounts {
  storedBlocks: number;
  removedBlocks: number;
  cleared: number;
  /** Stored events whose parent block the router never saw (e.g. stored before it subscribed). */
  orphanEvents: number;
  /** Removed hashes the router never saw stored. */
  unknownRemovals: number;
  /** Stored events whose block size differs from the router's (a configuration error). */
  blockSizeMismatches: number;
}

export function emptyCounts(): ApplyCounts {
  return { storedBlocks: 0, removedBlocks: 0, cleared: 0, orphanEvents: 0, unknownRemovals: 0, blockSizeMismatches: 0 };
}

const GPU = 1;
const OFFLOAD = 2;

interface OwnBlock {
  hi: number;
  lo: number;
  /** Tiers the engine reported holding it in (GPU, offload). */
  tiers: number;
}

export interface WorkerNamespace {
  /** The CLA group the worker's KV is made under, if it serves exactly one. */
  claGroup?: number | null;
}

export class KvEventApplier {
  private readonly maps = new Map<string, Map<EngineBlockHash, OwnBlock>>();
  private readonly scratch = new BlockHashes(64);
  private readonly root = new Uint32Array(2);
  private readonly one = { hi: new Uint32Array(1024), lo: new Uint32Array(1024), length: 0 };

  constructor(
    private readonly router: KVAwareRouter,
    private readonly namespaces: ReadonlyMap<string, WorkerNamespace> = new Map(),
  ) {}

  /** Blocks the router tracks for a worker from its events. */
  trackedBlocks(workerId: string): number {
    return this.maps.get(workerId)?.size ?? 0;
  }

  /** The engine's hashes (decimal, or hex for digests) of what the worker reported holding. */
  trackedEngineHashes(workerId: string): string[] {
    return [...(this.maps.get(workerId)?.keys() ?? [])].map((h) => h.toString());
  }

  /** Own hashes (hex) of what the worker reported holding, for comparing with the engine. */
  trackedHashes(workerId: string): string[] {
    const m = this.maps.get(workerId);
    if (!m) return [];
    return [...m.values()].map((b) => b.hi.toString(16).padStart(8, '0') + b.lo.toString(16).padStart(8, '0'));
  }

  apply(workerId: string, batch: KvEventBatch, counts: ApplyCounts = emptyCounts()): ApplyCounts {
    for (const event of batch.events) this.applyEvent(workerId, event, counts);
    return counts;
  }

  /** Forgets a worker's blocks: in the index (as AllBlocksCleared) and in the hash map. */
  clearWorker(workerId: string): void {
    this.maps.delete(workerId);
    this.router.applyCleared(workerId);
  }

  private mapFor(workerId: string): Map<EngineBlockHash, OwnBlock> {
    let m = this.maps.get(workerId);
    if (!m) this.maps.set(workerId, (m = new Map()));
    return m;
  }

  private applyEvent(workerId: string, e: KvEvent, counts: ApplyCounts): void {
    if (e.type === 'AllBlocksCleared') {
      this.clearWorker(workerId);
      counts.cleared++;
      return;
    }
    const map = this.mapFor(workerId);
    const tier = e.medium === null || e.medium === 'GPU' ? GPU : OFFLOAD;
    if (e.type === 'BlockStored') {
      if (e.blockSize !== this.router.blockSize) {
        counts.blockSizeMismatches++;
        return;
      }
      let parentHi: number;
      let parentLo: number;
      if (e.parentBlockHash === null) {
        chainRoot({ lora: e.loraName, claGroup: this.namespaces.get(workerId)?.claGroup ?? null }, this.root);
        parentHi = this.root[0];
        parentLo = this.root[1];
      } else {
        const parent = map.get(e.parentBlockHash);
        if (!parent) {
          counts.orphanEvents++;
          return;
        }
        parentHi = parent.hi;
        parentLo = parent.lo;
      }
      const own = hashTokenBlocksFrom(parentHi, parentLo, e.tokenIds, e.blockSize, this.scratch);
      for (let i = 0; i < own.length; i++) {
        const prev = map.get(e.blockHashes[i]);
        if (prev) prev.tiers |= tier;
        else map.set(e.blockHashes[i], { hi: own.hi[i], lo: own.lo[i], tiers: tier });
      }
      this.router.applyStored(workerId, own, tier === GPU ? 'gpu' : 'offload');
      counts.storedBlocks += own.length;
      return;
    }
    // BlockRemoved: from one tier (medium given) or all (medium null)
    const seq = this.one;
    if (seq.hi.length < e.blockHashes.length) {
      seq.hi = new Uint32Array(e.blockHashes.length);
      seq.lo = new Uint32Array(e.blockHashes.length);
    }
    let n = 0;
    for (const h of e.blockHashes) {
      const b = map.get(h);
      if (!b) {
        counts.unknownRemovals++;
        continue;
      }
      seq.hi[n] = b.hi;
      seq.lo[n] = b.lo;
      n++;
      b.tiers &= e.medium === null ? 0 : ~tier;
      if (b.tiers === 0) map.delete(h);
    }
    seq.length = n;
    if (n > 0) this.router.applyRemoved(workerId, seq, e.medium === null ? undefined : tier === GPU ? 'gpu' : 'offload');
    counts.removedBlocks += n;
  }
}
