import type { Candidate } from './types.js';

/** Scores within this distance are ties. */
export const TIE_EPSILON = 1e-9;

/** Scores pickMax() computes before picking (grown as needed; pickMax is not reentrant). */
let scored = new Float64Array(64);

/**
 * Index of the candidate with the highest score (skipping NaN scores); `score` gets each
 * candidate with its index. Ties rotate through `cursor`, so equally good workers share the
 * work instead of the first always winning. Returns -1 when no candidate has a score.
 */
export function pickMax(
  candidates: readonly Candidate[],
  score: (c: Candidate, i: number) => number,
  tieBreak: { cursor: number },
  scratch: number[],
  advance = true,
): number {
  const n = candidates.length;
  if (scored.length < n) scored = new Float64Array(2 * n);
  for (let i = 0; i < n; i++) scored[i] = score(candidates[i], i);
  return pickMaxScore(scored, n, tieBreak, scratch, advance);
}

/**
 * Index of the highest of the first `n` of `scores` (skipping NaN), ties within TIE_EPSILON
 * rotating through `cursor`, -1 when none has a score: pickMax over scores already computed.
 * With `advance` false (a dry run) the rotation stays where it is, so that the next decision
 * is the one this one showed.
 */
export function pickMaxScore(
  scores: Float64Array,
  n: number,
  tieBreak: { cursor: number },
  scratch: number[],
  advance = true,
): number {
  let best = -Infinity;
  let ties = 0;
  for (let i = 0; i < n; i++) {
    const s = scores[i];
    if (Number.isNaN(s)) continue;
    if (s > best + TIE_EPSILON) {
      best = s;
      ties = 0;
      scratch[ties++] = i;
    } else if (s >= best - TIE_EPSILON) {
      scratch[ties++] = i;
    }
  }
  if (ties === 0) return -1;
  if (ties === 1) return scratch[0];
  const index = scratch[tieBreak.cursor % ties];
  if (advance) tieBreak.cursor++;
  return index;
}

/**
 * Index of the candidate with the lowest (`sign` = -1) or highest (`sign` = 1) of `scores`
 * (first `n`), ties within TIE_EPSILON broken at random: what Dynamo's selector and llm-d's
 * max-score picker do. `scratch` collects the ties. -1 when no score is a number.
 */
export function pickWithRandomTies(
  scores: Float64Array,
  n: number,
  sign: 1 | -1,
  random: () => number,
  scratch: number[],
): number {
  let best = -Infinity;
  for (let i = 0; i < n; i++) if (sign * scores[i] > best) best = sign * scores[i];
  let ties = 0;
  for (let i = 0; i < n; i++) if (sign * scores[i] >= best - TIE_EPSILON) scratch[ties++] = i;
  if (ties === 0) return -1;
  return ties === 1 ? scratch[0] : scratch[Math.floor(random() * ties)];
}

/** The router's own count of a worker's outstanding requests: the queue-length peers use. */
export function outstanding(c: Candidate): number {
  return c.worker.inFlightRequests;
}
