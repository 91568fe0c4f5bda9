/**
 * Candidate collection: for one request, every worker that may take it, with the features
 * policies score (prefix overlap by tier, content anchors held, the seed anchor's home, CLA
 * group, workflow continuity). It runs on every route(), so candidate objects and the list
 * are reused between decisions rather than allocated.
 */
import type { AnchorTable } from '../anchor-table.js';
import type { BlockIndex, OverlapResult } from '../block-index.js';
import type { ContentAnchor, ContentAnchorIndex } from '../content-anchors.js';
import type { Candidate, RouteFeatures, RoutingPolicy } from '../policies/types.js';
import type { WorkflowTable } from '../workflow-table.js';
import type { WorkerRegistry } from '../worker-registry.js';
import type { ResolvedRouterOptions } from './options.js';
import type { CandidateExplain } from './types.js';

/** The router state candidates are read from. */
export interface CandidateSources {
  readonly workers: WorkerRegistry;
  readonly anchors: AnchorTable;
  readonly workflows: WorkflowTable;
  readonly contentAnchors: ContentAnchorIndex;
  readonly index: BlockIndex;
}

type CandidateSettings = Pick<
  ResolvedRouterOptions,
  | 'anchorLocalityEnabled'
  | 'claAffinityEnabled'
  | 'contentAnchorScoring'
  | 'offloadCredit'
  | 'predictedCredit'
  | 'blockSize'
>;

export class CandidateCollector {
  private readonly candidates: Candidate[] = [];

  constructor(
    private readonly sources: CandidateSources,
    private readonly settings: CandidateSettings,
  ) {}

