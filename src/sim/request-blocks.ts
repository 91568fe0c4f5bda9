import { BlockHashes, hashPrecomputedBlocks, hashString32 } from '../core/hashing.js';
import { blockKey, type EngineAnchor } from '../engine-model/index.js';
import type { TraceRequest } from './trace.js';

/**
 * The KV blocks of a trace request, keyed the same way by the engine model, the bounds and
 * the pooled-LRU reference, so all three count prefixes, content anchors, CLA groups and
 * isolation alike:
 * - prefix blocks: the trace's hash ids under the request's namespace (its model, as vLLM keys
 *   a LoRA adapter's blocks; its CLA group; the cache salt of an isolated request), only the
 *   full blocks of the prompt outside anchors;
 * - content anchors: each passage takes ceil(tokens / block) blocks of its own, keyed by the
 *   passage id under the same namespace (a passage cached for one model, one CLA group or one
 *   isolated request is not another's).
 */
export interface RequestBlocks {
  keys: Float64Array;
  hashHi: Uint32Array;
  hashLo: Uint32Array;
  anchors: EngineAnchor[];
}

/** Blocks of requests without a cache salt, kept per trace request: every policy run and the bounds share them. */
const unsalted = new WeakMap<TraceRequest, RequestBlocks>();

/**
 * The blocks of `req` under `cacheSalt`. Unsalted blocks are computed once per request object
 * and shared (callers must not modify them).
 */
export function requestBlocks(req: TraceRequest, cacheSalt: string | undefined, scratch: BlockHashes): RequestBlocks {
  if (cacheSalt !== undefined) return computeBlocks(req, cacheSalt, scratch);
  let blocks = unsalted.get(req);
  if (!blocks) {
    blocks = computeBlocks(req, undefined, scratch);
    unsalted.set(req, blocks);
  }
  return blocks;
}

/**
 * The hash ids of the request's full prompt blocks outside its content anchors. A trace names
 * the prompt's last, partial block too; an engine caches full blocks only, and a router hashing
 * the prompt's tokens keys only those, so the engine model and the simulated router see these.
 */
export function fullBlockIds(req: TraceRequest): readonly number[] {
  let anchorTokens = 0;
  for (const a of req.anchors ?? []) anchorTokens += a.tokens;
  const full = Math.max(0, Math.floor((Math.max(1, req.inputLength) - anchorTokens) / req.blockSize));
  return req.hashIds.length > full ? req.hashIds.slice(0, full) : req.hashIds;
}

function computeBlocks(req: TraceRequest, cacheSalt: string | undefined, scratch: BlockHashes): RequestBlocks {
  const ns = { lora: req.model ?? null, claGroup: req.claGroup ?? null, cacheSalt: cacheSalt ?? null };
  const ids = fullBlockIds(req);
  hashPrecomputedBlocks(ids, req.blockSize, ns, scratch);
  const n = scratch.length;
  const hashHi = scratch.hi.slice(0, n);
  const hashLo = scratch.lo.slice(0, n);
  const keys = new Float64Array(n);
  for (let i = 0; i < n; i++) keys[i] = blockKey(hashHi[i], hashLo[i]);
  const anchors: EngineAnchor[] = [];
  for (const a of req.anchors ?? []) {
    const blocks = Math.ceil(a.tokens / req.blockSize);
    const high = (hashString32(`anchor:${a.id}`) & 0x1fffff) * 4294967296;
    const aids = new Array<number>(blocks);
    for (let k = 0; k < blocks; k++) aids[k] = high + hashString32(`${a.id}#${k}`);
    hashPrecomputedBlocks(aids, req.blockSize, ns, scratch);
    const akeys = new Float64Array(blocks);
    for (let k = 0; k < blocks; k++) akeys[k] = blockKey(scratch.hi[k], scratch.lo[k]);
    anchors.push({ tokens: a.tokens, keys: akeys });
  }
  return { keys, hashHi, hashLo, anchors };
}

/**
 * Prompt tokens a request finds cached, given which blocks are present, counted as the
 * engine counts them (EngineModel.admit): the leading present prefix blocks, at most
 * prompt − 1 tokens; plus every content anchor whose blocks are all present, less the share
 * recomputed to blend it (`blendRecompute`). `present` is asked about each key at most once.
 */
export function cachedTokensOf(
  blocks: RequestBlocks,
  inputTokens: number,
  blockTokens: number,
  blendRecompute: number,
  present: (key: number) => boolean,
): number {
  const input = Math.max(1, inputTokens);
  const maxHit = Math.min(blocks.keys.length, Math.floor((input - 1) / blockTokens));
  let hit = 0;
  while (hit < maxHit && present(blocks.keys[hit])) hit++;
  let anchorHit = 0;
  for (const a of blocks.anchors) {
    let all = true;
    for (let k = 0; k < a.keys.length && all; k++) all = present(a.keys[k]);
    if (all) anchorHit += a.tokens;
  }
  return Math.max(0, Math.min(input - 1, hit * blockTokens + anchorHit - Math.ceil(anchorHit * blendRecompute)));
}
