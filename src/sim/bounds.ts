import { BlockHashes } from '../core/hashing.js';
import { EngineModel, type EngineConfig } from '../engine-model/engine-model.js';
import { LruSet } from './lru.js';
import { requestBlocks } from './simulator.js';
import type { TraceRequest } from './trace.js';

/**
 * Limits no routing policy can pass on a trace:
 * - infiniteCacheHitRate: the token-weighted hit rate of one infinitely large cache seeing
 *   every request in order: its cached prefix, plus the content anchors it has seen before
 *   (for engines with position-independent reuse); isolated requests never hit, CLA groups
 *   never share;
 * - idealTtftMean: the mean TTFT (s) if every request ran alone on an idle engine holding
 *   every earlier block, i.e. only its truly new tokens are prefilled, in budget-sized chunks.
 */
export interface Bounds {
  infiniteCacheHitRate: number;
  idealTtftMean: number;
}

export function computeBounds(trace: readonly TraceRequest[], engine: Partial<Omit<EngineConfig, 'blockTokens'>> = {}): Bounds {
  if (trace.length === 0) return { infiniteCacheHitRate: 0, idealTtftMean: 0 };
  const model = new EngineModel({ ...engine, blockTokens: trace[0].blockSize });
  const budget = model.config.maxBatchTokens;
  const seen = new Set<number>();
  const seenAnchors = new Set<string>();
  const scratch = new BlockHashes(256);
  let hit = 0;
  let prompt = 0;
  let ttftSum = 0;
  let salt = 0;
  for (const req of trace) {
    const input = Math.max(1, req.inputLength);
    const { keys } = requestBlocks(req, req.isolate ? `bound-${salt++}` : undefined, scratch);
    let k = 0;
    while (k < keys.length && seen.has(keys[k])) k++;
    for (const key of keys) seen.add(key);
    let anchorTokens = 0;
    if (!req.isolate) {
      for (const a of req.anchors ?? []) {
        const key = `${req.claGroup ?? ''}:${a.id}`;
        if (seenAnchors.has(key)) anchorTokens += a.tokens;
        else seenAnchors.add(key);
      }
    }
    const cached = Math.min(k * req.blockSize + anchorTokens, input);
    hit += cached;
    prompt += input;
    // alone on an idle engine: the last prompt token is always computed
    let done = Math.min(cached, input - 1);
    let t = 0;
    while (done < input) {
      const chunk = Math.min(budget, input - done);
      t += model.stepTime([[chunk, done]], 0);
      done += chunk;
    }
    ttftSum += t;
  }
  return { infiniteCacheHitRate: hit / prompt, idealTtftMean: ttftSum / trace.length / 1000 };
}

/**
 * A reference for what KV capacity allows (not a bound): the token-weighted prefix hit rate
 * of one LRU cache of `capacityTokens` seeing every request in order, as if the whole
 * fleet's KV were a single pool. Routing splits the pool per worker, so policies usually
 * land below it; it says how much of the infinite-cache bound capacity leaves reachable.
 */
export function pooledLruHitRate(trace: readonly TraceRequest[], capacityTokens: number): number {
  if (trace.length === 0) return 0;
  const blockTokens = trace[0].blockSize;
  const capacity = Math.max(1, Math.floor(capacityTokens / blockTokens));
  const lru = new LruSet(capacity);
  const scratch = new BlockHashes(256);
  let hit = 0;
  let prompt = 0;
  let salt = 0;
  for (const req of trace) {
    const input = Math.max(1, req.inputLength);
    const { keys } = requestBlocks(req, req.isolate ? `lru-${salt++}` : undefined, scratch);
    let k = 0;
    while (k < keys.length && lru.has(keys[k])) k++;
    hit += Math.min(k * req.blockSize, input);
    prompt += input;
    for (const key of keys) lru.touch(key);
  }
  return hit / prompt;
}
