import type { EngineRequest } from './request.js';

/** A request in the engine: its progress survives preemption, its blocks do not. */
export interface Job {
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

/** A queued request's job: nothing computed, nothing held. */
export function newJob(request: EngineRequest, blockTokens: number): Job {
  let anchorTokens = 0;
  for (const a of request.anchors ?? []) anchorTokens += a.tokens;
  anchorTokens = Math.min(anchorTokens, request.inputTokens);
  const regionPrompt = request.inputTokens - anchorTokens;
  return {
    request,
    produced: 0,
    cachedTokens: -1,
    keyed: Math.min(request.keys.length, Math.floor(regionPrompt / blockTokens)),
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
}

/**
 * Tokens to compute before the next token can be sampled: region tokens without KV and
 * anchor work (vLLM's num_tokens − num_computed_tokens; 1 for a decoding request).
 */
export function computeLeft(job: Job): number {
  return job.regionTarget - job.regionDone + job.anchorWork;
}

/** Tokens of context a request's attention reads before its next tokens. */
export function contextTokens(job: Job): number {
  return job.regionDone + job.anchorTokens;
}

/** Region tokens with KV after computing `tokens` more: the prefix first, anchors, then the rest. */
export function regionAfter(job: Job, tokens: number, blockTokens: number): number {
  const prefixEnd = job.keyed * blockTokens;
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

/** Records `tokens` computed in the order regionAfter counts them. */
export function advancePrefill(job: Job, tokens: number, blockTokens: number): void {
  const prefixEnd = job.keyed * blockTokens;
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
