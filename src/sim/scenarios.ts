import { BlockHashes } from '../core/hashing.js';
import { createRng } from '../core/rng.js';
import { quotedText } from '../core/shown-text.js';
import type {
  KVAwareRouter,
  RouteOptions,
  RouteRequest,
  RouteResult,
  SharedDecision,
  WorkerMetrics,
} from '../core/router/index.js';
import { MAX_SIMULATED_SPAN_MS, type TraceRequest } from './trace.js';
import { RemoteLoad } from '../state/remote-load.js';

/**
 * What can go wrong, or differ, around the router in a simulated run: workers failing or
 * draining mid-run, KV events arriving late or not at all, several router replicas sharing
 * state with a lag, clients cancelling, workers of different sizes. Every option defaults
 * to the ideal the plain simulation assumes.
 */
export interface ScenarioOptions {
  /** Workers that fail (die, losing their KV and their requests) at a time. */
  fail?: readonly WorkerEvent[];
  /** Workers taken out of rotation (finishing what they have) at a time. */
  drain?: readonly WorkerEvent[];
  /** Extra delay of each batch of KV events, uniform in [0, jitter] ms, per router replica (default 0). */
  eventJitterMs?: number;
  /** Fraction of KV-event batches a router replica never receives (default 0). */
  eventLoss?: number;
  /** Router replicas behind a round-robin load balancer (default 1). */
  replicas?: number;
  /** Delay before a replica's decisions and releases reach the other replicas (default 20 ms). */
  stateLagMs?: number;
  /** Fraction of requests whose client cancels before the answer is complete (default 0). */
  cancelRate?: number;
  /** A cancelling client gives up uniformly within this long after sending (default 10,000 ms). */
  cancelWithinMs?: number;
  /**
   * Fraction of requests whose answer is not streamed (default 0): the gateway sees their
   * first byte only with the whole answer, so the router reads their prefill off the engines'
   * waiting queues as scraped; the end of the answer is also when it learns of the first token.
   */
  nonStreamingShare?: number;
  /**
   * Replays sessions closed-loop (default false: every request at its trace time): a request
   * of a session (its `session_id`) is sent no sooner than the session's previous request has
   * ended, as a client that waits for its answer sends its next turn; at its trace time when
   * that has ended by then. Requests without a session are sent at their trace times.
   */
  closedLoop?: boolean;
  /** KV capacity of each worker in tokens (heterogeneous workers); length = workers. */
  workerKvTokens?: readonly number[];
  /** Seed of the random source for jitter, loss and cancellations (default 1). */
  seed?: number;
}

/** A worker (0-based index) and a time in ms of simulated time. */
export interface WorkerEvent {
  worker: number;
  atMs: number;
}

/** Latest time of a failure or a drain (ms of simulated time): the longest replay (MAX_SIMULATED_SPAN_MS). */
export const MAX_EVENT_MS = MAX_SIMULATED_SPAN_MS;

/**
 * Parses `w3@600s` (also `3@600s`, `w3@1.5m`, `w3@250ms`; a time without unit is in seconds): worker
 * 3 at 600 s. An index with leading zeros (`w03`) is refused, naming the flag.
 */
export function parseWorkerEvent(spec: string, flag: string, workers: number): WorkerEvent {
  const m = /^w?(\d+)@(\d+(?:\.\d+)?)(ms|s|m)?$/.exec(spec.trim());
  if (!m)
    throw new RangeError(
      `${flag}: expected WORKER@TIME such as w3@600s, got ${quotedText(spec)} (TIME in ms, s or m; without a unit, seconds)`,
    );
  // a worker is named by its index as the simulator names it (w3): `w03` would be read as w3,
  // and a name that does not read back as itself is refused rather than guessed at
  if (m[1].length > 1 && m[1].startsWith('0'))
    throw new RangeError(
      `${flag}: ${quotedText(spec.trim().slice(0, spec.trim().indexOf('@')))} is no worker name: ${Number(m[1]) < workers ? `write w${Number(m[1])}` : `the workers are w0..w${workers - 1}`} (w and the index, without leading zeros)`,
    );
  const worker = Number(m[1]);
  if (worker >= workers)
    throw new RangeError(`${flag}: worker w${worker} does not exist (workers are w0..w${workers - 1})`);
  const unit = m[3] ?? 's';
  const atMs = Number(m[2]) * (unit === 'ms' ? 1 : unit === 's' ? 1000 : 60_000);
  // no replay lasts longer: a time past it would never come
  if (!(atMs <= MAX_EVENT_MS))
    throw new RangeError(
      `${flag}: the time must be at most 31 days (${MAX_EVENT_MS / 1000}s), got ${quotedText(spec)}`,
    );
  return { worker, atMs };
}

