/**
 * The KVAwareRouter class: state (workers, block index, anchor and workflow tables, in-flight
 * tickets) and the operations on it. Types, option handling, in-flight bookkeeping and
 * candidate collection live in the sibling modules of src/core/router/.
 */
import { AnchorTable, MAX_ANCHOR_BLOCK_IDS } from '../anchor-table.js';
import type { BlockKeying } from '../block-keying.js';
import { BlockIndex, Tier } from '../block-index.js';
import { ContentAnchorIndex } from '../content-anchors.js';
import { BlockHashes, chainRoot, hashString32, type HashNamespace } from '../hashing.js';
import type { CostWeights } from '../policies/index.js';
import { checkChoice, choiceError } from '../policies/policy-object.js';
import type { Candidate, PolicyChoice, RouteFeatures, RouteReason, RoutingPolicy } from '../policies/types.js';
import type { SeededRandom } from '../rng.js';
import { roundHalfEven3 } from '../round-half-even.js';
import { quotedText } from '../shown-text.js';
import * as check from '../validate.js';
import { WorkflowTable } from '../workflow-table.js';
import { MAX_ENGINE_REQUESTS, WorkerRegistry, type WorkerInfo, type WorkerState } from '../worker-registry.js';
import { CandidateCollector, explainCandidates } from './candidates.js';
import { DecisionRecorder } from './decision-recording.js';
import { InFlightTickets, localLoad, setRemoteLoad } from './in-flight.js';
import { diagnoseNoWorker, NoEndpointsError } from './no-worker.js';
import { resolveRouterOptions, type KVAwareRouterOptions } from './options.js';
import { MAX_PROMPT_TOKENS } from './options-schema.js';
import { PrefixLookup } from './prefix-lookup.js';
import { PromptTooLongError } from './prompt-too-long.js';
import { checkContentAnchors, readRouteFields, RouteFields } from './request-fields.js';
import { applySeedWorkerState, seedRouteRequest } from './seed-api.js';
import { WithdrawablePredictions } from './withdrawable.js';
import type {
  BlockSequence,
  IndexMode,
  InFlightLoad,
  RouteDecision,
  RouteOptions,
  RouteRequest,
  NoWorkerResult,
  RouteResult,
  RouteResultFields,
  RoutedResult,
  RouterStats,
  SelectWorkerOptions,
  PrefillReadListener,
  SharedDecision,
  UpdateWorkerStateOptions,
  WorkerLoadStats,
  WorkerMetrics,
} from './types.js';

/**
 * ContextForge's KV-aware router: the seed's API (`reference/seed/kv_aware_router.py`) and
 * the request-level route() over a block index and pluggable policies. Every method's work
 * is synchronous, so state-changing calls are atomic with respect to each other, which is
 * what the seed's asyncio.Lock guaranteed; the seed's coroutine methods stay async.
 */
export class KVAwareRouter {
  readonly numWorkers: number;
  readonly claAffinityEnabled: boolean;
  readonly anchorLocalityEnabled: boolean;
  readonly policy: RoutingPolicy;
  /** The built-in policies' random source (PolicyContext.random), put back after a dry run. */
  private readonly random: SeededRandom;
  readonly costWeights: Readonly<CostWeights>;
  readonly blockSize: number;
  readonly textChunkBytes: number;
  /** How token blocks are keyed (the router's hash or vLLM's). */
  readonly keying: BlockKeying;
  readonly indexMode: IndexMode;
  readonly index: BlockIndex;

  private readonly workers = new WorkerRegistry();
  private readonly anchors: AnchorTable;
  private readonly workflows: WorkflowTable;
  private readonly contentAnchors: ContentAnchorIndex;
  private readonly speculativeBlocks: number;
  /** The longest prompt routed, in tokens: a longer one is refused before anything is recorded for it. */
  readonly maxPromptTokens: number;
  private readonly judgeRoles: ReadonlySet<string>;
  private readonly clock: () => number;
  private readonly instanceId: string;
  /** The seed never counts blocks; under policy 'seed' activeBlocks stays 0 as there. */
  private readonly countsBlocks: boolean;
  /** Decisions by reason; no prototype, so that a policy's reason named like one of Object's members is a key as any other. */
  private readonly decisions: Partial<Record<string, number>> = Object.create(null) as Partial<Record<string, number>>;
  /** How many keys `decisions` has: past MAX_DECISION_REASONS, a new reason counts under OTHER_REASON. */
  private decisionReasons = 0;
  private readonly inFlight = new InFlightTickets();
  /** The blocks pending decisions alone added to the index, withdrawn if their engine refuses them. */
  private readonly withdrawable: WithdrawablePredictions;
  /**
   * Applied shared decisions kept in `withdrawable`, by their id, oldest first: their key
   * there (negative, apart from this router's tickets) and when they were applied.
   */
  private readonly appliedDecisions = new Map<string, { key: number; at: number }>();
  private lastAppliedKey = 0;
  private readonly predictedTtlMs: number;
  /**
   * The latest time the router has taken (a clock reading or a `now` it decided or recorded
   * at): its time never goes back from it. 0 before the first.
   */
  private latestTime = 0;
  /** How far past the router's time a `now` or `sampledAt` may be (see timeLeadMs()). */
  private readonly maxTimeLeadMs: number;
  /** Longest id a client chose that the router takes, in UTF-8 bytes. */
  readonly maxIdBytes: number;
  /** Most content anchors a request (or a shared decision) names. */
  readonly maxContentAnchors: number;
  private readonly candidates: CandidateCollector;
  private readonly recorder: DecisionRecorder;
  /** The checked metadata of the request being routed (scratch reused by every route()). */
  private readonly fields = new RouteFields();
  private isolationCounter = 0;

  private readonly prefix: PrefixLookup;
  /** The hash namespace of the request being routed (scratch reused by every route()). */
  private readonly hashNs: HashNamespace = {};
  /**
   * What a built-in policy is told of the request being routed (scratch reused by every
   * route(): the built-in policies keep nothing of it past the decision). A policy object of
   * the caller's own gets a fresh one per decision, which it may keep.
   */
  private readonly features: FeaturesScratch | undefined;
  /**
   * Set while route() runs the policy's code (choose(), and scoreTerms() for `explain`): the
   * request's working data above (fields, hash namespace, prefix lookup, candidates, features)
   * is the router's own, so a call that routes or changes the router from there is refused
   * (refuseWhileDeciding()) rather than left to overwrite the decision being taken.
   */
  private deciding: 'choose()' | 'scoreTerms()' | undefined = undefined;

