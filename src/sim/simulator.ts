import { BlockHashes } from '../core/hashing.js';
import { LLMD_SCRAPE_INTERVAL_MS } from '../core/policies/llmd.js';
import { createRng } from '../core/rng.js';
import {
  KVAwareRouter,
  type CandidateExplain,
  type KVAwareRouterOptions,
  type SharedDecision,
} from '../core/router/index.js';
import { MAX_CONTENT_ANCHORS, MAX_PROMPT_TOKENS } from '../core/router/options-schema.js';
import { EngineModel, type EngineConfig, type EngineRequest, type StepResult } from '../engine-model/index.js';
import { fullBlockIds, requestBlocks } from './request-blocks.js';
import { checkScenario, RouterFleet, seedAnchor, type ScenarioOptions } from './scenarios.js';
import { checkReplayable, MAX_SIMULATED_SPAN_MS, MAX_TRACE_ID_BYTES, ReplayError, type TraceRequest } from './trace.js';
import { percentile } from './percentile.js';

export { requestBlocks } from './request-blocks.js';

/**
 * Discrete-event simulation of N engines behind the router, replaying a trace in simulated
 * time (no sleeping). The router is the production KVAwareRouter in precise mode: it learns
 * what engines store only from their KV events, delivered `eventDelayMs` after the step that
 * produced them, and their load only from scrapes every `scrapeIntervalMs`, plus its own
 * in-flight accounting (markPrefillDone at the first token, release at the end), as the
 * gateway does. Nothing peeks into an engine.
 *
 * An engine step is scheduled when it starts (allocations, evictions, admissions) and its
 * outputs applied when it ends, so a scrape during a long prefill step reads the engine as
 * it is then. Requests over the engines' context limit are refused at arrival, as vLLM's
 * server refuses them (HTTP 400), counted in `rejected` and left out of every other figure.
 */
export interface SimulationOptions {
  workers: number;
  policy: string;
  /** Name in reports (default: the policy), e.g. for a variant with other router options. */
  label?: string;
  /** Arrival-rate multiplier: timestamps are divided by it (default 1). */
  speed?: number;
  engine?: Partial<Omit<EngineConfig, 'blockTokens'>>;
  /** Delay from an engine step to the router applying its KV events (default 50 ms). */
  eventDelayMs?: number;
  /** Interval of load scrapes, as from /metrics (default 200 ms; llmd, llmd-affinity: llm-d's refresh interval, 50 ms). */
  scrapeIntervalMs?: number;
  /** Failures, drains, event jitter and loss, router replicas, cancellations, heterogeneous workers. */
  scenario?: ScenarioOptions;
  /** Further router options (cost weights, judge roles...). */
  router?: Omit<KVAwareRouterOptions, 'policy' | 'clock' | 'indexMode' | 'blockSize'>;
  /** Called at every load scrape with what the router is told of each live worker (for diagnostics). */
  onScrape?: (
    timeMs: number,
    worker: number,
    metrics: { kvUsage: number; waitingRequests: number; runningRequests: number },
  ) => void;
  /**
   * Called at every request routed to a worker, with what each engine held of its prompt at
   * that moment (for diagnostics: what a decision gives up, and, against the request's
   * outcome, what eviction takes before the engine admits it).
   */
  onRoute?: (decision: RouteTrace) => void;
  /** Ask the router to explain every decision (each candidate's policy terms, in `RouteTrace.explain`). */
  explainRoutes?: boolean;
  /** Called now and then with the number of requests finished. */
  onProgress?: (finished: number, total: number) => void;
}

export interface RequestOutcome {
  /** 0-based line of the request in the trace file. */
  request: number;
  /** Worker index, 0..N-1. */
  worker: number;
  cachedTokens: number;
  promptTokens: number;
  /** Seconds of simulated time. */
  ttft: number;
  e2e: number;
  /** Arrival, seconds of simulated time after the first request. */
  arrival: number;
  /** Set when the request did not complete: its worker failed mid-answer, or its client went away. */
  status?: 'failed' | 'cancelled';
}

