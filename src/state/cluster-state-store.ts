import { LRUCache } from 'lru-cache';
import type { RouteRequest, SharedDecision } from '../core/router/index.js';
import { isRemoteAmount, RemoteLoad, type ReplicaLoad } from './remote-load.js';
import { ROUTER_DEFAULTS } from '../core/router/options-schema.js';
import { MAX_WORKERS } from '../core/worker-registry.js';
import { isId, isWorkerId } from '../core/validate.js';
import { shownText } from '../core/shown-text.js';
import { hasRank } from '../server/engine-deployments.js';
import { parseWorkerRecord } from '../server/worker-input.js';
import {
  DECIDED,
  hasShape,
  isFlag,
  isText,
  isWorkerRecord,
  isWorkflowStep,
  KV_EVENTS,
  optional,
  PREFILLED,
  REFUSED,
  RELEASED,
  WORKER_ADDED,
  WORKER_REMOVED,
  workerDrained,
  type FieldCheck,
  type Shape,
} from './message-checks.js';
import { decisionIdOf, writeDecisionFields, type DecisionFields } from './redis-wire.js';
import {
  SharedStateUnanswered,
  type StateStats,
  type StateStore,
  type StateStoreHost,
  type WorkerChange,
  type WorkerChangeVerdict,
  type WorkerRecord,
  workerLimitRefusal,
} from './state-store.js';

/**
 * Shared state for the gateway processes of one machine (`serve --processes N`): the primary
 * process relays what each gateway process learns to the others over the cluster's IPC
 * channels, and keeps the few things that must have one answer (which worker a workflow
 * lives on) so that the processes route as one router. The same StateStore interface as the
 * Redis store, so the gateway does not know which one it has; with `--state redis` the
 * processes use Redis instead and this relay is not started.
 *
 * Messages travel with the `advanced` serialization (structured clone), so block hashes
 * cross as Uint32Arrays. Every message carries `cf` (its kind) so the channel can carry other
 * traffic too. What a process sends in one turn of its event loop goes as one `batch` (every
 * request sends a decision and a release, and each IPC message is a write and a read in the
 * sender, the relay and every other process); what someone waits on (a workflow lookup and
 * its answer, the start snapshot) goes at once, after what was queued before it.
 */

/** What a gateway process can send to the relay and receive from it. */
export type ClusterMessage =
  | ({
      cf: 'decision';
      r: string;
      w: string;
      hi: Uint32Array;
      lo: Uint32Array;
      claim?: boolean;
      /**
       * The relay's number for the decision, set as it relays it (and kept in a start snapshot):
       * a process that applied the decision before its snapshot does not apply it again.
       */
      n?: number;
    } & DecisionFields)
  /** A tracked request's first token: q tokens leave its queued prefill, d join the decode load; i its decision's id. */
  | { cf: 'prefilled'; r: string; w: string; q: number; d: number; i?: string }
  /** A tracked request ended; d present when its 'prefilled' was sent (then q already left the prefill). */
  | { cf: 'released'; r: string; w: string; q: number; d?: number; i?: string }
  /** A tracked request's engine refused it, holding none of it: what decision i alone added is withdrawn. */
  | { cf: 'refused'; r: string; w: string; i: string }
  | { cf: 'worker-added'; r: string; worker: WorkerRecord }
  /** `record` false: a removal the relay does not keep for processes that start later (DNS discovery's). */
  | { cf: 'worker-removed'; r: string; id: string; record?: boolean }
  /** A worker drained (true) or resumed (false) through a process's admin API. */
  | { cf: 'worker-drained'; r: string; id: string; draining: boolean }
  /** KV events posted to a process's admin API (JSON, as it took them), for the others to apply. */
  | { cf: 'kv-events'; r: string; w: string; events: unknown }
  | { cf: 'workflow?'; r: string; q: number; id: string }
  | { cf: 'workflow'; q: number; id: string; w?: string; s?: number | null }
  /** An admin worker change for the relay to decide against its registry, in the order changes arrive. */
  | { cf: 'change?'; r: string; q: number; change: WorkerChange }
  /** The relay's verdict on change q, sent after the change (when made) went to every other process. */
  | { cf: 'change'; q: number; v: WorkerChangeVerdict }
  /** Asks the relay to answer once what it sent this process before is delivered (an admin read). */
  | { cf: 'sync?'; r: string; q: number }
  | { cf: 'sync'; q: number }
  /** `ttl`: the process's router's prediction lifetime (older decisions are not replayed to it). */
  | { cf: 'hello'; r: string; ttl?: number }
  | {
      cf: 'snapshot';
      workers: WorkerRecord[];
      workflows: Array<[string, string, number | null]>;
      decisions: ClusterDecision[];
      /** [replica, worker, requests, prefill, decode] */
      loads: Array<[string, string, number, number, number]>;
      /** Workers drained through the admin API and not resumed. */
      draining?: string[];
      /** Workers removed through the admin API (and not added again): a process configured with one does not bring it back. */
      removed?: string[];
    }
  | { cf: 'gone'; r: string }
  | { cf: 'batch'; m: ClusterMessage[] };
type ClusterDecision = Extract<ClusterMessage, { cf: 'decision' }>;

/** The IPC channel of a gateway process (process.send / process.on('message')), or a test double. */
export interface ClusterChannel {
  send(message: ClusterMessage): void;
  onMessage(listener: (message: unknown) => void): void;
  offMessage(listener: (message: unknown) => void): void;
  /** Calls `listener` once the channel closes (the primary is gone): nothing sent is answered after that. */
  onClose?(listener: () => void): void;
}

