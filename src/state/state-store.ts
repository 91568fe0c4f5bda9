import type { KVAwareRouter, RouteRequest, SharedDecision } from '../core/router/index.js';
import { MAX_WORKERS } from '../core/worker-registry.js';

/** A worker as the gateway takes it and the replicas share it. */
export interface WorkerRecord {
  id: string;
  /** The engine's origin, without a path (the router adds /v1/…), e.g. http://10.0.0.5:8000 */
  url: string;
  claGroups?: number[];
  /** Models the engine serves; a request naming another model is not sent to it (absent: any). */
  models?: string[];
  /** The engine's KV-event PUB endpoint (tcp://host:port), subscribed in precise mode. */
  events?: string;
  /** The engine's replay ROUTER endpoint, for gaps in the event stream. */
  replay?: string;
  /** Prometheus endpoint for load metrics (default `{url}/metrics`). */
  metrics?: string;
  /** The environment variable holding the engine's API key (each replica reads its own). */
  apiKeyEnv?: string;
  /** Data-parallel ranks behind the URL (vLLM --data-parallel-size); rank r's events on the events port + r. */
  dpSize?: number;
  /**
   * The first of the ranks' global ranks (vLLM --data-parallel-start-rank S, a node of a
   * multi-node deployment): ranks S…S+dpSize−1, ids ID#S…, events on the port + S…; requests
   * name rank S + i as `X-data-parallel-rank: i` (engine-deployments.ts workerRanks). Default 0.
   */
  dpStartRank?: number;
  /** Tokens per KV block on this engine (default: the router's --block-size). */
  blockSize?: number;
}

/**
 * Where a worker change comes from: a running replica's message, or the shared registry read;
 * 'replaced': a worker held here with another record than the registry's, removed and added
 * again with the registry's (one change: said once, as the addition).
 */
export type WorkerChangeSource = 'replica' | 'registry' | 'replaced';

/** What a state store needs from the gateway it serves. */
export interface StateStoreHost {
  router: KVAwareRouter;
  /** The gateway's workers (what this replica would register in the shared registry). */
  listWorkers(): WorkerRecord[];
  /**
   * Adds a worker because another replica did; must not call back into the store. `from`
   * 'registry': read from the shared registry (at start, or on resynchronising), where any
   * replica may have put it, running or not; else heard from a replica that is running.
   */
  addWorkerFromState(worker: WorkerRecord, from?: WorkerChangeSource): void;
  /**
   * Removes a worker because another replica did; must not call back into the store. `from`
   * 'registry': the shared registry records its removal (through the admin API, by any replica).
   */
  removeWorkerFromState(workerId: string, from?: WorkerChangeSource): void;
  /** Drains (true) or resumes (false) a worker because another replica did; must not call back into the store. */
  drainWorkerFromState?(workerId: string, draining: boolean): void;
  /** Applies KV events (JSON, as `POST /admin/events` takes them) another replica was given; must not call back. */
  applyKvEventsFromState?(workerId: string, events: unknown): void;
  log(message: string): void;
}

export type StateStats = Record<string, number | boolean | string>;

/** A change of the worker registry through the admin API, as the shared state decides it (orderWorkerChange()). */
export type WorkerChange =
  | { op: 'add'; worker: WorkerRecord }
  | { op: 'remove'; id: string }
  /** `id` may name a data-parallel rank (`ID#r`): its worker drains (or resumes). */
  | { op: 'drain'; id: string; draining: boolean };

/**
 * The shared state's answer to a WorkerChange: made (`id` the worker changed: a rank's drain
 * names its worker), or refused with the status and message the admin API answers.
 */
export type WorkerChangeVerdict =
  { ok: true; id: string } | { ok: false; status: number; message: string; param?: string };

/**
 * Why worker `id` (of `dpSize` data-parallel ranks) is not added while `registered` ranks are: a
 * router holds at most MAX_WORKERS. `param` names what the client can change: the ranks, when
 * the worker alone would fit.
 */
export function workerLimitRefusal(
  id: string,
  dpSize: number,
  registered: number,
): { message: string; param: 'id' | 'dpSize' } {
  return {
    message:
      `worker '${id}' not added: the router holds at most ${MAX_WORKERS} workers (each data-parallel rank is one), ` +
      `${registered} are registered${dpSize > 1 ? ` and this one has ${dpSize} ranks` : ''}`,
    param: dpSize > 1 && registered + 1 <= MAX_WORKERS ? 'dpSize' : 'id',
  };
}

/** The shared state did not answer an admin change (or read) within its bound: the admin API answers 503. */
export class SharedStateUnanswered extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SharedStateUnanswered';
  }
}

