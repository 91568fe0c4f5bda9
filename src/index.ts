export {
  KVAwareRouter,
  type KVAwareRouterOptions,
  type RouteDecision,
  type RouterStats,
  type SelectWorkerOptions,
  type UpdateWorkerStateOptions,
  type WorkerLoadStats,
} from './core/router/index.js';
export type { WorkerInfo } from './core/worker-registry.js';
export { DEFAULT_COST_WEIGHTS, type CostWeights } from './core/policies/cost.js';
export { POLICY_NAMES, createPolicy } from './core/policies/index.js';
export type { Candidate, PolicyChoice, RouteFeatures, RouteReason, RoutingPolicy } from './core/policies/types.js';
