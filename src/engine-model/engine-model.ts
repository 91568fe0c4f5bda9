/**
 * A model of one inference engine (one vLLM V1 data-parallel rank), shared by the simulator
 * and the mock engine: a paged KV cache with prefix caching, continuous batching with a token
 * budget per step (chunked prefill), KV blocks allocated as tokens are computed, preemption by
 * recompute, and step times from a roofline.
 *
 * What follows vLLM V1, and where (vllm-project/vllm):
 * - one pool of `kvTokens / blockTokens` blocks; every block with no request holding it sits
 *   in one free queue, least recently freed first; a new block is taken from the front of the
 *   queue, and if that block still holds a cached prefix it is evicted then (BlockRemoved)
 *   (`vllm/v1/core/block_pool.py`: FreeKVCacheBlockQueue, get_new_blocks, free_blocks);
 * - a finished or preempted request frees its blocks tail first, so the head of a prefix
 *   outlives its tail (`vllm/v1/core/single_type_kv_cache_manager.py`: free, "Free blocks in
 *   reverse order so that the tail blocks are freed first");
 * - a prefix hit takes the leading full blocks already computed, at most `prompt − 1` tokens
 *   worth, so the last prompt token is always computed (`vllm/v1/core/kv_cache_manager.py`:
 *   get_computed_blocks, max_cache_hit_length = num_tokens − 1); only full blocks are ever
 *   cached (`block_pool.py`: cache_full_blocks);
 * - blocks are allocated for the tokens a step computes, not for the whole output up front;
 *   a request's KV grows by one token per decode step (`kv_cache_manager.py`: allocate_slots);
 * - each step schedules the running requests first, in order, each taking
 *   min(tokens left, budget) tokens; when one cannot get its blocks the newest running request
 *   is preempted (blocks freed, progress dropped, back to the front of the waiting queue) until
 *   it can, or until it was itself the newest; waiting requests are admitted, first come first
 *   served, only in steps without preemption, and the first that does not fit stops admission
 *   (`vllm/v1/core/sched/scheduler.py`: schedule, _preempt_request);
 * - KV usage (vllm:kv_cache_usage_perc) is the fraction of blocks held by requests
 *   (`block_pool.py`: get_usage = 1 − free / total).
 *
 * Where it differs (docs/simulator.md lists these too): a block is hashed and announced at the
 * end of the step that computed it (vLLM: when scheduled, events published after the step);
 * duplicate computations of one block keep one cached copy; output tokens are never cached
 * under a key a later prompt could hit; content anchors (CacheBlend-style passages) are
 * allocated whole at admission and are not announced as KV events.
 *
 * The engine reports the prefix blocks it caches and evicts through `onStored` / `onRemoved`;
 * the simulator delivers those to the router later, never synchronously. Work is split in two
 * halves like a real step: `startStep` schedules (allocations, evictions, admissions happen
 * then, as in vLLM's schedule()), `finishStep` applies the outputs when the step ends (first
 * tokens, finished requests and their frees, as in update_from_output()), so a metrics scrape
 * in between sees the engine as it is during the step.
 */

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

/** 53-bit engine cache key from a 64-bit block hash. */
export function blockKey(hi: number, lo: number): number {
  return (hi & 0x1fffff) * 4294967296 + (lo >>> 0);
}

/** A content anchor as the engine sees it: its tokens and the keys of its own blocks. */
export interface EngineAnchor {
  tokens: number;
  keys: Float64Array;
}

/** A request as the engine sees it. */
export interface EngineRequest {
  id: number;
  /**
   * Keys of the prompt's leading blocks (numeric cache keys) with the router's hashes for
   * events. Only full blocks of the prompt are ever cached: keys past the last full block
   * (e.g. a partial last block) are not used.
   */
  keys: Float64Array;
  hashHi: Uint32Array;
  hashLo: Uint32Array;
  inputTokens: number;
  outputTokens: number;
  /**
   * Position-independent chunks (retrieved passages) the engine may reuse wherever they sit
   * (CacheBlend-style), part of `inputTokens`; each takes blocks of its own.
   */
  anchors?: readonly EngineAnchor[];
}