/** Parses every spec of one flag (see parseWorkerEvent); a worker named twice is an error naming the flag. */
export function parseWorkerEvents(specs: readonly string[], flag: string, workers: number): WorkerEvent[] {
  const events = specs.map((spec) => parseWorkerEvent(spec, flag, workers));
  const seen = new Set<number>();
  for (const e of events) {
    if (seen.has(e.worker)) throw new RangeError(`${flag}: worker w${e.worker} is named twice`);
    seen.add(e.worker);
  }
  return events;
}

/** Checks scenario options against the cluster; throws a RangeError naming the option. */
export function checkScenario(s: ScenarioOptions, workers: number): void {
  const frac = (v: number | undefined, name: string) => {
    if (v !== undefined && !(Number.isFinite(v) && v >= 0 && v <= 1))
      throw new RangeError(`${name} must be within [0, 1], got ${v}`);
  };
  const nonNeg = (v: number | undefined, name: string) => {
    if (v !== undefined && !(Number.isFinite(v) && v >= 0))
      throw new RangeError(`${name} must be a finite number >= 0, got ${v}`);
  };
  frac(s.eventLoss, 'eventLoss');
  frac(s.cancelRate, 'cancelRate');
  frac(s.nonStreamingShare, 'nonStreamingShare');
  if (s.closedLoop !== undefined && typeof s.closedLoop !== 'boolean')
    throw new TypeError(`closedLoop must be a boolean, got ${typeof s.closedLoop}`);
  nonNeg(s.eventJitterMs, 'eventJitterMs');
  nonNeg(s.stateLagMs, 'stateLagMs');
  nonNeg(s.cancelWithinMs, 'cancelWithinMs');
  if (s.replicas !== undefined && !(Number.isInteger(s.replicas) && s.replicas >= 1 && s.replicas <= 64)) {
    throw new RangeError(`replicas must be an integer in [1, 64], got ${s.replicas}`);
  }
  if (s.workerKvTokens !== undefined) {
    if (s.workerKvTokens.length !== workers)
      throw new RangeError(`workerKvTokens lists ${s.workerKvTokens.length} workers, the cluster has ${workers}`);
    s.workerKvTokens.forEach((t, i) => {
      if (!(Number.isInteger(t) && t > 0))
        throw new RangeError(`workerKvTokens[${i}] must be a positive integer, got ${t}`);
    });
  }
  for (const [name, list] of [
    ['fail', s.fail],
    ['drain', s.drain],
  ] as const) {
    const seen = new Set<number>();
    for (const e of list ?? []) {
      if (!(Number.isInteger(e.worker) && e.worker >= 0 && e.worker < workers))
        throw new RangeError(`${name}: worker ${e.worker} does not exist`);
      nonNeg(e.atMs, `${name}.atMs`);
      if (e.atMs > MAX_EVENT_MS)
        throw new RangeError(`${name}.atMs must be at most ${MAX_EVENT_MS} (31 days), got ${e.atMs}`);
      // a worker fails (or is drained) once: a second time would say nothing more
      if (seen.has(e.worker)) throw new RangeError(`${name}: worker w${e.worker} is named twice`);
      seen.add(e.worker);
    }
  }
}

/** What the caller of the seed's API would name as the anchor: the workflow, else the first block (per model). */
export function seedAnchor(req: TraceRequest): string | undefined {
  const anchor =
    req.sessionId !== undefined
      ? `session:${req.sessionId}`
      : req.hashIds.length > 0
        ? `block:${req.hashIds[0]}`
        : undefined;
  // another model's KV is of no use: its requests anchor apart
  return anchor !== undefined && req.model !== undefined ? `model:${req.model}/${anchor}` : anchor;
}

