/**
 * A model of one inference engine (one vLLM data-parallel rank) for the simulator: a prefix
 * KV cache of a fixed number of blocks, continuous batching with a per-step token budget
 * (chunked prefill), and step times from a simple roofline.
 *
 * Defaults model Qwen3-32B in fp8 on one H100 SXM (the setup of Dynamo's published A/B, 8
 * such workers), derived from first principles and documented per field in ENGINE_DEFAULTS.
 * The engine reports what it stores and evicts (as vLLM's KV events) through `onStored` /
 * `onRemoved`; the simulator delivers those to the router later, never synchronously.
 */

export interface EngineConfig {
  /** Tokens per cache block (the trace's block size for trace replay). */
  blockTokens: number;
  /** KV capacity of the engine in tokens. */
  kvTokens: number;
  /** Token budget of one step (vLLM max_num_batched_tokens): decode tokens + prefill chunks. */
  maxBatchTokens: number;
  /** Most sequences running at once (vLLM max_num_seqs). */
  maxRunning: number;
  /** Fixed cost of a step: reading the weights once (ms). */
  stepBaseMs: number;
  /** Prefill compute per new token (ms). */
  prefillMsPerToken: number;
  /** Attention compute per (new token × context token) pair (ms). */
  attentionMsPerTokenPair: number;
  /** Decode cost per context token read per step (ms): KV-cache bandwidth. */
  decodeMsPerContextToken: number;
}

/**
 * Qwen3-32B (64 layers, 8 KV heads × 128 dims, fp8 weights and KV) on one H100 SXM
 * (3.35 TB/s HBM, ~989 dense bf16 / ~1979 fp8 TFLOP/s), assuming ~70% of peak bandwidth and
 * ~40% of peak fp8 compute are achieved:
 * - weights 32 GB / (0.7 × 3.35 TB/s) ≈ 14 ms per step;
 * - prefill 2 × 32e9 FLOP/token / (0.4 × 1979e12) ≈ 0.08 ms per token (~12,500 tokens/s);
 * - attention 4 × 64 layers × 64 heads × 128 dims FLOP per (query, key) pair ≈ 2.1 MFLOP
 *   → ≈ 2.6e-6 ms per pair;
 * - KV per token 2 × 64 × 8 × 128 bytes = 131 KB → 131 KB / 2.3 TB/s ≈ 5.7e-5 ms per
 *   context token read per decode step;
 * - KV capacity (80 GB − 32 GB weights − ~8 GB activations) / 131 KB ≈ 300,000 tokens;
 * - step budget 8,192 tokens and 256 sequences, vLLM's defaults for chunked prefill.
 * These are estimates, not measurements of a GPU; the comparison between policies is what
 * the simulator is for, and every constant can be overridden.
 */
export const ENGINE_DEFAULTS: Readonly<Omit<EngineConfig, 'blockTokens'>> = Object.freeze({
  kvTokens: 300_000,
  maxBatchTokens: 8192,
  maxRunning: 256,
  stepBaseMs: 14,
  prefillMsPerToken: 0.08,
  attentionMsPerTokenPair: 2.6e-6,
  decodeMsPerContextToken: 5.7e-5,
});

/** 53-bit engine cache key from a 64-bit block hash. */
export function blockKey(hi: number, lo: number): number {
  return (hi & 0x1fffff) * 4294967296 + (lo >>> 0);
}

/** A request as the engine sees it. */
export interface EngineRequest {
  id: number;
  /** Block keys of the prompt (numeric cache keys) with the router's hashes for events. */
  keys: Float64Array;
  hashHi: Uint32Array;
  hashLo: Uint32Array;
  inputTokens: number;
  outputTokens: number;
  /** Position-independent chunks the engine may reuse wherever they sit (CacheBlend-style). */
  anchors?: ReadonlyArray<{ id: string; tokens: number }>;
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
}