/** Progress reported at the end of a step. */
export interface StepResult {
  /** When the step ends (ms). */
  end: number;
  /** Requests whose first token came out of this step, with the tokens found cached. */
  firstTokens: Array<{ request: EngineRequest; cachedTokens: number }>;
  finished: EngineRequest[];
  /** Output tokens each decoding request produced in this step (or run of steps). */
  decoded: Array<{ request: EngineRequest; tokens: number }>;
  /** Requests preempted (recompute) when this step was scheduled. */
  preempted: EngineRequest[];
}

/** A request in the engine: its progress survives preemption, its blocks do not. */
interface Job {
  request: EngineRequest;
  /** Output tokens produced so far (kept across preemption, recomputed as prompt). */
  produced: number;
  /** Tokens reported cached at the first admission; -1 before. */
  cachedTokens: number;
  /** Leading keys usable for prefix caching (full prompt blocks). */
  keyed: number;
  /** Prompt tokens outside content anchors. */
  regionPrompt: number;
  anchorTokens: number;
  // running state (reset by preemption)
  /** Blocks held for the prompt region and the output, in token order. */
  slots: number[];
  /** Blocks held for content anchors, and which anchors were computed here. */
  anchorSlots: number[];
  anchorMissKeys: number[];
  /** Region tokens with KV (cached or computed). */
  regionDone: number;
  /** Region tokens to reach before the next token: prompt region + outputs so far. */
  regionTarget: number;
  /** Anchor tokens still to compute (missed anchors whole, hit ones' recompute share). */
  anchorWork: number;
  /** Keyed region blocks already hashed. */
  hashed: number;
  /** Tokens scheduled in the step under way (0: not scheduled). */
  scheduled: number;
  /** The pool's change counters and the budget at the last admission that did not fit. */
  refusedAt: [cache: number, frees: number, budget: number];
}

const NONE = -1;

/**
 * Cache key → block slot, open addressing with linear probing over typed arrays: the engine
 * looks up every prompt block of every request, and a Map keyed by 53-bit doubles allocates
 * and hashes slowly. At most `capacity` keys (one per block); the table stays at most half full.
 */
export class KeySlotTable {
  private readonly keys: Float64Array;
  private readonly slots: Int32Array;
  private readonly mask: number;
  private readonly shift: number;
  size = 0;

  constructor(capacity: number) {
    let bits = 4;
    while (1 << bits < 2 * capacity) bits++;
    this.keys = new Float64Array(1 << bits);
    this.slots = new Int32Array(1 << bits).fill(NONE);
    this.mask = (1 << bits) - 1;
    this.shift = 32 - bits;
  }

  private home(key: number): number {
    return Math.imul((key >>> 0) ^ Math.floor(key / 4294967296), 0x9e3779b1) >>> this.shift;
  }

  get(key: number): number {
    for (let i = this.home(key); ; i = (i + 1) & this.mask) {
      const s = this.slots[i];
      if (s === NONE) return NONE;
      if (this.keys[i] === key) return s;
    }
  }

  has(key: number): boolean {
    return this.get(key) !== NONE;
  }

  /** Adds a key that is not present. */
  set(key: number, slot: number): void {
    let i = this.home(key);
    while (this.slots[i] !== NONE) i = (i + 1) & this.mask;
    this.keys[i] = key;
    this.slots[i] = slot;
    this.size++;
  }

  delete(key: number): void {
    let i = this.home(key);
    for (; ; i = (i + 1) & this.mask) {
      if (this.slots[i] === NONE) return;
      if (this.keys[i] === key) break;
    }
    this.size--;
    // backward-shift deletion: move later entries of the run into the hole when they may
    for (let j = (i + 1) & this.mask; this.slots[j] !== NONE; j = (j + 1) & this.mask) {
      const h = this.home(this.keys[j]);
      const movable = i <= j ? h <= i || h > j : h <= i && h > j;
      if (movable) {
        this.keys[i] = this.keys[j];
        this.slots[i] = this.slots[j];
        i = j;
      }
    }
    this.slots[i] = NONE;
  }

