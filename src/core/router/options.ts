/**
 * The router's constructor options: their types, their defaults, and the validation that
 * turns what a caller passed into the settings the router runs on. Validation happens here,
 * once, so the route path can trust every setting; errors name the option (TypeError for a
 * wrong type, RangeError for a value out of range).
 */
import { BlockKeying, type BlockHashMode } from '../block-keying.js';
import { createPolicy, resolveCostWeights, type CostWeights, type PolicyOptions } from '../policies/index.js';
import { checkPolicyObject } from '../policies/policy-object.js';
import type { RoutingPolicy } from '../policies/types.js';
import { createRng } from '../rng.js';
import * as check from '../validate.js';
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
  /** Most seed-API anchors remembered, least recently used evicted beyond (default 100,000). */
  anchorCapacity?: number;
  /** Most workflows remembered for step continuity (default 10,000). */
  workflowCapacity?: number;
  /** Tokens per KV block; must equal the engines' block size (default 16, vLLM's). */
  blockSize?: number;
  /** Bytes per chunk when hashing text (default 64, about 16 tokens of English). */
  textChunkBytes?: number;
  /**
   * How token blocks are keyed: 'router' (default: its own chain hash; engines' blocks are
   * learned through their KV events) or 'vllm' (vLLM's own sha256_cbor block hash, from
   * `pythonHashSeed`, the engines' PYTHONHASHSEED: keys equal the hashes engines report).
   */
  blockHash?: BlockHashMode;
  pythonHashSeed?: string;
  /** Default 'approximate'; 'precise' when engines' KV events feed the index. */
  indexMode?: IndexMode;
  /** Lifetime of the router's own block records: 120 s approximate, 5 s speculative (precise). */
  predictionTtlMs?: number;
  /**
   * Precise mode: speculative entries cover this many blocks past what the chosen worker
   * already holds (default 16). Enough to pull a burst of siblings to the same worker; the
   * engine's BlockStored events bring the rest moments later, so unique tails cost nothing.
   */
  speculativeBlocks?: number;
  /** Most (block, worker) entries in the block index (default 4,000,000). */
  maxIndexEntries?: number;
  /** Credit of an offloaded (CPU/disk) block relative to a GPU block (default 0.75). */
  offloadCredit?: number;
  /** Credit of a block known only from the router's own prediction (default 1). */
  predictedCredit?: number;
  /** Score content anchors a worker holds as cached tokens (default true); false scores the prefix only. */
  contentAnchorScoring?: boolean;
  /** Most content anchors remembered (default 100,000). */
  contentAnchorCapacity?: number;
  /** How long a content anchor stays recorded on a worker (default 600 s). */
  contentAnchorTtlMs?: number;
  /** Agent roles that never reuse other requests' KV (judges); default none. */
  judgeRoles?: readonly string[];
  /** Weights of the 'cost' policy; unspecified ones keep their defaults. */
  costWeights?: Partial<CostWeights>;
  /** Options of the peer policies (dynamo, sglang, llmd, seed); defaults are the peers' shipped ones. */
  policyOptions?: Omit<PolicyOptions, 'costWeights'>;
  /** Seed of the random source sampling policies use (default 1). */
  randomSeed?: number;
  /** Clock in ms for TTLs (default Date.now); the simulator passes simulated time. */
  clock?: () => number;
  /** Distinguishes this router's isolation salts from other replicas' (default random). */
  instanceId?: string;
}

export const ROUTER_DEFAULTS = {
  anchorCapacity: 100_000,
  workflowCapacity: 10_000,
  blockSize: 16,
  textChunkBytes: 64,
  approximateTtlMs: 120_000,
  speculativeTtlMs: 5_000,
  speculativeBlocks: 16,
  maxIndexEntries: 4_000_000,
  offloadCredit: 0.75,
  predictedCredit: 1,
  contentAnchorCapacity: 100_000,
  contentAnchorTtlMs: 600_000,
};

/** Validated options with every default filled in. */
export interface ResolvedRouterOptions {
  numWorkers: number;
  claAffinityEnabled: boolean;
  anchorLocalityEnabled: boolean;
  costWeights: Readonly<CostWeights>;
  policy: RoutingPolicy;
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
  contentAnchorScoring: boolean;
  speculativeBlocks: number;
  offloadCredit: number;
  predictedCredit: number;
  contentAnchorCapacity: number;
  contentAnchorTtlMs: number;
  judgeRoles: ReadonlySet<string>;
  clock: () => number;
  instanceId: string;
}

