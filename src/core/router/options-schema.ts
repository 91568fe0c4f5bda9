/**
 * The router's options declared once (zod): type, default, range and help of each. The
 * constructor validates through it, and `serve` derives its router flags, environment
 * variables and config-file keys from it, so every option is settable the same way
 * everywhere and fails with the same message. zod is pure (no I/O, no timers), as core must be.
 */
import { z } from 'zod';
import { POLICY_NAMES } from '../policies/index.js';
import { COST_WEIGHTS_SCHEMA, POLICY_OPTIONS_SCHEMA } from '../policies/options-schema.js';
import type { RoutingPolicy } from '../policies/types.js';
import { MAX_SEED } from '../rng.js';
import { gotPhrase } from '../schema-issues.js';
import { DEFAULT_MAX_ID_BYTES, MAX_BLOCK_SIZE, MAX_ID_BYTES } from '../validate.js';
import { VLLM_HASH_ALGOS } from '../vllm-block-hash.js';

/** Most agent roles `judgeRoles` may name. */
export const MAX_JUDGE_ROLES = 1024;

const positiveInt = () => z.int().min(1);

/** What a PYTHONHASHSEED must be, as the messages about one say it. */
export const PYTHON_HASH_SEED_RULE = "must be 'random' or an integer from 0 to 4294967295, as Python takes it";

/**
 * A PYTHONHASHSEED a Python process starts with ('random' or 0 to 2^32 - 1; anything else stops
 * it): vLLM hashes the variable's text, so any other value matches no engine's blocks.
 */
export function isPythonHashSeed(seed: unknown): boolean {
  return typeof seed === 'string' && (seed === 'random' || (/^\d{1,10}$/.test(seed) && Number(seed) <= 0xffff_ffff));
}
const nonNegativeInt = () => z.int().min(0);

/**
 * Longest lifetime of a predicted block, in whole milliseconds (about 24.8 days, what a timer
 * holds): the shared state keeps it with Redis's `SET … PX`, which takes a whole number of at
 * least 1, and every store reads it the same way.
 */
export const MAX_PREDICTION_TTL_MS = 2 ** 31 - 1;
const fraction = () => z.number().min(0).max(1);

/**
 * Most entries a remembered table (anchors, workflows, content anchors) may be given: each is
 * allocated for its capacity when the router is built, about 16 bytes an entry, and at this
 * bound that takes seconds and 160 MB per table; past 2^32 it cannot be allocated at all.
 */
export const MAX_TABLE_CAPACITY = 10_000_000;
const tableCapacity = () => positiveInt().max(MAX_TABLE_CAPACITY);

/**
 * Most (block, worker) entries the block index may be given: it holds them in typed arrays that
 * double as they fill, about 40 bytes a block with its hash table, so at this bound it may take
 * 4 GB; much past it a doubling cannot be allocated and the route that needed it would fail.
 */
export const MAX_INDEX_ENTRIES = 100_000_000;

/**
 * Longest prompt a router may be set to take (maxPromptTokens), in tokens: 2^27, about 134
 * million, past the longest contexts models serve today (10 million) with room to grow. The
 * bound keeps what one request adds to the index, and a /tokenize answer the gateway reads
 * for it, finite, and keeps token counts far below 2^53 when summed over many requests.
 */
export const MAX_PROMPT_TOKENS = 2 ** 27;

/**
 * Most blocks `speculativeBlocks` may be set to: the most blocks any prompt has (the longest a
 * router takes, MAX_PROMPT_TOKENS, at one token a block). The stretch is cut at the prompt's
 * blocks, so a larger value would record nothing more; bounded, the stretch's end (what the
 * worker holds plus it) stays a small integer the route path's buffers are sized for.
 */
export const MAX_SPECULATIVE_BLOCKS = MAX_PROMPT_TOKENS;

/**
 * Most content anchors a request may name by default (the router's `maxContentAnchors`): the
 * gateway's own default bound (--max-anchors, 128). Each anchor is looked up for every
 * candidate and recorded on the chosen worker: a million of them blocked the event loop for
 * seconds and flushed the content-anchor table.
 */
export const DEFAULT_MAX_CONTENT_ANCHORS = 128;

/** Most content anchors per request a router may be set to take (`maxContentAnchors`). */
export const MAX_CONTENT_ANCHORS = 4096;