  *entries(): Generator<[number, number]> {
    for (let i = 0; i < this.slots.length; i++) if (this.slots[i] !== NONE) yield [this.keys[i], this.slots[i]];
  }
}

export class EngineModel {
  readonly config: EngineConfig;
  readonly capacityBlocks: number;
  /** The longest request served: config.maxModelLen capped by the KV capacity. */
  readonly maxModelLen: number;
  /** Sum of step durations (ms): how long the engine was busy. */
  busyMs = 0;
  /** Prompt tokens actually computed (cache misses, blend recompute, and preemption redo). */
  prefillTokens = 0;
  /** Preemptions so far. */
  preemptions = 0;

  // the block pool: per slot its cache key (NaN: not cached), hashes for events, refs, and
  // the links of the free queue (every slot with refs 0, least recently freed first)
  // kept over lru-cache: pinning takes a block out mid-queue; typed links are 1.44× faster (`npm run bench:lru`)
  private readonly slotOf: KeySlotTable;
  private readonly keyOf: Float64Array;
  private readonly hiOf: Uint32Array;
  private readonly loOf: Uint32Array;
  private readonly announced: Uint8Array;
  private readonly refs: Int32Array;
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private freeHead = NONE;
  private freeTail = NONE;
  private freeCount = 0;
  /** Counters of cache changes (blocks cached or evicted) and of blocks freed. */
  private cacheChanges = 0;
  private frees = 0;

  private waiting: Job[] = [];
  private waitingHead = 0;
  private readonly running: Job[] = [];
  private readonly jobs = new Map<number, Job>();
  /** Step under way: its end, or NaN. */
  private stepEnd = Number.NaN;
  private stepDecodeSteps = 0;
  private stepPreempted: EngineRequest[] = [];

  constructor(
    config: Partial<EngineConfig> & { blockTokens: number },
    private readonly onStored: (hi: number, lo: number) => void = () => {},
    private readonly onRemoved: (hi: number, lo: number) => void = () => {},
  ) {
    this.config = { ...ENGINE_DEFAULTS, ...config };
    for (const [k, v] of Object.entries(this.config)) {
      if (typeof v !== 'number' || !(v >= 0) || !Number.isFinite(v))
        throw new RangeError(`engine ${k} must be a finite number >= 0, got ${v}`);
    }
    const c = this.config;
    if (!Number.isInteger(c.blockTokens) || c.blockTokens < 1)
      throw new RangeError('engine blockTokens must be an integer >= 1');
    if (c.blendRecompute > 1) throw new RangeError(`engine blendRecompute must be in [0, 1], got ${c.blendRecompute}`);
    if (c.maxBatchTokens < 1 || c.maxRunning < 1)
      throw new RangeError('engine maxBatchTokens and maxRunning must be >= 1');
    this.capacityBlocks = Math.max(1, Math.floor(c.kvTokens / c.blockTokens));
    this.maxModelLen = Math.max(1, Math.min(Math.floor(c.maxModelLen), this.capacityBlocks * c.blockTokens));
    const n = this.capacityBlocks;
    this.slotOf = new KeySlotTable(n);
    this.keyOf = new Float64Array(n).fill(Number.NaN);
    this.hiOf = new Uint32Array(n);
    this.loOf = new Uint32Array(n);
    this.announced = new Uint8Array(n);
    this.refs = new Int32Array(n);
    this.prev = new Int32Array(n);
    this.next = new Int32Array(n);
    for (let s = 0; s < n; s++) this.appendFree(s);
  }

