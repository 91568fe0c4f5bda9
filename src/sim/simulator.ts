import { BlockHashes } from '../core/hashing.js';
import { KVAwareRouter, type KVAwareRouterOptions } from '../core/router/index.js';
import { EngineModel, type EngineConfig, type EngineRequest, type StepResult } from '../engine-model/engine-model.js';
import { requestBlocks } from './request-blocks.js';
import type { TraceRequest } from './trace.js';

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
  /** Interval of load scrapes, as from /metrics (default 200 ms). */
  scrapeIntervalMs?: number;
  /** Further router options (cost weights, judge roles...). */
  router?: Omit<KVAwareRouterOptions, 'policy' | 'clock' | 'indexMode' | 'blockSize'>;
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
  /** Busy time per worker (s) and its samples over time, for reports. */
  workerBusySeconds: number[];
  loadTimeline: Array<{ t: number; kvUsage: number[] }>;
  /** Requests refused for exceeding the context limit (never routed). */
  rejected: number;
  /** Preemptions (recompute) over all engines. */
  preemptions: number;
}

const KIND_STEP_END = 0;
const KIND_DELIVER = 1;
const KIND_SCRAPE = 2;

interface SimEvent {
  time: number;
  seq: number;
  kind: number;
  worker: number;
  stored?: number[];
  removed?: number[];
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
    const a = this.items;
    a.push(e);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!before(a[i], a[p])) break;
      [a[i], a[p]] = [a[p], a[i]];
      i = p;
    }
  }
  pop(): SimEvent | undefined {
    const a = this.items;
    if (a.length === 0) return undefined;
    const top = a[0];
    const last = a.pop()!;
    if (a.length > 0) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < a.length && before(a[l], a[m])) m = l;
        if (r < a.length && before(a[r], a[m])) m = r;
        if (m === i) break;
        [a[i], a[m]] = [a[m], a[i]];
        i = m;
      }
    }
    return top;
  }
}
function before(x: SimEvent, y: SimEvent): boolean {
  return x.time < y.time || (x.time === y.time && (x.kind < y.kind || (x.kind === y.kind && x.seq < y.seq)));
}

export function percentiles(values: number[]): Percentiles {
  if (values.length === 0) return { mean: 0, p50: 0, p90: 0, p99: 0 };
  const s = [...values].sort((a, b) => a - b);
  const at = (p: number) => s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
  return { mean: s.reduce((a, b) => a + b, 0) / s.length, p50: at(50), p90: at(90), p99: at(99) };
}