/** Checks the options in a fixed order (the first bad one is reported) and fills in defaults. */
export function resolveRouterOptions(options: KVAwareRouterOptions): ResolvedRouterOptions {
  if (options === null || typeof options !== 'object') throw new TypeError('options must be an object');
  const numWorkers = check.positiveInt(options.numWorkers, 'numWorkers', 1);
  const claAffinityEnabled = optionalBool(options.enableClaAffinity, 'enableClaAffinity', true);
  const anchorLocalityEnabled = optionalBool(options.enableAnchorLocality, 'enableAnchorLocality', true);
  const policyName = options.policy ?? 'cost';
  const costWeights = resolveCostWeights(options.costWeights);
  const random = createRng(check.nonNegativeInt(options.randomSeed, 'randomSeed', 1));
  const policy =
    typeof policyName === 'string'
      ? createPolicy(policyName, { ...options.policyOptions, costWeights }, { random })
      : checkPolicyObject(policyName);
  const anchorCapacity = check.positiveInt(options.anchorCapacity, 'anchorCapacity', ROUTER_DEFAULTS.anchorCapacity);
  const workflowCapacity = check.positiveInt(
    options.workflowCapacity,
    'workflowCapacity',
    ROUTER_DEFAULTS.workflowCapacity,
  );
  const blockSize = check.positiveInt(options.blockSize, 'blockSize', ROUTER_DEFAULTS.blockSize);
  const textChunkBytes = check.positiveInt(options.textChunkBytes, 'textChunkBytes', ROUTER_DEFAULTS.textChunkBytes);
  if (textChunkBytes % 4 !== 0) throw new RangeError(`textChunkBytes must be a multiple of 4, got ${textChunkBytes}`);
  const keying = new BlockKeying(options.blockHash ?? 'router', options.pythonHashSeed);
  const indexMode = options.indexMode ?? 'approximate';
  if (indexMode !== 'precise' && indexMode !== 'approximate')
    throw new RangeError(`indexMode must be 'precise' or 'approximate', got '${String(indexMode)}'`);
  const ttl =
    options.predictionTtlMs ??
    (indexMode === 'precise' ? ROUTER_DEFAULTS.speculativeTtlMs : ROUTER_DEFAULTS.approximateTtlMs);
  check.finiteNonNegative(ttl, 'predictionTtlMs');
  const maxIndexEntries = check.positiveInt(
    options.maxIndexEntries,
    'maxIndexEntries',
    ROUTER_DEFAULTS.maxIndexEntries,
  );
  const contentAnchorScoring = optionalBool(options.contentAnchorScoring, 'contentAnchorScoring', true);
  const speculativeBlocks = check.nonNegativeInt(
    options.speculativeBlocks,
    'speculativeBlocks',
    ROUTER_DEFAULTS.speculativeBlocks,
  );
  const offloadCredit = check.fraction(options.offloadCredit ?? ROUTER_DEFAULTS.offloadCredit, 'offloadCredit');
  const predictedCredit = check.fraction(options.predictedCredit ?? ROUTER_DEFAULTS.predictedCredit, 'predictedCredit');
  const contentAnchorCapacity = check.positiveInt(
    options.contentAnchorCapacity,
    'contentAnchorCapacity',
    ROUTER_DEFAULTS.contentAnchorCapacity,
  );
  const contentAnchorTtlMs = check.finiteNonNegative(
    options.contentAnchorTtlMs ?? ROUTER_DEFAULTS.contentAnchorTtlMs,
    'contentAnchorTtlMs',
  );
  const roles = options.judgeRoles ?? [];
  if (!Array.isArray(roles)) throw new TypeError('judgeRoles must be an array of strings');
  const judgeRoles = new Set(roles.map((r, i) => check.requireId(r, `judgeRoles[${i}]`)));
  if (options.clock !== undefined && typeof options.clock !== 'function')
    throw new TypeError('clock must be a function');
  const clock = options.clock ?? Date.now;
  const instanceId = check.optionalId(options.instanceId, 'instanceId') ?? globalThis.crypto.randomUUID().slice(0, 8);
  return {
    numWorkers,
    claAffinityEnabled,
    anchorLocalityEnabled,
    costWeights,
    policy,
    countsBlocks: policyName !== 'seed',
    anchorCapacity,
    workflowCapacity,
    blockSize,
    textChunkBytes,
    keying,
    indexMode,
    predictedTtlMs: Math.max(ttl, 1),
    maxIndexEntries,
    contentAnchorScoring,
    speculativeBlocks,
    offloadCredit,
    predictedCredit,
    contentAnchorCapacity,
    contentAnchorTtlMs,
    judgeRoles,
    clock,
    instanceId,
  };
}

function optionalBool(value: unknown, name: string, fallback: boolean): boolean {
  if (value === undefined) return fallback;
  if (typeof value !== 'boolean') throw new TypeError(`${name} must be a boolean`);
  return value;
}