  /**
   * Why the engine would refuse the request, as vLLM's OpenAI server words it (HTTP 400), or
   * null. vLLM refuses a prompt of max_model_len tokens or more, and a prompt whose requested
   * output does not fit in what is left (vllm/entrypoints/openai/serving_engine.py,
   * _validate_input); the output a trace recorded is taken as the max_tokens asked for.
   */
  rejection(request: {
    inputTokens: number;
    outputTokens: number;
    anchors?: ReadonlyArray<{ tokens: number }>;
  }): string | null {
    const len = this.maxModelLen;
    const input = request.inputTokens;
    if (input >= len) {
      return `This model's maximum context length is ${len} tokens. However, your request has ${input} input tokens. Please reduce the length of the input messages.`;
    }
    if (input + request.outputTokens > len) {
      return `'max_tokens' or 'max_completion_tokens' is too large: ${request.outputTokens}. This model's maximum context length is ${len} tokens and your request has ${input} input tokens (${request.outputTokens} > ${len} - ${input}).`;
    }
    // content anchors take whole blocks of their own: the request must still fit alone
    const bt = this.config.blockTokens;
    let anchorTokens = 0;
    let blocks = 0;
    for (const a of request.anchors ?? []) {
      anchorTokens += a.tokens;
      blocks += Math.ceil(a.tokens / bt);
    }
    blocks += Math.ceil(Math.max(1, input - anchorTokens + request.outputTokens) / bt);
    if (blocks > this.capacityBlocks)
      return `This request needs ${blocks} KV blocks with its passages, more than the ${this.capacityBlocks} the engine has.`;
    return null;
  }

  /** Queues a request; throws a RangeError naming the limit when the engine refuses it. */
  enqueue(request: EngineRequest): void {
    const why = this.rejection(request);
    if (why !== null) throw new RangeError(why);
    if (this.jobs.has(request.id)) throw new RangeError(`request ${request.id} is already in the engine`);
    const bt = this.config.blockTokens;
    let anchorTokens = 0;
    for (const a of request.anchors ?? []) anchorTokens += a.tokens;
    anchorTokens = Math.min(anchorTokens, request.inputTokens);
    const regionPrompt = request.inputTokens - anchorTokens;
    const job: Job = {
      request,
      produced: 0,
      cachedTokens: -1,
      keyed: Math.min(request.keys.length, Math.floor(regionPrompt / bt)),
      regionPrompt,
      anchorTokens,
      slots: [],
      anchorSlots: [],
      anchorMissKeys: [],
      regionDone: 0,
      regionTarget: 0,
      anchorWork: 0,
      hashed: 0,
      scheduled: 0,
      refusedAt: [-1, -1, 0],
    };
    this.jobs.set(request.id, job);
    this.waiting.push(job);
  }

  get idle(): boolean {
    return this.running.length === 0 && this.waitingHead >= this.waiting.length;
  }

  get waitingCount(): number {
    return this.waiting.length - this.waitingHead;
  }

  get runningCount(): number {
    return this.running.length;
  }

  /** Fraction of KV blocks held by requests (vLLM's kv_cache_usage_perc). */
  get kvUsage(): number {
    return (this.capacityBlocks - this.freeCount) / this.capacityBlocks;
  }

  /** Whether the engine holds the block cached (or computing it under that key). */
  holds(key: number): boolean {
    return this.slotOf.has(key);
  }

  /** Prefix blocks in the cache (held or free) — what the engine would list as cached. */
  cachedKeys(): number[] {
    const out: number[] = [];
    for (const [key, slot] of this.slotOf.entries()) if (this.announced[slot]) out.push(key);
    return out;
  }

  /**
   * Duration (ms) of one step computing `chunks`, each [new tokens, context before them] (a
   * decoding sequence is a chunk of one token): the linear layers are one roofline over the
   * step's tokens (reading the weights vs computing them), attention another per sequence
   * (reading its context's KV vs its query × key pairs, causal within the chunk), added up.
   */
  stepTime(chunks: ReadonlyArray<readonly [number, number]>): number {
    const c = this.config;
    let tokens = 0;
    let attention = 0;
    for (const [chunk, start] of chunks) {
      tokens += chunk;
      const pairs = chunk * start + (chunk * (chunk + 1)) / 2;
      attention += Math.max((start + chunk) * c.kvReadMsPerToken, pairs * c.attentionMsPerTokenPair);
    }
    return Math.max(c.weightReadMs, tokens * c.linearMsPerToken) + attention;
  }