export function simulate(trace: readonly TraceRequest[], options: SimulationOptions): PolicyResult {
  const { workers: n, policy } = options;
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`workers must be a positive integer, got ${n}`);
  const speed = options.speed ?? 1;
  if (!(speed > 0)) throw new RangeError(`speed must be > 0, got ${speed}`);
  const eventDelay = options.eventDelayMs ?? 50;
  const scrapeInterval = options.scrapeIntervalMs ?? 200;
  if (trace.length === 0) throw new RangeError('the trace has no requests');
  const blockTokens = trace[0].blockSize;

  let now = 0;
  const router = new KVAwareRouter({ ...options.router, policy, indexMode: 'precise', blockSize: blockTokens, clock: () => now });
  const ids = Array.from({ length: n }, (_, i) => `w${i}`);
  ids.forEach((id) => router.registerWorker(id));
  const pending = Array.from({ length: n }, () => ({ stored: [] as number[], removed: [] as number[] }));
  const engines = ids.map(
    (_, w) =>
      new EngineModel(
        { ...options.engine, blockTokens },
        (hi, lo) => pending[w].stored.push(hi, lo),
        (hi, lo) => pending[w].removed.push(hi, lo),
      ),
  );
  const stepping = new Array<boolean>(n).fill(false);
  const queue = new EventQueue();
  let seq = 0;

  const t0 = trace[0].timestamp;
  const arrivalOf = (r: TraceRequest) => (r.timestamp - t0) / speed;
  const outcomes: RequestOutcome[] = new Array(trace.length);
  const live = new Map<number, { req: TraceRequest; worker: number; ticket: number; arrival: number; cached: number; ttft: number }>();
  const scratch = new BlockHashes(256);
  const loadTimeline: PolicyResult['loadTimeline'] = [];
  let finished = 0;
  let nextArrival = 0;

  let rejected = 0;
  const startStep = (w: number) => {
    // a run of decode steps stops at the next arrival or scrape, which may change the batch
    const nextScrape = (Math.floor(now / scrapeInterval) + 1) * scrapeInterval;
    const until = Math.min(nextScrape, nextArrival < trace.length ? arrivalOf(trace[nextArrival]) : Infinity);
    const end = engines[w].startStep(now, until);
    stepping[w] = true;
    queue.push({ time: end, seq: seq++, kind: KIND_STEP_END, worker: w });
  };

  /** KV events of the step that just ended (its evictions and the blocks it computed) leave now. */
  const publish = (w: number) => {
    const p = pending[w];
    if (p.stored.length > 0 || p.removed.length > 0) {
      queue.push({ time: now + eventDelay, seq: seq++, kind: KIND_DELIVER, worker: w, stored: p.stored, removed: p.removed });
      pending[w] = { stored: [], removed: [] };
    }
  };

  const arrive = (index: number) => {
    const req = trace[index];
    if (engines[0].rejection({ inputTokens: Math.max(1, req.inputLength), outputTokens: Math.max(1, req.outputLength), anchors: req.anchors }) !== null) {
      rejected++;
      finished++;
      return;
    }
    const d = router.route({
      blockHashes: req.hashIds,
      blockTokens: req.blockSize,
      promptTokens: Math.max(1, req.inputLength),
      claGroup: req.claGroup ?? null,
      workflowId: req.sessionId,
      workflowStep: req.step ?? null,
      agentRole: req.agentRole,
      isolate: req.isolate,
      contentAnchors: req.anchors,
    });
    const w = ids.indexOf(d.workerId);
    const blocks = requestBlocks(req, d.cacheSalt, scratch);
    const engineReq: EngineRequest = {
      id: index,
      ...blocks,
      inputTokens: Math.max(1, req.inputLength),
      outputTokens: Math.max(1, req.outputLength),
    };
    live.set(index, { req, worker: w, ticket: d.ticket, arrival: now, cached: 0, ttft: 0 });
    engines[w].enqueue(engineReq);
    if (!stepping[w]) startStep(w);
  };

  const deliver = (e: SimEvent) => {
    const id = ids[e.worker];
    for (const [list, apply] of [
      [e.stored!, (b: BlockHashes) => router.applyStored(id, b)],
      [e.removed!, (b: BlockHashes) => router.applyRemoved(id, b)],
    ] as const) {
      if (list.length === 0) continue;
      const b = new BlockHashes(list.length / 2);
      for (let i = 0; i < list.length; i += 2) {
        b.hi[i / 2] = list[i];
        b.lo[i / 2] = list[i + 1];
      }
      b.length = list.length / 2;
      apply(b);
    }
  };

  queue.push({ time: 0, seq: seq++, kind: KIND_SCRAPE, worker: -1 });
  while (nextArrival < trace.length || queue.size > 0) {
    const top = queue.peek();
    const arrivalTime = nextArrival < trace.length ? arrivalOf(trace[nextArrival]) : Infinity;
    if (top === undefined || arrivalTime < top.time) {
      now = arrivalTime;
      arrive(nextArrival);
      nextArrival++;
      continue;
    }
    queue.pop();
    now = top.time;
    if (top.kind === KIND_STEP_END) {
      const w = top.worker;
      const step: StepResult = engines[w].finishStep();
      publish(w);
      for (const { request, cachedTokens } of step.firstTokens) {
        const s = live.get(request.id)!;
        s.cached = cachedTokens;
        s.ttft = now - s.arrival;
        router.markPrefillDone(s.ticket);
      }
      for (const request of step.finished) {
        const s = live.get(request.id)!;
        live.delete(request.id);
        router.release(s.ticket);
        outcomes[request.id] = {
          request: s.req.index,
          worker: w,
          cachedTokens: s.cached,
          promptTokens: Math.max(1, s.req.inputLength),
          ttft: s.ttft / 1000,
          e2e: (now - s.arrival) / 1000,
          arrival: s.arrival / 1000,
        };
        if (++finished % 500 === 0) options.onProgress?.(finished, trace.length);
      }
      stepping[w] = false;
      if (!engines[w].idle) startStep(w);
    } else if (top.kind === KIND_DELIVER) {
      deliver(top);
    } else {
      const sample: number[] = [];
      engines.forEach((e, w) => {
        router.updateWorkerMetrics(ids[w], { kvUsage: e.kvUsage, waitingRequests: e.waitingCount, runningRequests: e.runningCount });
        sample.push(e.kvUsage);
      });
      if (loadTimeline.length === 0 || now - loadTimeline[loadTimeline.length - 1].t * 1000 >= 5000) loadTimeline.push({ t: now / 1000, kvUsage: sample });
      const busy = nextArrival < trace.length || live.size > 0;
      if (busy) queue.push({ time: now + scrapeInterval, seq: seq++, kind: KIND_SCRAPE, worker: -1 });
    }
  }
  options.onProgress?.(trace.length, trace.length);

  const served = outcomes.filter(Boolean);
  let cached = 0;
  let prompt = 0;
  let tokens = 0;
  let lastFinish = 0;
  for (const o of served) {
    cached += o.cachedTokens;
    prompt += o.promptTokens;
    lastFinish = Math.max(lastFinish, o.arrival + o.e2e);
  }
  trace.forEach((r, i) => {
    if (outcomes[i]) tokens += Math.max(1, r.inputLength) + Math.max(1, r.outputLength);
  });
  const busy = engines.map((e) => e.busyMs / 1000);
  const meanBusy = busy.reduce((a, b) => a + b, 0) / n;
  const e2e = percentiles(served.map((o) => o.e2e));
  return {
    policy: options.label ?? policy,
    hitRate: prompt > 0 ? cached / prompt : 0,
    ttft: percentiles(served.map((o) => o.ttft)),
    e2e: { mean: e2e.mean, p99: e2e.p99 },
    throughputTokPerS: lastFinish > 0 ? tokens / lastFinish : 0,
    loadImbalance: meanBusy > 0 ? Math.max(...busy) / meanBusy : 1,
    prefillTokens: engines.reduce((a, e) => a + e.prefillTokens, 0),
    outcomes: served,
    workerBusySeconds: busy,
    loadTimeline,
    rejected,
    preemptions: engines.reduce((a, e) => a + e.preemptions, 0),
  };
}