interface Running {
  request: EngineRequest;
  cachedTokens: number;
  /** Prompt tokens computed or found cached so far. */
  done: number;
  /** Output tokens still to generate after the first. */
  decodeLeft: number;
  context: number;
  outputBlocks: number;
  anchorKeys: string[];
}

const NONE = -1;

export class EngineModel {
  readonly config: EngineConfig;
  readonly capacityBlocks: number;
  /** Sum of step durations (ms): how long the engine was busy. */
  busyMs = 0;
  /** Prompt tokens actually computed (cache misses). */
  prefillTokens = 0;

  // cache blocks: key → slot; per slot refs, computed flag, LRU links (unreferenced, computed)
  private readonly slotOf = new Map<number, number>();
  private keyOf: Float64Array;
  private hiOf: Uint32Array;
  private loOf: Uint32Array;
  private refs: Int32Array;
  private computed: Uint8Array;
  private prev: Int32Array;
  private next: Int32Array;
  private lruHead = NONE;
  private lruTail = NONE;
  private evictable = 0;
  private freeSlots: number[] = [];
  private slotCount = 0;
  private outputReserved = 0;
  /** Content-anchor KV (position-independent): id → blocks it takes, LRU by insertion order. */
  private readonly anchorBlocks = new Map<string, number>();
  private anchorBlocksTotal = 0;
  private readonly anchorRefs = new Map<string, number>();

  private readonly waiting: EngineRequest[] = [];
  private waitingHead = 0;
  private running: Running[] = [];

  constructor(
    config: Partial<EngineConfig> & { blockTokens: number },
    private readonly onStored: (hi: number, lo: number) => void = () => {},
    private readonly onRemoved: (hi: number, lo: number) => void = () => {},
  ) {
    this.config = { ...ENGINE_DEFAULTS, ...config };
    for (const [k, v] of Object.entries(this.config)) {
      if (typeof v !== 'number' || !(v >= 0) || !Number.isFinite(v)) throw new RangeError(`engine ${k} must be a finite number >= 0, got ${v}`);
    }
    if (this.config.blockTokens < 1) throw new RangeError('engine blockTokens must be >= 1');
    this.capacityBlocks = Math.max(1, Math.floor(this.config.kvTokens / this.config.blockTokens));
    const cap = this.capacityBlocks + 1;
    this.keyOf = new Float64Array(cap);
    this.hiOf = new Uint32Array(cap);
    this.loOf = new Uint32Array(cap);
    this.refs = new Int32Array(cap);
    this.computed = new Uint8Array(cap);
    this.prev = new Int32Array(cap);
    this.next = new Int32Array(cap);
  }

