/**
 * The router's constructor options: their types, their defaults, and the validation that
 * turns what a caller passed into the settings the router runs on. Validation happens here,
 * once, so the route path can trust every setting; errors name the option (TypeError for a
 * wrong type, RangeError for a value out of range).
 */
import { BlockKeying, type BlockHashMode } from '../block-keying.js';
import type { VllmHashAlgo } from '../vllm-block-hash.js';
import { createPolicy, resolveCostWeights, type CostWeights, type PolicyOptions } from '../policies/index.js';
import { checkPolicyObject } from '../policies/policy-object.js';
import type { RoutingPolicy } from '../policies/types.js';
import { SeededRandom } from '../rng.js';
import { describeIssue, firstIssue, issueError } from '../schema-issues.js';
import * as check from '../validate.js';
import type { z } from 'zod';
import { ROUTER_DEFAULTS, ROUTER_OPTIONS_SCHEMA } from './options-schema.js';
import type { IndexMode } from './types.js';

export interface KVAwareRouterOptions {
  /** Informational, as in the seed. */
  numWorkers?: number;
  /** Prefer workers that serve the request's CLA group (default true). */
  enableClaAffinity?: boolean;
  /** Prefer workers that hold the request's KV (default true). */
  enableAnchorLocality?: boolean;
  /**
   * 'cost' (default), 'seed', a baseline / peer policy (see POLICY_NAMES), or an object of
   * the caller's implementing RoutingPolicy (one per router: its hooks see this router's decisions).
   */
  policy?: string | RoutingPolicy;
  /** Most seed-API anchors remembered, least recently used evicted beyond (default 100,000, at most 10,000,000). */
  anchorCapacity?: number;
  /** Most workflows remembered for step continuity (default 10,000, at most 10,000,000). */
  workflowCapacity?: number;
  /** Tokens per KV block; must equal the engines' block size (default 16, vLLM's). */
  blockSize?: number;
  /** Bytes per chunk when hashing text (default 64, about 16 tokens of English). */
  textChunkBytes?: number;
  /**
   * How token blocks are keyed: 'router' (default: its own chain hash; engines' blocks are
   * learned through their KV events) or 'vllm' (vLLM's own block hash, from `pythonHashSeed`,
   * the engines' PYTHONHASHSEED, and `prefixCachingHashAlgo`, their --prefix-caching-hash-algo:
   * keys equal the hashes engines report).
   */
  blockHash?: BlockHashMode;
  pythonHashSeed?: string;
  /**
   * blockHash 'vllm': the engines' --prefix-caching-hash-algo. Default 'sha256_cbor' (what
   * this mode always computed); vLLM's own default is 'sha256'.
   */
  prefixCachingHashAlgo?: VllmHashAlgo;
  /** Default 'approximate'; 'precise' when engines' KV events feed the index. */
  indexMode?: IndexMode;
  /**
   * Lifetime of the router's own block records: 120 s approximate, 5 s speculative (precise);
   * whole ms from 1 to MAX_PREDICTION_TTL_MS (2^31 - 1).
   */
  predictionTtlMs?: number;
  /**
   * Precise mode: speculative entries cover this many blocks past what the chosen worker
   * already holds (default 16; at most MAX_SPECULATIVE_BLOCKS, 2^27, the most blocks a prompt
   * has). Enough to pull a burst of siblings to the same worker; the engine's BlockStored events
   * bring the rest moments later, so unique tails cost nothing.
   */
  speculativeBlocks?: number;
  /** Most (block, worker) entries in the block index (default 4,000,000). */
  maxIndexEntries?: number;
  /**
   * Longest prompt routed, in tokens (default 1,048,576; at most MAX_PROMPT_TOKENS, 2^27):
   * route() throws a PromptTooLongError for a longer one and records nothing, so no single
   * request can fill the index. The prompt's blocks (token ids, text chunks, `blockHashes`
   * times `blockTokens`) and a `promptTokens` given are each held to it: a short length given
   * does not pass a long prompt.
   */
  maxPromptTokens?: number;
  /** Credit of an offloaded (CPU/disk) block relative to a GPU block (default 0.75). */
  offloadCredit?: number;
  /** Credit of a block known only from the router's own prediction (default 1). */
  predictedCredit?: number;
  /** Score content anchors a worker holds as cached tokens (default true); false scores the prefix only. */
  contentAnchorScoring?: boolean;
  /** Most content anchors remembered (default 100,000, at most 10,000,000). */
  contentAnchorCapacity?: number;
  /** How long a content anchor stays recorded on a worker (default 600 s): whole ms, at most MAX_PREDICTION_TTL_MS (2^31 - 1). */
  contentAnchorTtlMs?: number;
  /** Agent roles that never reuse other requests' KV (judges); default none. */
  judgeRoles?: readonly string[];
  /** Weights of the 'cost' policy; unspecified ones keep their defaults. */
  costWeights?: Partial<CostWeights>;
  /** Options of the peer policies (dynamo, sglang, smg, llmd, llmd-affinity, seed); defaults are the peers' shipped ones. */
  policyOptions?: Omit<PolicyOptions, 'costWeights'>;
  /** Seed of the random source sampling policies use, from 0 to 4294967295 (default 1). */
  randomSeed?: number;
  /**
   * Clock in ms for TTLs and the times requests wait (default: the process's monotonic clock,
   * counted from its time origin, so close to Date.now); the simulator passes simulated time.
   */
  clock?: () => number;
  /** Distinguishes this router's isolation salts from other replicas' (default random). */
  instanceId?: string;
  /**
   * Longest id a request names, in UTF-8 bytes (default 1024, what the gateway hands the
   * router at its default --max-id-bytes, 256: a LoRA name may be 4 × as long; at most 2^30): a
   * workflow id, an agent role, an anchor (selectWorker's too), a content anchor's id, a cache
   * salt, a LoRA name, a block id broadcastNewBlocks() records. A longer one is refused with a
   * RangeError naming the field: the router keeps such ids in its tables (a workflow's, an
   * anchor's, up to their capacity), so an unbounded one would let each request keep megabytes. Worker ids have their own bound
   * (MAX_WORKER_ID_LENGTH).
   */
  maxIdBytes?: number;
  /**
   * Most content anchors a request (or a shared decision) names, from 1 to MAX_CONTENT_ANCHORS
   * (4096); default DEFAULT_MAX_CONTENT_ANCHORS (128, the gateway's default --max-anchors). More
   * are refused with a RangeError naming `contentAnchors`: each is looked up for every candidate
   * and recorded on the chosen worker.
   */
  maxContentAnchors?: number;
}