/** Counts a run's scenario effects (reported per policy). */
export interface ScenarioCounts {
  /** KV-event batches a replica never received. */
  eventBatchesLost: number;
  /** Shared decisions applied at other replicas. */
  sharedDecisionsApplied: number;
}

type Schedule = (atMs: number, fn: () => void) => void;

/**
 * N router replicas behind a round-robin balancer, sharing what they learn the way the Redis
 * state store does (src/state/redis-state-store.ts): each tracked decision reaches the other
 * replicas `stateLagMs` later through `applySharedDecision` (its blocks as predicted entries,
 * the workflow and anchor) and counts its request and queued prefill on the worker through
 * `setRemoteLoad`; its first token moves them from queued prefill to decode load and its
 * release takes them off, as the store's prefill-done and release messages do. Every
 * replica subscribes to every engine's KV events and scrapes every engine. With one replica
 * and no jitter or loss, this is a plain router.
 */
export class RouterFleet {
  readonly replicas: KVAwareRouter[];
  readonly counts: ScenarioCounts = { eventBatchesLost: 0, sharedDecisionsApplied: 0 };
  private readonly lag: number;
  private readonly jitter: number;
  private readonly loss: number;
  private readonly random: () => number;
  /** remote[r]: the other replicas' in-flight work as replica r has heard of it. */
  private readonly remote: RemoteLoad[];
  private next = 0;
  /** Decisions whose prefill-done was sent: their release takes decode tokens off, not prefill. */
  private readonly prefilled = new WeakSet<SharedDecision>();

  constructor(
    replicas: KVAwareRouter[],
    scenario: ScenarioOptions,
    private readonly schedule: Schedule,
    private readonly clock: () => number,
  ) {
    if (replicas.length === 0) throw new RangeError('a fleet needs at least one router');
    this.replicas = replicas;
    this.lag = scenario.stateLagMs ?? 20;
    this.jitter = scenario.eventJitterMs ?? 0;
    this.loss = scenario.eventLoss ?? 0;
    this.random = createRng(((scenario.seed ?? 1) * 7919 + 17) >>> 0);
    this.remote = replicas.map(() => new RemoteLoad());
    // a prefill a replica reads off the engine reaches the others as a first token would
    replicas.forEach((r, i) =>
      r.onPrefillRead((_ticket, shared) => {
        if (shared?.tracked) this.sharePrefilled(i, shared);
      }),
    );
  }

  get size(): number {
    return this.replicas.length;
  }

  registerWorker(id: string): void {
    for (const r of this.replicas) r.registerWorker(id);
  }

  /** Routes on the next replica in turn; returns its index with the result. */
  route(request: RouteRequest, options: RouteOptions = {}): { replica: number; result: RouteResult } {
    const replica = this.next;
    this.next = (this.next + 1) % this.replicas.length;
    const shared = this.replicas.length > 1;
    const result = this.replicas[replica].route(request, shared ? { ...options, share: true } : options);
    if (shared && result.shared?.tracked) {
      const d = result.shared;
      this.schedule(this.clock() + this.lag, () => this.applyDecision(replica, d));
    }
    return { replica, result };
  }

  /** The request's first token: its replica moves it to decode, and tells the others `stateLagMs` later. */
  markPrefillDone(replica: number, ticket: number, shared: SharedDecision | undefined): void {
    this.replicas[replica].markPrefillDone(ticket);
    if (shared?.tracked && this.replicas.length > 1) this.sharePrefilled(replica, shared);
  }

  /** The others hear of a decision's first token `stateLagMs` later, once (as the stores send it). */
  private sharePrefilled(replica: number, shared: SharedDecision): void {
    if (this.prefilled.has(shared)) return;
    this.prefilled.add(shared);
    this.schedule(this.clock() + this.lag, () => {
      this.settle(replica, shared);
      this.updateRemote(replica, shared.workerId, (load, from) =>
        load.prefilled(from, shared.workerId, shared.prefillTokens, shared.decodeTokens),
      );
    });
  }

