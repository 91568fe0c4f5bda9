import type { EngineConfig } from './config.js';

/**
 * Duration (ms) of one step computing `chunks`, each [new tokens, context before them] (a
 * decoding sequence is a chunk of one token): the linear layers are one roofline over the
 * step's tokens (reading the weights vs computing them), attention another per sequence
 * (reading its context's KV vs its query × key pairs, causal within the chunk), added up.
 */
export function stepTime(c: EngineConfig, chunks: ReadonlyArray<readonly [number, number]>): number {
  let tokens = 0;
  let attention = 0;
  for (const [chunk, start] of chunks) {
    tokens += chunk;
    const pairs = chunk * start + (chunk * (chunk + 1)) / 2;
    attention += Math.max((start + chunk) * c.kvReadMsPerToken, pairs * c.attentionMsPerTokenPair);
  }
  return Math.max(c.weightReadMs, tokens * c.linearMsPerToken) + attention;
}