  constructor(options: KVAwareRouterOptions = {}) {
    const o = resolveRouterOptions(options);
    this.numWorkers = o.numWorkers;
    this.claAffinityEnabled = o.claAffinityEnabled;
    this.anchorLocalityEnabled = o.anchorLocalityEnabled;
    this.costWeights = o.costWeights;
    this.policy = o.policy;
    this.random = o.random;
    this.features = o.builtInPolicy ? newFeatures() : undefined;
    this.countsBlocks = o.countsBlocks;
    // the seed counts no blocks: then none of broadcastNewBlocks()' ids is kept
    this.anchors = new AnchorTable(o.anchorCapacity, o.countsBlocks ? MAX_ANCHOR_BLOCK_IDS : 0);
    this.workflows = new WorkflowTable(o.workflowCapacity);
    this.blockSize = o.blockSize;
    this.textChunkBytes = o.textChunkBytes;
    this.keying = o.keying;
    this.indexMode = o.indexMode;
    this.index = new BlockIndex({ maxEntries: o.maxIndexEntries, predictedTtlMs: o.predictedTtlMs });
    this.prefix = new PrefixLookup(
      this.index,
      this.keying,
      this.blockSize,
      this.textChunkBytes,
      this.policy.readsBlocks !== true,
    );
    // a policy that, like its upstream, predicts nothing gets no speculative entries
    this.speculativeBlocks = this.policy.speculative === false ? 0 : o.speculativeBlocks;
    this.maxPromptTokens = o.maxPromptTokens;
    this.contentAnchors = new ContentAnchorIndex(o.contentAnchorCapacity, o.contentAnchorTtlMs);
    this.withdrawable = new WithdrawablePredictions(o.maxIndexEntries);
    this.predictedTtlMs = o.predictedTtlMs;
    this.maxTimeLeadMs = Math.max(MAX_TIME_LEAD_MS, o.predictedTtlMs);
    this.maxIdBytes = o.maxIdBytes;
    this.maxContentAnchors = o.maxContentAnchors;
    this.judgeRoles = o.judgeRoles;
    this.clock = o.clock;
    this.instanceId = o.instanceId;
    this.candidates = new CandidateCollector(
      {
        workers: this.workers,
        anchors: this.anchors,
        workflows: this.workflows,
        contentAnchors: this.contentAnchors,
        index: this.index,
      },
      o,
    );
    this.recorder = new DecisionRecorder(
      {
        index: this.index,
        contentAnchors: this.contentAnchors,
        anchors: this.anchors,
        workflows: this.workflows,
        prefix: this.prefix,
        withdrawable: this.withdrawable,
      },
      { indexMode: this.indexMode, speculativeBlocks: this.speculativeBlocks, blockSize: this.blockSize },
    );
  }

  // ------------------------------------------------------------------------- workers

  /**
   * Registers a worker; registering a known id again changes nothing, though its id and info
   * are checked as for a new one. An id is at most 256 characters (MAX_WORKER_ID_LENGTH).
   */
  registerWorker(workerId: string, info?: WorkerInfo): void {
    this.refuseWhileDeciding('registerWorker()');
    this.workers.register(workerId, info);
    this.prefix.groupBlockSizes(this.workers.values());
  }

  /** The block size a worker's KV is made of (its own, or the router's). */
  blockSizeOf(workerId: string): number {
    return this.requireRegistered(workerId).info.blockSize ?? this.blockSize;
  }

  /**
   * The CLA group a worker's KV is made under: its one group, or null when it serves none or
   * several (its engine's KV events do not say which group a block was made under).
   */
  claGroupOf(workerId: string): number | null {
    const groups = this.requireRegistered(workerId).claGroups;
    if (groups.size !== 1) return null;
    for (const g of groups) return g;
    return null;
  }

  /** Most blocks the longest prompt (maxPromptTokens) has on a worker: what a shared decision may record there. */
  maxPromptBlocks(workerId: string): number {
    return Math.ceil(this.maxPromptTokens / this.blockSizeOf(workerId));
  }

  /** Forgets a worker and everything recorded on it. Returns whether it was known. */
  removeWorker(workerId: string): boolean {
    this.refuseWhileDeciding('removeWorker()');
    check.requireId(workerId, 'workerId');
    const state = this.workers.remove(workerId);
    if (!state) return false;
    this.anchors.dropWorker(workerId);
    this.workflows.dropWorker(workerId);
    this.withdrawable.dropWorker(state);
    this.index.applyCleared(state.slot);
    this.contentAnchors.remove(state.slot);
    this.prefix.groupBlockSizes(this.workers.values());
    this.policy.onWorkerRemoved?.(state);
    return true;
  }

  /**
   * Stops sending new requests to a worker. What it holds stays recorded and is re-homed on
   * the next use. `resumeWorker` undoes it.
   */
  drainWorker(workerId: string): void {
    this.refuseWhileDeciding('drainWorker()');
    this.requireRegistered(workerId).draining = true;
  }

  resumeWorker(workerId: string): void {
    this.refuseWhileDeciding('resumeWorker()');
    this.requireRegistered(workerId).draining = false;
  }

  /** Health from the gateway's checks: an unhealthy worker gets no requests but keeps its state. */
  setWorkerHealth(workerId: string, healthy: boolean): void {
    this.refuseWhileDeciding('setWorkerHealth()');
    if (typeof healthy !== 'boolean') throw new TypeError('healthy must be a boolean');
    this.requireRegistered(workerId).healthy = healthy;
  }

  /** Engine-reported load, e.g. scraped from /metrics. */
  updateWorkerMetrics(workerId: string, metrics: WorkerMetrics): void {
    this.refuseWhileDeciding('updateWorkerMetrics()');
    const w = this.requireRegistered(workerId);
    check.object(metrics, 'metrics');
    check.knownKeys(metrics, METRICS_KEYS, 'metrics');
    const { kvUsage, waitingRequests, runningRequests, kvCapacityTokens, sampledAt } = metrics;
    // every field is checked before any is applied: a rejected call changes nothing
    const load = kvUsage === undefined ? undefined : check.load(kvUsage, 'kvUsage');
    // a count past any engine's is held at the bound, where sums over the workers stay exact
    const waiting =
      waitingRequests === undefined
        ? undefined
        : Math.min(check.finiteNonNegative(waitingRequests, 'waitingRequests'), MAX_ENGINE_REQUESTS);
    const running =
      runningRequests === undefined
        ? undefined
        : Math.min(check.finiteNonNegative(runningRequests, 'runningRequests'), MAX_ENGINE_REQUESTS);
    // a capacity is a count of tokens (blocks × block size): a fraction is no engine's reading
    const capacity =
      kvCapacityTokens === undefined ? undefined : check.requiredNonNegativeInt(kvCapacityTokens, 'kvCapacityTokens');
    const at =
      sampledAt === undefined
        ? undefined
        : this.givenTime(check.finiteNonNegative(sampledAt, 'sampledAt'), 'sampledAt');
    const readAt = waiting === undefined ? 0 : (at ?? this.readClock());
    if (load !== undefined) w.load = load;
    if (waiting !== undefined) {
      w.waitingRequests = waiting;
      this.inFlight.admitUnreported(w, waiting, readAt, this.prefillDone);
    }
    if (running !== undefined) w.runningRequests = running;
    if (capacity !== undefined) w.kvCapacityTokens = capacity;
    w.metricsAt = at ?? this.readClock();
    this.throwListenerError();
  }

