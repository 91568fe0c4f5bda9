import { CostPolicy, DEFAULT_COST_WEIGHTS, type CostWeights } from './cost.js';
import { SeedPolicy } from './seed.js';
import type { RoutingPolicy } from './types.js';

export interface PolicyOptions {
  costWeights?: Partial<CostWeights>;
}

type PolicyFactory = (options: PolicyOptions) => RoutingPolicy;

/** One line per policy; each policy lives in its own file. */
const POLICY_FACTORIES: Readonly<Record<string, PolicyFactory>> = {
  cost: (o) => new CostPolicy(resolveCostWeights(o.costWeights)),
  seed: () => new SeedPolicy(),
};

export const POLICY_NAMES: readonly string[] = Object.keys(POLICY_FACTORIES);

export function createPolicy(name: string, options: PolicyOptions = {}): RoutingPolicy {
  const factory = Object.hasOwn(POLICY_FACTORIES, name) ? POLICY_FACTORIES[name] : undefined;
  if (!factory) {
    throw new RangeError(`policy must be one of ${POLICY_NAMES.join(', ')}; got '${name}'`);
  }
  return factory(options);
}

export function resolveCostWeights(partial: Partial<CostWeights> = {}): CostWeights {
  const w: CostWeights = { ...DEFAULT_COST_WEIGHTS };
  for (const [key, value] of Object.entries(partial)) {
    if (!Object.hasOwn(DEFAULT_COST_WEIGHTS, key)) {
      throw new RangeError(`costWeights.${key} is not a cost weight (known: ${Object.keys(DEFAULT_COST_WEIGHTS).join(', ')})`);
    }
    if (value === undefined) continue;
    if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
      throw new RangeError(`costWeights.${key} must be a finite number >= 0, got ${String(value)}`);
    }
    w[key as keyof CostWeights] = value;
  }
  if (w.pressureKnee >= 1) throw new RangeError(`costWeights.pressureKnee must be < 1, got ${w.pressureKnee}`);
  if (w.pressureCeiling > 1) throw new RangeError(`costWeights.pressureCeiling must be <= 1, got ${w.pressureCeiling}`);
  return w;
}

export type { CostWeights } from './cost.js';
export type { Candidate, PolicyChoice, RouteFeatures, RouteReason, RoutingPolicy } from './types.js';
