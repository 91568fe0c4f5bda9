/**
 * The router's public surface: the KVAwareRouter class, its options and the types of its
 * requests, results and stats. Import the router from here, not from the files behind it.
 */
export { KVAwareRouter } from './kv-aware-router.js';
export { NoEndpointsError } from './no-worker.js';
export { PromptTooLongError } from './prompt-too-long.js';
export type { KVAwareRouterOptions } from './options.js';
export type {
  BlockSequence,
  CandidateExplain,
  IndexMode,
  InFlightLoad,
  NoWorker,
  NoWorkerReason,
  NoWorkerResult,
  PrefillReadListener,
  RouteDecision,
  RoutedResult,
  RouteOptions,
  RouteRequest,
  RouteResult,
  RouteResultFields,
  RouterStats,
  SelectWorkerOptions,
  SharedDecision,
  UpdateWorkerStateOptions,
  WorkerLoadStats,
  WorkerMetrics,
} from './types.js';