export const ROUTER_DEFAULTS = Object.freeze({
  anchorCapacity: 100_000,
  workflowCapacity: 10_000,
  blockSize: 16,
  textChunkBytes: 64,
  approximateTtlMs: 120_000,
  speculativeTtlMs: 5_000,
  speculativeBlocks: 16,
  maxIndexEntries: 4_000_000,
  // 2^20: past every context length engines serve today, and a bound on what one request adds to the index
  maxPromptTokens: 1_048_576,
  offloadCredit: 0.75,
  predictedCredit: 1,
  contentAnchorCapacity: 100_000,
  contentAnchorTtlMs: 600_000,
});

/**
 * The options that can be written down (in a file, a flag, a variable): all but `clock`.
 * Order is the order of validation (the first bad option is reported).
 */
export const ROUTER_SETTINGS_SCHEMA = z.strictObject({
  // informational, as in the seed, which takes any number (0, a fraction): nothing reads it
  numWorkers: z.number().min(0).default(1),
  enableClaAffinity: z.boolean().default(true),
  enableAnchorLocality: z.boolean().default(true),
  policy: z.enum(POLICY_NAMES as [string, ...string[]]).default('cost'),
  costWeights: COST_WEIGHTS_SCHEMA.optional(),
  policyOptions: POLICY_OPTIONS_SCHEMA.optional(),
  randomSeed: nonNegativeInt().max(MAX_SEED).default(1),
  anchorCapacity: tableCapacity().default(ROUTER_DEFAULTS.anchorCapacity),
  workflowCapacity: tableCapacity().default(ROUTER_DEFAULTS.workflowCapacity),
  blockSize: positiveInt().max(MAX_BLOCK_SIZE).default(ROUTER_DEFAULTS.blockSize),
  textChunkBytes: positiveInt().multipleOf(4).default(ROUTER_DEFAULTS.textChunkBytes),
  blockHash: z.enum(['router', 'vllm']).default('router'),
  pythonHashSeed: z
    .string()
    .refine(isPythonHashSeed, {
      error: (iss) => `${PYTHON_HASH_SEED_RULE}${gotPhrase(iss.input)}`,
    })
    .optional(),
  // the router's default is sha256_cbor, the one algorithm `--block-hash vllm` computed before
  // the others; vLLM's own default is sha256, so the engines' value must be passed
  prefixCachingHashAlgo: z.enum(VLLM_HASH_ALGOS).default('sha256_cbor'),
  indexMode: z.enum(['precise', 'approximate']).default('approximate'),
  predictionTtlMs: positiveInt().max(MAX_PREDICTION_TTL_MS).optional(),
  maxIndexEntries: positiveInt().max(MAX_INDEX_ENTRIES).default(ROUTER_DEFAULTS.maxIndexEntries),
  maxPromptTokens: positiveInt().max(MAX_PROMPT_TOKENS).default(ROUTER_DEFAULTS.maxPromptTokens),
  contentAnchorScoring: z.boolean().default(true),
  speculativeBlocks: nonNegativeInt().max(MAX_SPECULATIVE_BLOCKS).default(ROUTER_DEFAULTS.speculativeBlocks),
  offloadCredit: fraction().default(ROUTER_DEFAULTS.offloadCredit),
  predictedCredit: fraction().default(ROUTER_DEFAULTS.predictedCredit),
  contentAnchorCapacity: tableCapacity().default(ROUTER_DEFAULTS.contentAnchorCapacity),
  // whole ms, at most what predictionTtlMs may be (a timer's longest delay)
  contentAnchorTtlMs: nonNegativeInt().max(MAX_PREDICTION_TTL_MS).default(ROUTER_DEFAULTS.contentAnchorTtlMs),
  judgeRoles: z.array(z.string().min(1)).max(MAX_JUDGE_ROLES).default([]),
  instanceId: z.string().min(1).max(256).optional(),
});

