import { ConsistentHashPolicy } from './consistent-hash.js';
import { CostPolicy, DEFAULT_COST_WEIGHTS, type CostWeights } from './cost.js';
import { DynamoPolicy, type DynamoOptions } from './dynamo.js';
import { LeastLoadedPolicy } from './least-loaded.js';
import { LlmdPolicy, type LlmdOptions } from './llmd.js';
import { LlmdAffinityPolicy, type LlmdAffinityOptions } from './llmd-affinity.js';
import { PowerOfTwoPolicy } from './power-of-two.js';
import { RandomPolicy } from './random.js';
import { RoundRobinPolicy } from './round-robin.js';
import { SeedPolicy, type SeedOptions } from './seed.js';
import { SglangPolicy, type SglangOptions } from './sglang.js';
import { SmgPolicy, type SmgOptions } from './smg.js';
import type { PolicyContext, RoutingPolicy } from './types.js';
import { createRng } from '../rng.js';
import { describeIssue, firstIssue, issueError } from '../schema-issues.js';
import { COST_WEIGHTS_SCHEMA, definedOnly, POLICY_OPTIONS_SCHEMA } from './options-schema.js';
import { typeName } from '../validate.js';

export interface PolicyOptions {
  costWeights?: Partial<CostWeights>;
  dynamo?: DynamoOptions;
  sglang?: SglangOptions;
  smg?: SmgOptions;
  llmd?: LlmdOptions;
  'llmd-affinity'?: LlmdAffinityOptions;
  seed?: SeedOptions;
}

type PolicyFactory = (options: PolicyOptions, ctx: PolicyContext) => RoutingPolicy;

/** One line per policy; each policy lives in its own file. */
const POLICY_FACTORIES: Readonly<Record<string, PolicyFactory>> = {
  cost: (o) => new CostPolicy(resolveCostWeights(o.costWeights)),
  seed: (o) => new SeedPolicy(o.seed),
  'round-robin': () => new RoundRobinPolicy(),
  random: (_o, ctx) => new RandomPolicy(ctx),
  'least-loaded': () => new LeastLoadedPolicy(),
  'power-of-two': (_o, ctx) => new PowerOfTwoPolicy(ctx),
  'consistent-hash': () => new ConsistentHashPolicy(),
  dynamo: (o, ctx) => new DynamoPolicy(ctx, o.dynamo),
  sglang: (o, ctx) => new SglangPolicy(o.sglang, ctx),
  smg: (o, ctx) => new SmgPolicy(o.smg, ctx),
  llmd: (o, ctx) => new LlmdPolicy(ctx, o.llmd),
  'llmd-affinity': (o, ctx) => new LlmdAffinityPolicy(ctx, o['llmd-affinity']),
};

/** The policies' names (frozen: a caller cannot add or remove a name the router takes). */
export const POLICY_NAMES: readonly string[] = Object.freeze(Object.keys(POLICY_FACTORIES));

/** Rejects misspelt policy options (a typo would otherwise silently keep a default). */
export function checkPolicyOptions(options: unknown): void {
  if (options === undefined) return;
  if (options === null || typeof options !== 'object' || Array.isArray(options))
    throw new TypeError('policyOptions must be an object');
  const { costWeights: _costWeights, ...peers } = options as Record<string, unknown>;
  void _costWeights;
  const given = Object.fromEntries(Object.entries(peers).filter(([, v]) => v !== undefined));
  const parsed = POLICY_OPTIONS_SCHEMA.safeParse(given, { error: describeIssue });
  if (!parsed.success) throw issueError(firstIssue(parsed.error.issues), POLICY_OPTIONS_SCHEMA, 'policyOptions');
}

/**
 * The policy `name` built from its options. Every option given is checked whichever policy
 * reads it, cost weights as much as the peers' knobs (and as the router checks them): a bad
 * value is an error even where the chosen policy leaves it unread. `ctx.random()` is checked
 * at each draw the policy makes (a number in [0, 1)).
 */
export function createPolicy(
  name: string,
  options: PolicyOptions = {},
  // without a context, a random source of its own seeded as the router's default (1)
  ctx: PolicyContext = { random: createRng(1) },
): RoutingPolicy {
  if (typeof name !== 'string') throw new TypeError(`policy must be a policy name (a string), got ${typeName(name)}`);
  checkPolicyOptions(options);
  if (ctx === null || typeof ctx !== 'object' || typeof ctx.random !== 'function')
    throw new TypeError('ctx must be an object with a random() function (PolicyContext)');
  const costWeights = resolveCostWeights(options.costWeights);
  const factory = Object.hasOwn(POLICY_FACTORIES, name) ? POLICY_FACTORIES[name] : undefined;
  if (!factory) {
    throw new RangeError(`policy must be one of ${POLICY_NAMES.join(', ')}; got '${name}'`);
  }
  return factory({ ...options, costWeights }, checkedRandom(ctx));
}

/**
 * The context with its random source checked at each draw: a policy turns a draw into an index
 * (`Math.floor(random() * n)`), so a value outside [0, 1) (NaN, 1, -1, a string) would pick no
 * candidate and fail far from its cause. The check is one test per draw; `ctx.random` is read
 * and called on `ctx` as a policy holding `ctx` itself would.
 */
function checkedRandom(ctx: PolicyContext): PolicyContext {
  return {
    random: () => {
      const r: unknown = ctx.random();
      if (typeof r !== 'number' || !(r >= 0 && r < 1)) throw randomError(r);
      return r;
    },
  };
}

function randomError(r: unknown): TypeError | RangeError {
  return typeof r === 'number'
    ? new RangeError(`ctx.random() must return a number in [0, 1), got ${r}`)
    : new TypeError(`ctx.random() must return a number in [0, 1), got ${typeName(r)}`);
}

/**
 * The cost weights with the defaults filled in. They are checked by COST_WEIGHTS_SCHEMA, the
 * schema the router's options and serve's --cost-weights use, so every path takes and refuses
 * the same weights with the same message.
 */
export function resolveCostWeights(partial: Partial<CostWeights> = {}): CostWeights {
  const parsed = COST_WEIGHTS_SCHEMA.safeParse(partial, { error: describeIssue });
  if (!parsed.success) throw issueError(firstIssue(parsed.error.issues), COST_WEIGHTS_SCHEMA, 'costWeights');
  return { ...DEFAULT_COST_WEIGHTS, ...definedOnly(parsed.data) };
}

export type { CostWeights } from './cost.js';
export type { DynamoOptions } from './dynamo.js';
export type { LlmdOptions } from './llmd.js';
export type { LlmdAffinityOptions } from './llmd-affinity.js';
export type { SeedOptions, SeedLoadSignal } from './seed.js';
export type { SglangOptions } from './sglang.js';
export type { SmgMode, SmgOptions } from './smg.js';
export type { Candidate, PolicyChoice, PolicyContext, RouteFeatures, RouteReason, RoutingPolicy } from './types.js';