/** Every option of the interface is declared in the schema, and nothing else is. */
type SameKeys<A, B> = [Exclude<keyof A, keyof B>, Exclude<keyof B, keyof A>] extends [never, never] ? true : never;
const schemaCoversOptions: SameKeys<KVAwareRouterOptions, z.input<typeof ROUTER_OPTIONS_SCHEMA>> = true;
void schemaCoversOptions;

export { ROUTER_DEFAULTS };

/** Validated options with every default filled in. */
export interface ResolvedRouterOptions {
  numWorkers: number;
  claAffinityEnabled: boolean;
  anchorLocalityEnabled: boolean;
  costWeights: Readonly<CostWeights>;
  policy: RoutingPolicy;
  /** The policy was made here from its name (not an object of the caller's). */
  builtInPolicy: boolean;
  /** The seed never counts blocks; under policy 'seed' activeBlocks stays 0 as there. */
  countsBlocks: boolean;
  anchorCapacity: number;
  workflowCapacity: number;
  blockSize: number;
  textChunkBytes: number;
  keying: BlockKeying;
  indexMode: IndexMode;
  /** Lifetime of the router's own block records in the index (at least 1 ms). */
  predictedTtlMs: number;
  maxIndexEntries: number;
  maxPromptTokens: number;
  contentAnchorScoring: boolean;
  speculativeBlocks: number;
  offloadCredit: number;
  predictedCredit: number;
  contentAnchorCapacity: number;
  contentAnchorTtlMs: number;
  judgeRoles: ReadonlySet<string>;
  /** The random source of the built-in policies (PolicyContext.random), put back after a dry run. */
  random: SeededRandom;
  clock: () => number;
  instanceId: string;
  maxIdBytes: number;
  maxContentAnchors: number;
}

/**
 * Milliseconds since the epoch as of the process's start, then as a clock that never steps: a
 * wall clock set forward (an NTP step, a machine resumed) would make every queued request look
 * late at once and age every prediction, and one set back would keep them.
 */
function monotonicClock(): number {
  return performance.timeOrigin + performance.now();
}

/** Checks the options against the schema (the first bad one is reported) and fills in defaults. */
export function resolveRouterOptions(options: KVAwareRouterOptions): ResolvedRouterOptions {
  check.object(options, 'options');
  // an option given as undefined means "not given", as with the hand-written checks before
  const given = Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined));
  const parsed = ROUTER_OPTIONS_SCHEMA.safeParse(given, { error: describeIssue });
  if (!parsed.success) throw issueError(firstIssue(parsed.error.issues), ROUTER_OPTIONS_SCHEMA);
  const o = parsed.data;
  const costWeights = resolveCostWeights(o.costWeights);
  const random = new SeededRandom(o.randomSeed);
  const policy =
    typeof o.policy === 'string'
      ? createPolicy(o.policy, { ...o.policyOptions, costWeights }, { random: random.next })
      : checkPolicyObject(o.policy);
  const keying = new BlockKeying(o.blockHash, o.pythonHashSeed, o.prefixCachingHashAlgo);
  const ttl =
    o.predictionTtlMs ??
    (o.indexMode === 'precise' ? ROUTER_DEFAULTS.speculativeTtlMs : ROUTER_DEFAULTS.approximateTtlMs);
  return {
    numWorkers: o.numWorkers,
    claAffinityEnabled: o.enableClaAffinity,
    anchorLocalityEnabled: o.enableAnchorLocality,
    costWeights,
    policy,
    random,
    builtInPolicy: typeof o.policy === 'string',
    countsBlocks: o.policy !== 'seed',
    anchorCapacity: o.anchorCapacity,
    workflowCapacity: o.workflowCapacity,
    blockSize: o.blockSize,
    textChunkBytes: o.textChunkBytes,
    keying,
    indexMode: o.indexMode,
    predictedTtlMs: Math.max(ttl, 1),
    maxIndexEntries: o.maxIndexEntries,
    maxPromptTokens: o.maxPromptTokens,
    contentAnchorScoring: o.contentAnchorScoring,
    speculativeBlocks: o.speculativeBlocks,
    offloadCredit: o.offloadCredit,
    predictedCredit: o.predictedCredit,
    contentAnchorCapacity: o.contentAnchorCapacity,
    contentAnchorTtlMs: o.contentAnchorTtlMs,
    judgeRoles: new Set(o.judgeRoles),
    clock: o.clock ?? monotonicClock,
    instanceId: o.instanceId ?? globalThis.crypto.randomUUID().slice(0, 8),
    maxIdBytes: o.maxIdBytes,
    maxContentAnchors: o.maxContentAnchors,
  };
}
