import { BlockHashes } from '../core/hashing.js';
import { EngineModel, type EngineConfig } from '../engine-model/index.js';
import { LruSet } from './lru.js';
import { cachedTokensOf, requestBlocks } from './request-blocks.js';
import { checkReplayable, type TraceRequest } from './trace.js';

/**
 * Limits no routing policy can pass on a trace, counted as the engine model counts (the same
 * block keys and hit rule, src/sim/request-blocks.ts):
 * - infiniteCacheHitRate: the token-weighted hit rate of one infinitely large cache seeing
 *   every request in order: its cached prefix (at most prompt − 1 tokens, full blocks only)
 *   plus the content anchors it has seen before less their blend-recompute share; isolated
 *   requests never hit, CLA groups never share;
 * - idealTtftMean: the mean TTFT (s) if every request ran alone on an idle engine holding
 *   every earlier block, i.e. only its truly new tokens are prefilled, in budget-sized chunks.
 * Requests the engine would refuse (over the context limit, or needing more KV blocks than it
 * has) are left out, as the simulator leaves them out of its figures. With `workerKvTokens`
 * (workers of their own KV capacities, as the scenario gives them) a request is left out when
 * every worker would refuse it, as the simulator refuses it before routing; one that some
 * worker can hold counts, though a policy may send it to one too small and have it rejected.
 * Such a policy's figures cover fewer requests than these bounds: pass its refused requests
 * as `leftOut` for the bounds over the requests it answered, the ones its figures are held to.
 */
export interface Bounds {
  infiniteCacheHitRate: number;
  idealTtftMean: number;
}

export function computeBounds(
  trace: readonly TraceRequest[],
  engine: Partial<Omit<EngineConfig, 'blockTokens'>> = {},
  workerKvTokens?: readonly number[],
  leftOut?: ReadonlySet<number>,
): Bounds {
  return boundsOver(trace, engine, workerKvTokens, leftOut).bounds;
}

/**
 * computeBounds, and how many requests it counted. `leftOut` holds positions in `trace` of
 * requests a policy had refused (PolicyResult.refused): they never reached an engine, so they
 * are left out too, and the bounds are over the requests that policy answered.
 */
export function boundsOver(
  trace: readonly TraceRequest[],
  engine: Partial<Omit<EngineConfig, 'blockTokens'>> = {},
  workerKvTokens?: readonly number[],
  leftOut?: ReadonlySet<number>,
): { bounds: Bounds; counted: number } {
  if (trace.length === 0) return { bounds: { infiniteCacheHitRate: 0, idealTtftMean: 0 }, counted: 0 };
  checkReplayable(trace);
  const bt = trace[0].blockSize;
  const models =
    workerKvTokens !== undefined && workerKvTokens.length > 0
      ? workerKvTokens.map((kvTokens) => new EngineModel({ ...engine, kvTokens, blockTokens: bt }))
      : [new EngineModel({ ...engine, blockTokens: bt })];
  // the step times and the blend share do not depend on the KV capacity: any worker's model gives them
  const model = models[0];
  const { maxBatchTokens: budget, blendRecompute } = model.config;
  const seen = new Set<number>();
  const isSeen = (key: number) => seen.has(key);
  const scratch = new BlockHashes(256);
  let hit = 0;
  let prompt = 0;
  let ttftSum = 0;
  let served = 0;
  let salt = 0;
  for (let i = 0; i < trace.length; i++) {
    const req = trace[i];
    if (leftOut?.has(i)) continue;
    const input = Math.max(1, req.inputLength);
    const blocks = requestBlocks(req, req.isolate ? `bound-${salt++}` : undefined, scratch);
    const limits = { inputTokens: input, outputTokens: Math.max(1, req.outputLength), anchors: blocks.anchors };
    if (models.every((m) => m.rejection(limits) !== null)) continue;
    const cached = cachedTokensOf(blocks, input, bt, blendRecompute, isSeen);
    for (const key of blocks.keys) seen.add(key);
    for (const a of blocks.anchors) for (const key of a.keys) seen.add(key);
    hit += cached;
    prompt += input;
    served++;
    // alone on an idle engine: chunks of the budget over the tokens not cached
    let done = cached;
    let t = 0;
    while (done < input) {
      const chunk = Math.min(budget, input - done);
      t += model.stepTime([[chunk, done]]);
      done += chunk;
    }
    ttftSum += t;
  }
  return {
    bounds: {
      infiniteCacheHitRate: prompt > 0 ? hit / prompt : 0,
      idealTtftMean: served > 0 ? ttftSum / served / 1000 : 0,
    },
    counted: served,
  };
}

/**
 * A reference for what KV capacity allows (not a bound): the token-weighted hit rate of one
 * LRU cache of `capacityTokens` seeing every request in order, as if the whole fleet's KV
 * were a single pool, counted as the engine counts (prefix, anchors, CLA groups, isolation).
 * Each request then leaves its blocks behind as the engine frees them: the uncached tail
 * (rest of the prompt and the output) least recent, then its passages, then its prefix from
 * the last block to the first, so a prefix's head outlives its tail. Routing splits the pool
 * per worker, so policies usually land below it.
 */
export function pooledLruHitRate(
  trace: readonly TraceRequest[],
  capacityTokens: number,
  engine: Partial<Omit<EngineConfig, 'blockTokens'>> = {},
): number {
  if (trace.length === 0) return 0;
  checkReplayable(trace);
  const bt = trace[0].blockSize;
  // one worker's engine decides what is refused; the pool only sets the capacity
  const model = new EngineModel({ ...engine, blockTokens: bt });
  const blend = model.config.blendRecompute;
  const lru = new LruSet(Math.max(1, Math.floor(capacityTokens / bt)));
  const has = (key: number) => lru.has(key);
  const scratch = new BlockHashes(256);
  let hit = 0;
  let prompt = 0;
  let salt = 0;
  let anonymous = -1; // keys of blocks no later request can hit
  for (const req of trace) {
    const input = Math.max(1, req.inputLength);
    const output = Math.max(1, req.outputLength);
    const blocks = requestBlocks(req, req.isolate ? `lru-${salt++}` : undefined, scratch);
    if (model.rejection({ inputTokens: input, outputTokens: output, anchors: blocks.anchors }) !== null) continue;
    hit += cachedTokensOf(blocks, input, bt, blend, has);
    prompt += input;
    let anchorTokens = 0;
    for (const a of blocks.anchors) anchorTokens += a.tokens;
    const regionBlocks = Math.ceil(Math.max(1, input - anchorTokens + output - 1) / bt);
    for (let i = blocks.keys.length; i < regionBlocks; i++) lru.touch(anonymous--);
    for (let j = blocks.anchors.length - 1; j >= 0; j--) {
      const keys = blocks.anchors[j].keys;
      for (let k = keys.length - 1; k >= 0; k--) lru.touch(keys[k]);
    }
    for (let i = blocks.keys.length - 1; i >= 0; i--) lru.touch(blocks.keys[i]);
  }
  return prompt > 0 ? hit / prompt : 0;
}