  /** Whether a worker (or a data-parallel rank, `ID#r`) is registered under this id. */
  hasWorker(workerId: string): boolean {
    return this.workers.has(workerId);
  }

  /** Workers registered (each data-parallel rank counts as one). */
  get workerCount(): number {
    return this.workers.size;
  }

  /** Workers in registration order (read-only views). */
  listWorkers(): readonly WorkerState[] {
    return [...this.workers.values()];
  }

  // --------------------------------------------------------------- KV events (precise)

  /** The worker stored these blocks (sequence hashes as from hashTokens). */
  applyStored(workerId: string, blocks: BlockSequence, tier: 'gpu' | 'offload' = 'gpu'): void {
    this.refuseWhileDeciding('applyStored()');
    const w = this.requireRegistered(workerId);
    checkBlocks(blocks);
    this.index.applyStored(w.slot, blocks.hi, blocks.lo, 0, blocks.length, tierOf(tier));
    if (this.inFlight.awaitsBlocks(w)) {
      this.inFlight.storedBlocks(w, blocks.hi, blocks.lo, blocks.length, this.prefillDone);
      this.throwListenerError();
    }
  }

  /** The worker evicted these blocks; without a tier, from every tier. */
  applyRemoved(workerId: string, blocks: BlockSequence, tier?: 'gpu' | 'offload'): void {
    this.refuseWhileDeciding('applyRemoved()');
    const w = this.requireRegistered(workerId);
    checkBlocks(blocks);
    this.index.applyRemoved(
      w.slot,
      blocks.hi,
      blocks.lo,
      0,
      blocks.length,
      tier === undefined ? undefined : tierOf(tier),
    );
  }

  /**
   * The worker dropped all its blocks (AllBlocksCleared), or its events can no longer be trusted.
   * With `keep` 'offload', only its GPU (and predicted) entries go: its prefix cache was reset
   * while its offload tier kept its copies.
   */
  applyCleared(workerId: string, keep?: 'offload'): void {
    this.refuseWhileDeciding('applyCleared()');
    const w = this.requireRegistered(workerId);
    if (keep !== undefined && keep !== 'offload') {
      const given: unknown = keep;
      if (typeof given === 'string')
        throw new RangeError(`keep must be 'offload' or left out, got ${quotedText(given)}`);
      throw new TypeError(`keep must be 'offload' or left out, got ${check.typeName(given)}`);
    }
    this.index.applyCleared(w.slot, keep === 'offload');
  }

  /**
   * Block keys of token ids as this router computes them (a fresh copy); `blockSize` default:
   * the router's. At most MAX_PROMPT_TOKENS (2^27) ids, the longest prompt any router takes
   * (its `maxPromptTokens` at most): a longer list is refused with a RangeError naming `tokens`
   * before any memory is taken for it.
   */
  hashTokens(tokens: ArrayLike<number>, ns?: HashNamespace, blockSize: number = this.blockSize): BlockHashes {
    if (tokens === null || typeof tokens !== 'object')
      throw new TypeError(`tokens must be an array of token ids, got ${check.typeName(tokens)}`);
    const length: unknown = tokens.length;
    if (!(Number.isSafeInteger(length) && (length as number) >= 0))
      throw new TypeError(`tokens must be an array of token ids (its length a count), got length ${String(length)}`);
    if ((length as number) > MAX_PROMPT_TOKENS)
      throw new RangeError(
        `tokens must hold at most ${MAX_PROMPT_TOKENS} token ids (MAX_PROMPT_TOKENS, the longest prompt a router takes), got ${length as number}`,
      );
    if (ns !== undefined && ns !== null) checkHashNamespace(ns);
    check.blockSize(blockSize, 'blockSize');
    return this.keying.hashTokens(
      tokens,
      blockSize,
      ns,
      new BlockHashes(Math.max(1, Math.floor(tokens.length / blockSize))),
    );
  }

  // ------------------------------------------------------------------------ routing