/**
 * Where a router replica keeps what it learns so other replicas can use it: the worker
 * registry, in-flight work per worker, workflow → worker affinities, anchor homes and the
 * approximate index's block entries. The router core stays the working copy every decision
 * reads (synchronous, in memory); a store copies decisions out and other replicas' decisions
 * in. The in-memory store is a single replica's: it shares nothing.
 */
export interface StateStore {
  readonly kind: 'memory' | 'redis' | 'cluster';
  /** Whether the gateway should ask route() for `shared` decisions to pass to decisionMade(). */
  readonly sharesDecisions: boolean;
  /** Binds the store to a gateway and loads what the shared state already holds. */
  attach(host: StateStoreHost): Promise<void>;
  /**
   * Called before routing a request: returns a promise when something must be learnt first
   * (a workflow this replica has not seen may already live on a worker), else undefined so
   * the hot path does not await.
   */
  beforeRoute(request: RouteRequest): Promise<void> | undefined;
  /** A tracked decision this replica made (route() with share). */
  decisionMade(decision: SharedDecision): void;
  /**
   * The request of a tracked decision finished its prefill (its first token arrived): the
   * other replicas move its tokens from queued prefill to decode load. At most once per decision.
   */
  decisionPrefilled(decision: SharedDecision): void;
  /** The request of a tracked decision ended (completed, failed, abandoned): its work left the worker. */
  decisionEnded(decision: SharedDecision): void;
  /**
   * The engine refused the request of a tracked decision, holding none of it (see
   * KVAwareRouter.markRefused()): the other replicas withdraw what the decision alone added
   * there (KVAwareRouter.refuseSharedDecision()). Called before decisionPrefilled() and decisionEnded().
   */
  decisionRefused(decision: SharedDecision): void;
  /** The registry changed through this replica's admin API, configuration or DNS discovery. */
  workerAdded(worker: WorkerRecord): void;
  /**
   * `record` (default true: a removal through the admin API): the removal is recorded, so a
   * replica configured with the worker that starts later does not bring it back. DNS
   * discovery's removals are not (every replica reads the DNS records itself).
   */
  workerRemoved(workerId: string, options?: { record?: boolean }): void;
  /** A worker was drained (true) or resumed (false) through this replica's admin API. */
  workerDrained(workerId: string, draining: boolean): void;
  /**
   * KV events were posted to this replica's admin API (JSON, already applied here): the
   * other replicas apply them too. `workerId` may name a data-parallel rank (`ID#r`).
   */
  kvEventsPosted(workerId: string, events: unknown): void;
  /**
   * Present when the shared state decides the admin API's worker changes in one order (the
   * cluster store; the Redis store while Redis is up, see decidesWorkerChanges()): instead of
   * the replica deciding against its own view and telling the others (workerAdded(),
   * workerRemoved(), workerDrained()), it sends `change` to be decided.
   * `apply` is called with the verdict as it arrives, after every change decided before it is
   * applied here and before any decided after it is (the other replicas are told of a change
   * the verdict makes before the verdict is sent); the promise resolves with what it returns
   * (rejects with what it throws). Rejects with SharedStateUnanswered when no verdict comes
   * within the store's bound; a verdict that comes later is still applied.
   */
  orderWorkerChange?<T>(change: WorkerChange, apply: (verdict: WorkerChangeVerdict) => T): Promise<T>;
  /**
   * Present with orderWorkerChange(): resolves once every worker change decided before the call
   * is applied here (an admin read then shows every change some replica has answered); rejects
   * with SharedStateUnanswered past the store's bound.
   */
  syncWorkerChanges?(): Promise<void>;
  /**
   * Present with orderWorkerChange() when the store decides worker changes only at times (the
   * Redis store: while Redis is up): false now, the replica decides a change against its own
   * view and tells the others (workerAdded() and the like), as without orderWorkerChange().
   */
  decidesWorkerChanges?(): boolean;
  stats(): StateStats;
  close(): Promise<void>;
}

/** The default: one replica, its router is the whole state. */
export class MemoryStateStore implements StateStore {
  readonly kind = 'memory';
  readonly sharesDecisions = false;
  async attach(): Promise<void> {}
  beforeRoute(): undefined {
    return undefined;
  }
  decisionMade(): void {}
  decisionPrefilled(): void {}
  decisionEnded(): void {}
  decisionRefused(): void {}
  workerAdded(): void {}
  workerRemoved(): void {}
  workerDrained(): void {}
  kvEventsPosted(): void {}
  stats(): StateStats {
    return { kind: 'memory' };
  }
  async close(): Promise<void> {}
}
