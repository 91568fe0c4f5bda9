/** The engine's hardware and scheduler settings, and the defaults they take. */

export interface EngineConfig {
  /** Tokens per cache block (the trace's block size for trace replay). */
  blockTokens: number;
  /** KV capacity of the engine in tokens. */
  kvTokens: number;
  /**
   * Longest request (prompt + output tokens) the engine serves, vLLM's max_model_len; the
   * effective limit is also capped by the KV capacity (see EngineModel.maxModelLen).
   */
  maxModelLen: number;
  /** Token budget of one step (vLLM max_num_batched_tokens): decode tokens + prefill chunks. */
  maxBatchTokens: number;
  /** Most sequences running at once (vLLM max_num_seqs). */
  maxRunning: number;
  /** Reading the weights once (ms): the floor of every step (memory-bound). */
  weightReadMs: number;
  /** Linear-layer compute per token in the step, prefill or decode (ms): 2 × params FLOP. */
  linearMsPerToken: number;
  /** Attention compute per (query token × context token) pair (ms). */
  attentionMsPerTokenPair: number;
  /** Reading one context token's KV (all layers) once (ms): attention's memory bound. */
  kvReadMsPerToken: number;
  /**
   * Fraction of a reused content anchor's tokens computed again (CacheBlend recomputes a
   * small share of tokens to repair cross-attention when reusing position-independent KV).
   */
  blendRecompute: number;
}

/**
 * Qwen3-32B in fp8 on one H100 SXM 80 GB (the setup of Dynamo's published A/B, 8 such
 * workers). Model (Qwen3-32B model card and config.json): 32.8 B parameters, 64 layers, 64
 * query heads and 8 KV heads of 128 dims, untied 151,936 × 5,120 LM head, 32,768 tokens of
 * native context and 131,072 with YaRN (rope scaling factor 4), the setting Qwen documents
 * for long inputs. GPU (NVIDIA H100 SXM datasheet): 3.35 TB/s HBM3, 1,979 dense fp8 TFLOP/s.
 *
 * - weightReadMs: every step reads the 31.2 B non-embedding weights plus the 0.78 B-parameter
 *   LM head, ≈ 32.0 GB in fp8, at an assumed 80% of peak bandwidth (2.68 TB/s):
 *   32.0 / 2.68 ≈ 12 ms.
 * - linearMsPerToken: 2 FLOP per parameter per token = 64 GFLOP, at an assumed 60% of dense
 *   fp8 peak (1.19 PFLOP/s; the fraction FlashAttention-3 reached with fp8 on H100, ≈ 1.2
 *   PFLOP/s, Shah et al. 2024 — no measurement of this model's GEMMs is used):
 *   64e9 / 1.19e15 s ≈ 0.054 ms, ≈ 18,500 tokens/s. A step becomes compute-bound above
 *   12 / 0.054 ≈ 220 tokens, which is where large decode batches start to pay for the
 *   linear layers.
 * - attentionMsPerTokenPair: QKᵀ and PV cost 4 × heads × head_dim = 32,768 FLOP per layer
 *   and pair, × 64 layers = 2.1 MFLOP; FlashAttention-3 measured up to 740 TFLOP/s (75% of
 *   peak) for bf16 forward attention on H100 (Shah et al. 2024), causal masking runs below
 *   that, so 600 TFLOP/s: 2.1e6 / 600e12 s ≈ 3.5e-6 ms.
 * - kvReadMsPerToken: KV per token = 2 (K, V) × 64 layers × 8 heads × 128 dims × 1 byte
 *   (fp8 KV cache) = 131,072 bytes, read at 2.68 TB/s ≈ 4.9e-5 ms.
 * - kvTokens: vLLM's default gpu_memory_utilization 0.9 of 79.6 GiB (85.5 GB) = 77 GB, less
 *   33 GB of weights and ≈ 4 GB of profiled activations, leaves ≈ 40 GB / 131 KB ≈ 300,000
 *   tokens.
 * - maxModelLen: 131,072, the YaRN context (capped by kvTokens per engine).
 * - maxBatchTokens 8,192 and maxRunning 1,024: vLLM's defaults for the OpenAI server on a GPU
 *   of 70 GiB or more other than an A100 (vllm/engine/arg_utils.py, EngineArgs batch
 *   defaults: default_max_num_batched_tokens, default_max_num_seqs).
 * - blendRecompute 0.15: CacheBlend (Yao et al., EuroSys 2025) selectively recomputes a small
 *   share of a reused chunk's tokens, on the order of 15%, to restore cross-attention.
 * The efficiencies (80% of bandwidth, 60% of linear-layer compute) are assumptions, not
 * measurements of this setup (only the attention rate above is a published measurement);
 * every constant can be overridden, and the comparison between policies is what the
 * simulator is for.
 */
export const ENGINE_DEFAULTS: Readonly<Omit<EngineConfig, 'blockTokens'>> = Object.freeze({
  kvTokens: 300_000,
  maxModelLen: 131_072,
  maxBatchTokens: 8192,
  maxRunning: 1024,
  weightReadMs: 12,
  linearMsPerToken: 0.054,
  attentionMsPerTokenPair: 3.5e-6,
  kvReadMsPerToken: 4.9e-5,
  blendRecompute: 0.15,
});

/** Fills in the defaults and checks every setting; RangeError naming the setting otherwise. */
export function engineConfig(config: Partial<EngineConfig> & { blockTokens: number }): EngineConfig {
  const c: EngineConfig = { ...ENGINE_DEFAULTS, ...config };
  for (const [k, v] of Object.entries(c)) {
    if (typeof v !== 'number' || !(v >= 0) || !Number.isFinite(v))
      throw new RangeError(`engine ${k} must be a finite number >= 0, got ${v}`);
  }
  if (!Number.isInteger(c.blockTokens) || c.blockTokens < 1)
    throw new RangeError('engine blockTokens must be an integer >= 1');
  if (c.blendRecompute > 1) throw new RangeError(`engine blendRecompute must be in [0, 1], got ${c.blendRecompute}`);
  if (c.maxBatchTokens < 1 || c.maxRunning < 1)
    throw new RangeError('engine maxBatchTokens and maxRunning must be >= 1');
  return c;
}