  /**
   * Routes one request: hash → index lookup → candidates → policy. Unless `dryRun`, the
   * decision is recorded (predicted blocks, content anchors, anchor home, workflow step) and,
   * unless `track: false`, counted as in-flight work until release().
   */
  route(request: RouteRequest, options: RouteOptions = NO_OPTIONS): RouteResult {
    this.refuseWhileDeciding('route()');
    check.object(request, 'request');
    check.knownKeys(request, ROUTE_REQUEST_KEYS, 'request');
    check.object(options, 'options');
    if (options !== NO_OPTIONS) {
      check.knownKeys(options, ROUTE_OPTION_KEYS, 'options');
      check.optionalBoolean(options.explain, 'options.explain');
      check.optionalBoolean(options.track, 'options.track');
      check.optionalBoolean(options.dryRun, 'options.dryRun');
      check.optionalBoolean(options.share, 'options.share');
      check.optionalBoolean(options.firstTokenReported, 'options.firstTokenReported');
    }
    const replaces = options.replaces;
    if (replaces !== undefined && (replaces === null || typeof replaces !== 'object' || !replaces.noWorker))
      throw new TypeError('replaces must be a route() result that found no worker (noWorker set)');
    check.optionalSet(options.exclude, 'exclude');
    check.optionalSet(options.panicCandidates, 'panicCandidates');
    const servedBy = check.optionalId(options.servedBy, 'servedBy');
    // a time that is no number would stay in the policy's and the index's bookkeeping; it is
    // taken as the router's time once the request has passed its checks
    const given = options.now === undefined ? this.readClock() : this.givenTime(options.now, 'now');
    const fields = this.fields;
    readRouteFields(request, this.judgeRoles, this.maxIdBytes, this.maxContentAnchors, fields);
    const { claGroup, workflowId, anchor, isolated } = fields;

    // isolated requests hash under a private salt: their blocks match nothing else
    const cacheSalt = isolated
      ? `cf-${this.instanceId}-${(++this.isolationCounter).toString(36)}`
      : check.optionalBoundedId(request.cacheSalt, 'cacheSalt', this.maxIdBytes);
    const ns = this.hashNs;
    ns.lora = check.optionalBoundedId(request.lora, 'lora', this.maxIdBytes) ?? null;
    ns.cacheSalt = cacheSalt ?? null;
    ns.claGroup = claGroup;
    // content anchors are keyed under the namespace the prefix blocks are: its chain's root
    if (fields.contentAnchors !== undefined && fields.contentAnchors.length > 0) chainRoot(ns, fields.anchorNamespace);
    // a token list past the longest prompt is refused before it is hashed (as it would be after):
    // hashing a billion-long list would take the memory and the time the bound is there to spare
    // (a text or chat past it is refused in hashRequest, before it is encoded and hashed)
    const tokenCount = request.tokens?.length ?? 0;
    if (Number.isSafeInteger(tokenCount) && tokenCount > this.maxPromptTokens && tokenCount >= this.blockSize)
      throw new PromptTooLongError(tokenCount, this.maxPromptTokens);
    // a length given (a count: readRouteFields checked it) is judged before the prompt is hashed
    // too, and the prompt's blocks are judged in hashRequest whatever length is given: neither
    // stands in for the other
    if (
      request.tokens === undefined &&
      request.promptTokens !== undefined &&
      request.promptTokens > this.maxPromptTokens
    )
      throw new PromptTooLongError(request.promptTokens, this.maxPromptTokens, 'promptTokens');
    const hashes = this.prefix.hashRequest(request, ns, this.maxPromptTokens);
    const promptTokens = this.prefix.promptTokensOf(request, hashes);
    // a prompt given is what fills the index; a length alone (the seed API's) fills the in-flight
    // counts, where a length past any prompt (1e308) would stay as Infinity or NaN for good.
    // A token list shorter than one block records nothing and is not refused
    if (promptTokens > this.maxPromptTokens && (request.tokens === undefined || this.prefix.blockCount(hashes) > 0))
      throw new PromptTooLongError(
        promptTokens,
        this.maxPromptTokens,
        // the length is the field's when it is given (0 means "estimate it from the blocks")
        request.tokens === undefined && (request.promptTokens ?? 0) > 0 ? 'promptTokens' : undefined,
      );
    const matching = !isolated && this.anchorLocalityEnabled;
    const now = this.takeTime(given);
    const overlap = this.prefix.lookup(request, hashes, ns, matching, this.workers.slotCount, now);
    // keys of token ids are computed on demand: `hashes` holds those computed so far
    const requestBlocks = this.prefix.blockCount(hashes);
    this.prefix.ensureKeys(hashes, 4); // the routing key's block

    const candidates = this.candidates.collect(
      overlap,
      hashes.tokensPerBlock,
      anchor,
      claGroup,
      promptTokens,
      workflowId,
      fields.contentAnchors,
      fields.anchorNamespace,
      isolated,
      now,
      options.exclude,
      options.panicCandidates,
      servedBy,
    );
    const features = this.features ?? newFeatures();
    features.claGroup = claGroup;
    features.promptTokens = promptTokens;
    features.requestBlocks = requestBlocks;
    features.blockSize = hashes.tokensPerBlock || this.blockSize;
    features.routingKey =
      requestBlocks > 0 ? hashes.lo[Math.min(requestBlocks, 4) - 1] : anchor ? hashString32(anchor) : 0;
    features.blocks = this.prefix.sequence(hashes);
    features.sharedPrefixKey =
      overlap.maxBlocks > 0
        ? hashes.lo[Math.min(overlap.maxBlocks, requestBlocks) - 1]
        : anchor
          ? hashString32(anchor)
          : 0;
    features.now = now;
    features.firstTokenReported = options.firstTokenReported !== false;
    features.workflowStep = fields.workflowStep;
    const dryRun = options.dryRun === true;
    features.dryRun = dryRun;
    // a dry run shows the next decision: the random source its policy draws from is put back
    const randomState = this.random.state;
    let index: number;
    let confidence: number;
    let reason: RouteReason;
    // the policy's code may not route or change the router: the request's working data is the router's
    this.deciding = 'choose()';
    try {
      const choice: PolicyChoice = this.policy.choose(candidates, features);
      if (typeof choice !== 'object' || choice === null) throw choiceError(this.policy.name, choice, candidates.length);
      // each member read once, then checked and used: a getter answering otherwise the second
      // time would pass the check with one value and decide with another
      index = choice.index;
      confidence = choice.confidence;
      reason = choice.reason;
    } finally {
      this.deciding = undefined;
      if (dryRun) this.random.state = randomState;
    }
    // a user's policy is not trusted to keep to PolicyChoice; the built-in ones always do
    checkChoice(this.policy.name, index, confidence, reason, candidates.length);
    const chosen = index >= 0 ? candidates[index] : undefined;

    const result: RouteResult = {
      workerId: chosen ? chosen.worker.id : '',
      cachedTokens: chosen ? chosen.cachedTokens : 0,
      promptTokens,
      confidence,
      policy: this.policy.name,
      reason,
      blocks: requestBlocks,
      ticket: 0,
      preRope: true,
    };
    // worked out only on this rare path; the result is then a NoWorkerResult (workerId '')
    if (!chosen)
      (result as RouteResultFields as NoWorkerResult).noWorker = diagnoseNoWorker(
        this.workers.values(),
        candidates.length,
        options.exclude,
      );
    if (cacheSalt !== undefined && isolated) result.cacheSalt = cacheSalt;
    if (options.explain) {
      this.deciding = 'scoreTerms()'; // the policy's code too
      try {
        result.explain = explainCandidates(candidates, features, index, this.policy);
      } finally {
        this.deciding = undefined;
      }
    }
    if (options.dryRun) return result;

    // a decision taken again counts in place of the one it replaces (a count never goes below zero)
    if (replaces !== undefined && typeof replaces.reason === 'string') {
      const replaced = this.decisionKey(replaces.reason);
      if ((this.decisions[replaced] ?? 0) > 0) this.decisions[replaced]!--;
    }
    const key = this.decisionKey(reason);
    const counted = this.decisions[key];
    if (counted === undefined) this.decisionReasons++;
    this.decisions[key] = (counted ?? 0) + 1;
    if (!chosen) return result;
    const worker = chosen.worker;
    const tracked = options.track !== false;
    // a policy that keeps its tracked decisions' prefixes itself needs no speculative entries for them
    const predict = !(tracked && this.policy.speculative === 'untracked');
    this.recorder.record(worker, chosen.overlapBlocks, hashes, request.tokens !== undefined, fields, now, predict);
    const uncached = Math.max(0, promptTokens - chosen.cachedTokens);
    if (options.share)
      result.shared = this.recorder.shared(
        worker.id,
        fields,
        tracked ? uncached : 0,
        tracked ? promptTokens : 0,
        tracked,
      );
    if (tracked) {
      const reported = options.firstTokenReported !== false;
      result.ticket = this.inFlight.open(worker, uncached, promptTokens, now, reported, result.shared);
      if (result.shared) result.shared.id = `${this.instanceId}.${result.ticket.toString(36)}`;
      this.recorder.keepAdded(result.ticket, worker);
      if (!reported) this.inferPrefillEnd(result.ticket, request, hashes, chosen, promptTokens);
    }
    this.policy.onRouted?.(worker, features, result.ticket, now);
    return result;
  }