  /**
   * Runs one whole step from `now` (schedule, then outputs): see startStep / finishStep.
   */
  step(now: number, until: number): StepResult {
    this.startStep(now, until);
    return this.finishStep();
  }

  /**
   * Schedules one step starting at `now` and returns when it ends. When every running
   * request is decoding, nothing waits and the blocks suffice, it schedules a run of decode
   * steps instead, ending no later than `until` when possible (at least one step). Block
   * allocation, eviction, preemption and admission happen here; outputs at finishStep.
   */
  startStep(now: number, until: number): number {
    if (!Number.isNaN(this.stepEnd)) throw new Error('startStep: a step is already under way');
    const c = this.config;
    this.stepPreempted = [];
    this.stepDecodeSteps = 0;
    if (this.waitingHead >= this.waiting.length && this.running.length > 0 && this.allDecoding()) {
      const end = this.scheduleDecodeRun(now, until);
      if (end >= 0) return end;
    }
    let budget = c.maxBatchTokens;
    const chunks: Array<[number, number]> = [];
    // running requests first, in order; the newest is preempted when blocks run out
    for (let i = 0; i < this.running.length && budget > 0; i++) {
      const job = this.running[i];
      const tokens = Math.min(this.computeLeft(job), budget);
      let fits = this.allocateFor(job, tokens);
      while (!fits) {
        const victim = this.running.pop()!;
        this.preempt(victim);
        if (victim === job) break;
        fits = this.allocateFor(job, tokens);
      }
      if (!fits) break;
      job.scheduled = tokens;
      budget -= tokens;
      chunks.push([tokens, this.context(job)]);
    }
    // then waiting requests, first come first served, if nothing was preempted
    if (this.stepPreempted.length === 0) {
      while (budget > 0 && this.running.length < c.maxRunning && this.waitingHead < this.waiting.length) {
        const job = this.waiting[this.waitingHead];
        const tokens = this.admit(job, budget);
        if (tokens === 0) break; // not enough KV: the head of the queue waits
        this.waitingHead++;
        this.running.push(job);
        job.scheduled = tokens;
        budget -= tokens;
        chunks.push([tokens, this.context(job)]);
      }
      if (this.waitingHead > 1024 && this.waitingHead * 2 > this.waiting.length) {
        this.waiting = this.waiting.slice(this.waitingHead);
        this.waitingHead = 0;
      }
    }
    const duration = chunks.length > 0 ? this.stepTime(chunks) : 0;
    this.busyMs += duration;
    this.stepEnd = now + duration;
    return this.stepEnd;
  }

  /** Applies the outputs of the step under way: KV computed, tokens out, finished requests freed. */
  finishStep(): StepResult {
    if (Number.isNaN(this.stepEnd)) throw new Error('finishStep: no step under way');
    const end = this.stepEnd;
    this.stepEnd = Number.NaN;
    const firstTokens: StepResult['firstTokens'] = [];
    const finished: EngineRequest[] = [];
    const decoded: StepResult['decoded'] = [];
    const runSteps = this.stepDecodeSteps;
    let kept = 0;
    for (const job of this.running) {
      const tokens = job.scheduled;
      job.scheduled = 0;
      if (tokens > 0 && runSteps > 0) {
        job.regionDone += tokens;
        job.regionTarget += tokens;
        job.produced += tokens;
        decoded.push({ request: job.request, tokens });
      } else if (tokens > 0) {
        // a steady decode computes the one token sampled last; anything more is prefill
        if (job.produced === 0 || tokens > 1 || this.computeLeft(job) > 1) this.prefillTokens += tokens;
        this.advancePrefill(job, tokens);
        this.cacheComputed(job);
        if (this.computeLeft(job) === 0) {
          // every token so far has its KV: the step samples the next one
          if (job.produced === 0) firstTokens.push({ request: job.request, cachedTokens: job.cachedTokens });
          else decoded.push({ request: job.request, tokens: 1 });
          job.produced++;
          job.regionTarget++;
        }
      }
      if (job.produced >= job.request.outputTokens) {
        this.free(job);
        this.jobs.delete(job.request.id);
        finished.push(job.request);
      } else this.running[kept++] = job;
    }
    this.running.length = kept;
    return { end, firstTokens, finished, decoded, preempted: this.stepPreempted };
  }