export interface ClusterStateOptions {
  /** This process's id among the gateway processes. */
  replicaId: string;
  channel: ClusterChannel;
  /** How long to wait for the relay's answers (workflow lookups, the start snapshot; default 250 ms). */
  timeoutMs?: number;
  /** How long an admin worker change or read waits for the relay's answer before it is answered 503 (default 5 s). */
  adminTimeoutMs?: number;
}

function isMessage(m: unknown): m is ClusterMessage {
  return m !== null && typeof m === 'object' && typeof (m as { cf?: unknown }).cf === 'string';
}

const isArray: FieldCheck = (v) => Array.isArray(v);
const isNumber: FieldCheck = (v) => typeof v === 'number';
const isHashHalf: FieldCheck = (v) => v instanceof Uint32Array;
/** A workflow id, as the router takes one (isId). */
const isWorkflowId: FieldCheck = isId;
/** The relay's number of a decision it relayed: from 1 up. */
const isDecisionNumber: FieldCheck = (v) => Number.isSafeInteger(v) && (v as number) > 0;

/** An admin worker change: the record itself the relay checks as a gateway does (parseWorkerRecord()). */
const isWorkerChange: FieldCheck = (v) => {
  if (v === null || typeof v !== 'object') return false;
  const c = v as Partial<Record<string, unknown>>;
  switch (c.op) {
    case 'add':
      return isWorkerRecord(c.worker);
    case 'remove':
      return isWorkerId(c.id);
    case 'drain':
      return isWorkerId(c.id) && isFlag(c.draining);
    default:
      return false;
  }
};
const isVerdict: FieldCheck = (v) => {
  if (v === null || typeof v !== 'object') return false;
  const x = v as Partial<Record<string, unknown>>;
  return x.ok === true
    ? isWorkerId(x.id)
    : x.ok === false && isNumber(x.status) && isText(x.message) && optional(isText)(x.param);
};

/** Why an admin change or read is refused once the channel to the primary closed. */
const PRIMARY_GONE =
  'the primary process is gone (this process finishes its requests and stops): the worker change or read was not answered';

/** Most admin changes waiting for (or past waiting for) the relay's verdict; past it the oldest is dropped unapplied. */
const MOST_PENDING_CHANGES = 10_000;

/**
 * Most decisions a starting process remembers having applied until its start snapshot comes
 * (the snapshot replays at most the relay's recentDecisions, 10,000 by default): past it, the
 * oldest are forgotten, and a snapshot that comes that late applies them again.
 */
const HEARD_BEFORE_SNAPSHOT = 100_000;

/**
 * The shape each kind of message must have beside `cf`: the fields the Redis channel carries
 * too are checked by the same rules (message-checks.ts), so a defect in one process (a bad id,
 * an amount out of range, a field of the wrong kind) is counted and dropped by the relay and by
 * every process, and corrupts no other's index or tallies. How many blocks a decision may have
 * depends on the router's settings: the router checks that as it applies it (applySharedDecision()),
 * and the relay, given the same settings, before it counts or keeps any of it (mostBlocks()).
 */
const SHAPES: { readonly [K in ClusterMessage['cf']]: Shape } = {
  decision: {
    ...DECIDED,
    hi: isHashHalf,
    lo: isHashHalf,
    wf: optional(isWorkflowId),
    s: isWorkflowStep,
    claim: optional(isFlag),
    n: optional(isDecisionNumber),
  },
  prefilled: PREFILLED,
  released: RELEASED,
  refused: REFUSED,
  'worker-added': WORKER_ADDED,
  'worker-removed': { ...WORKER_REMOVED, record: optional(isFlag) },
  'worker-drained': workerDrained('draining'),
  'kv-events': KV_EVENTS,
  'workflow?': { r: isText, q: isNumber, id: isWorkflowId },
  'change?': { r: isText, q: isNumber, change: isWorkerChange },
  change: { q: isNumber, v: isVerdict },
  'sync?': { r: isText, q: isNumber },
  sync: { q: isNumber },
  workflow: { q: isNumber, id: isWorkflowId, w: optional(isWorkerId), s: isWorkflowStep },
  hello: { r: isText, ttl: optional((v) => typeof v === 'number' && v > 0 && Number.isFinite(v)) },
  snapshot: {
    workers: isArray,
    workflows: isArray,
    decisions: isArray,
    loads: isArray,
    draining: optional(isArray),
    removed: optional(isArray),
  },
  gone: { r: isText },
  batch: { m: isArray },
};

/** Whether a message has its kind's shape (a decision's two halves also of one length). */
function isWellFormed(m: ClusterMessage): boolean {
  if (!Object.hasOwn(SHAPES, m.cf) || !hasShape(m, SHAPES[m.cf])) return false;
  return m.cf !== 'decision' || m.hi.length === m.lo.length;
}

/** A start snapshot's workflow entry: [workflow, worker, step]. */
function isWorkflowEntry(e: unknown): e is [string, string, number | null] {
  return Array.isArray(e) && isWorkflowId(e[0]) && isWorkerId(e[1]) && isWorkflowStep(e[2]);
}

/** A start snapshot's load entry: [process, worker, requests, prefill, decode], each amount isRemoteAmount(). */
function isLoadEntry(e: unknown): e is [string, string, number, number, number | undefined] {
  return (
    Array.isArray(e) &&
    isText(e[0]) &&
    isWorkerId(e[1]) &&
    isRemoteAmount(e[2]) &&
    isRemoteAmount(e[3]) &&
    optional(isRemoteAmount)(e[4])
  );
}

/** Messages to one destination, sent as one batch per turn of the event loop (see above). */
class Outbox {
  private queue: ClusterMessage[] = [];
  private scheduled = false;