/** One routing decision as the simulator saw it (SimulationOptions.onRoute). */
export interface RouteTrace {
  /** 0-based line of the request in the trace file (as RequestOutcome.request). */
  request: number;
  /** Simulated time of the decision (ms after the first request). */
  timeMs: number;
  /** Worker index chosen, 0..N-1. */
  worker: number;
  promptTokens: number;
  /**
   * Per worker index, the prompt's leading tokens that engine held (cached or being computed)
   * when the request was routed: the full blocks of its prefix, no content anchors.
   */
  heldTokens: number[];
  /** Full blocks the router was given for the prompt (its last, partial block is never one). */
  routedBlocks: number;
  /** With SimulationOptions.explainRoutes: the router's explanation (candidate `worker` is `w<index>`). */
  explain?: CandidateExplain[];
}

export interface Percentiles {
  mean: number;
  p50: number;
  p90: number;
  p99: number;
}

export interface PolicyResult {
  policy: string;
  hitRate: number;
  ttft: Percentiles;
  e2e: { mean: number; p99: number };
  throughputTokPerS: number;
  loadImbalance: number;
  prefillTokens: number;
  outcomes: RequestOutcome[];
  /** Requests whose client cancelled them (with or without a first token). */
  cancelled: number;
  /** Requests that lost their worker after their first token (no retry is possible mid-answer). */
  failed: number;
  /** Requests sent again to another worker because theirs failed before their first token. */
  retried: number;
  /** KV-event batches a router replica never received (--event-loss). */
  eventBatchesLost: number;
  /** Busy time per worker (s) and its samples over time, for reports. */
  workerBusySeconds: number[];
  loadTimeline: Array<{ t: number; kvUsage: number[] }>;
  /**
   * Requests refused: over the engines' context limit (before routing, or by the chosen
   * worker when workers differ), or with no worker available to take them.
   */
  rejected: number;
  /**
   * Positions in the trace of the requests counted in `rejected`, ascending: the bounds over
   * the requests this policy answered leave them out (computeBounds).
   */
  refused: number[];
  /** Preemptions (recompute) over all engines. */
  preemptions: number;
}

const KIND_STEP_END = 0;
const KIND_DELIVER = 1;
const KIND_SCRAPE = 2;
const KIND_TIMER = 3;

interface SimEvent {
  time: number;
  seq: number;
  kind: number;
  worker: number;
  stored?: number[];
  removed?: number[];
  run?: () => void;
  /** Index in the queue's heap while queued (for moveEarlier). */
  pos?: number;
}

/** Min-heap on (time, kind, seq): deterministic order for equal times. */
class EventQueue {
  private readonly items: SimEvent[] = [];
  get size(): number {
    return this.items.length;
  }
  peek(): SimEvent | undefined {
    return this.items[0];
  }
  push(e: SimEvent): void {
    this.items.push(e);
    this.up(this.items.length - 1);
  }
  pop(): SimEvent | undefined {
    const a = this.items;
    if (a.length === 0) return undefined;
    const top = a[0];
    const last = a.pop()!;
    if (a.length > 0) {
      a[0] = last;
      last.pos = 0;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < a.length && before(a[l], a[m])) m = l;
        if (r < a.length && before(a[r], a[m])) m = r;
        if (m === i) break;
        this.swap(i, m);
        i = m;
      }
    }
    top.pos = undefined;
    return top;
  }
  /** Brings a queued event forward to `time` (no later than its own). */
  moveEarlier(e: SimEvent, time: number): void {
    if (e.pos === undefined || this.items[e.pos] !== e || time > e.time)
      throw new Error('moveEarlier: not queued, or later');
    e.time = time;
    this.up(e.pos);
  }
  private up(i: number): void {
    const a = this.items;
    a[i].pos = i;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!before(a[i], a[p])) break;
      this.swap(i, p);
      i = p;
    }
  }
  private swap(i: number, j: number): void {
    const a = this.items;
    const x = a[i];
    a[i] = a[j];
    a[j] = x;
    a[i].pos = i;
    x.pos = j;
  }
}
function before(x: SimEvent, y: SimEvent): boolean {
  return x.time < y.time || (x.time === y.time && (x.kind < y.kind || (x.kind === y.kind && x.seq < y.seq)));
}