  /**
   * The chosen engine refused the request (HTTP 4xx): its replica withdraws what it predicted
   * there, as the gateway does, and the others what they applied of its decision, `stateLagMs`
   * later. Returns what its replica withdrew.
   */
  markRefused(replica: number, ticket: number, shared?: SharedDecision): number {
    if (shared?.tracked && this.replicas.length > 1)
      this.schedule(this.clock() + this.lag, () =>
        this.replicas.forEach((r, i) => {
          if (i !== replica) r.refuseSharedDecision(shared);
        }),
      );
    return this.replicas[replica].markRefused(ticket);
  }

  release(replica: number, ticket: number, shared: SharedDecision | undefined): void {
    this.replicas[replica].release(ticket);
    if (shared?.tracked && this.replicas.length > 1) {
      const decode = this.prefilled.has(shared) ? shared.decodeTokens : undefined;
      this.schedule(this.clock() + this.lag, () => {
        this.settle(replica, shared);
        this.updateRemote(replica, shared.workerId, (load, from) =>
          load.released(from, shared.workerId, shared.prefillTokens, decode),
        );
      });
    }
  }

  /** The others hear the decision is past refusal (its prefill ended, or it ended): what they applied of it stays. */
  private settle(from: number, shared: SharedDecision): void {
    this.replicas.forEach((r, i) => {
      if (i !== from) r.settleSharedDecision(shared);
    });
  }

  private applyDecision(from: number, d: SharedDecision): void {
    this.replicas.forEach((r, i) => {
      if (i === from) return;
      if (r.applySharedDecision(d)) this.counts.sharedDecisionsApplied++;
    });
    this.updateRemote(from, d.workerId, (load, replica) => load.decided(replica, d.workerId, d.prefillTokens));
  }

  /** Applies one replica's message to every other replica's tally, and its sum to that replica's router. */
  private updateRemote(from: number, workerId: string, change: (load: RemoteLoad, from: string) => boolean): void {
    const sender = String(from);
    this.replicas.forEach((r, i) => {
      if (i === from || !change(this.remote[i], sender)) return;
      if (r.listWorkers().some((w) => w.id === workerId)) r.setRemoteLoad(workerId, this.remote[i].sum(workerId));
    });
  }

  /**
   * One engine step's KV events (hash pairs hi, lo, …) reaching every replica, late or lost as
   * configured. The removals go first: the engine evicts while it schedules the step and caches
   * the blocks it will compute after evicting for them, so a block evicted and cached again in one
   * step is held after it (vLLM publishes each step's events as one ordered list).
   */
  deliverEvents(workerId: string, stored: readonly number[], removed: readonly number[]): void {
    for (const r of this.replicas) {
      if (this.loss > 0 && this.random() < this.loss) {
        this.counts.eventBatchesLost++;
        continue;
      }
      const apply = () => {
        if (!r.listWorkers().some((w) => w.id === workerId)) return;
        if (removed.length > 0) r.applyRemoved(workerId, pairs(removed));
        if (stored.length > 0) r.applyStored(workerId, pairs(stored));
      };
      if (this.jitter > 0) this.schedule(this.clock() + this.random() * this.jitter, apply);
      else apply();
    }
  }

  updateWorkerMetrics(workerId: string, metrics: WorkerMetrics): void {
    for (const r of this.replicas) r.updateWorkerMetrics(workerId, metrics);
  }

  /** The worker died: out of rotation at every replica, and what they knew it held is void. */
  failWorker(workerId: string): void {
    for (const r of this.replicas) {
      r.setWorkerHealth(workerId, false);
      r.applyCleared(workerId);
    }
  }

  drainWorker(workerId: string): void {
    for (const r of this.replicas) r.drainWorker(workerId);
  }
}

function pairs(list: readonly number[]): BlockHashes {
  const b = new BlockHashes(Math.max(1, list.length / 2));
  for (let i = 0; i < list.length; i += 2) {
    b.hi[i / 2] = list[i];
    b.lo[i / 2] = list[i + 1];
  }
  b.length = list.length / 2;
  return b;
}