  constructor(private readonly deliver: (m: ClusterMessage) => void) {}

  push(m: ClusterMessage): void {
    this.queue.push(m);
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  /** Sends what is queued and then `m`, now: someone is waiting for it. */
  now(m: ClusterMessage): void {
    this.queue.push(m);
    this.flush();
  }

  flush(): void {
    this.scheduled = false;
    const q = this.queue;
    if (q.length === 0) return;
    this.queue = [];
    this.deliver(q.length === 1 ? q[0] : { cf: 'batch', m: q });
  }
}

/** The gateway process's side: a StateStore whose shared state is the relay in the primary. */
export class ClusterStateStore implements StateStore {
  readonly kind = 'cluster';
  readonly sharesDecisions = true;
  readonly replicaId: string;
  private readonly channel: ClusterChannel;
  private readonly timeoutMs: number;
  private host: StateStoreHost | undefined;
  /** The other processes' in-flight work, on the workers this process's router has (see RemoteLoad). */
  private readonly remote = new RemoteLoad({
    // a data-parallel rank's `ID#r`, as decisions name it, is a worker of the router too
    hasWorker: (id) => this.host?.router.hasWorker(id) === true,
    onRefused: (why) =>
      this.host?.log(
        `state: other processes' load refused past a bound (${why}); further refusals are only counted (state.remoteLoadRefused)`,
      ),
  });
  /** Own decisions whose 'prefilled' was sent: their release takes decode tokens off, not prefill. */
  private readonly prefilled = new WeakSet<SharedDecision>();
  private nextQuery = 1;
  private readonly queries = new Map<number, () => void>();
  private readonly adminTimeoutMs: number;
  /** Admin changes and reads waiting for the relay, by query: called with its answer (a sync's is undefined). */
  private readonly pendingAdmin = new Map<
    number,
    { done: (v: WorkerChangeVerdict | undefined) => void; fail: (err: Error) => void }
  >();
  private snapshotArrived: (() => void) | undefined;
  /** The channel to the primary closed: no question is sent any more, and those waiting are settled. */
  private primaryGone = false;
  /**
   * Until the start snapshot comes: the relay's numbers of the decisions applied here, which the
   * snapshot holds too (the relay sends it after them). Applied once: a second time, without its
   * id, a decision would take over its own blocks, and its refusal would withdraw none of them.
   */
  private heardBeforeSnapshot: Set<number> | undefined;
  /**
   * Workflows the relay did not know: the decision that follows claims them. A lookup no
   * decision follows (no worker to route to, the client gone) stays until it is the oldest of
   * unclaimedLimit, and is dropped then: a full set must not stop new workflows from being claimed.
   */
  private readonly unclaimed = new Set<string>();
  /** The most unclaimed workflows kept (the router's workflow capacity, set by attach()). */
  private unclaimedLimit = 1;
  /** The workers the relay's start snapshot named: this process announces only those it adds. */
  private registered: Set<string> | undefined;
  private readonly counters = {
    decisionsSent: 0,
    decisionsApplied: 0,
    decisionsUnknownWorker: 0,
    /** Refusals of other processes' decisions that withdrew blocks here. */
    refusalsWithdrawn: 0,
    workflowLookups: 0,
    workflowLookupTimeouts: 0,
    malformedMessages: 0,
  };
  private readonly listener = (m: unknown) => this.onMessage(m);
  private readonly outbox: Outbox;

  constructor(options: ClusterStateOptions) {
    this.replicaId = options.replicaId;
    this.channel = options.channel;
    this.timeoutMs = options.timeoutMs ?? 250;
    this.adminTimeoutMs = options.adminTimeoutMs ?? 5000;
    this.outbox = new Outbox((m) => this.channel.send(m));
  }

  async attach(host: StateStoreHost): Promise<void> {
    this.host = host;
    this.unclaimedLimit = host.router.workflowCapacity;
    this.heardBeforeSnapshot = new Set();
    this.channel.onMessage(this.listener);
    this.channel.onClose?.(() => this.channelClosed());
    const arrived = new Promise<void>((resolve) => {
      this.snapshotArrived = resolve;
      setTimeout(resolve, 4 * this.timeoutMs).unref();
    });
    this.outbox.now({ cf: 'hello', r: this.replicaId, ttl: host.router.predictionTtlMs });
    await arrived;
    this.snapshotArrived = undefined;
    // what this process was configured with and the registry lacks, for the other processes
    // and those that start later; without a snapshot (the relay did not answer) all of it
    for (const w of host.listWorkers())
      if (!this.registered?.has(w.id)) this.outbox.push({ cf: 'worker-added', r: this.replicaId, worker: w });
    this.registered = undefined;
  }