  /**
   * route(), for callers that prefer an exception to branching on `noWorker`: throws a
   * NoEndpointsError (its `reason` says why) when no worker can take the request.
   */
  routeOrThrow(request: RouteRequest, options: RouteOptions = NO_OPTIONS): RoutedResult {
    this.refuseWhileDeciding('routeOrThrow()');
    const result = this.route(request, options);
    if (result.noWorker) throw new NoEndpointsError(result.noWorker, result.policy);
    return result;
  }

  /**
   * Applies another replica's decision (see RouteOptions.share): its blocks become predicted
   * entries on the worker, and the workflow and anchors follow it. False when the worker is
   * not registered here (yet), so nothing was applied.
   *
   * With an `id`, the blocks it alone added here are kept, as markRefused() keeps a ticket's,
   * until settleSharedDecision() (its prefill ended or it ended) or refuseSharedDecision() (its
   * engine refused it), or at the latest the prediction lifetime, past which they are gone anyway
   * (a message that never came does not keep them).
   */
  applySharedDecision(d: Omit<SharedDecision, 'prefillTokens' | 'decodeTokens' | 'tracked'>, now?: number): boolean {
    this.refuseWhileDeciding('applySharedDecision()');
    checkSharedDecision(d, this.maxIdBytes, this.maxContentAnchors);
    const given = now === undefined ? this.readClock() : this.givenTime(now, 'now');
    const worker = this.workers.get(d.workerId);
    if (!worker) return false;
    // no decision made here records more blocks than the longest prompt has on that worker
    if (d.hi.length > this.maxPromptBlocks(d.workerId))
      throw new RangeError(
        `a shared decision of ${d.hi.length} blocks is longer than the longest prompt (maxPromptTokens ${this.maxPromptTokens}) allows`,
      );
    const at = this.takeTime(given);
    this.expireAppliedDecisions(at);
    if (d.id !== undefined) this.settleSharedDecision(d); // the same decision again replaces it
    this.recorder.applyShared(worker, d, at);
    if (d.id !== undefined) {
      const key = --this.lastAppliedKey;
      if (this.recorder.keepAdded(key, worker)) this.appliedDecisions.set(d.id, { key, at });
    }
    return true;
  }

  /** Another replica's decision applied here has passed refusal (its prefill ended, or it ended): its blocks stay. */
  settleSharedDecision(d: Pick<SharedDecision, 'id'>): void {
    this.refuseWhileDeciding('settleSharedDecision()');
    check.object(d, 'decision');
    if (d.id === undefined) return;
    check.requireId(d.id, 'decision.id');
    const applied = this.appliedDecisions.get(d.id);
    if (!applied) return;
    this.appliedDecisions.delete(d.id);
    this.withdrawable.drop(applied.key);
  }

  /**
   * The engine refused another replica's decision applied here (see markRefused()): the
   * blocks it alone added here are withdrawn, but those that a decision made here since on
   * the same worker predicts too (this router's or another applied one) stay. Returns how
   * many index entries were withdrawn (0 for a decision unknown here, or settled).
   */
  refuseSharedDecision(d: Pick<SharedDecision, 'id'>): number {
    this.refuseWhileDeciding('refuseSharedDecision()');
    check.object(d, 'decision');
    if (d.id === undefined) return 0;
    check.requireId(d.id, 'decision.id');
    const applied = this.appliedDecisions.get(d.id);
    if (!applied) return 0;
    this.appliedDecisions.delete(d.id);
    return this.withdrawKept(applied.key);
  }

  /** Withdraws from the index the blocks kept under `key` (a ticket, or an applied decision's key). */
  private withdrawKept(key: number): number {
    const blocks = this.withdrawable.take(key);
    if (!blocks) return 0;
    return this.index.withdrawPredicted(blocks.slot, blocks.hi, blocks.lo, blocks.start, blocks.end);
  }

  /** Stops keeping applied decisions older than the prediction lifetime: their blocks have expired. */
  private expireAppliedDecisions(now: number): void {
    for (const [id, applied] of this.appliedDecisions) {
      if (now - applied.at < this.predictedTtlMs) return;
      this.appliedDecisions.delete(id);
      this.withdrawable.drop(applied.key);
    }
  }

  /** The worker a workflow's latest step ran on, as far as this router knows. */
  workflowAffinity(workflowId: string): { workerId: string; step: number | null } | undefined {
    check.requireId(workflowId, 'workflowId');
    return this.workflows.peek(workflowId);
  }

  /** Sets a workflow's worker (the shared state's word for it, which wins); ignored for unknown workers. */
  setWorkflowAffinity(workflowId: string, workerId: string, step: number | null = null): void {
    this.refuseWhileDeciding('setWorkflowAffinity()');
    check.boundedId(workflowId, 'workflowId', this.maxIdBytes);
    check.requireId(workerId, 'workerId');
    check.optionalNonNegativeInt(step, 'step');
    if (!this.workers.get(workerId)) return;
    this.workflows.set(workflowId, workerId, step);
  }

  /** The most workflows this router remembers (--workflow-capacity). */
  get workflowCapacity(): number {
    return this.workflows.capacity;
  }

  /**
   * How long this router keeps a predicted block record, in ms: `predictionTtlMs`, else 120 s
   * in approximate mode and 5 s (the speculative entries) in precise mode. The shared state
   * keeps the decisions it replays to a replica that starts later for as long.
   */
  get predictionTtlMs(): number {
    return this.predictedTtlMs;
  }

  /** Every workflow this router remembers, least recently used first. */
  workflowAffinities(): IterableIterator<[string, { workerId: string; step: number | null }]> {
    return this.workflows.all();
  }

  /** This replica's own in-flight work on a worker (what it shares with the others). */
  localLoad(workerId: string): InFlightLoad {
    return localLoad(this.requireRegistered(workerId));
  }

  /** The requests in flight on a worker, this replica's and the others' (setRemoteLoad) together. */
  inFlightRequests(workerId: string): number {
    return this.requireRegistered(workerId).inFlightRequests;
  }

