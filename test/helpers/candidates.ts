import type { Candidate } from '../../src/core/policies/types.js';
import { WorkerState } from '../../src/core/worker-registry.js';

/** The block size, in tokens, that candidates built here count their cached tokens in. */
export const CANDIDATE_BLOCK = 16;

/** One worker as a policy test describes it for one request; what is left out is 0 (none). */
export interface CandidateSpec {
  /** Leading blocks of the request held (any tier); without it, the whole blocks of `cached`. */
  overlap?: number;
  /** Prompt tokens held; without it, `overlap` blocks of CANDIDATE_BLOCK tokens. */
  cached?: number;
  /** Of the blocks held, those held only in an offload tier. */
  offload?: number;
  /** Of the blocks held, those the router only predicted. */
  predicted?: number;
  /** Blocks the router's index holds for the worker (all its prefixes, not only this request's). */
  entries?: number;
  /** KV-cache usage as last reported (0-1). */
  load?: number;
  /** When the engine's metrics were last read; undefined: never. */
  metricsAt?: number;
  /** The router's requests in flight on the worker. */
  inFlight?: number;
  /** Of those, what other router replicas reported. */
  remoteInFlight?: number;
  /** Uncached prompt tokens the router has in flight on the worker. */
  queued?: number;
  /** Of those, what other router replicas reported. */
  remoteQueued?: number;
  /** KV tokens of the router's requests that are decoding. */
  decode?: number;
  /** Requests the engine reports waiting. */
  waiting?: number;
  /** KV-cache capacity in tokens the engine reports (0: unknown). */
  capacity?: number;
}

/**
 * Candidates built by hand, as the policies' documentation describes the situations: worker
 * `w<slot>` in registry slot `slots[i]` (default its position) for each spec.
 */
export function candidates(specs: CandidateSpec[], slots?: number[]): Candidate[] {
  return specs.map((s, i) => {
    const slot = slots ? slots[i] : i;
    const w = new WorkerState(`w${slot}`, {}, slot);
    w.load = s.load ?? 0;
    w.metricsAt = s.metricsAt;
    w.inFlightRequests = s.inFlight ?? 0;
    w.remoteInFlightRequests = s.remoteInFlight ?? 0;
    w.queuedPrefillTokens = s.queued ?? 0;
    w.remoteQueuedPrefillTokens = s.remoteQueued ?? 0;
    w.activeDecodeTokens = s.decode ?? 0;
    w.waitingRequests = s.waiting ?? 0;
    w.kvCapacityTokens = s.capacity ?? 0;
    const overlap = s.overlap ?? Math.floor((s.cached ?? 0) / CANDIDATE_BLOCK);
    return {
      worker: w,
      holdsAnchor: false,
      overlapBlocks: overlap,
      offloadBlocks: s.offload ?? 0,
      predictedBlocks: s.predicted ?? 0,
      anchorTokens: 0,
      cachedTokens: s.cached ?? overlap * CANDIDATE_BLOCK,
      cachedFraction: 0,
      servesCla: false,
      continuity: false,
      indexEntries: s.entries ?? 0,
    };
  });
}