  /**
   * Available workers (registered, not draining, healthy) in registration order, with their
   * features; an unhealthy one too when it is in `panic` (panic routing), never a draining one;
   * with `only`, that worker alone, available or not (the one already serving the request). `overlap` is the index lookup for the request's blocks (all zeros when
   * locality is off); `tokensPerBlock` 0 means the router's block size; `anchorNamespace` the
   * (hi, lo) the content anchors are keyed under (RouteFields.anchorNamespace). The returned list and
   * its objects are overwritten by the next call. Positional arguments: this runs on every
   * route() and allocates nothing once the list has grown to the fleet's size.
   */
  collect(
    overlap: OverlapResult,
    tokensPerBlock: number,
    anchorHash: string | undefined,
    claGroup: number | null,
    promptTokens: number,
    workflowId: string | undefined,
    contentAnchors: readonly ContentAnchor[] | undefined,
    anchorNamespace: Uint32Array,
    isolated: boolean,
    now: number,
    exclude: ReadonlySet<string> | undefined,
    panic: ReadonlySet<string> | undefined,
    only?: string,
  ): readonly Candidate[] {
    const { workers, anchors, workflows, contentAnchors: contentIndex, index } = this.sources;
    const settings = this.settings;
    const locality = settings.anchorLocalityEnabled && !isolated;
    const anchor = locality && anchorHash !== undefined ? anchors.peek(anchorHash) : undefined;
    const previousStepWorker = workflowId !== undefined ? workflows.peek(workflowId)?.workerId : undefined;
    const o = overlap;
    const blockTokens = tokensPerBlock || settings.blockSize;
    const candidates = this.candidates;
    // decided once per request, not per candidate
    const excluded = exclude !== undefined && exclude.size > 0 ? exclude : undefined;
    const panicking = panic !== undefined && panic.size > 0 ? panic : undefined;
    const scoreAnchors =
      locality && contentAnchors !== undefined && contentAnchors.length > 0 && settings.contentAnchorScoring;
    const offloadCredit = settings.offloadCredit;
    const predictedCredit = settings.predictedCredit;
    const claGroups = settings.claAffinityEnabled && claGroup !== null;
    let n = 0;
    for (const worker of workers.values()) {
      if (only !== undefined) {
        // the worker serving the request: whether it is available does not matter
        if (worker.id !== only) continue;
      } else if (
        !(worker.available || (panicking !== undefined && !worker.draining && panicking.has(worker.id))) ||
        (excluded !== undefined && excluded.has(worker.id))
      )
        continue;
      const slot = worker.slot;
      const overlapBlocks = slot < o.blocks.length ? o.blocks[slot] : 0;
      const offloadBlocks = overlapBlocks > 0 ? o.offloadBlocks[slot] : 0;
      const predictedBlocks = overlapBlocks > 0 ? o.predictedBlocks[slot] : 0;
      const anchorTokens = scoreAnchors ? contentIndex.heldTokens(slot, contentAnchors, anchorNamespace, now) : 0;
      const credit =
        overlapBlocks -
        offloadBlocks -
        predictedBlocks +
        offloadBlocks * offloadCredit +
        predictedBlocks * predictedCredit;
      // token blocks are the worker's own size when it has one (the overlap was looked up in it)
      const workerBlockTokens =
        tokensPerBlock === settings.blockSize ? (worker.info.blockSize ?? blockTokens) : blockTokens;
      let cachedTokens = credit * workerBlockTokens + anchorTokens;
      if (promptTokens > 0 && cachedTokens > promptTokens) cachedTokens = promptTokens;
      let holdsAnchor: boolean;
      let cachedFraction = promptTokens > 0 ? cachedTokens / promptTokens : 0;
      if (anchorHash !== undefined) {
        // the seed's anchor: its home in the anchor table, KV reusable within its CLA group. The
        // home holds the anchor's whole prompt, as the seed scores it (1.0), unless the index
        // credits the worker with some of the request's own blocks: broadcastNewBlocks()' ids
        // are the seed's opaque labels, not blocks of `blockSize` tokens, so their count says
        // nothing of how much of the prompt the home holds
        holdsAnchor = anchor !== undefined && anchor.workerId === worker.id;
        if (
          holdsAnchor &&
          cachedTokens === 0 &&
          (claGroup === null || anchor!.claGroup === null || anchor!.claGroup === claGroup)
        ) {
          cachedFraction = 1;
          cachedTokens = promptTokens;
        }
      } else {
        // without one, the anchor's home is the worker holding the longest cached prefix
        holdsAnchor = overlapBlocks > 0 && overlapBlocks === o.maxBlocks;
      }
      const servesCla = claGroups && worker.claGroups.has(claGroup!);
      // a judge's step reuses no KV there and leaves none the workflow can use: no worker is its own
      const continuity = !isolated && previousStepWorker === worker.id;
      const indexEntries = index.entriesFor(slot);
      const c = candidates[n] as Candidate | undefined;
      if (c && c.worker === worker) {
        c.holdsAnchor = holdsAnchor;
        c.overlapBlocks = overlapBlocks;
        c.offloadBlocks = offloadBlocks;
        c.predictedBlocks = predictedBlocks;
        c.anchorTokens = anchorTokens;
        c.cachedTokens = cachedTokens;
        c.cachedFraction = cachedFraction;
        c.servesCla = servesCla;
        c.continuity = continuity;
        c.indexEntries = indexEntries;
      } else {
        candidates[n] = {
          worker,
          holdsAnchor,
          overlapBlocks,
          offloadBlocks,
          predictedBlocks,
          anchorTokens,
          cachedTokens,
          cachedFraction,
          servesCla,
          continuity,
          indexEntries,
        };
      }
      n++;
    }
    candidates.length = n;
    return candidates;
  }
}

/** Every candidate's features and score terms, for `explain` (allocates; not the hot path). */
export function explainCandidates(
  candidates: readonly Candidate[],
  features: RouteFeatures,
  chosen: number,
  policy: RoutingPolicy,
): CandidateExplain[] {
  return candidates.map((c, i) => ({
    worker: c.worker.id,
    chosen: i === chosen,
    overlapBlocks: c.overlapBlocks,
    offloadBlocks: c.offloadBlocks,
    predictedBlocks: c.predictedBlocks,
    anchorTokens: c.anchorTokens,
    cachedTokens: c.cachedTokens,
    kvUsage: c.worker.load,
    queuedPrefillTokens: c.worker.queuedPrefillTokens,
    activeDecodeTokens: c.worker.activeDecodeTokens,
    inFlightRequests: c.worker.inFlightRequests,
    servesCla: c.servesCla,
    continuity: c.continuity,
    terms: policy.scoreTerms ? policy.scoreTerms(c, features) : {},
  }));
}
