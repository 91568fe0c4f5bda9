import type { WorkerState } from '../worker-registry.js';

/**
 * One worker that may take the request, with the features every policy scores. The router
 * builds the list in registration order, leaving out draining, unhealthy and removed workers.
 * Objects are reused between decisions: a policy must not keep references to them.
 */
export interface Candidate {
  readonly worker: WorkerState;
  /** The request's anchor is homed on this worker (the seed's "preferred worker"). */
  holdsAnchor: boolean;
  /** Leading blocks of the request the worker holds, in any tier. */
  overlapBlocks: number;
  /** Of those, blocks held only in an offload tier (CPU, disk). */
  offloadBlocks: number;
  /** Of those, blocks held only as the router's own prediction. */
  predictedBlocks: number;
  /** Tokens of the request's content anchors the worker holds. */
  anchorTokens: number;
  /** Predicted cached prompt tokens on this worker (prefix, tier-weighted, plus anchors). */
  cachedTokens: number;
  /** Estimated fraction (0-1) of the request's KV already on this worker. */
  cachedFraction: number;
  /** The worker serves the request's CLA group. */
  servesCla: boolean;
  /** The worker ran the previous step of the request's workflow. */
  continuity: boolean;
  /** Entries the block index holds for the worker (SGLang's "tree size"). */
  indexEntries: number;
}

/** What a policy knows of the request beyond the candidates. */
export interface RouteFeatures {
  readonly claGroup: number | null;
  /** Prompt tokens (0 when unknown, as in the seed API without tokenLength). */
  readonly promptTokens: number;
  /** Full blocks the request's prompt has. */
  readonly requestBlocks: number;
  /** Tokens per KV block. */
  readonly blockSize: number;
  /** A stable key for hash-based placement (the first blocks or the anchor); 0 when none. */
  readonly routingKey: number;
  /**
   * The request's block hashes (prefix-chained; high and low 32-bit halves), for policies that
   * keep their own per-worker view (SGLang's approximate tree, Dynamo's active sequences).
   * Scratch owned by the router: valid during choose() and onRouted() only.
   */
  readonly blocks?: RequestBlocks;
  /**
   * Identifies the longest prefix some worker already holds (its last block's hash; the
   * anchor's for seed-API requests); 0 when no worker holds any. Requests with equal keys
   * reuse the same cached prefix: the cost policy counts them to tell how hot a prefix is.
   */
  readonly sharedPrefixKey?: number;
  /** When the decision is made (ms, the router's clock); policies that measure rates read it. */
  readonly now?: number;
  /**
   * Whether the caller reports the request's first token (RouteOptions.firstTokenReported;
   * default true). A request whose answer is not streamed has its first token with its last:
   * policies that time prefills leave it out.
   */
  readonly firstTokenReported?: boolean;
  /**
   * The step the request names in its workflow (a multi-agent pipeline's step), null when it
   * names none (a session's turns carry a workflow id alone).
   */
  readonly workflowStep?: number | null;
  /**
   * A dry run (RouteOptions.dryRun): the decision is shown, not acted on. A policy keeps its
   * rotation (a tie cursor, a round-robin turn) where it is, so that the next decision is the
   * one shown; the router restores the random source it gives policies (PolicyContext.random).
   */
  readonly dryRun?: boolean;
}

/** Prefix-chained block hashes of one request (valid while the call that received them runs). */
export interface RequestBlocks {
  readonly hi: ArrayLike<number>;
  readonly lo: ArrayLike<number>;
  readonly length: number;
}

/** Why a worker was picked; shown in explanations and counted in metrics. */
export type RouteReason =
  | 'locality'
  | 'cla'
  | 'least-loaded'
  | 'cost'
  | 'replicate'
  | 'balance'
  | 'cache-match'
  | 'hash'
  | 'random'
  | 'rotation'
  | 'none';

export interface PolicyChoice {
  /** Index into the candidates; -1 when there is none. */
  readonly index: number;
  /** 0-1; policies without a notion of their own report the chosen worker's cachedFraction. */
  readonly confidence: number;
  readonly reason: RouteReason;
}

/**
 * A routing policy: a choice over candidates. State changes that follow a decision (homing
 * the anchor, recording blocks and the workflow step, counting in-flight work) are the
 * router's job, the same for every policy. A policy may keep private state (a cursor, an RNG).
 */
export interface RoutingPolicy {
  readonly name: string;
  /**
   * False when the policy, as its upstream ships, keeps no speculative (predict-on-route)
   * entries in precise mode: the router then records none for its decisions, so neither
   * the overlap it sees nor the prefill the router counts includes predictions. Default true.
   * 'untracked': the policy keeps the prefixes of its tracked decisions itself until they are
   * released (cost's pending prefixes), so the router records speculative entries in its own
   * index only for untracked decisions; what it shares with other replicas is unchanged.
   */
  readonly speculative?: boolean | 'untracked';
  /**
   * A hint: true when choose() or onRouted() read every key of RouteFeatures.blocks. The
   * router then hashes a prompt's token ids in one go; otherwise it computes keys only as far
   * as the route needs them, and the rest when `blocks` is first read (the same keys either way).
   */
  readonly readsBlocks?: boolean;
  choose(candidates: readonly Candidate[], request: RouteFeatures): PolicyChoice;
  /**
   * The score terms behind the choice for one candidate, for explanations (not the hot path).
   * Called after choose() on the same candidates (scores may be relative to the others').
   */
  scoreTerms?(candidate: Candidate, request: RouteFeatures): Record<string, number | boolean>;
  /**
   * The router committed a decision (not a dry run) to `worker`. `ticket` is the in-flight
   * handle (0 when the request is not tracked); `now` the router's clock in ms. For policies
   * whose state follows their own decisions.
   */
  onRouted?(worker: WorkerState, request: RouteFeatures, ticket: number, now: number): void;
  /** The tracked request of `ticket` completed, failed or was abandoned. */
  onReleased?(ticket: number): void;
  /** A tracked request's prefill finished (first token seen). */
  onPrefillDone?(ticket: number): void;
  /** The worker was removed; its slot may be reused by another worker. */
  onWorkerRemoved?(worker: WorkerState): void;
}

export interface PolicyContext {
  /** A seeded random source in [0, 1) for policies that sample. */
  random: () => number;
}

export const NO_CHOICE: PolicyChoice = Object.freeze({ index: -1, confidence: 0, reason: 'none' });
