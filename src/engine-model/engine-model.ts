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
 * - a step's full prompt blocks are cached when it is scheduled, before it runs, so a request
 *   admitted later in the same step reuses them; their events go out after the step
 *   (`kv_cache_manager.py`: allocate_slots → cache_blocks).
 *
 * Where it differs (docs/simulator.md lists these too): duplicate computations of one block
 * keep one cached copy; output tokens are never cached
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
import { BlockPool } from './block-pool.js';
import { engineConfig, type EngineConfig } from './config.js';
import { advancePrefill, computeLeft, contextTokens, newJob, regionAfter, type Job } from './job.js';
import { NONE } from './key-slot-table.js';
import { rejection, type EngineLimits } from './limits.js';
import type { EngineRequest, StepResult } from './request.js';
import { stepTime } from './step-time.js';

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

  private readonly pool: BlockPool;
  private readonly limits: EngineLimits;

  private waiting: Job[] = [];
  private waitingHead = 0;
  private readonly running: Job[] = [];
  private readonly jobs = new Map<number, Job>();
  /** Step under way: its end, or NaN. */
  private stepEnd = Number.NaN;
  private stepDecodeSteps = 0;
  private stepPreempted: EngineRequest[] = [];
  /** The run of decode steps under way: its start, busyMs before it, and its steps' terms (cutRun). */
  private runStart = 0;
  private runBusyBefore = 0;
  private runBatch = 0;
  private runContext = 0;
  private runLinear = 0;
  private runPerContext = 0;

  constructor(
    config: Partial<EngineConfig> & { blockTokens: number },
    private readonly onStored: (hi: number, lo: number) => void = () => {},
    onRemoved: (hi: number, lo: number) => void = () => {},
  ) {
    this.config = engineConfig(config);
    const c = this.config;
    this.capacityBlocks = Math.max(1, Math.floor(c.kvTokens / c.blockTokens));
    this.maxModelLen = Math.max(1, Math.min(Math.floor(c.maxModelLen), this.capacityBlocks * c.blockTokens));
    this.limits = { maxModelLen: this.maxModelLen, capacityBlocks: this.capacityBlocks, blockTokens: c.blockTokens };
    this.pool = new BlockPool(this.capacityBlocks, onRemoved);
  }

  /** Why the engine would refuse the request, in vLLM's words, or null: see limits.ts. */
  rejection(request: {
    inputTokens: number;
    outputTokens: number;
    anchors?: ReadonlyArray<{ tokens: number }>;
  }): string | null {
    return rejection(this.limits, request);
  }

  /** Queues a request; throws a RangeError naming the limit when the engine refuses it. */
  enqueue(request: EngineRequest): void {
    const why = this.rejection(request);
    if (why !== null) throw new RangeError(why);
    if (this.jobs.has(request.id)) throw new RangeError(`request ${request.id} is already in the engine`);
    const job = newJob(request, this.config.blockTokens);
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
    return (this.capacityBlocks - this.pool.freeCount) / this.capacityBlocks;
  }

  /** Whether the engine holds the block cached (or computing it under that key). */
  holds(key: number): boolean {
    return this.pool.slotOf.has(key);
  }

  /** Prefix blocks in the cache (held or free) — what the engine would list as cached. */
  cachedKeys(): number[] {
    return this.pool.announcedKeys();
  }

  /** Duration (ms) of one step computing `chunks`, each [new tokens, context before them]: see step-time.ts. */
  stepTime(chunks: ReadonlyArray<readonly [number, number]>): number {
    return stepTime(this.config, chunks);
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
      const tokens = Math.min(computeLeft(job), budget);
      let fits = this.allocateFor(job, tokens);
      while (!fits) {
        const victim = this.running.pop()!;
        this.preempt(victim);
        if (victim === job) break;
        fits = this.allocateFor(job, tokens);
      }
      if (!fits) break;
      job.scheduled = tokens;
      this.cacheScheduled(job, tokens);
      budget -= tokens;
      chunks.push([tokens, contextTokens(job)]);
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
        this.cacheScheduled(job, tokens);
        budget -= tokens;
        chunks.push([tokens, contextTokens(job)]);
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

  /**
   * Ends the run of decode steps under way with the first of its steps to end at or after
   * `now`, and returns that step's end: something that changes the batch (a new request, a
   * request dropped) reached the engine, which a real engine takes in at its next step, not
   * after the steps the run scheduled beyond it. A single step is left as it is. Blocks the
   * run took for its later steps stay with their requests, which need them at their next steps.
   */
  cutRun(now: number): number {
    if (Number.isNaN(this.stepEnd)) throw new Error('cutRun: no step under way');
    const steps = this.stepDecodeSteps;
    if (steps <= 1 || now >= this.stepEnd) return this.stepEnd;
    // the same sums as scheduleDecodeRun: a run cut to k steps ends where a run of k steps ends
    let t = this.runStart;
    let k = 0;
    while (k < steps) {
      t += this.runLinear + (this.runContext + (k + 1) * this.runBatch) * this.runPerContext;
      k++;
      if (t >= now) break;
    }
    if (k === steps) return this.stepEnd;
    for (const job of this.running) if (job.scheduled > 0) job.scheduled = k;
    this.stepDecodeSteps = k;
    this.busyMs = this.runBusyBefore + (t - this.runStart);
    this.stepEnd = t;
    return t;
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
        if (job.produced === 0 || tokens > 1 || computeLeft(job) > 1) this.prefillTokens += tokens;
        advancePrefill(job, tokens, this.config.blockTokens);
        this.cacheComputed(job);
        if (computeLeft(job) === 0) {
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
    for (const job of this.running) if (job.produced === 0 || computeLeft(job) !== 1) return false;
    return true;
  }

  /** Makes sure the job holds the blocks for `tokens` more; false (nothing taken) if short. */
  private allocateFor(job: Job, tokens: number): boolean {
    const need =
      Math.ceil(regionAfter(job, tokens, this.config.blockTokens) / this.config.blockTokens) - job.slots.length;
    if (need <= 0) return true;
    if (need > this.pool.freeCount) return false;
    for (let i = 0; i < need; i++) job.slots.push(this.pool.takeFree());
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
    if (cache === this.pool.cacheChanges && frees === this.pool.frees && budget >= lastBudget) return 0;
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
      const slot = this.pool.slotOf.get(r.keys[hit]);
      if (slot === NONE) break;
      if (this.pool.refs[slot] === 0) pinnedFree++;
      slots.push(slot);
    }
    let anchorHitTokens = 0;
    let anchorMissTokens = 0;
    let anchorNew = 0;
    for (const a of r.anchors ?? []) {
      let present = 0;
      for (let k = 0; k < a.keys.length; k++) {
        const slot = this.pool.slotOf.get(a.keys[k]);
        if (slot === NONE) continue;
        present++;
        if (this.pool.refs[slot] === 0) pinnedFree++;
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
    if (computeLeft(job) === 0) job.regionDone--;
    const tokens = Math.min(budget, computeLeft(job));
    const regionBlocks = Math.ceil(regionAfter(job, tokens, this.config.blockTokens) / bt);
    const need = regionBlocks - hit + anchorNew + pinnedFree;
    if (need > this.pool.freeCount) {
      job.regionDone = 0;
      job.regionTarget = 0;
      job.anchorWork = 0;
      job.refusedAt = [this.pool.cacheChanges, this.pool.frees, budget];
      slots.length = 0;
      return 0;
    }
    // pin the cached prefix and anchors first (taking new blocks may evict free ones), then allocate
    for (let i = 0; i < hit; i++) this.pool.pin(slots[i]);
    job.hashed = hit;
    for (const a of r.anchors ?? []) {
      for (let k = 0; k < a.keys.length; k++) {
        const slot = this.pool.slotOf.get(a.keys[k]);
        if (slot !== NONE) job.anchorSlots.push(this.pool.pin(slot));
        else job.anchorMissKeys.push(a.keys[k]);
      }
    }
    for (let k = 0; k < job.anchorMissKeys.length; k++) job.anchorSlots.push(this.pool.takeFree());
    while (job.slots.length < regionBlocks) job.slots.push(this.pool.takeFree());
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
    for (let i = slots.length - 1; i >= keyedEnd; i--) this.pool.unpin(slots[i]);
    for (let i = job.anchorSlots.length - 1; i >= 0; i--) this.pool.unpin(job.anchorSlots[i]);
    for (let i = keyedEnd - 1; i >= 0; i--) this.pool.unpin(slots[i]);
    slots.length = 0;
    job.anchorSlots.length = 0;
    job.anchorMissKeys.length = 0;
    job.hashed = 0;
  }

  /**
   * The full keyed blocks a step computes become cached and are announced when it is
   * scheduled, before it runs, as vLLM's allocate_slots caches them (cache_blocks up to
   * num_computed_tokens + num_new_tokens, vllm/v1/core/kv_cache_manager.py): a request admitted
   * later in the same step finds them and computes only the rest (its attention reads their KV as
   * the step writes it). The events go out with the step's others, after it.
   */
  private cacheScheduled(job: Job, tokens: number): void {
    const r = job.request;
    const full = Math.min(
      job.keyed,
      Math.floor(regionAfter(job, tokens, this.config.blockTokens) / this.config.blockTokens),
    );
    for (let i = job.hashed; i < full; i++) {
      const slot = job.slots[i];
      const key = r.keys[i];
      if (this.pool.slotOf.has(key)) continue; // another request computed it first
      this.pool.cache(slot, key, r.hashHi[i], r.hashLo[i]);
      this.onStored(r.hashHi[i], r.hashLo[i]);
    }
    if (full > job.hashed) job.hashed = full;
  }

  /** Anchors, once computed, become cached (never announced: content anchors are no vLLM prefix). */
  private cacheComputed(job: Job): void {
    if (job.anchorWork === 0 && job.anchorMissKeys.length > 0) {
      for (const key of job.anchorMissKeys) {
        if (this.pool.slotOf.has(key)) continue;
        const slot = job.anchorSlots.find((s) => this.pool.uncached(s))!;
        this.pool.cacheSilently(slot, key);
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
      context += contextTokens(job);
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
      if (newBlocks + stepBlocks > this.pool.freeCount) break;
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
      for (let i = 0; i < need; i++) job.slots.push(this.pool.takeFree());
      job.scheduled = steps;
    }
    this.stepDecodeSteps = steps;
    this.runStart = now;
    this.runBusyBefore = this.busyMs;
    this.runBatch = batch;
    this.runContext = context;
    this.runLinear = linear;
    this.runPerContext = perContext;
    this.busyMs += t - now;
    this.stepEnd = t;
    return t;
  }
}