  beforeRoute(request: RouteRequest): Promise<void> | undefined {
    const id = request.workflowId;
    if (id === undefined || !this.host || this.host.router.workflowAffinity(id) !== undefined) return undefined;
    // no primary to ask: the workflow is routed on what this process knows
    if (this.primaryGone) return undefined;
    this.counters.workflowLookups++;
    const q = this.nextQuery++;
    return new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.queries.delete(q);
        this.counters.workflowLookupTimeouts++;
        resolve();
      }, this.timeoutMs);
      this.queries.set(q, () => {
        clearTimeout(timer);
        resolve();
      });
      this.outbox.now({ cf: 'workflow?', r: this.replicaId, q, id });
    });
  }

  /** A workflow the relay did not know: the decision that follows claims it; the oldest such lookup makes room. */
  private markUnclaimed(id: string): void {
    this.unclaimed.delete(id);
    if (this.unclaimed.size >= this.unclaimedLimit) this.unclaimed.delete(this.unclaimed.values().next().value!);
    this.unclaimed.add(id);
  }

  decisionMade(d: SharedDecision): void {
    const m: ClusterDecision = { cf: 'decision', r: this.replicaId, w: d.workerId, hi: d.hi, lo: d.lo };
    writeDecisionFields(d, m);
    if (d.workflowId !== undefined && this.unclaimed.delete(d.workflowId)) m.claim = true;
    this.counters.decisionsSent++;
    this.outbox.push(m);
  }

  decisionPrefilled(d: SharedDecision): void {
    if (!d.tracked || this.prefilled.has(d)) return;
    this.prefilled.add(d);
    const m: ClusterMessage = {
      cf: 'prefilled',
      r: this.replicaId,
      w: d.workerId,
      q: d.prefillTokens,
      d: d.decodeTokens,
    };
    if (d.id !== undefined) m.i = d.id;
    this.outbox.push(m);
  }

  decisionEnded(d: SharedDecision): void {
    if (!d.tracked) return;
    const m: ClusterMessage = { cf: 'released', r: this.replicaId, w: d.workerId, q: d.prefillTokens };
    if (this.prefilled.has(d)) m.d = d.decodeTokens;
    if (d.id !== undefined) m.i = d.id;
    this.outbox.push(m);
  }

  decisionRefused(d: SharedDecision): void {
    if (d.tracked && d.id !== undefined) this.outbox.push({ cf: 'refused', r: this.replicaId, w: d.workerId, i: d.id });
  }

  workerAdded(worker: WorkerRecord): void {
    this.outbox.push({ cf: 'worker-added', r: this.replicaId, worker });
  }

  workerRemoved(workerId: string, options: { record?: boolean } = {}): void {
    // its tallies (its ranks') go with it: a worker added again starts from nothing
    this.remote.forgetUnknownWorkers();
    const m: ClusterMessage = { cf: 'worker-removed', r: this.replicaId, id: workerId };
    if (options.record === false) m.record = false;
    this.outbox.push(m);
  }

  workerDrained(workerId: string, draining: boolean): void {
    this.outbox.push({ cf: 'worker-drained', r: this.replicaId, id: workerId, draining });
  }

  kvEventsPosted(workerId: string, events: unknown): void {
    this.outbox.push({ cf: 'kv-events', r: this.replicaId, w: workerId, events });
  }

  orderWorkerChange<T>(change: WorkerChange, apply: (verdict: WorkerChangeVerdict) => T): Promise<T> {
    return this.askRelay(
      (q) => ({ cf: 'change?', r: this.replicaId, q, change }),
      `the primary process did not decide the worker change within ${this.adminTimeoutMs} ms (it is busy or stopping); it may still be made: read /admin/workers before trying again`,
      (v) => apply(v!),
    );
  }

  syncWorkerChanges(): Promise<void> {
    return this.askRelay(
      (q) => ({ cf: 'sync?', r: this.replicaId, q }),
      `the primary process did not answer within ${this.adminTimeoutMs} ms (it is busy or stopping): this process cannot tell whether its workers are current`,
      () => undefined,
    );
  }

  /**
   * Sends the relay the question made with a fresh query id, and settles with `answer` of its
   * reply, called as the reply is read (in the channel's order). Past adminTimeoutMs rejects
   * with SharedStateUnanswered; a late reply is still given to `answer` (its change is made
   * everywhere else), its result dropped.
   */
  private askRelay<T>(
    question: (q: number) => ClusterMessage,
    unanswered: string,
    answer: (v: WorkerChangeVerdict | undefined) => T,
  ): Promise<T> {
    if (this.primaryGone) return Promise.reject(new SharedStateUnanswered(PRIMARY_GONE));
    const q = this.nextQuery++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => reject(new SharedStateUnanswered(unanswered)), this.adminTimeoutMs);
      if (this.pendingAdmin.size >= MOST_PENDING_CHANGES)
        this.pendingAdmin.delete(this.pendingAdmin.keys().next().value!);
      this.pendingAdmin.set(q, {
        done: (v) => {
          clearTimeout(timer);
          try {
            resolve(answer(v));
          } catch (err) {
            reject(err as Error);
          }
        },
        fail: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      });
      this.outbox.now(question(q));
    });
  }

  stats(): StateStats {
    return {
      kind: 'cluster',
      replicaId: this.replicaId,
      ...this.counters,
      remoteLoadClamped: this.remote.clamped,
      remoteLoadUnknownWorkers: this.remote.unknownWorkers,
      remoteLoadRefused: this.remote.refused,
    };
  }

  /**
   * The primary is gone (killed, say): what waits for its answer is settled now, not at its
   * timeout: a workflow lookup routes on what this process knows, an admin change or read is
   * refused as unanswered (503), and so is every later one.
   */
  private channelClosed(): void {
    this.primaryGone = true;
    this.snapshotArrived?.();
    for (const done of this.queries.values()) done();
    this.queries.clear();
    for (const { fail } of this.pendingAdmin.values()) fail(new SharedStateUnanswered(PRIMARY_GONE));
    this.pendingAdmin.clear();
  }

  async close(): Promise<void> {
    this.outbox.flush();
    this.channel.offMessage(this.listener);
    for (const done of this.queries.values()) done();
    this.queries.clear();
    for (const { fail } of this.pendingAdmin.values())
      fail(new SharedStateUnanswered('this process is stopping: the worker change was not answered'));
    this.pendingAdmin.clear();
  }

  // ------------------------------------------------------------------------ internals

  private onMessage(m: unknown): void {
    if (!isMessage(m) || !this.host) return;
    if (!isWellFormed(m)) return void this.counters.malformedMessages++;
    const host = this.host;
    try {
      switch (m.cf) {
        case 'batch':
          for (const inner of m.m)
            if (isMessage(inner) && inner.cf !== 'batch') this.onMessage(inner);
            else this.counters.malformedMessages++;
          return;
        case 'decision':
          if (m.r === this.replicaId) return;
          if (this.apply(m) && m.n !== undefined) this.heardBefore(m.n);
          if (typeof m.q === 'number' && this.remote.decided(m.r, m.w, m.q)) this.applyRemote(m.w);
          return;
        case 'prefilled':
          if (m.r === this.replicaId) return;
          host.router.settleSharedDecision({ id: decisionIdOf(m) });
          if (this.remote.prefilled(m.r, m.w, m.q, m.d)) this.applyRemote(m.w);
          return;
        case 'released':
          if (m.r === this.replicaId) return;
          host.router.settleSharedDecision({ id: decisionIdOf(m) });
          if (this.remote.released(m.r, m.w, m.q, m.d)) this.applyRemote(m.w);
          return;
        case 'refused':
          if (m.r !== this.replicaId && host.router.refuseSharedDecision({ id: decisionIdOf(m) }) > 0)
            this.counters.refusalsWithdrawn++;
          return;
        case 'worker-added':
          if (m.r !== this.replicaId && !host.listWorkers().some((w) => w.id === m.worker.id))
            host.addWorkerFromState(m.worker);
          return;
        case 'worker-removed':
          if (m.r !== this.replicaId && host.listWorkers().some((w) => w.id === m.id)) {
            host.removeWorkerFromState(m.id);
            this.remote.forgetUnknownWorkers();
          }
          return;
        case 'worker-drained':
          if (m.r !== this.replicaId && host.listWorkers().some((w) => w.id === m.id))
            host.drainWorkerFromState?.(m.id, m.draining);
          return;
        case 'kv-events':
          if (m.r !== this.replicaId) host.applyKvEventsFromState?.(m.w, m.events);
          return;
        case 'workflow': {
          // the relay's word wins: it is the first step any process routed
          if (m.w !== undefined) host.router.setWorkflowAffinity(m.id, m.w, m.s ?? null);
          else this.markUnclaimed(m.id);
          const done = this.queries.get(m.q);
          if (done) {
            this.queries.delete(m.q);
            done();
          }
          return;
        }
        case 'change':
        case 'sync': {
          const done = this.pendingAdmin.get(m.q);
          if (!done) return;
          this.pendingAdmin.delete(m.q);
          done.done(m.cf === 'change' ? m.v : undefined);
          return;
        }
        case 'gone':
          if (this.remote.drop(m.r)) for (const w of host.router.listWorkers()) this.applyRemote(w.id);
          return;
        case 'snapshot': {
          // each entry checked on its own: one malformed entry is counted, the rest still loads
          const valid = <T>(entries: readonly unknown[], check: (e: unknown) => e is T): T[] =>
            entries.filter((e): e is T => check(e) || (this.counters.malformedMessages++, false));
          const isDecision = (d: unknown): d is ClusterDecision =>
            isMessage(d) && d.cf === 'decision' && isWellFormed(d);
          // the shared registry wins over this process's flags: a worker removed through the
          // admin API stays removed when a process configured with it (re)starts
          const removed = new Set(valid(m.removed ?? [], isWorkerId));
          for (const w of [...host.listWorkers()]) if (removed.has(w.id)) host.removeWorkerFromState(w.id, 'registry');
          this.remote.forgetUnknownWorkers();
          const workers = valid(m.workers, isWorkerRecord);
          for (const w of workers)
            if (!host.listWorkers().some((x) => x.id === w.id)) host.addWorkerFromState(w, 'registry');
          this.registered = new Set(workers.map((w) => w.id));
          for (const id of valid(m.draining ?? [], isWorkerId))
            if (host.listWorkers().some((w) => w.id === id)) host.drainWorkerFromState?.(id, true);
          for (const [id, w, s] of valid(m.workflows, isWorkflowEntry)) host.router.setWorkflowAffinity(id, w, s);
          // not kept to withdraw: whether they are past refusal was not heard here; those
          // relayed to this process before the snapshot and applied then are not applied again
          const heard = this.heardBeforeSnapshot;
          this.heardBeforeSnapshot = undefined;
          for (const d of valid(m.decisions, isDecision))
            if (d.r !== this.replicaId && !(d.n !== undefined && heard?.has(d.n)))
              this.applyOne({ ...d, wf: undefined, s: undefined, i: undefined });
          // the relay's tallies count every message it sent this process before the snapshot (the
          // relay sends it after them): those heard here, and any sent before this process
          // listened. They replace what was heard, else a request relayed just before the
          // snapshot would count twice and stay counted once released
          const loads = new Map<string, ReplicaLoad>();
          for (const [replica, worker, requests, prefill, decode] of valid(m.loads, isLoadEntry)) {
            if (replica === this.replicaId) continue;
            const load = loads.get(replica) ?? loads.set(replica, new Map()).get(replica)!;
            load.set(worker, { requests, prefill, decode: decode ?? 0 });
          }
          this.remote.clear();
          for (const [replica, load] of loads) this.remote.replace(replica, load);
          for (const w of host.router.listWorkers()) this.applyRemote(w.id);
          this.snapshotArrived?.();
          return;
        }
        default:
          return;
      }
    } catch {
      this.counters.malformedMessages++;
    }
  }

  /** Sums the other processes' work on a worker into the router's view. */
  private applyRemote(workerId: string): void {
    const router = this.host!.router;
    if (router.hasWorker(workerId)) router.setRemoteLoad(workerId, this.remote.sum(workerId));
  }

  /** A decision relayed before the start snapshot was applied: the snapshot does not apply it again. */
  private heardBefore(n: number): void {
    const heard = this.heardBeforeSnapshot;
    if (!heard) return;
    if (heard.size >= HEARD_BEFORE_SNAPSHOT) heard.delete(heard.values().next().value!);
    heard.add(n);
  }

  /** apply(), a malformed decision counted (one of a snapshot's: the rest still loads). */
  private applyOne(m: ClusterDecision): void {
    try {
      this.apply(m);
    } catch {
      this.counters.malformedMessages++;
    }
  }

  /** Applies another process's decision; false when its worker is not this router's (nothing applied). */
  private apply(m: ClusterDecision): boolean {
    const applied = this.host!.router.applySharedDecision({
      workerId: m.w,
      hi: m.hi,
      lo: m.lo,
      workflowId: m.wf,
      workflowStep: m.s ?? null,
      anchor: m.a,
      claGroup: m.c ?? null,
      contentAnchors: m.ca,
      anchorNamespace: m.ns,
      id: decisionIdOf(m),
    });
    if (applied) this.counters.decisionsApplied++;
    else this.counters.decisionsUnknownWorker++;
    return applied;
  }
}

