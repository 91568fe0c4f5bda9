/**
 * What the router learns from a decision, its own or another replica's: the blocks the chosen
 * worker is predicted to hold (every block in approximate mode; in precise mode a speculative
 * stretch past what it holds, until its KV events confirm them), the content anchors it now
 * holds, the seed anchor's home and the workflow's latest step. Which of the predicted blocks
 * the decision alone added is kept for the caller (see WithdrawablePredictions).
 */
import type { AnchorTable } from '../anchor-table.js';
import type { BlockIndex } from '../block-index.js';
import type { ContentAnchor, ContentAnchorIndex } from '../content-anchors.js';
import { chainRoot, hashHex, type BlockHashes } from '../hashing.js';
import type { WorkflowTable } from '../workflow-table.js';
import type { WorkerState } from '../worker-registry.js';
import type { PrefixLookup } from './prefix-lookup.js';
import type { RouteFields } from './request-fields.js';
import type { IndexMode, SharedDecision } from './types.js';
import type { WithdrawablePredictions } from './withdrawable.js';

/** A shared decision's anchor namespace, read into (hi, lo). */
const sharedNamespace = new Uint32Array(2);

/** The router state a decision is recorded in. */
export interface DecisionSinks {
  readonly index: BlockIndex;
  readonly contentAnchors: ContentAnchorIndex;
  readonly anchors: AnchorTable;
  readonly workflows: WorkflowTable;
  readonly prefix: PrefixLookup;
  /** Pending decisions' own blocks, which a decision predicting them too claims. */
  readonly withdrawable: WithdrawablePredictions;
}

export interface DecisionSettings {
  readonly indexMode: IndexMode;
  readonly speculativeBlocks: number;
  readonly blockSize: number;
}

export class DecisionRecorder {
  /** The predicted range the last record() wrote: keys [start, end) of `keys`. */
  private keys: BlockHashes | undefined;
  private start = 0;
  private end = 0;
  /** Positions in `addedHi`/`addedLo` of the blocks the last record() or applyShared() added to its worker (the first `added`). */
  private addedAt = new Int32Array(64);
  private added = 0;
  private addedHi: ArrayLike<number> = [];
  private addedLo: ArrayLike<number> = [];

  constructor(
    private readonly sinks: DecisionSinks,
    private readonly settings: DecisionSettings,
  ) {}

  /**
   * Records the router's decision to send the request (its keys `hashes`, of which the worker
   * holds `heldBlocks`) to `worker`. `hasTokens`: the keys came from token ids, so a worker of
   * another block size gets the keys in its own size. `predict` false: in precise mode the
   * speculative stretch is worked out (for other replicas, see shared()) but not written to
   * this router's index, as the policy keeps the request's prefix itself.
   */
  record(
    worker: WorkerState,
    heldBlocks: number,
    hashes: BlockHashes,
    hasTokens: boolean,
    fields: RouteFields,
    now: number,
    predict = true,
  ): void {
    const { indexMode, speculativeBlocks, blockSize } = this.settings;
    let start = 0;
    let end = 0;
    let added = 0;
    let recorded = hashes;
    const blocks = this.sinks.prefix.blockCount(hashes);
    if (!fields.isolated) {
      if (blocks > 0) {
        // approximate: every block (refreshing the TTL); precise: a speculative stretch past
        // what the worker holds
        end = indexMode === 'precise' ? Math.min(blocks, heldBlocks + speculativeBlocks) : blocks;
        start = indexMode === 'precise' ? heldBlocks : 0;
        this.sinks.prefix.ensureKeys(hashes, end); // keys of token ids are computed on demand
        // a worker of another block size records the request's keys in its size
        if (worker.info.blockSize !== undefined && worker.info.blockSize !== blockSize && hasTokens) {
          recorded = this.sinks.prefix.keysInBlockSize(worker.info.blockSize) ?? hashes;
          end = indexMode === 'precise' ? Math.min(recorded.length, heldBlocks + speculativeBlocks) : recorded.length;
        }
        if (end > start && (predict || indexMode !== 'precise')) {
          this.reserveAdded(end - start);
          added = this.sinks.index.recordPredicted(
            worker.slot,
            recorded.hi,
            recorded.lo,
            start,
            end,
            now,
            this.addedAt,
          );
        }
        // the worker will hold the blocks [0, end) once this request is computed, those it
        // counted as held included: pending decisions' blocks among them are its too
        this.sinks.withdrawable.claim(worker, recorded.hi, recorded.lo, end);
      }
      if (fields.contentAnchors && fields.contentAnchors.length > 0)
        this.sinks.contentAnchors.record(worker.slot, fields.contentAnchors, fields.anchorNamespace, now);
    }
    this.keys = recorded;
    this.start = start;
    this.end = end;
    this.added = added;
    this.addedHi = recorded.hi;
    this.addedLo = recorded.lo;
    // an isolated request (a judge) leaves nothing its anchor or its workflow's next step can
    // use on its worker: neither moves there
    if (fields.isolated) return;
    if (fields.anchor !== undefined) this.sinks.anchors.home(fields.anchor, worker.id, fields.claGroup);
    if (fields.workflowId !== undefined) this.sinks.workflows.record(fields.workflowId, worker.id, fields.workflowStep);
  }