  /**
   * Drops a request (its client went away): out of the queue, or out of the batch with its
   * blocks freed. Blocks it finished computing stay cached. Returns whether it was here.
   */
  cancel(id: number): boolean {
    const job = this.jobs.get(id);
    if (!job) return false;
    this.jobs.delete(id);
    const w = this.waiting.indexOf(job, this.waitingHead);
    if (w >= 0) {
      this.waiting.splice(w, 1);
      return true;
    }
    const k = this.running.indexOf(job);
    if (k >= 0) {
      this.running.splice(k, 1);
      this.free(job);
    }
    return true;
  }

  // ---------------------------------------------------------------- scheduling internals

  private allDecoding(): boolean {
    for (const job of this.running) if (job.produced === 0 || this.computeLeft(job) !== 1) return false;
    return true;
  }

  /**
   * Tokens to compute before the next token can be sampled: region tokens without KV and
   * anchor work (vLLM's num_tokens − num_computed_tokens; 1 for a decoding request).
   */
  private computeLeft(job: Job): number {
    return job.regionTarget - job.regionDone + job.anchorWork;
  }

  /** Tokens of context a request's attention reads before its next tokens. */
  private context(job: Job): number {
    return job.regionDone + job.anchorTokens;
  }

  /** Region tokens with KV after computing `tokens` more: the prefix first, anchors, then the rest. */
  private regionAfter(job: Job, tokens: number): number {
    const prefixEnd = job.keyed * this.config.blockTokens;
    let left = tokens;
    let done = job.regionDone;
    if (done < prefixEnd) {
      const a = Math.min(left, prefixEnd - done);
      done += a;
      left -= a;
    }
    left -= Math.min(left, job.anchorWork);
    return done + left;
  }

  private advancePrefill(job: Job, tokens: number): void {
    const prefixEnd = job.keyed * this.config.blockTokens;
    let left = tokens;
    if (job.regionDone < prefixEnd) {
      const a = Math.min(left, prefixEnd - job.regionDone);
      job.regionDone += a;
      left -= a;
    }
    const b = Math.min(left, job.anchorWork);
    job.anchorWork -= b;
    job.regionDone += left - b;
  }

  /** Makes sure the job holds the blocks for `tokens` more; false (nothing taken) if short. */
  private allocateFor(job: Job, tokens: number): boolean {
    const need = Math.ceil(this.regionAfter(job, tokens) / this.config.blockTokens) - job.slots.length;
    if (need <= 0) return true;
    if (need > this.freeCount) return false;
    for (let i = 0; i < need; i++) job.slots.push(this.takeFree());
    return true;
  }