export interface ClusterRelayOptions {
  /** Most recent decisions kept for processes that start later (default 10,000). */
  recentDecisions?: number;
  /**
   * How long those decisions are kept (default 120 s, the approximate index's lifetime). A
   * process that starts is replayed only those younger than its own router's prediction
   * lifetime, which its hello names (5 s in precise mode).
   */
  decisionTtlMs?: number;
  /** Most workflows remembered (default 100,000; least recently routed dropped first). */
  workflows?: number;
  /** Most admin removals remembered (default 100,000; the oldest forgotten first). */
  removals?: number;
  /**
   * The processes' routers' longest prompt and block size, as they are configured (defaults:
   * the router's): a decision with more blocks than a router takes for its worker
   * (applySharedDecision()) is counted and dropped here, before any of it counts.
   */
  maxPromptTokens?: number;
  blockSize?: number;
  /** Where the relay says it refused something past a bound (once for each bound). */
  log?: (message: string) => void;
}

/** How long the relay remembers a removal through the admin API (the Redis store keeps its record as long). */
const REMOVAL_KEPT_MS = 24 * 3_600_000;

/** A gateway process as the relay sees it (a cluster worker, or a test double). */
export interface RelayPeer {
  readonly id: string;
  send(message: ClusterMessage): void;
}

