/**
 * The package's public API: the router, what route() takes and returns, the options, and
 * what a routing policy of one's own implements (RoutingPolicy, the candidates and request
 * features it chooses over, its choice).
 */
export {
  KVAwareRouter,
  NoEndpointsError,
  PromptTooLongError,
  type BlockSequence,
  type CandidateExplain,
  type IndexMode,
  type InFlightLoad,
  type KVAwareRouterOptions,
  type NoWorker,
  type NoWorkerReason,
  type NoWorkerResult,
  type PrefillReadListener,
  type RouteDecision,
  type RoutedResult,
  type RouteOptions,
  type RouteRequest,
  type RouteResult,
  type RouteResultFields,
  type RouterStats,
  type SelectWorkerOptions,
  type SharedDecision,
  type UpdateWorkerStateOptions,
  type WorkerLoadStats,
  type WorkerMetrics,
} from './core/router/index.js';
export type { WorkerInfo, WorkerState } from './core/worker-registry.js';
export type { BlockHashes, ChatMessage, HashNamespace } from './core/hashing.js';
export type { BlockHashMode } from './core/block-keying.js';
export type { VllmHashAlgo } from './core/vllm-block-hash.js';
export type { BlockIndexStats } from './core/block-index.js';
export type { ContentAnchor } from './core/content-anchors.js';
export { DEFAULT_COST_WEIGHTS, type CostWeights } from './core/policies/cost.js';
export {
  POLICY_NAMES,
  createPolicy,
  type DynamoOptions,
  type LlmdAffinityOptions,
  type LlmdOptions,
  type PolicyOptions,
  type SeedLoadSignal,
  type SeedOptions,
  type SglangOptions,
  type SmgMode,
  type SmgOptions,
} from './core/policies/index.js';
export {
  NO_CHOICE,
  type Candidate,
  type PolicyChoice,
  type PolicyContext,
  type RequestBlocks,
  type RouteFeatures,
  type RouteReason,
  type RoutingPolicy,
} from './core/policies/types.js';