  /**
   * The in-flight work other replicas have on a worker (their sum): policies then see the
   * whole fleet's load, not just this replica's, and replicas do not pile onto one worker.
   * Each amount is a number from 0 to MAX_REMOTE_LOAD (2^40; a RangeError naming it otherwise,
   * a TypeError for one that is no number), and nothing changes unless all three are.
   */
  setRemoteLoad(workerId: string, load: InFlightLoad): void {
    this.refuseWhileDeciding('setRemoteLoad()');
    const w = this.requireRegistered(workerId);
    check.object(load, 'load');
    check.knownKeys(load, IN_FLIGHT_LOAD_KEYS, 'load');
    setRemoteLoad(w, load);
  }

  /** The request's prefill finished (first token seen): its work moves from prefill to decode. */
  markPrefillDone(ticket: number): void {
    this.refuseWhileDeciding('markPrefillDone()');
    check.ticket(ticket);
    this.policy.onPrefillDone?.(ticket);
    this.inFlight.markPrefillDone(ticket);
    this.withdrawable.drop(ticket);
  }

  /**
   * The engine holds none of the request: it refused it (an HTTP 4xx: a prompt longer than its
   * context, a parameter it rejects, a 429 when it is overloaded), failed it (a 5xx), or never
   * received it (the connection failed before any answer). The blocks the decision predicted
   * on the worker are withdrawn from the index, since the worker will not hold them, and the
   * next request with that prefix is not sent there for them. Only
   * the blocks this decision alone added go: a block the worker held before it (reported by
   * its engine, or predicted for another request) stays, as does one that a decision made
   * since on the same worker predicts too (this replica's, or another's it applied). In
   * precise mode that is the decision's speculative stretch.
   *
   * Call it before markPrefillDone() and release(): past either, the decision's blocks are
   * taken as computed and kept. The ticket itself stays open until release(). Returns how
   * many index entries were withdrawn (0 for an unknown, untracked or ended ticket).
   */
  markRefused(ticket: number): number {
    this.refuseWhileDeciding('markRefused()');
    check.ticket(ticket);
    // a removed worker's decisions were dropped with it (its slot may be reused since)
    return this.withdrawKept(ticket);
  }

  /**
   * How the router learns that a request whose first token nobody reports has finished its
   * prefill. The engine computes the prompt's last full block in the prefill's last chunk, so
   * when that block is new on the worker, the KV event storing it says so; when the worker
   * already holds it, what is left is less than a block, done once the engine admits the
   * request (its scraped waiting queue). Either needs the engine's own keys: precise mode,
   * keys from token ids or the engine's block ids, the worker's block size. Otherwise the
   * whole answer, when it comes, is the first the router hears.
   */
  private inferPrefillEnd(
    ticket: number,
    request: RouteRequest,
    hashes: BlockHashes,
    chosen: Candidate,
    promptTokens: number,
  ): void {
    const worker = chosen.worker;
    if (this.indexMode !== 'precise') return;
    if (request.tokens === undefined && request.blockHashes === undefined) return;
    if (worker.info.blockSize !== undefined && worker.info.blockSize !== this.blockSize) return;
    const perBlock = request.tokens !== undefined ? this.blockSize : hashes.tokensPerBlock;
    // a precomputed list may end with a partial block, which the engine never stores
    const full = Math.min(this.prefix.blockCount(hashes), Math.floor(promptTokens / perBlock));
    if (full <= chosen.overlapBlocks) return this.inFlight.awaitAdmission(ticket);
    this.prefix.ensureKeys(hashes, full);
    this.inFlight.awaitBlock(ticket, hashes.hi[full - 1], hashes.lo[full - 1]);
  }

  /**
   * Ends a prefill the router read off the engine, and tells the listeners. One reading may end
   * several: a listener's error is kept (the first) and thrown by throwListenerError() once
   * every one is ended and heard of.
   */
  private readonly prefillDone = (ticket: number): void => {
    const shared = this.inFlight.sharedOf(ticket);
    this.markPrefillDone(ticket);
    for (const listener of this.prefillListeners) {
      try {
        listener(ticket, shared);
      } catch (error) {
        this.listenerFailure ??= { error };
      }
    }
  };
  private prefillListeners: ReadonlyArray<PrefillReadListener> = [];
  /** The first error a prefill listener threw during the reading being applied. */
  private listenerFailure: { error: unknown } | undefined = undefined;

  /** Throws the error a prefill listener threw while a reading was applied, if one did. */
  private throwListenerError(): void {
    const failure = this.listenerFailure;
    if (failure === undefined) return;
    this.listenerFailure = undefined;
    throw failure.error;
  }

  /**
   * Calls `listener` with each ticket whose prefill the router ended itself, reading it off
   * the engine (a request routed with `firstTokenReported: false`), and the decision it shared
   * with other replicas (route() with `share`): where a caller would have reported the first
   * token, e.g. to the other replicas. Returns a function that removes it. A listener that
   * throws keeps neither the router's counts nor the other listeners from hearing: every
   * prefill the reading ends is ended and heard of by every listener, then the call that gave
   * the reading (applyStored(), updateWorkerMetrics()) throws the first error, its own
   * changes all made.
   */
  onPrefillRead(listener: PrefillReadListener): () => void {
    if (typeof listener !== 'function') throw new TypeError('listener must be a function');
    this.prefillListeners = [...this.prefillListeners, listener];
    return () => {
      this.prefillListeners = this.prefillListeners.filter((l) => l !== listener);
    };
  }

  /** The router's clock (ms): what `now` and `sampledAt` are measured on. */
  now(): number {
    return this.readClock();
  }

  /** The request completed, failed or was abandoned: its work leaves the worker. Idempotent. */
  release(ticket: number): void {
    this.refuseWhileDeciding('release()');
    check.ticket(ticket);
    this.policy.onReleased?.(ticket);
    this.inFlight.release(ticket);
    this.withdrawable.drop(ticket);
  }

  // --------------------------------------------------------------- the seed's API

  async selectWorker(anchorHash: string, opts: SelectWorkerOptions = {}): Promise<RouteDecision> {
    this.refuseWhileDeciding('selectWorker()');
    const r = this.route(seedRouteRequest(anchorHash, opts, this.maxPromptTokens, this.maxIdBytes), { track: false });
    const claGroup = opts.claGroup ?? null;
    return { targetWorkerId: r.workerId, anchorHash, claGroup, confidence: r.confidence, preRope: true };
  }

  async updateWorkerState(workerId: string, load: number, opts: UpdateWorkerStateOptions = {}): Promise<void> {
    this.refuseWhileDeciding('updateWorkerState()');
    applySeedWorkerState(this.workers, workerId, load, opts);
  }