  /**
   * Admits a waiting request if the blocks for its first chunk fit: its cached prefix and
   * anchors are pinned, the rest allocated. Returns the chunk scheduled, or 0.
   */
  private admit(job: Job, budget: number): number {
    // a request that did not fit still does not while no block was cached, evicted or freed
    // and the budget is no smaller (a block pinned by another request leaves the slack as is)
    const [cache, frees, lastBudget] = job.refusedAt;
    if (cache === this.cacheChanges && frees === this.frees && budget >= lastBudget) return 0;
    const c = this.config;
    const bt = c.blockTokens;
    const r = job.request;
    // resumed after preemption: the outputs so far are recomputed as prompt
    const target = job.regionPrompt + job.produced;
    const total = r.inputTokens + job.produced;
    const maxHit = Math.min(job.keyed, Math.floor((total - 1) / bt));
    let hit = 0;
    let pinnedFree = 0;
    const slots = job.slots; // the hit prefix's blocks, pinned below if the request fits
    for (; hit < maxHit; hit++) {
      const slot = this.slotOf.get(r.keys[hit]);
      if (slot === NONE) break;
      if (this.refs[slot] === 0) pinnedFree++;
      slots.push(slot);
    }
    let anchorHitTokens = 0;
    let anchorMissTokens = 0;
    let anchorNew = 0;
    for (const a of r.anchors ?? []) {
      let present = 0;
      for (let k = 0; k < a.keys.length; k++) {
        const slot = this.slotOf.get(a.keys[k]);
        if (slot === NONE) continue;
        present++;
        if (this.refs[slot] === 0) pinnedFree++;
      }
      anchorNew += a.keys.length - present;
      if (present === a.keys.length) anchorHitTokens += a.tokens;
      else anchorMissTokens += a.tokens;
    }
    const recompute = Math.ceil(anchorHitTokens * c.blendRecompute);
    job.regionDone = hit * bt;
    job.regionTarget = target;
    job.anchorWork = anchorMissTokens + recompute;
    // an engine always computes at least one token to get logits
    if (this.computeLeft(job) === 0) job.regionDone--;
    const tokens = Math.min(budget, this.computeLeft(job));
    const regionBlocks = Math.ceil(this.regionAfter(job, tokens) / bt);
    const need = regionBlocks - hit + anchorNew + pinnedFree;
    if (need > this.freeCount) {
      job.regionDone = 0;
      job.regionTarget = 0;
      job.anchorWork = 0;
      job.refusedAt = [this.cacheChanges, this.frees, budget];
      slots.length = 0;
      return 0;
    }
    // pin the cached prefix and anchors first (taking new blocks may evict free ones), then allocate
    for (let i = 0; i < hit; i++) this.pin(slots[i]);
    job.hashed = hit;
    for (const a of r.anchors ?? []) {
      for (let k = 0; k < a.keys.length; k++) {
        const slot = this.slotOf.get(a.keys[k]);
        if (slot !== NONE) job.anchorSlots.push(this.pin(slot));
        else job.anchorMissKeys.push(a.keys[k]);
      }
    }
    for (let k = 0; k < job.anchorMissKeys.length; k++) job.anchorSlots.push(this.takeFree());
    while (job.slots.length < regionBlocks) job.slots.push(this.takeFree());
    if (job.cachedTokens < 0) job.cachedTokens = Math.min(r.inputTokens - 1, hit * bt + anchorHitTokens - recompute);
    return tokens;
  }

  /** Preempts a running request (recompute): its blocks freed tail first, back to the front of the queue. */
  private preempt(job: Job): void {
    this.free(job);
    job.regionDone = 0;
    job.regionTarget = 0;
    job.anchorWork = 0;
    job.scheduled = 0;
    this.preemptions++;
    this.stepPreempted.push(job.request);
    if (this.waitingHead > 0) this.waiting[--this.waitingHead] = job;
    else this.waiting.unshift(job);
  }

  /** Frees a request's blocks in reverse order of the prompt: outputs and tail first, anchors, then the prefix. */
  private free(job: Job): void {
    const slots = job.slots;
    const keyedEnd = Math.min(job.keyed, slots.length);
    for (let i = slots.length - 1; i >= keyedEnd; i--) this.unpin(slots[i]);
    for (let i = job.anchorSlots.length - 1; i >= 0; i--) this.unpin(job.anchorSlots[i]);
    for (let i = keyedEnd - 1; i >= 0; i--) this.unpin(slots[i]);
    slots.length = 0;
    job.anchorSlots.length = 0;
    job.anchorMissKeys.length = 0;
    job.hashed = 0;
  }

  /** Full keyed blocks now computed become cached and are announced; anchors once computed. */
  private cacheComputed(job: Job): void {
    const r = job.request;
    const full = Math.min(job.keyed, Math.floor(job.regionDone / this.config.blockTokens));
    for (let i = job.hashed; i < full; i++) {
      const slot = job.slots[i];
      const key = r.keys[i];
      if (this.slotOf.has(key)) continue; // another request computed it first
      this.keyOf[slot] = key;
      this.hiOf[slot] = r.hashHi[i];
      this.loOf[slot] = r.hashLo[i];
      this.announced[slot] = 1;
      this.slotOf.set(key, slot);
      this.cacheChanges++;
      this.onStored(r.hashHi[i], r.hashLo[i]);
    }
    if (full > job.hashed) job.hashed = full;
    if (job.anchorWork === 0 && job.anchorMissKeys.length > 0) {
      for (const key of job.anchorMissKeys) {
        if (this.slotOf.has(key)) continue;
        const slot = job.anchorSlots.find((s) => Number.isNaN(this.keyOf[s]))!;
        this.keyOf[slot] = key;
        this.announced[slot] = 0;
        this.slotOf.set(key, slot);
        this.cacheChanges++;
      }
      job.anchorMissKeys.length = 0;
    }
  }

