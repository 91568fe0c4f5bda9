/**
 * The policies' options as a schema (zod): the cost policy's weights and the peer policies'
 * knobs, with their ranges. The router's options schema and createPolicy() both check
 * through it, so a misspelt option is refused the same way everywhere.
 */
import { z } from 'zod';
import { gotPhrase } from '../schema-issues.js';
import { DEFAULT_COST_WEIGHTS, kneeCeilingProblem, type CostWeights } from './cost.js';
import { LLMD_SCRAPE_INTERVAL_RANGE } from './llmd.js';
import { LLMD_MAX_TTFT_PENALTY_MS } from './llmd-affinity.js';
import { SGLANG_EVICTION_INTERVAL_SECS } from './sglang.js';
import { SMG_MODES } from './smg.js';

const finiteAtLeastZero = 'must be a finite number >= 0';
/** A weight or credit: finite and not negative (message shared by every such option). */
export const nonNegative = () =>
  z
    .number({ error: (iss) => `${finiteAtLeastZero}${gotPhrase(iss.input)}` })
    .min(0, { error: (iss) => `${finiteAtLeastZero}${gotPhrase(iss.input)}` });
const positiveInt = () => z.int().min(1);
const fraction = () => z.number().min(0).max(1);
const finiteNumber = () => z.number();

const bound = (phrase: string) => ({ error: (iss: { input?: unknown }) => `must be ${phrase}${gotPhrase(iss.input)}` });
/**
 * The largest multiplier weight (attention, decode, recompute, the guards and bonuses, the new
 * session's slack). Far above any value that means something (the defaults are at most 6), and
 * low enough that every term stays finite for any prompt: a weight near the largest double made
 * the costs Infinity and NaN, and then no worker was chosen for any request.
 */
export const MAX_MULTIPLIER_WEIGHT = 1e6;
/** The largest weight counted in tokens or tokens a second (a rate, a capacity, a grace). */
export const MAX_TOKEN_WEIGHT = 1e9;
/** SGLang's and SMG's eviction interval: whole seconds, as upstream's u64 (the bounds first: z.int() would name the safe-integer top). */
const evictionIntervalSecs = () =>
  finiteNumber()
    .min(SGLANG_EVICTION_INTERVAL_SECS.min)
    .max(SGLANG_EVICTION_INTERVAL_SECS.max)
    .refine(Number.isInteger, bound('a whole number of seconds'));
/** llm-d's metrics refresh interval (llmd, llmd-affinity), ms. */
const llmdScrapeIntervalMs = () =>
  finiteNumber().min(LLMD_SCRAPE_INTERVAL_RANGE.min).max(LLMD_SCRAPE_INTERVAL_RANGE.max);
const multiplier = () => nonNegative().max(MAX_MULTIPLIER_WEIGHT, bound(`<= ${MAX_MULTIPLIER_WEIGHT}`));
/**
 * Weights with a narrower range than finite and >= 0. This is the one statement of the
 * weights' ranges: resolveCostWeights (createPolicy, the router) checks through
 * COST_WEIGHTS_SCHEMA as the router's options and serve's settings do.
 */
const COST_WEIGHT_RANGES: Record<keyof CostWeights, z.ZodNumber> = {
  // it divides (seconds and due times are token equivalents over it): below one token a second
  // a due time is past every clock and a decision's seconds overflow
  prefillTokensPerSecond: nonNegative()
    .min(1, bound('>= 1'))
    .max(MAX_TOKEN_WEIGHT, bound(`<= ${MAX_TOKEN_WEIGHT}`)),
  attention: multiplier(),
  decode: multiplier(),
  recompute: multiplier(),
  load: multiplier(),
  pressure: multiplier(),
  // the pressure term divides by 1 - knee
  pressureKnee: nonNegative().lt(1, bound('< 1')),
  pressureCeiling: nonNegative().max(1, bound('<= 1')),
  cla: multiplier(),
  workflow: multiplier(),
  // a count of tokens, as a worker's reported capacity is (updateWorkerMetrics() takes an integer)
  kvCapacityTokens: nonNegative()
    .max(MAX_TOKEN_WEIGHT, bound(`<= ${MAX_TOKEN_WEIGHT}`))
    .refine(Number.isInteger, bound('a whole number of tokens')),
  newSessionSlack: multiplier(),
  lateGraceTokens: nonNegative().max(MAX_TOKEN_WEIGHT, bound(`<= ${MAX_TOKEN_WEIGHT}`)),
};