/**
 * The primary's side: relays each process's decisions, prefill-dones, releases, refusals and registry changes to the
 * other processes, answers workflow lookups (the first step routed claims the workflow, so
 * two processes starting one workflow at once agree), decides the admin API's worker changes
 * against its registry in the order they arrive (so two processes adding one id at once get
 * one 201 and one 409), and gives a process that starts (or restarts) the current state. One
 * thread, so every claim and every change is atomic.
 */
export class ClusterRelay {
  private readonly peers = new Map<string, { peer: RelayPeer; outbox: Outbox }>();
  /** Workflow → its worker and step, least recently routed dropped first. */
  private readonly workflows: LRUCache<string, { w: string; s: number | null }>;
  private readonly workers = new Map<string, WorkerRecord>();
  /** Their data-parallel ranks, in all: each is one of a router's workers (at most MAX_WORKERS). */
  private workerRanks = 0;
  /** Workers drained through a process's admin API, until resumed or removed (at most MAX_WORKERS). */
  private readonly draining = new Set<string>();
  /** Workers removed through a process's admin API, until added again (or forgotten: a day, the bound), by when, oldest first. */
  private readonly removed = new Map<string, number>();
  private readonly removalLimit: number;
  private readonly recent: Array<{ d: ClusterDecision; at: number }> = [];
  /**
   * Each process's in-flight work, for the snapshot a process that starts later gets (which
   * keeps only its router's workers of it): no registry here, so bounded by RemoteLoad's caps.
   */
  private readonly loads = new RemoteLoad();
  private readonly recentLimit: number;
  private readonly ttlMs: number;
  private readonly maxPromptTokens: number;
  private readonly blockSize: number;
  private readonly log: (message: string) => void;
  /** The bounds whose refusal was logged. */
  private readonly refusalsLogged = new Set<'workers' | 'draining'>();
  /** The number given the last decision relayed (ClusterMessage's `n`). */
  private decisionNumber = 0;
  readonly counters = {
    relayed: 0,
    claimsLost: 0,
    malformed: 0,
    /** Decisions with more blocks than the processes' routers take (dropped). */
    tooLong: 0,
    /** Worker records a gateway would not accept (dropped). */
    workersRefused: 0,
    /** Workers and drains not kept past MAX_WORKERS. */
    refusedPastBound: 0,
  };

  constructor(
    options: ClusterRelayOptions = {},
    private readonly clock: () => number = Date.now,
  ) {
    this.recentLimit = options.recentDecisions ?? 10_000;
    this.ttlMs = options.decisionTtlMs ?? 120_000;
    this.workflows = new LRUCache({ max: options.workflows ?? 100_000 });
    this.removalLimit = options.removals ?? 100_000;
    this.maxPromptTokens = options.maxPromptTokens ?? ROUTER_DEFAULTS.maxPromptTokens;
    this.blockSize = options.blockSize ?? ROUTER_DEFAULTS.blockSize;
    this.log = options.log ?? (() => {});
  }

  add(peer: RelayPeer): void {
    this.peers.set(peer.id, { peer, outbox: new Outbox((m) => peer.send(m)) });
  }

