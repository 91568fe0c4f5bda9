import type { RequestBlocks } from './types.js';

/** 53-bit map key of a 64-bit block hash (the same key the engine model uses). */
export function blockKey53(hi: number, lo: number): number {
  return (hi & 0x1fffff) * 4294967296 + (lo >>> 0);
}

/** A request's block keys, in a buffer reused from request to request. */
export class BlockKeys {
  keys = new Float64Array(256);
  length = 0;

  load(blocks: RequestBlocks | undefined): void {
    const n = blocks ? blocks.length : 0;
    if (this.keys.length < n) this.keys = new Float64Array(Math.max(n, this.keys.length * 2));
    for (let i = 0; i < n; i++) this.keys[i] = blockKey53(blocks!.hi[i], blocks!.lo[i]);
    this.length = n;
  }

  /**
   * Leading blocks present in `set`. Blocks are prefix-chained and the sets policies keep
   * hold whole prefixes (a live request's blocks, an approximate tree's paths), so presence
   * is monotone along the prompt: a binary search for the first absent block.
   */
  presentPrefix(set: { has(key: number): boolean }): number {
    let lo = 0;
    let hi = this.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (set.has(this.keys[mid])) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}
