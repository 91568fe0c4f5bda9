import type { WorkerState } from '../worker-registry.js';

/**
 * One worker that may take the request, with the features every policy scores. The router
 * builds the list in registration order, draining and removed workers left out.
 */
export interface Candidate {
  readonly worker: WorkerState;
  /** The request's anchor is homed on this worker (the seed's "preferred worker"). */
  holdsAnchor: boolean;
  /** Estimated fraction (0-1) of the request's KV already on this worker, CLA group respected. */
  cachedFraction: number;
  /** The worker serves the request's CLA group. */
  servesCla: boolean;
  /** The worker ran the previous step of the request's workflow. */
  continuity: boolean;
}

/** What a policy knows of the request beyond the candidates. */
export interface RouteFeatures {
  readonly claGroup: number | null;
  readonly tokenLength: number;
}

/** Why a worker was picked; shown in explanations and counted in metrics. */
export type RouteReason = 'locality' | 'cla' | 'least-loaded' | 'cost' | 'none';

export interface PolicyChoice {
  /** Index into the candidates; -1 when there is none. */
  readonly index: number;
  readonly confidence: number;
  readonly reason: RouteReason;
}

/**
 * A routing policy: a pure choice over candidates. State changes that follow a decision
 * (homing the anchor, recording the workflow step) are the router's job, the same for all
 * policies. A policy may keep private state of its own (a tie-break cursor).
 */
export interface RoutingPolicy {
  readonly name: string;
  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice;
}

export const NO_CHOICE: PolicyChoice = Object.freeze({ index: -1, confidence: 0, reason: 'none' });
