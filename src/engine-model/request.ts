/** What the engine model takes in and reports: requests, their cache keys, step results. */

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