  /**
   * Keeps the blocks the last record() or applyShared() added to `worker` as the ticket's
   * own, to withdraw if its engine refuses the request (see KVAwareRouter.markRefused() and
   * refuseSharedDecision()). Returns whether there were any.
   */
  keepAdded(ticket: number, worker: WorkerState): boolean {
    if (this.added <= 0) return false;
    this.sinks.withdrawable.open(ticket, worker, this.addedHi, this.addedLo, this.addedAt, this.added);
    return true;
  }

  private reserveAdded(n: number): void {
    if (this.addedAt.length < n) this.addedAt = new Int32Array(Math.max(n, 2 * this.addedAt.length));
  }

  /** The last record() as another replica applies it (a copy; allocates). */
  shared(
    workerId: string,
    fields: RouteFields,
    prefillTokens: number,
    decodeTokens: number,
    tracked: boolean,
  ): SharedDecision {
    // the predicted range only: in precise mode what the worker holds comes from its own events
    const { start } = this;
    const n = Math.max(0, this.end - start);
    const keys = this.keys;
    return {
      workerId,
      hi: keys ? keys.hi.slice(start, start + n) : new Uint32Array(0),
      lo: keys ? keys.lo.slice(start, start + n) : new Uint32Array(0),
      // an isolated request's worker is neither its anchor's nor its workflow's (record())
      workflowId: fields.isolated ? undefined : fields.workflowId,
      workflowStep: fields.isolated ? null : fields.workflowStep,
      anchor: fields.isolated ? undefined : fields.anchor,
      claGroup: fields.claGroup,
      contentAnchors: fields.isolated ? undefined : fields.contentAnchors,
      anchorNamespace:
        fields.isolated || !fields.contentAnchors || fields.contentAnchors.length === 0
          ? undefined
          : hashHex(fields.anchorNamespace[0], fields.anchorNamespace[1]),
      prefillTokens,
      decodeTokens,
      tracked,
    };
  }

  /** Applies another replica's decision on `worker` (see RouteOptions.share). */
  applyShared(
    worker: WorkerState,
    d: Omit<SharedDecision, 'prefillTokens' | 'decodeTokens' | 'tracked'>,
    now: number,
  ): void {
    if (d.hi.length !== d.lo.length) throw new RangeError('shared decision: hi and lo differ in length');
    this.added = 0;
    if (d.hi.length > 0) {
      this.reserveAdded(d.hi.length);
      this.added = this.sinks.index.recordPredicted(worker.slot, d.hi, d.lo, 0, d.hi.length, now, this.addedAt);
      this.addedHi = d.hi;
      this.addedLo = d.lo;
      // in approximate mode the keys run from the request's first block, at the positions a
      // pending decision here has them (a precise-mode stretch starts further on: it claims
      // nothing, and a refusal here withdraws at most a short-lived speculative stretch)
      this.sinks.withdrawable.claim(worker, d.hi, d.lo, d.hi.length);
    }
    if (d.contentAnchors && d.contentAnchors.length > 0) {
      // checked as the decision was (checkSharedDecision)
      const ns = sharedNamespace;
      if (d.anchorNamespace !== undefined) {
        ns[0] = Number.parseInt(d.anchorNamespace.slice(0, 8), 16);
        ns[1] = Number.parseInt(d.anchorNamespace.slice(8), 16);
      } else chainRoot({ claGroup: d.claGroup }, ns); // all a decision of an earlier release says of it
      this.sinks.contentAnchors.record(worker.slot, d.contentAnchors as ContentAnchor[], ns, now);
    }
    if (d.anchor !== undefined) this.sinks.anchors.home(d.anchor, worker.id, d.claGroup);
    if (d.workflowId !== undefined) this.sinks.workflows.record(d.workflowId, worker.id, d.workflowStep);
  }
}