  /**
   * Every running request is decoding and nothing waits: schedule k decode steps at once, k
   * the most that end by `until` (at least one) and whose new blocks fit, capped by the
   * first request to finish. Returns the end, or -1 when not even one step's blocks fit
   * (the caller then schedules a normal step, which preempts).
   */
  private scheduleDecodeRun(now: number, until: number): number {
    const c = this.config;
    const bt = c.blockTokens;
    const batch = this.running.length;
    let maxSteps = Infinity;
    let context = 0;
    for (const job of this.running) {
      maxSteps = Math.min(maxSteps, Math.max(1, job.request.outputTokens - job.produced));
      context += this.context(job);
    }
    const linear = Math.max(c.weightReadMs, batch * c.linearMsPerToken);
    const perContext = Math.max(c.kvReadMsPerToken, c.attentionMsPerTokenPair);
    let steps = 0;
    let newBlocks = 0;
    let t = now;
    for (;;) {
      // step s+1 writes KV at position regionDone + s of each request
      let stepBlocks = 0;
      for (const job of this.running)
        if ((job.regionDone + steps) % bt === 0 && Math.ceil((job.regionDone + steps + 1) / bt) > job.slots.length)
          stepBlocks++;
      if (newBlocks + stepBlocks > this.freeCount) break;
      const dt = linear + (context + (steps + 1) * batch) * perContext;
      if (steps > 0 && t + dt > until) break;
      newBlocks += stepBlocks;
      t += dt;
      steps++;
      if (steps >= maxSteps) break;
    }
    if (steps === 0) return -1;
    for (const job of this.running) {
      const need = Math.ceil((job.regionDone + steps) / bt) - job.slots.length;
      for (let i = 0; i < need; i++) job.slots.push(this.takeFree());
      job.scheduled = steps;
    }
    this.stepDecodeSteps = steps;
    this.busyMs += t - now;
    this.stepEnd = t;
    return t;
  }

  // ------------------------------------------------------------------------ block pool

  /** Takes the block at the front of the free queue, evicting what it cached. */
  private takeFree(): number {
    const slot = this.freeHead;
    if (slot === NONE) throw new Error('engine block pool exhausted');
    this.unlinkFree(slot);
    const key = this.keyOf[slot];
    if (!Number.isNaN(key)) {
      this.cacheChanges++;
      this.slotOf.delete(key);
      this.keyOf[slot] = Number.NaN;
      if (this.announced[slot]) this.onRemoved(this.hiOf[slot], this.loOf[slot]);
      this.announced[slot] = 0;
    }
    this.refs[slot] = 1;
    return slot;
  }

  private pin(slot: number): number {
    if (this.refs[slot]++ === 0) this.unlinkFree(slot);
    return slot;
  }

  private unpin(slot: number): void {
    if (--this.refs[slot] === 0) this.appendFree(slot);
  }

  private appendFree(slot: number): void {
    this.prev[slot] = this.freeTail;
    this.next[slot] = NONE;
    if (this.freeTail !== NONE) this.next[this.freeTail] = slot;
    else this.freeHead = slot;
    this.freeTail = slot;
    this.freeCount++;
    this.frees++;
  }

  private unlinkFree(slot: number): void {
    const p = this.prev[slot];
    const n = this.next[slot];
    if (p !== NONE) this.next[p] = n;
    else this.freeHead = n;
    if (n !== NONE) this.prev[n] = p;
    else this.freeTail = p;
    this.freeCount--;
  }
}