  enqueue(request: EngineRequest): void {
    this.waiting.push(request);
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

  /** Fraction of KV blocks held by running requests (vLLM's kv_cache_usage_perc). */
  get kvUsage(): number {
    const used = this.slotOf.size - this.evictable + this.outputReserved + this.anchorBlocksTotal;
    return Math.min(1, Math.max(0, used / this.capacityBlocks));
  }

  /** Whether the engine has a slot for the block (cached, or allocated to a running request). */
  holds(key: number): boolean {
    return this.slotOf.has(key);
  }

  /** Blocks in the cache (held or evictable) — what the engine would list as cached. */
  cachedKeys(): number[] {
    const out: number[] = [];
    for (const [key, slot] of this.slotOf) if (this.computed[slot]) out.push(key);
    return out;
  }

  /** Leading prompt blocks that are cached and computed, in tokens (no state change). */
  prefixHitTokens(request: EngineRequest): number {
    let k = 0;
    for (; k < request.keys.length; k++) {
      const slot = this.slotOf.get(request.keys[k]);
      if (slot === undefined || !this.computed[slot]) break;
    }
    return Math.min(k * this.config.blockTokens, request.inputTokens);
  }

  /** Time of one step computing `prefill` new tokens over `context` earlier ones, and decode reads. */
  stepTime(prefillChunks: ReadonlyArray<readonly [number, number]>, decodeContext: number): number {
    const c = this.config;
    let t = c.stepBaseMs + decodeContext * c.decodeMsPerContextToken;
    for (const [chunk, start] of prefillChunks) t += chunk * c.prefillMsPerToken + chunk * (start + chunk / 2) * c.attentionMsPerTokenPair;
    return t;
  }

  /**
   * Runs one step starting at `now` (or, when every running request is decoding and none is
   * waiting, a run of decode steps that ends no later than `until` when possible) and returns
   * what happened. Cache changes apply at once; the caller stamps results at `end`.
   */
  step(now: number, until: number): StepResult {
    const c = this.config;
    const firstTokens: StepResult['firstTokens'] = [];
    const finished: EngineRequest[] = [];
    const decoded: StepResult['decoded'] = [];
    let budget = c.maxBatchTokens;
    let decodeContext = 0;
    let decoders = 0;
    const chunks: Array<[number, number]> = [];
    const prefilling: Array<[Running, number]> = [];

    for (const r of this.running) {
      if (r.done >= r.request.inputTokens) {
        decodeContext += r.context;
        decoders++;
        budget--;
      }
    }
    // pure decode: fast-forward several steps at once
    if (decoders === this.running.length && this.waitingHead >= this.waiting.length && decoders > 0) {
      return this.decodeRun(now, until, decodeContext);
    }
    for (const r of this.running) {
      if (budget <= 0) break;
      if (r.done < r.request.inputTokens) {
        const chunk = Math.min(budget, r.request.inputTokens - r.done);
        prefilling.push([r, chunk]);
        chunks.push([chunk, r.done]);
        budget -= chunk;
      }
    }
    while (budget > 0 && this.running.length < c.maxRunning && this.waitingHead < this.waiting.length) {
      const admitted = this.admit(this.waiting[this.waitingHead]);
      if (!admitted) break; // not enough KV: head-of-line waits, as vLLM's FCFS scheduler
      this.waitingHead++;
      this.running.push(admitted);
      const chunk = Math.min(budget, admitted.request.inputTokens - admitted.done);
      prefilling.push([admitted, chunk]);
      chunks.push([chunk, admitted.done]);
      budget -= chunk;
    }
    if (this.waitingHead > 1024 && this.waitingHead * 2 > this.waiting.length) {
      this.waiting.splice(0, this.waitingHead);
      this.waitingHead = 0;
    }
    const duration = this.stepTime(chunks, decodeContext);
    const end = now + duration;
    this.busyMs += duration;

    // decoders emit one token each (requests still prefilling have done < inputTokens here)
    if (decoders > 0) {
      for (const r of this.running) {
        if (r.done >= r.request.inputTokens) {
          r.decodeLeft--;
          r.context++;
          decoded.push({ request: r.request, tokens: 1 });
        }
      }
    }
    // prefill chunks complete blocks; the last chunk yields the first token
    for (const [r, chunk] of prefilling) {
      r.done += chunk;
      r.context = r.done;
      this.prefillTokens += chunk;
      this.markComputed(r);
      if (r.done >= r.request.inputTokens) firstTokens.push({ request: r.request, cachedTokens: r.cachedTokens });
    }
    this.finishDone(finished);
    return { end, firstTokens, finished, decoded };
  }

  /**
   * Drops a request (its client went away): out of the queue, or out of the batch with its
   * blocks released. Blocks it finished computing stay cached. Returns whether it was here.
   */
  cancel(id: number): boolean {
    for (let i = this.waitingHead; i < this.waiting.length; i++) {
      if (this.waiting[i].id === id) {
        this.waiting.splice(i, 1);
        return true;
      }
    }
    const k = this.running.findIndex((r) => r.request.id === id);
    if (k < 0) return false;
    this.release(this.running[k]);
    this.running.splice(k, 1);
    return true;
  }

  /** Admits a request if its blocks fit: pins its cached prefix, allocates the rest. */
  private admit(request: EngineRequest): Running | null {
    const c = this.config;
    const n = request.keys.length;
    let hit = 0;
    while (hit < n) {
      const slot = this.slotOf.get(request.keys[hit]);
      if (slot === undefined || !this.computed[slot]) break;
      hit++;
    }
    let fresh = 0;
    for (let i = hit; i < n; i++) if (!this.slotOf.has(request.keys[i])) fresh++;
    const outputBlocks = Math.ceil(request.outputTokens / c.blockTokens);
    // position-independent chunks already held count as cached beyond the prefix
    let anchorTokens = 0;
    const anchorKeys: string[] = [];
    let anchorFresh = 0;
    for (const a of request.anchors ?? []) {
      if (this.anchorBlocks.has(a.id)) anchorTokens += a.tokens;
      else anchorFresh += Math.ceil(a.tokens / c.blockTokens);
      anchorKeys.push(a.id);
    }
    const needed = fresh + outputBlocks + anchorFresh;
    const free = this.capacityBlocks - (this.slotOf.size - this.evictable) - this.outputReserved - this.anchorBlocksTotal;
    // the cached prefix about to be pinned is not evictable for this request's room
    let pinnedEvictable = 0;
    for (let i = 0; i < n; i++) {
      const slot = this.slotOf.get(request.keys[i]);
      if (slot !== undefined && this.refs[slot] === 0 && this.computed[slot]) pinnedEvictable++;
    }
    if (needed > free - pinnedEvictable && this.running.length > 0) return null;

    for (let i = 0; i < n; i++) {
      const key = request.keys[i];
      let slot = this.slotOf.get(key);
      if (slot === undefined) {
        slot = this.allocate();
        this.slotOf.set(key, slot);
        this.keyOf[slot] = key;
        this.hiOf[slot] = request.hashHi[i];
        this.loOf[slot] = request.hashLo[i];
        this.computed[slot] = 0;
        this.refs[slot] = 0;
      }
      if (this.refs[slot] === 0 && this.computed[slot]) this.unlinkLru(slot);
      this.refs[slot]++;
    }
    this.outputReserved += outputBlocks;
    for (const a of request.anchors ?? []) {
      if (!this.anchorBlocks.has(a.id)) {
        const blocks = Math.ceil(a.tokens / c.blockTokens);
        this.anchorBlocks.set(a.id, blocks);
        this.anchorBlocksTotal += blocks;
      }
      this.anchorRefs.set(a.id, (this.anchorRefs.get(a.id) ?? 0) + 1);
    }
    this.evictOverCapacity();
    const prefixTokens = Math.min(hit * c.blockTokens, request.inputTokens);
    const cachedTokens = Math.min(request.inputTokens, prefixTokens + anchorTokens);
    // an engine always computes at least the last prompt token to get logits
    const done = Math.min(cachedTokens, Math.max(0, request.inputTokens - 1));
    return {
      request,
      cachedTokens,
      done,
      decodeLeft: Math.max(0, request.outputTokens - 1),
      context: 0,
      outputBlocks,
      anchorKeys,
    };
  }

  private allocate(): number {
    if (this.freeSlots.length > 0) return this.freeSlots.pop()!;
    if (this.slotCount >= this.keyOf.length) this.grow();
    return this.slotCount++;
  }

  private grow(): void {
    const cap = this.keyOf.length * 2;
    const f64 = (a: Float64Array) => { const b = new Float64Array(cap); b.set(a); return b; };
    const u32 = (a: Uint32Array) => { const b = new Uint32Array(cap); b.set(a); return b; };
    const i32 = (a: Int32Array) => { const b = new Int32Array(cap); b.set(a); return b; };
    this.keyOf = f64(this.keyOf);
    this.hiOf = u32(this.hiOf);
    this.loOf = u32(this.loOf);
    this.refs = i32(this.refs);
    this.prev = i32(this.prev);
    this.next = i32(this.next);
    const computed = new Uint8Array(cap);
    computed.set(this.computed);
    this.computed = computed;
  }

  /** Evicts least recently used unreferenced blocks (then unreferenced anchors) while over capacity. */
  private evictOverCapacity(): void {
    const over = () => this.slotOf.size + this.outputReserved + this.anchorBlocksTotal - this.capacityBlocks;
    while (over() > 0 && this.lruHead !== NONE) {
      const slot = this.lruHead;
      this.unlinkLru(slot);
      this.slotOf.delete(this.keyOf[slot]);
      this.freeSlots.push(slot);
      this.onRemoved(this.hiOf[slot], this.loOf[slot]);
    }
    if (over() > 0) {
      for (const [id, blocks] of this.anchorBlocks) {
        if (over() <= 0) break;
        if ((this.anchorRefs.get(id) ?? 0) > 0) continue;
        this.anchorBlocks.delete(id);
        this.anchorBlocksTotal -= blocks;
      }
    }
  }

  /** Blocks whose tokens are all computed become cached (and are announced). */
  private markComputed(r: Running): void {
    const bt = this.config.blockTokens;
    const keys = r.request.keys;
    const full = r.done >= r.request.inputTokens ? keys.length : Math.min(keys.length, Math.floor(r.done / bt));
    for (let i = 0; i < full; i++) {
      const slot = this.slotOf.get(keys[i])!;
      if (!this.computed[slot]) {
        this.computed[slot] = 1;
        this.onStored(this.hiOf[slot], this.loOf[slot]);
      }
    }
  }

  private finishDone(finished: EngineRequest[]): void {
    let kept = 0;
    for (const r of this.running) {
      if (r.done >= r.request.inputTokens && r.context > 0 && r.decodeLeft <= 0) {
        this.release(r);
        finished.push(r.request);
      } else this.running[kept++] = r;
    }
    this.running.length = kept;
  }

  private release(r: Running): void {
    for (const key of r.request.keys) {
      const slot = this.slotOf.get(key);
      if (slot === undefined) continue;
      if (--this.refs[slot] === 0) {
        if (this.computed[slot]) this.appendLru(slot);
        else {
          this.slotOf.delete(key);
          this.freeSlots.push(slot);
        }
      }
    }
    this.outputReserved -= r.outputBlocks;
    for (const id of r.anchorKeys) this.anchorRefs.set(id, (this.anchorRefs.get(id) ?? 1) - 1);
  }

  /**
   * Every running request is decoding and nothing waits: run k decode steps at once, k the
   * most that end by `until` (at least one), capped by the first request to finish. Step i
   * reads the batch's context, which grows by the batch size each step.
   */
  private decodeRun(now: number, until: number, context: number): StepResult {
    const c = this.config;
    const batch = this.running.length;
    let maxSteps = Infinity;
    for (const r of this.running) maxSteps = Math.min(maxSteps, Math.max(1, r.decodeLeft));
    let steps = 0;
    let t = now;
    for (;;) {
      const dt = c.stepBaseMs + (context + steps * batch) * c.decodeMsPerContextToken;
      if (steps > 0 && t + dt > until) break;
      t += dt;
      steps++;
      if (steps >= maxSteps) break;
    }
    this.busyMs += t - now;
    const decoded: StepResult['decoded'] = [];
    for (const r of this.running) {
      const tokens = Math.min(steps, Math.max(0, r.decodeLeft));
      r.decodeLeft -= steps;
      r.context += steps;
      if (tokens > 0) decoded.push({ request: r.request, tokens });
    }
    const finished: EngineRequest[] = [];
    this.finishDone(finished);
    return { end: t, firstTokens: [], finished, decoded };
  }

  private appendLru(slot: number): void {
    this.prev[slot] = this.lruTail;
    this.next[slot] = NONE;
    if (this.lruTail !== NONE) this.next[this.lruTail] = slot;
    else this.lruHead = slot;
    this.lruTail = slot;
    this.evictable++;
  }

  private unlinkLru(slot: number): void {
    const p = this.prev[slot];
    const n = this.next[slot];
    if (p !== NONE) this.next[p] = n;
    else this.lruHead = n;
    if (n !== NONE) this.prev[n] = p;
    else this.lruTail = p;
    this.evictable--;
  }
}