  /** Records that `targetWorkerId` now holds the anchor's blocks (registered or not, as the seed). */
  async broadcastNewBlocks(anchorHash: string, blockIds: string[], targetWorkerId: string): Promise<void> {
    this.refuseWhileDeciding('broadcastNewBlocks()');
    check.boundedId(anchorHash, 'anchorHash', this.maxIdBytes);
    check.boundedIdList(blockIds, 'blockIds', this.maxIdBytes);
    check.workerId(targetWorkerId, 'targetWorkerId');
    this.anchors.recordBlocks(anchorHash, blockIds, targetWorkerId);
  }

  getWorkerForAnchor(anchorHash: string): string | undefined {
    check.requireId(anchorHash, 'anchorHash');
    return this.anchors.peek(anchorHash)?.workerId;
  }

  getStats(): RouterStats {
    const workerLoads: Record<string, WorkerLoadStats> = {};
    const drainingWorkers: string[] = [];
    for (const w of this.workers.values()) {
      setOwn(workerLoads, w.id, {
        load: roundHalfEven3(w.load),
        claGroups: w.claGroups.size,
        activeBlocks: this.countsBlocks ? this.anchors.blocksOn(w.id) + this.index.entriesFor(w.slot) : 0,
      });
      if (w.draining) drainingWorkers.push(w.id);
    }
    return {
      numWorkers: this.workers.size,
      anchorsTracked: this.anchors.size,
      claAffinityEnabled: this.claAffinityEnabled,
      anchorLocalityEnabled: this.anchorLocalityEnabled,
      workerLoads,
      policy: this.policy.name,
      indexMode: this.indexMode,
      anchorCapacity: this.anchors.capacity,
      anchorEvictions: this.anchors.evictions,
      workflowsTracked: this.workflows.size,
      contentAnchorsTracked: this.contentAnchors.size,
      drainingWorkers,
      inFlightRequests: this.inFlight.size,
      decisionsByReason: { ...this.decisions },
      index: this.index.stats(),
    };
  }

  // ------------------------------------------------------------------------ internals

  /**
   * The clock's reading, checked where it is read (the clock is the caller's): a time that is
   * no finite number would stay in the policy's and the index's bookkeeping for good.
   */
  private readClock(): number {
    return check.time(this.clock(), 'clock');
  }

  /**
   * A time a caller gave (a `now`, a `sampledAt`), checked: a finite number >= 0, at most
   * maxTimeLeadMs past the router's time (the latest it has taken, or its clock's reading if
   * later). Further ahead it is another clock's (Date.now() given to a router on a simulated
   * or monotonic clock): the index's time never goes back, so everything recorded at it would
   * outlive its lifetime by the whole difference once the caller is back on the router's clock,
   * and everything recorded before it would expire at once. Changes nothing.
   */
  private givenTime(value: unknown, name: string): number {
    const t = check.time(value, name);
    if (t <= this.latestTime + this.maxTimeLeadMs) return t;
    const time = Math.max(this.latestTime, this.readClock());
    if (t > time + this.maxTimeLeadMs)
      throw new RangeError(
        `${name} must be at most ${this.maxTimeLeadMs} ms past the router's time (${time} ms on its clock), got ${t}: is it another clock's?`,
      );
    return t;
  }

  /** Takes `t` as the router's time, which never goes back: an earlier one reads as the latest taken. */
  private takeTime(t: number): number {
    if (t > this.latestTime) this.latestTime = t;
    return this.latestTime;
  }

  /**
   * The router's time: the latest time it has taken (a clock reading or a `now` it routed or
   * applied a decision at). It never goes back: a `now` earlier than it is read as it, so that
   * what is recorded at an earlier time (a prediction, a content anchor, a request in flight)
   * lives as long as one recorded now, and no wait is counted as negative.
   */
  get time(): number {
    return this.latestTime;
  }

  /**
   * Refuses a call that routes or changes the router made from inside the policy's choose()
   * (or scoreTerms()) while route() decides: it would overwrite the decision's working data
   * (the request's fields, its hashes, the candidate list) or free the chosen worker's slot, and
   * the outer decision would be recorded wrong without a word. Nothing has changed when it throws.
   */
  private refuseWhileDeciding(call: string): void {
    if (this.deciding !== undefined)
      throw new TypeError(
        `${call} called from inside the ${this.deciding} of policy '${this.policy.name}': a policy may not route or change the router while route() decides`,
      );
  }

  /**
   * The key getStats().decisionsByReason counts a decision of `reason` under: its own, unless
   * MAX_DECISION_REASONS reasons have one already, then OTHER_REASON. A policy of the caller's
   * own names its reasons, and a map it fills would otherwise grow without limit (as would the
   * gateway's decision metric, a series per reason).
   */
  private decisionKey(reason: string): string {
    return this.decisions[reason] !== undefined || this.decisionReasons < MAX_DECISION_REASONS ? reason : OTHER_REASON;
  }

  private requireRegistered(workerId: string): WorkerState {
    check.requireId(workerId, 'workerId');
    const state = this.workers.get(workerId);
    if (!state) throw new RangeError(`workerId '${workerId}' is not registered`);
    return state;
  }
}

/**
 * How far past the router's time (the latest it has taken, or its clock's reading if later) a
 * `now` or `sampledAt` may be, in ms, unless the prediction lifetime is longer: one minute, far
 * more than clocks of one host (or of hosts NTP keeps in step) differ, and far less than the
 * difference between two clocks of different origins (the epoch, a process's start, a
 * simulation's 0). The index's time never goes back, so a `now` ahead of the router's clock
 * keeps what is recorded at it that much longer than its lifetime: at most this bound longer.
 */
export const MAX_TIME_LEAD_MS = 60_000;

/**
 * Most reasons getStats().decisionsByReason counts under their own key; decisions of further
 * reasons count under OTHER_REASON ('other').
 */
export const MAX_DECISION_REASONS = 64;
export const OTHER_REASON = 'other';

/** route()'s options when none are given: one object, not a new one per call. */
const NO_OPTIONS: RouteOptions = Object.freeze({});

/** route()'s option keys: any other is refused (a misspelt `dryrun` would route for real). */
const ROUTE_OPTION_KEYS = check.keySet<RouteOptions>({
  explain: true,
  track: true,
  dryRun: true,
  now: true,
  exclude: true,
  panicCandidates: true,
  servedBy: true,
  replaces: true,
  share: true,
  firstTokenReported: true,
});