export function percentiles(values: number[]): Percentiles {
  if (values.length === 0) return { mean: 0, p50: 0, p90: 0, p99: 0 };
  const s = [...values].sort((a, b) => a - b);
  return {
    mean: s.reduce((a, b) => a + b, 0) / s.length,
    p50: percentile(s, 50),
    p90: percentile(s, 90),
    p99: percentile(s, 99),
  };
}

/** Delay from an engine step to the router applying its KV events (ms), unless the options say. */
export const DEFAULT_EVENT_DELAY_MS = 50;
/**
 * Interval of load scrapes (ms), unless the options say; llmd and llmd-affinity scrape at llm-d's
 * own (LLMD_SCRAPE_INTERVAL_MS).
 */
export const DEFAULT_SCRAPE_INTERVAL_MS = 200;

/**
 * Most load readings (a worker's metrics at a scrape) a replay takes, 2^29: a month of eight
 * workers scraped every 50 ms (llm-d's interval) while busy is 428 million. A run's time grows
 * with them (a billion took two minutes here), and the flags alone (a thousand workers scraped
 * every millisecond) could ask for trillions.
 */
export const MAX_LOAD_READINGS = 2 ** 29;

/** The error for a replay whose requests are still answered past MAX_SIMULATED_SPAN_MS. */
function pastSpan(now: number, trace: readonly TraceRequest[], speed: number): ReplayError {
  let longest = trace[0];
  for (const r of trace) if (r.outputLength > longest.outputLength) longest = r;
  return new ReplayError(
    `the replay runs past the ${MAX_SIMULATED_SPAN_MS} ms (31 days) a replay may cover (at ${Math.round(now)} ms, speed ×${speed}): its answers outlast it (the longest, trace line ${longest.index + 1}, has an output of ${longest.outputLength} tokens)`,
  );
}