  /** A process stopped: the others drop its in-flight work. */
  remove(id: string): void {
    if (!this.peers.delete(id)) return;
    this.loads.drop(id);
    this.broadcast({ cf: 'gone', r: id }, id);
  }

  receive(from: string, m: unknown): void {
    if (!isMessage(m)) return;
    const peer = this.peers.get(from)?.outbox;
    if (!peer) return;
    // checked as every process checks it (isWellFormed): what the relay keeps and passes on is
    // well formed, and names its sender, so one process's defect costs no other its tallies
    const r = (m as { r?: unknown }).r;
    if (!isWellFormed(m) || (r !== undefined && r !== from)) return void this.counters.malformed++;
    switch (m.cf) {
      case 'batch':
        for (const inner of m.m) {
          if (isMessage(inner) && inner.cf !== 'batch') this.receive(from, inner);
          else this.counters.malformed++;
        }
        return;
      case 'decision': {
        // one that every process's router would refuse is no one's load, nor kept, nor a claim
        if (m.hi.length > this.mostBlocks(m.w)) return void this.counters.tooLong++;
        if (m.wf !== undefined) {
          const held = this.workflows.get(m.wf);
          if (m.claim && held) {
            // another process routed this workflow's first step first: follow it
            this.counters.claimsLost++;
            peer.push({ cf: 'workflow', q: 0, id: m.wf, w: held.w, s: held.s });
            m.wf = undefined;
          } else {
            this.workflows.set(m.wf, { w: m.w, s: m.s ?? null });
          }
        }
        m.n = ++this.decisionNumber; // whatever its sender set
        if (m.hi.length > 0) {
          this.recent.push({ d: m, at: this.clock() });
          if (this.recent.length > this.recentLimit * 2) this.recent.splice(0, this.recent.length - this.recentLimit);
        }
        if (typeof m.q === 'number') this.loads.decided(from, m.w, m.q);
        this.broadcast(m, from);
        return;
      }
      case 'prefilled':
        this.loads.prefilled(from, m.w, m.q, m.d);
        this.broadcast(m, from);
        return;
      case 'released':
        this.loads.released(from, m.w, m.q, m.d);
        this.broadcast(m, from);
        return;
      case 'refused': {
        // a process that starts later does not get its blocks either (the refusal is recent)
        const at = this.recent.findLastIndex((r) => r.d.r === from && r.d.i === m.i);
        if (at >= 0) this.recent.splice(at, 1);
        this.broadcast(m, from);
        return;
      }
      case 'worker-added': {
        // checked as a gateway checks a worker it is told of (WorkerConnections.add()): one no
        // gateway would take does not undo a removal, nor reach a process that starts later
        let worker: WorkerRecord;
        try {
          worker = parseWorkerRecord(m.worker, 'worker');
        } catch {
          return void this.counters.workersRefused++;
        }
        // each process is told of every worker kept: past a router's bound, none would take it
        const after = this.ranksWith(worker);
        if (after > MAX_WORKERS)
          return this.refusePastBound(
            'workers',
            `worker '${worker.id}' added by gateway process ${from} not kept nor passed on: the processes' routers hold at most ${MAX_WORKERS} workers (each data-parallel rank is one), ${this.workerRanks} are kept`,
          );
        this.keepWorker(worker, after);
        this.broadcast(m, from);
        return;
      }
      case 'worker-removed':
        this.forgetWorker(m.id, m.record !== false);
        this.broadcast(m, from);
        return;
      case 'worker-drained':
        this.keepDrain(m.id, m.draining, from);
        this.broadcast(m, from);
        return;
      case 'change?': {
        const v = this.decide(from, m.change);
        // the change goes to every other process before the verdict to the one that asked, which
        // applies it as it reads the verdict: then no process reads a later answer of the relay
        // (a verdict, a sync) before it has the change
        if (v.ok) for (const [id, p] of this.peers) if (id !== from) p.outbox.flush();
        peer.now({ cf: 'change', q: m.q, v });
        return;
      }
      case 'sync?':
        // after everything queued for the process: it has applied all of it when it reads this
        peer.now({ cf: 'sync', q: m.q });
        return;
      case 'kv-events':
        this.broadcast(m, from);
        return;
      case 'workflow?': {
        const held = this.workflows.get(m.id);
        peer.now({ cf: 'workflow', q: m.q, id: m.id, w: held?.w, s: held?.s });
        return;
      }
      case 'hello':
        peer.now(this.snapshot(from, m.ttl ?? this.ttlMs));
        return;
      default:
        this.counters.malformed++;
    }
  }

  /**
   * Decides an admin worker change of process `from` against the registry, as a gateway alone
   * decides one against its own (the same statuses and messages), and makes it: kept here and
   * sent to every other process. Changes are decided one at a time, in the order they arrive.
   */
  private decide(from: string, change: WorkerChange): WorkerChangeVerdict {
    switch (change.op) {
      case 'add': {
        let worker: WorkerRecord;
        try {
          worker = parseWorkerRecord(change.worker, 'worker');
        } catch (err) {
          this.counters.workersRefused++;
          return { ok: false, status: 400, message: (err as Error).message };
        }
        if (this.workers.has(worker.id))
          return { ok: false, status: 409, message: `worker '${worker.id}' exists`, param: 'id' };
        const dpSize = worker.dpSize ?? 1;
        const after = this.ranksWith(worker);
        if (after > MAX_WORKERS)
          return { ok: false, status: 409, ...workerLimitRefusal(worker.id, dpSize, this.workerRanks) };
        this.keepWorker(worker, after);
        this.broadcast({ cf: 'worker-added', r: from, worker }, from);
        return { ok: true, id: worker.id };
      }
      case 'remove':
        if (!this.workers.has(change.id)) return { ok: false, status: 404, message: `no worker '${change.id}'` };
        this.forgetWorker(change.id, true);
        this.broadcast({ cf: 'worker-removed', r: from, id: change.id }, from);
        return { ok: true, id: change.id };
      case 'drain': {
        // a rank's id (ID#r) drains its worker, in every process
        const id = this.workerOf(change.id);
        if (id === undefined) return { ok: false, status: 404, message: `no worker '${change.id}'` };
        this.keepDrain(id, change.draining, from);
        this.broadcast({ cf: 'worker-drained', r: from, id, draining: change.draining }, from);
        return { ok: true, id };
      }
    }
  }