/** A route() request's keys: any other is refused (a misspelt `clagroup` would route without the CLA group). */
const ROUTE_REQUEST_KEYS = check.keySet<RouteRequest>({
  tokens: true,
  text: true,
  messages: true,
  blockHashes: true,
  blockTokens: true,
  promptTokens: true,
  contentAnchors: true,
  anchor: true,
  claGroup: true,
  workflowId: true,
  workflowStep: true,
  agentRole: true,
  isolate: true,
  lora: true,
  cacheSalt: true,
});

/** setRemoteLoad()'s keys. */
const IN_FLIGHT_LOAD_KEYS = check.keySet<InFlightLoad>({
  inFlightRequests: true,
  queuedPrefillTokens: true,
  activeDecodeTokens: true,
});

/** applySharedDecision()'s keys: a decision as route() shares it (`result.shared`) has them all. */
const SHARED_DECISION_KEYS = check.keySet<SharedDecision>({
  workerId: true,
  hi: true,
  lo: true,
  workflowId: true,
  workflowStep: true,
  anchor: true,
  claGroup: true,
  contentAnchors: true,
  anchorNamespace: true,
  prefillTokens: true,
  decodeTokens: true,
  tracked: true,
  id: true,
});

/** hashTokens()'s namespace keys. */
const HASH_NAMESPACE_KEYS = check.keySet<HashNamespace>({ lora: true, cacheSalt: true, claGroup: true });

/** A hash namespace given to hashTokens(): its keys and their values, as a request's own are checked. */
function checkHashNamespace(ns: HashNamespace): void {
  check.object(ns, 'ns');
  check.knownKeys(ns, HASH_NAMESPACE_KEYS, 'ns');
  check.optionalId(ns.lora, 'ns.lora');
  check.optionalId(ns.cacheSalt, 'ns.cacheSalt');
  check.optionalNonNegativeInt(ns.claGroup, 'ns.claGroup');
}

/** updateWorkerMetrics()'s keys: any other is refused (a misspelt `kvusage` would leave the load as it was). */
const METRICS_KEYS = check.keySet<WorkerMetrics>({
  kvUsage: true,
  waitingRequests: true,
  sampledAt: true,
  runningRequests: true,
  kvCapacityTokens: true,
});

/**
 * Sets `key` on a plain object as its own property, whatever the key: assigning '__proto__'
 * would set the object's prototype instead (a worker may be named so), and the key be lost.
 */
function setOwn<T>(map: Record<string, T>, key: string, value: T): void {
  if (key === '__proto__')
    Object.defineProperty(map, key, { value, enumerable: true, writable: true, configurable: true });
  else map[key] = value;
}

/** RouteFeatures as route() fills them in. */
type FeaturesScratch = { -readonly [K in keyof RouteFeatures]: RouteFeatures[K] };

/** Features with every key present (one shape for every decision), to be filled in. */
function newFeatures(): FeaturesScratch {
  return {
    claGroup: null,
    promptTokens: 0,
    requestBlocks: 0,
    blockSize: 0,
    routingKey: 0,
    blocks: undefined,
    sharedPrefixKey: 0,
    now: 0,
    firstTokenReported: true,
    workflowStep: null,
    dryRun: false,
  };
}

/**
 * Checks another replica's decision before any of it is applied (it comes off the wire): the
 * same rules as a request's own fields, each error naming the field.
 */
function checkSharedDecision(
  d: Omit<SharedDecision, 'prefillTokens' | 'decodeTokens' | 'tracked'>,
  maxIdBytes: number,
  maxAnchors: number,
): void {
  check.object(d, 'decision');
  check.knownKeys(d, SHARED_DECISION_KEYS, 'decision');
  check.requireId(d.workerId, 'workerId');
  if (!(d.hi instanceof Uint32Array) || !(d.lo instanceof Uint32Array) || d.hi.length !== d.lo.length)
    throw new TypeError('hi and lo must be Uint32Arrays of one length');
  check.optionalBoundedId(d.workflowId, 'workflowId', maxIdBytes);
  check.optionalNonNegativeInt(d.workflowStep, 'workflowStep');
  check.optionalBoundedId(d.anchor, 'anchor', maxIdBytes);
  check.optionalNonNegativeInt(d.claGroup, 'claGroup');
  if (d.contentAnchors !== undefined) checkContentAnchors(d.contentAnchors, maxIdBytes, maxAnchors);
  check.optionalHashHex(d.anchorNamespace, 'anchorNamespace');
  check.optionalId(d.id, 'id');
}

/**
 * Checks a KV event's blocks before any is applied: key halves as Uint32Arrays (what
 * hashTokens() and the event decoders give) and a length within both, each error naming the field.
 */
function checkBlocks(blocks: BlockSequence): void {
  check.object(blocks, 'blocks');
  const { hi, lo, length } = blocks;
  checkHashHalf(hi, 'blocks.hi');
  checkHashHalf(lo, 'blocks.lo');
  if (typeof length !== 'number') throw new TypeError(`blocks.length must be a number, got ${typeof length}`);
  const most = Math.min(hi.length, lo.length);
  if (!(Number.isInteger(length) && length >= 0 && length <= most))
    throw new RangeError(
      `blocks.length must be an integer from 0 to ${most} (the length of blocks.hi and blocks.lo), got ${length}`,
    );
  // a plain array is read as the index reads it (>>> 0): each entry must be a 32-bit half already
  if (!(hi instanceof Uint32Array)) checkHashEntries(hi, length, 'blocks.hi');
  if (!(lo instanceof Uint32Array)) checkHashEntries(lo, length, 'blocks.lo');
}

/** One half of the block hashes: a Uint32Array, or another array of numbers (not a string). */
function checkHashHalf(half: unknown, name: string): void {
  if (half instanceof Uint32Array) return;
  if (half === null || typeof half !== 'object' || !Number.isSafeInteger((half as ArrayLike<number>).length))
    throw new TypeError(`${name} must be a Uint32Array or an array of 32-bit numbers`);
}

function checkHashEntries(half: ArrayLike<number>, length: number, name: string): void {
  for (let i = 0; i < length; i++) {
    const v = half[i];
    if (!(Number.isInteger(v) && v >= 0 && v <= 0xffff_ffff))
      throw new TypeError(`${name}[${i}] must be an integer from 0 to 2^32 - 1`);
  }
}

/** A KV event's tier, as the index keeps it. */
function tierOf(tier: 'gpu' | 'offload'): Tier {
  if (tier === 'gpu') return Tier.Gpu;
  if (tier === 'offload') return Tier.Offload;
  const message = "tier must be 'gpu' or 'offload'";
  const given: unknown = tier;
  if (typeof given === 'string') throw new RangeError(`${message}, got ${quotedText(given)}`);
  throw new TypeError(`${message}, got ${check.typeName(given)}`);
}