export function simulate(trace: readonly TraceRequest[], options: SimulationOptions): PolicyResult {
  const { workers: n, policy } = options;
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`workers must be a positive integer, got ${n}`);
  const speed = options.speed ?? 1;
  if (!(speed > 0)) throw new RangeError(`speed must be > 0, got ${speed}`);
  const eventDelay = options.eventDelayMs ?? DEFAULT_EVENT_DELAY_MS;
  const scrapeInterval =
    options.scrapeIntervalMs ??
    (policy === 'llmd' || policy === 'llmd-affinity'
      ? (options.router?.policyOptions?.[policy]?.scrapeIntervalMs ?? LLMD_SCRAPE_INTERVAL_MS)
      : DEFAULT_SCRAPE_INTERVAL_MS);
  if (!(scrapeInterval > 0)) throw new RangeError(`scrapeIntervalMs must be > 0, got ${scrapeInterval}`);
  if (trace.length === 0) throw new RangeError('the trace has no requests');
  checkReplayable(trace, speed);
  const blockTokens = trace[0].blockSize;
  const scenario = options.scenario ?? {};
  checkScenario(scenario, n);

  let now = 0;
  const queue = new EventQueue();
  let seq = 0;
  const schedule = (time: number, run: () => void) =>
    queue.push({ time, seq: seq++, kind: KIND_TIMER, worker: -1, run });
  const replicas = Array.from(
    { length: scenario.replicas ?? 1 },
    (_, i) =>
      new KVAwareRouter({
        // the engines refuse a prompt over their context (counted in `rejected`), as vLLM does;
        // the router's own bound must not stop a run whose engines take longer prompts (a
        // trace's are at most MAX_TRACE_REQUEST_TOKENS, below the largest bound a router takes)
        maxPromptTokens: MAX_PROMPT_TOKENS,
        // nor its bound on content anchors: the trace readers refuse a request naming more than this
        maxContentAnchors: MAX_CONTENT_ANCHORS,
        // nor its bound on ids: the seed's anchor puts a prefix and the model before a trace's id
        maxIdBytes: 4 * MAX_TRACE_ID_BYTES,
        ...options.router,
        policy,
        indexMode: 'precise',
        blockSize: blockTokens,
        clock: () => now,
        randomSeed: (options.router?.randomSeed ?? 1) + i,
        instanceId: `sim${i}`,
      }),
  );
  const router = new RouterFleet(replicas, scenario, schedule, () => now);
  const ids = Array.from({ length: n }, (_, i) => `w${i}`);
  ids.forEach((id) => router.registerWorker(id));
  const pending = Array.from({ length: n }, () => ({ stored: [] as number[], removed: [] as number[] }));
  const engines = ids.map(
    (_, w) =>
      new EngineModel(
        {
          ...options.engine,
          ...(scenario.workerKvTokens ? { kvTokens: scenario.workerKvTokens[w] } : {}),
          blockTokens,
        },
        (hi, lo) => pending[w].stored.push(hi, lo),
        (hi, lo) => pending[w].removed.push(hi, lo),
      ),
  );
  const stepping = new Array<boolean>(n).fill(false);
  /** Each worker's queued KIND_STEP_END, while it steps. */
  const stepEvents = new Array<SimEvent | undefined>(n);
  const dead = new Array<boolean>(n).fill(false);
  const scenarioRandom = createRng(((scenario.seed ?? 1) * 104_729 + 3) >>> 0);
  const cancelRate = scenario.cancelRate ?? 0;
  const cancelWithin = scenario.cancelWithinMs ?? 10_000;
  // a source of its own: other scenario draws stay the same whatever the share
  const nonStreamingShare = scenario.nonStreamingShare ?? 0;
  const streamingRandom = createRng(((scenario.seed ?? 1) * 15_485_863 + 11) >>> 0);
  const refused: number[] = [];
  let cancelled = 0;
  let failed = 0;
  let retried = 0;

  // closed loop: the request each session has out, its requests held until it has ended, and
  // how many of those are not sent yet (the scrapes go on while any is)
  const closedLoop = scenario.closedLoop === true;
  const sessionOut = new Map<string, number>();
  const sessionHeld = new Map<string, number[]>();
  let held = 0;

  const t0 = trace[0].timestamp;
  const arrivalOf = (r: TraceRequest) => (r.timestamp - t0) / speed;
  const outcomes: RequestOutcome[] = new Array(trace.length);
  interface Live {
    req: TraceRequest;
    worker: number;
    replica: number;
    ticket: number;
    shared: SharedDecision | undefined;
    arrival: number;
    cached: number;
    ttft: number;
    started: boolean;
    /** Not streamed: the gateway sees its first byte only with the whole answer. */
    whole: boolean;
  }
  const live = new Map<number, Live>();
  const scratch = new BlockHashes(256);
  const loadTimeline: PolicyResult['loadTimeline'] = [];
  let finished = 0;
  let nextArrival = 0;

  const startStep = (w: number) => {
    // a run of decode steps stops at the next arrival or scrape, which may change the batch;
    // whatever else reaches the engine during the run cuts it short (interrupt, below)
    const nextScrape = (Math.floor(now / scrapeInterval) + 1) * scrapeInterval;
    const until = Math.min(nextScrape, nextArrival < trace.length ? arrivalOf(trace[nextArrival]) : Infinity);
    const end = engines[w].startStep(now, until);
    stepping[w] = true;
    const e: SimEvent = { time: end, seq: seq++, kind: KIND_STEP_END, worker: w };
    stepEvents[w] = e;
    queue.push(e);
  };

  /**
   * A request reached the engine, or left it, during its step: a run of decode steps ends with
   * the step under way, as a real engine takes the change at its next step (a closed-loop turn,
   * a retry or a cancellation comes between the trace's arrivals, which bound the runs).
   */
  const interrupt = (w: number) => {
    const e = stepEvents[w];
    if (!stepping[w] || e === undefined) return;
    const end = engines[w].cutRun(now);
    if (end < e.time) queue.moveEarlier(e, end);
  };

  /** KV events of the step that just ended (its evictions and the blocks it computed) leave now. */
  const publish = (w: number) => {
    const p = pending[w];
    if (p.stored.length > 0 || p.removed.length > 0) {
      queue.push({
        time: now + eventDelay,
        seq: seq++,
        kind: KIND_DELIVER,
        worker: w,
        stored: p.stored,
        removed: p.removed,
      });
      pending[w] = { stored: [], removed: [] };
    }
  };

  /** Routes a request that arrived at `arrival` (now, or earlier for a retry). */
  const arrive = (index: number, arrival = now) => {
    const req = trace[index];
    const limits = {
      inputTokens: Math.max(1, req.inputLength),
      outputTokens: Math.max(1, req.outputLength),
      anchors: req.anchors,
    };
    // over every engine's context limit: refused before routing, as vLLM's server refuses it
    if (engines.every((e) => e.rejection(limits) !== null)) {
      refused.push(index);
      finished++;
      ended(index);
      return;
    }
    const whole = nonStreamingShare > 0 && streamingRandom() < nonStreamingShare;
    const { replica, result: d } = router.route(
      {
        blockHashes: fullBlockIds(req),
        blockTokens: req.blockSize,
        promptTokens: Math.max(1, req.inputLength),
        claGroup: req.claGroup ?? null,
        // a model's KV is its own (request-blocks.ts keys the engine's blocks the same way)
        lora: req.model,
        workflowId: req.sessionId,
        workflowStep: req.step ?? null,
        agentRole: req.agentRole,
        isolate: req.isolate,
        contentAnchors: req.anchors,
        // the seed's caller names the anchor: the workflow when there is one, else the first
        // block; an isolated request (a judge) reuses nothing, so it names none
        anchor: policy === 'seed' && !req.isolate ? seedAnchor(req) : undefined,
      },
      { firstTokenReported: !whole, ...(options.explainRoutes ? { explain: true } : {}) },
    );
    const w = ids.indexOf(d.workerId);
    if (w < 0) {
      refused.push(index);
      finished++;
      return;
    }
    // workers of different sizes have different limits: the chosen one may refuse it (HTTP 400, no retry)
    if (engines[w].rejection(limits) !== null) {
      router.markRefused(replica, d.ticket, d.shared);
      router.release(replica, d.ticket, d.shared);
      refused.push(index);
      finished++;
      return;
    }
    const blocks = requestBlocks(req, d.cacheSalt, scratch);
    if (options.onRoute) {
      const heldTokens = engines.map((e) => {
        let k = 0;
        while (k < blocks.keys.length && e.holds(blocks.keys[k])) k++;
        return k * blockTokens;
      });
      options.onRoute({
        request: req.index,
        timeMs: now,
        worker: w,
        promptTokens: Math.max(1, req.inputLength),
        heldTokens,
        routedBlocks: d.blocks,
        ...(d.explain ? { explain: d.explain } : {}),
      });
    }
    const engineReq: EngineRequest = {
      id: index,
      ...blocks,
      inputTokens: Math.max(1, req.inputLength),
      outputTokens: Math.max(1, req.outputLength),
    };
    live.set(index, {
      req,
      worker: w,
      replica,
      ticket: d.ticket,
      shared: d.shared,
      arrival,
      cached: 0,
      ttft: 0,
      started: false,
      whole,
    });
    engines[w].enqueue(engineReq);
    if (!stepping[w]) startStep(w);
    else interrupt(w);
  };

  const record = (id: number, s: Live, status?: RequestOutcome['status']) => {
    outcomes[id] = {
      request: s.req.index,
      worker: s.worker,
      cachedTokens: s.cached,
      promptTokens: Math.max(1, s.req.inputLength),
      ttft: s.ttft / 1000,
      e2e: (now - s.arrival) / 1000,
      arrival: s.arrival / 1000,
      ...(status ? { status } : {}),
    };
  };

  /** The client gives up: the engine drops the request and the router forgets it. */
  const cancel = (id: number) => {
    const s = live.get(id);
    if (!s) return;
    live.delete(id);
    engines[s.worker].cancel(id);
    interrupt(s.worker);
    router.release(s.replica, s.ticket, s.shared);
    cancelled++;
    if (s.started) record(id, s, 'cancelled');
    ended(id);
  };

  /** A request from the trace reaches the router now (its client may cancel it later). */
  const send = (index: number) => {
    arrive(index);
    if (cancelRate > 0 && scenarioRandom() < cancelRate)
      schedule(now + scenarioRandom() * cancelWithin, () => cancel(index));
  };

  /**
   * The request ended (answered, refused, failed or cancelled): closed-loop, its session's
   * next request held behind it is sent now.
   */
  function ended(index: number): void {
    if (!closedLoop) return;
    const session = trace[index].sessionId;
    if (session === undefined || sessionOut.get(session) !== index) return;
    const next = sessionHeld.get(session)?.shift();
    if (next === undefined) {
      sessionOut.delete(session);
      return;
    }
    sessionOut.set(session, next);
    // held until sent: a scrape due at this same time runs before the send, and must not find
    // nothing running or held and stop the scrapes
    schedule(now, () => {
      held--;
      send(next);
    });
  }

  /**
   * The worker dies: its cache and its requests are gone. Requests that had no first token
   * yet are sent again (the gateway retries before the first byte); the others fail.
   */
  const failWorker = (w: number) => {
    if (dead[w]) return;
    dead[w] = true;
    router.failWorker(ids[w]);
    for (const [id, s] of [...live]) {
      if (s.worker !== w) continue;
      live.delete(id);
      router.release(s.replica, s.ticket, s.shared);
      // nothing of a whole answer has reached its client: the gateway sends it again
      if (s.started && !s.whole) {
        failed++;
        record(id, s, 'failed');
        ended(id);
      } else {
        retried++;
        arrive(id, s.arrival);
      }
    }
  };
  for (const e of scenario.fail ?? []) schedule(e.atMs, () => failWorker(e.worker));
  for (const e of scenario.drain ?? []) schedule(e.atMs, () => router.drainWorker(ids[e.worker]));

  const deliver = (e: SimEvent) => {
    if (!dead[e.worker]) router.deliverEvents(ids[e.worker], e.stored!, e.removed!);
  };

  queue.push({ time: 0, seq: seq++, kind: KIND_SCRAPE, worker: -1 });
  let readings = 0;
  while (nextArrival < trace.length || queue.size > 0) {
    const top = queue.peek();
    const arrivalTime = nextArrival < trace.length ? arrivalOf(trace[nextArrival]) : Infinity;
    if (top === undefined || arrivalTime < top.time) {
      now = arrivalTime;
      const index = nextArrival++;
      const session = closedLoop ? trace[index].sessionId : undefined;
      if (session !== undefined) {
        // the session's previous request has not ended: this one waits for it
        if (sessionOut.has(session)) {
          let list = sessionHeld.get(session);
          if (!list) sessionHeld.set(session, (list = []));
          list.push(index);
          held++;
          continue;
        }
        sessionOut.set(session, index);
      }
      send(index);
      continue;
    }
    queue.pop();
    now = top.time;
    // the trace's arrivals are within the span (checkReplayable); answers that run on past it
    // (an output of millions of tokens) would keep every worker scraped for months
    if (now > MAX_SIMULATED_SPAN_MS) throw pastSpan(now, trace, speed);
    if (top.kind === KIND_STEP_END) {
      const w = top.worker;
      if (dead[w]) {
        // popped: no interrupt() may move it again
        stepping[w] = false;
        stepEvents[w] = undefined;
        continue;
      }
      const step: StepResult = engines[w].finishStep();
      publish(w);
      for (const { request, cachedTokens } of step.firstTokens) {
        const s = live.get(request.id);
        if (!s) continue;
        s.cached = cachedTokens;
        s.ttft = now - s.arrival;
        s.started = true;
        if (!s.whole) router.markPrefillDone(s.replica, s.ticket, s.shared);
      }
      for (const request of step.finished) {
        const s = live.get(request.id);
        if (!s) continue;
        live.delete(request.id);
        // a whole answer's first byte: the gateway marks its first token, then its end
        if (s.whole) router.markPrefillDone(s.replica, s.ticket, s.shared);
        router.release(s.replica, s.ticket, s.shared);
        record(request.id, s);
        if (++finished % 500 === 0) options.onProgress?.(finished, trace.length);
        ended(request.id);
      }
      stepping[w] = false;
      stepEvents[w] = undefined;
      if (!engines[w].idle) startStep(w);
    } else if (top.kind === KIND_DELIVER) {
      deliver(top);
    } else if (top.kind === KIND_TIMER) {
      top.run!();
    } else {
      readings += n;
      if (readings > MAX_LOAD_READINGS)
        throw new RangeError(
          `the replay took more than ${MAX_LOAD_READINGS} load readings by ${Math.round(now)} ms of simulated time (${n} workers scraped every ${scrapeInterval} ms while busy): raise the scrape interval or replay fewer workers`,
        );
      const sample: number[] = [];
      engines.forEach((e, w) => {
        if (!dead[w]) {
          const metrics = {
            kvUsage: e.kvUsage,
            waitingRequests: e.waitingCount,
            runningRequests: e.runningCount,
            kvCapacityTokens: e.capacityBlocks * blockTokens,
          };
          router.updateWorkerMetrics(ids[w], metrics);
          options.onScrape?.(now, w, metrics);
        }
        sample.push(dead[w] ? 0 : e.kvUsage);
      });
      if (loadTimeline.length === 0 || now - loadTimeline[loadTimeline.length - 1].t * 1000 >= 5000)
        loadTimeline.push({ t: now / 1000, kvUsage: sample });
      const busy = nextArrival < trace.length || live.size > 0 || held > 0;
      if (busy) {
        let next = now + scrapeInterval;
        // nothing runs and nothing is due before the next arrival: every scrape until then would
        // read what this one read, so only the last one before it is kept (same times, same
        // values; a trace with hours between requests would otherwise scrape every worker
        // through them)
        if (live.size === 0 && queue.size === 0 && nextArrival < trace.length) {
          const arrival = arrivalOf(trace[nextArrival]);
          while (next + scrapeInterval <= arrival) next += scrapeInterval;
        }
        queue.push({ time: next, seq: seq++, kind: KIND_SCRAPE, worker: -1 });
      }
    }
  }
  options.onProgress?.(trace.length, trace.length);

  // requests that got a first token count in hit rate and TTFT; completed ones in e2e
  const answered = outcomes.filter((o): o is RequestOutcome => o !== undefined);
  const completed = answered.filter((o) => o.status === undefined);
  let cached = 0;
  let prompt = 0;
  let tokens = 0;
  let lastFinish = 0;
  for (const o of answered) {
    cached += o.cachedTokens;
    prompt += o.promptTokens;
    lastFinish = Math.max(lastFinish, o.arrival + o.e2e);
  }
  for (let i = 0; i < outcomes.length; i++) {
    const o = outcomes[i];
    if (o !== undefined && o.status === undefined) tokens += o.promptTokens + Math.max(1, trace[i].outputLength);
  }
  const busy = engines.map((e) => e.busyMs / 1000);
  const meanBusy = busy.reduce((a, b) => a + b, 0) / n;
  const e2e = percentiles(completed.map((o) => o.e2e));
  return {
    policy: options.label ?? policy,
    hitRate: prompt > 0 ? cached / prompt : 0,
    ttft: percentiles(answered.map((o) => o.ttft)),
    e2e: { mean: e2e.mean, p99: e2e.p99 },
    throughputTokPerS: lastFinish > 0 ? tokens / lastFinish : 0,
    loadImbalance: meanBusy > 0 ? Math.max(...busy) / meanBusy : 1,
    prefillTokens: engines.reduce((a, e) => a + e.prefillTokens, 0),
    cancelled,
    failed,
    retried,
    eventBatchesLost: router.counts.eventBatchesLost,
    outcomes: answered,
    workerBusySeconds: busy,
    loadTimeline,
    rejected: refused.length,
    refused: refused.sort((a, b) => a - b),
    preemptions: engines.reduce((a, e) => a + e.preemptions, 0),
  };
}