/** Every option: the settings, a policy also as an object, and the clock (both given in code only). */
export const ROUTER_OPTIONS_SCHEMA = ROUTER_SETTINGS_SCHEMA.extend({
  // anything but a name is checked member by member when the router is built (checkPolicyObject)
  policy: z
    .custom<string | RoutingPolicy>((v) => typeof v !== 'string' || POLICY_NAMES.includes(v), {
      error: (iss) => `must be one of ${POLICY_NAMES.join(', ')}${gotPhrase(iss.input)}`,
    })
    .default('cost'),
  clock: z.custom<() => number>((v) => typeof v === 'function', { error: 'must be a function' }).optional(),
  // given in code: `serve` passes what its own --max-id-bytes lets through to the router
  // (routerIdBytes() in src/server/request-limits.ts), so it is no setting of its own there
  maxIdBytes: positiveInt().max(MAX_ID_BYTES).default(DEFAULT_MAX_ID_BYTES),
  // given in code too: a gateway passes its own bound on a request's anchors
  maxContentAnchors: positiveInt().max(MAX_CONTENT_ANCHORS).default(DEFAULT_MAX_CONTENT_ANCHORS),
});

export type RouterSettings = z.input<typeof ROUTER_SETTINGS_SCHEMA>;

/** One line of help per setting (for `serve --help` and the configuration document). */
export const ROUTER_SETTINGS_HELP: Readonly<Record<keyof RouterSettings, string>> = Object.freeze({
  numWorkers: 'informational, as in the seed API',
  enableClaAffinity: "prefer workers that serve the request's CLA group",
  enableAnchorLocality: "prefer workers that hold the request's KV",
  policy: `routing policy (${POLICY_NAMES.join(', ')})`,
  costWeights:
    "the cost policy's weights, e.g. {recompute: 2} (what `tune` prints); unspecified ones keep their defaults",
  policyOptions:
    "peer policies' options, e.g. {dynamo: {prefillLoadScale: 2}}; defaults are the peers' shipped ones (llmd's and llmd-affinity's scrapeIntervalMs is read by simulate alone: serve and the endpoint picker scrape at --metrics-interval-ms)",
  randomSeed: 'seed of the random source sampling policies use',
  anchorCapacity: 'most seed-API anchors remembered (least recently used evicted beyond)',
  workflowCapacity: 'most workflows remembered for step continuity',
  blockSize: "tokens per KV block (the engines')",
  textChunkBytes: 'bytes per chunk when hashing text (a multiple of 4; about 16 tokens of English at 64)',
  blockHash:
    "how blocks are keyed: router (its own hash of the token ids, chained through the events) or vllm (vLLM's own block hash: needs pythonHashSeed equal to the engines' PYTHONHASHSEED and prefixCachingHashAlgo equal to their --prefix-caching-hash-algo)",
  pythonHashSeed: 'the PYTHONHASHSEED the vLLM engines run with (blockHash vllm)',
  prefixCachingHashAlgo: `the vLLM engines' --prefix-caching-hash-algo (${VLLM_HASH_ALGOS.join(', ')}; blockHash vllm). vLLM's own default is sha256: pass the engines' value`,
  indexMode: "approximate (the router's own decisions, expired by TTL) or precise (the engines' KV events)",
  predictionTtlMs: `lifetime in ms of the router's own block records and of the shared ones (--state redis, --processes), from 1 to ${MAX_PREDICTION_TTL_MS} (default 120000 approximate, 5000 precise)`,
  maxIndexEntries: 'most (block, worker) entries in the block index',
  maxPromptTokens: `longest prompt routed, in tokens, at most ${MAX_PROMPT_TOKENS} (a longer one is refused before anything is recorded for it)`,
  contentAnchorScoring: 'score content anchors a worker holds as cached tokens (false: the prefix only)',
  speculativeBlocks: `precise mode: blocks recorded past what the chosen worker already holds, at most ${MAX_SPECULATIVE_BLOCKS}`,
  offloadCredit: 'credit of an offloaded (CPU/disk) block relative to a GPU block, from 0 to 1',
  predictedCredit: "credit of a block known only from the router's own prediction, from 0 to 1",
  contentAnchorCapacity: 'most content anchors remembered, each (anchor, namespace) once',
  contentAnchorTtlMs: `how long a content anchor stays recorded on a worker, in whole ms, at most ${MAX_PREDICTION_TTL_MS}`,
  judgeRoles: "agent roles that never reuse other requests' KV (judges)",
  instanceId: "distinguishes this router's isolation salts from other replicas' (default random)",
});