/** The keys whose value is not undefined (an undefined weight keeps its default). */
export const definedOnly = (w: Partial<CostWeights>): Partial<CostWeights> =>
  Object.fromEntries(Object.entries(w).filter(([, v]) => v !== undefined));

/** Every cost weight, each optional (unspecified ones keep their defaults). */
export const COST_WEIGHTS_SCHEMA = z
  .strictObject(
    Object.fromEntries(
      Object.keys(DEFAULT_COST_WEIGHTS).map((k) => [k, COST_WEIGHT_RANGES[k as keyof CostWeights].optional()]),
    ) as {
      [K in keyof CostWeights]: z.ZodOptional<z.ZodNumber>;
    },
    { error: (iss) => (iss.code === 'unrecognized_keys' ? 'is not a cost weight' : undefined) },
  )
  .superRefine((given, ctx) => {
    // the knee and the ceiling are checked together, with the defaults of the one not given
    const problem = kneeCeilingProblem({ ...DEFAULT_COST_WEIGHTS, ...definedOnly(given) });
    if (problem !== undefined)
      ctx.addIssue({ code: 'custom', message: problem, path: ['pressureKnee'], input: given.pressureKnee });
  });

/** One peer's options: a misspelt one is named as not an option of that peer. */
const peerOptions = <T extends z.core.$ZodLooseShape>(peer: string, shape: T) =>
  z.strictObject(shape, {
    error: (iss) => (iss.code === 'unrecognized_keys' ? `is not an option of ${peer}` : undefined),
  });

/**
 * The peer policies' knobs (defaults are upstream's, see each policy's file), each with the
 * range its policy's constructor checks (or a narrower one), so a value the policy would refuse
 * is refused where the flag or the config file gives it, naming it.
 */
export const POLICY_OPTIONS_SCHEMA = z.strictObject(
  {
    dynamo: peerOptions('dynamo', {
      prefillLoadScale: nonNegative().optional(),
      temperature: nonNegative().optional(),
      gpuCredit: fraction().optional(),
      offloadCredit: fraction().optional(),
      predictedCredit: fraction().optional(),
      activeRequestWeight: nonNegative().optional(),
    }).optional(),
    sglang: peerOptions('sglang', {
      cacheThreshold: fraction().optional(),
      balanceAbsThreshold: nonNegative().optional(),
      balanceRelThreshold: nonNegative().optional(),
      evictionIntervalSecs: evictionIntervalSecs().optional(),
      maxTreeSize: positiveInt().optional(),
    }).optional(),
    smg: peerOptions('smg', {
      mode: z.enum(SMG_MODES).optional(),
      cacheThreshold: fraction().optional(),
      balanceAbsThreshold: nonNegative().optional(),
      balanceRelThreshold: nonNegative().min(1, bound('>= 1')).optional(),
      balanceTokenUsageThreshold: nonNegative().gt(0, bound('> 0')).optional(),
      overloadTokenUsageThreshold: nonNegative().gt(0, bound('> 0')).optional(),
      evictionIntervalSecs: evictionIntervalSecs().optional(),
      maxTreeSize: positiveInt().optional(),
    }).optional(),
    llmd: peerOptions('llmd', {
      prefixWeight: nonNegative().optional(),
      kvWeight: nonNegative().optional(),
      queueWeight: nonNegative().optional(),
      scrapeIntervalMs: llmdScrapeIntervalMs().optional(),
    }).optional(),
    'llmd-affinity': peerOptions('llmd-affinity', {
      affinityThreshold: fraction().optional(),
      maxTtftPenaltyMs: nonNegative().optional(),
      // it divides (in-flight tokens over it are the TTFT load gate's milliseconds): 0 only
      // with the gate off (checked below)
      peakPrefillThroughput: nonNegative().optional(),
      tokenLoadCapacity: positiveInt().optional(),
      scrapeIntervalMs: llmdScrapeIntervalMs().optional(),
      speculativeIndexing: z.boolean().optional(),
    })
      .superRefine((given, ctx) => {
        const penalty = given.maxTtftPenaltyMs ?? LLMD_MAX_TTFT_PENALTY_MS;
        if (given.peakPrefillThroughput === 0 && penalty > 0)
          ctx.addIssue({
            code: 'custom',
            message: 'must be > 0 unless maxTtftPenaltyMs is 0, got 0',
            path: ['peakPrefillThroughput'],
            input: 0,
          });
      })
      .optional(),
    seed: peerOptions('seed', { loadSignal: z.enum(['kv-usage', 'queue-inclusive']).optional() }).optional(),
  },
  { error: (iss) => (iss.code === 'unrecognized_keys' ? 'is not a policy with options' : undefined) },
);
