import { pickMax } from './pick.js';
import { NO_CHOICE, type Candidate, type PolicyChoice, type RouteFeatures, type RoutingPolicy } from './types.js';

/**
 * The weights of the `cost` policy, in one place. For each candidate:
 *
 *   work  = (uncached prompt tokens + queued prefill tokens + decode · active decode tokens) / prompt
 *   score = − prefill · work − recompute · uncached / prompt
 *           − load · kvUsage − pressure · max(0, kvUsage − pressureKnee) / (1 − pressureKnee)
 *           + cla · servesCla + workflow · continuity
 *
 * and the highest score wins. `work` is the prefill this request would wait for on that
 * worker, in units of its own prompt: it rewards cached KV (locality) and penalises queues in
 * the same currency, so a hot prefix held by a saturated worker is spread to an idle one as
 * soon as the queue costs more than the cache saves. `recompute` charges what the request
 * adds to the fleet's total prefill beyond its own wait: a sibling queued behind the request
 * that is computing its prefix waits as long as one recomputing it elsewhere, but costs the
 * fleet nothing extra. When the prompt length is unknown (the
 * seed API without tokenLength) a prompt of REFERENCE_PROMPT_TOKENS is assumed. Workers at or
 * above `pressureCeiling` KV usage are left out unless every candidate is.
 */
export interface CostWeights {
  /** Weight of the prefill work (uncached + queued tokens, per prompt token). */
  prefill: number;
  /** Weight of the prefill the request adds to the fleet (uncached tokens, per prompt token). */
  recompute: number;
  /** Weight of a worker's active decode tokens relative to queued prefill tokens. */
  decode: number;
  /** Linear penalty per unit of KV usage. */
  load: number;
  /** Extra penalty, scaled to 1 at full KV usage, beyond the knee (VRAM pressure). */
  pressure: number;
  /** KV usage at which the pressure penalty starts. */
  pressureKnee: number;
  /** KV usage at or above which a worker is excluded while any other is below it. */
  pressureCeiling: number;
  /** Reward for serving the request's CLA group. */
  cla: number;
  /** Reward for the worker that ran the workflow's previous step. */
  workflow: number;
}

export const DEFAULT_COST_WEIGHTS: Readonly<CostWeights> = Object.freeze({
  prefill: 1.0,
  recompute: 2.0,
  decode: 0.1,
  load: 0.5,
  pressure: 6.0,
  pressureKnee: 0.8,
  pressureCeiling: 0.95,
  cla: 0.3,
  workflow: 0.6,
});

/** Prompt length assumed when the request does not say (seed API without tokenLength). */
export const REFERENCE_PROMPT_TOKENS = 4096;

/** The score of one candidate (higher is better); the hot path, so it allocates nothing. */
export function costScore(c: Candidate, r: RouteFeatures, w: Readonly<CostWeights>): number {
  const prompt = r.promptTokens > 0 ? r.promptTokens : REFERENCE_PROMPT_TOKENS;
  const uncached = r.promptTokens > 0 ? Math.max(0, r.promptTokens - c.cachedTokens) : (1 - c.cachedFraction) * prompt;
  const worker = c.worker;
  const work = (uncached + worker.queuedPrefillTokens + w.decode * worker.activeDecodeTokens) / prompt;
  const kv = worker.load;
  const overKnee = kv > w.pressureKnee ? (kv - w.pressureKnee) / (1 - w.pressureKnee) : 0;
  return -w.prefill * work - (w.recompute * uncached) / prompt - w.load * kv - w.pressure * overKnee + (c.servesCla ? w.cla : 0) + (c.continuity ? w.workflow : 0);
}

/** The terms behind costScore, for explanations. */
export function costTerms(c: Candidate, r: RouteFeatures, w: Readonly<CostWeights>) {
  const prompt = r.promptTokens > 0 ? r.promptTokens : REFERENCE_PROMPT_TOKENS;
  const uncached = r.promptTokens > 0 ? Math.max(0, r.promptTokens - c.cachedTokens) : (1 - c.cachedFraction) * prompt;
  const work = (uncached + c.worker.queuedPrefillTokens + w.decode * c.worker.activeDecodeTokens) / prompt;
  const kv = c.worker.load;
  const overKnee = kv > w.pressureKnee ? (kv - w.pressureKnee) / (1 - w.pressureKnee) : 0;
  return { uncachedTokens: uncached, work, kvUsage: kv, overKnee, score: costScore(c, r, w) };
}

/**
 * The default policy (see CostWeights). Ties rotate among the tied workers instead of always
 * going to the first registered one, which would skew a fleet of equally idle workers.
 */
export class CostPolicy implements RoutingPolicy {
  readonly name = 'cost';
  private readonly tieBreak = { cursor: 0 };
  private readonly scratch: number[] = [];
  // the scoring closure is made once; choose() sets what it reads
  private request: RouteFeatures | undefined;
  private anyBelowCeiling = false;
  private readonly score = (c: Candidate): number =>
    this.anyBelowCeiling && c.worker.load >= this.weights.pressureCeiling ? NaN : costScore(c, this.request!, this.weights);

  constructor(readonly weights: Readonly<CostWeights> = DEFAULT_COST_WEIGHTS) {}

  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice {
    const w = this.weights;
    let anyBelowCeiling = false;
    for (const c of candidates) if (c.worker.load < w.pressureCeiling) anyBelowCeiling = true;
    this.request = request;
    this.anyBelowCeiling = anyBelowCeiling;
    const index = pickMax(candidates, this.score, this.tieBreak, this.scratch);
    if (index < 0) return NO_CHOICE;
    return { index, confidence: candidates[index].cachedFraction, reason: 'cost' };
  }

  scoreTerms(c: Candidate, request: RouteFeatures): Record<string, number | boolean> {
    const t = costTerms(c, request, this.weights);
    return {
      ...t,
      queuedPrefillTokens: c.worker.queuedPrefillTokens,
      activeDecodeTokens: c.worker.activeDecodeTokens,
      servesCla: c.servesCla,
      continuity: c.continuity,
      excluded: c.worker.load >= this.weights.pressureCeiling,
    };
  }
}