  /** The worker `id` names: itself, or the worker of its data-parallel rank `ID#r`; undefined when none is kept. */
  private workerOf(id: string): string | undefined {
    if (this.workers.has(id)) return id;
    const hash = id.lastIndexOf('#');
    if (hash < 0) return undefined;
    const worker = id.slice(0, hash);
    const record = this.workers.get(worker);
    return record !== undefined && hasRank(record, id.slice(hash + 1)) ? worker : undefined;
  }

  /** The workers' ranks, in all, with `worker` kept (in place of one of its id). */
  private ranksWith(worker: WorkerRecord): number {
    const kept = this.workers.get(worker.id);
    return this.workerRanks - (kept ? (kept.dpSize ?? 1) : 0) + (worker.dpSize ?? 1);
  }

  /** Keeps `worker` (the ranks then kept: ranksWith()); a removal of it is no longer kept. */
  private keepWorker(worker: WorkerRecord, ranks: number): void {
    this.workerRanks = ranks;
    this.workers.set(worker.id, worker);
    this.removed.delete(worker.id);
  }

  /** Forgets worker `id`; `record`: its removal is kept (one through the admin API, not DNS discovery's). */
  private forgetWorker(id: string, record: boolean): void {
    const kept = this.workers.get(id);
    if (kept) this.workerRanks -= kept.dpSize ?? 1;
    this.workers.delete(id);
    this.draining.delete(id);
    // discovery's removals are not kept: every process reads the DNS records itself
    if (!record) return;
    this.removed.delete(id); // to the end: the newest
    this.removed.set(id, this.clock());
    for (const old of this.removed.keys()) {
      if (this.removed.size <= this.removalLimit) break;
      this.removed.delete(old);
    }
  }

  /** Keeps whether worker `id` is draining, for processes that start later. */
  private keepDrain(id: string, draining: boolean, from: string): void {
    // past the bound a drain is not kept for processes that start later; those running,
    // which drain a worker only if they have it, still get it
    if (!draining) this.draining.delete(id);
    else if (this.draining.has(id) || this.draining.size < MAX_WORKERS) this.draining.add(id);
    else
      this.refusePastBound(
        'draining',
        `drain of worker ${JSON.stringify(shownText(id, 64))} by gateway process ${from} not kept for processes that start later: at most ${MAX_WORKERS} drained workers are kept`,
      );
  }

  /**
   * Most blocks a process's router takes of a decision on worker `w` (applySharedDecision()): its
   * longest prompt in the worker's blocks (a data-parallel rank's are its worker's). Of a worker
   * the relay was not told of, in the smallest blocks a worker may have (1 token).
   */
  private mostBlocks(w: string): number {
    const hash = w.indexOf('#');
    const record = this.workers.get(hash < 0 ? w : w.slice(0, hash));
    return Math.ceil(this.maxPromptTokens / (record ? (record.blockSize ?? this.blockSize) : 1));
  }

  /** Counts a refusal past a bound; the first of each bound is logged. */
  private refusePastBound(bound: 'workers' | 'draining', message: string): void {
    this.counters.refusedPastBound++;
    if (this.refusalsLogged.has(bound)) return;
    this.refusalsLogged.add(bound);
    this.log(`${message}; further refusals are only counted`);
  }

  /**
   * The start snapshot for process `to`, whose router keeps a predicted block `ttlMs`: the
   * decisions replayed are those younger than that (and than the relay's own lifetime), as
   * its maker's router, configured alike, still holds them.
   */
  private snapshot(to: string, ttlMs: number): ClusterMessage {
    const now = this.clock();
    let live = 0;
    while (live < this.recent.length && now - this.recent[live].at > this.ttlMs) live++;
    if (live > 0) this.recent.splice(0, live);
    for (const [id, at] of this.removed) {
      if (now - at <= REMOVAL_KEPT_MS) break;
      this.removed.delete(id);
    }
    let start = Math.max(0, this.recent.length - this.recentLimit);
    while (start < this.recent.length && now - this.recent[start].at > ttlMs) start++;
    const loads: Array<[string, string, number, number, number]> = [];
    for (const [replica, worker, l] of this.loads.entries())
      if (replica !== to) loads.push([replica, worker, l.requests, l.prefill, l.decode]);
    return {
      cf: 'snapshot',
      workers: [...this.workers.values()],
      workflows: [...this.workflows.rkeys()].map((id) => {
        const e = this.workflows.peek(id)!;
        return [id, e.w, e.s];
      }),
      decisions: this.recent.slice(start).map((r) => r.d),
      loads,
      draining: [...this.draining],
      removed: [...this.removed.keys()],
    };
  }

  private broadcast(m: ClusterMessage, except: string): void {
    for (const [id, p] of this.peers) {
      if (id === except) continue;
      p.outbox.push(m);
      this.counters.relayed++;
    }
  }
}
