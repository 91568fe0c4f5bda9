import { hashTokenBlocks, type BlockHashes, type HashNamespace } from './hashing.js';
import { VllmBlockHasher, type VllmHashAlgo } from './vllm-block-hash.js';

/**
 * How a prompt's token ids become block keys, for a given block size: the router's own chain
 * hash (`router`, hashing.ts; engines' hashes are then learned through their events), or
 * vLLM's own block hash (`vllm`, vllm-block-hash.ts, under the engines' PYTHONHASHSEED and
 * --prefix-caching-hash-algo; the keys are the hashes the engines report, so no chain of
 * events is needed). In `vllm` mode the namespace's LoRA name and
 * cache salt become vLLM's extra_keys; the CLA group has no vLLM counterpart and is not used.
 */
export type BlockHashMode = 'router' | 'vllm';

export class BlockKeying {
  readonly mode: BlockHashMode;
  /** `vllm` mode: the engines' --prefix-caching-hash-algo the keys are computed with. */
  readonly vllmAlgo: VllmHashAlgo | undefined;
  private readonly vllm: VllmBlockHasher | undefined;

  constructor(mode: BlockHashMode = 'router', pythonHashSeed?: string, vllmAlgo: VllmHashAlgo = 'sha256_cbor') {
    if (mode !== 'router' && mode !== 'vllm')
      throw new RangeError(`blockHash must be 'router' or 'vllm', got '${String(mode)}'`);
    this.mode = mode;
    if (mode === 'vllm') {
      if (typeof pythonHashSeed !== 'string' || pythonHashSeed === '')
        throw new RangeError("blockHash 'vllm' needs pythonHashSeed: the engines' PYTHONHASHSEED");
      this.vllm = new VllmBlockHasher(pythonHashSeed, vllmAlgo);
      this.vllmAlgo = vllmAlgo;
    }
  }

  /** Keys of every full block of `tokens`, written into `out`. */
  hashTokens(
    tokens: ArrayLike<number>,
    blockSize: number,
    ns: HashNamespace | undefined,
    out: BlockHashes,
  ): BlockHashes {
    if (this.vllm)
      return this.vllm.hashBlocks(tokens, blockSize, { lora: ns?.lora ?? null, cacheSalt: ns?.cacheSalt ?? null }, out);
    return hashTokenBlocks(tokens, blockSize, ns, out);
  }
}
