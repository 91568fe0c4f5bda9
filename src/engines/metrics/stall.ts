import type { WorkerHealth } from '../health.js';

/**
 * How long an engine may show no progress while it holds requests of the gateway's before it is
 * held out of rotation, by default. Both engines move what the scrape reads as progress
 * (prometheus.ts PROGRESS_COUNTERS, and the running and waiting counts and KV usage their
 * scheduler sets) with every scheduler step or batch, a chunk of a chunked prefill included: vLLM
 * sends its scheduler stats each step, outputs or not; SGLang counts each prefill batch's tokens
 * and sets its gauges then, and every 40 decode steps. So the quiet a working engine can show is
 * one step: a prefill chunk of at most --max-num-batched-tokens (vLLM) or --chunked-prefill-size
 * (SGLang) tokens, seconds even at long contexts. A minute leaves room for a prefill that is not
 * chunked (a whole long prompt in one step) and for a scrape interval or two, and still takes a
 * wedged engine out in a fifth of the default --upstream-timeout-ms (300 s).
 */
export const DEFAULT_STALL_TIMEOUT_MS = 60_000;

export interface StallWatchOptions {
  /** No progress for this long with work on the engine makes it stalled (0: never). */
  timeoutMs: number;
  health: WorkerHealth;
  /** The gateway's own requests on a router worker that have not completed (the router's count). */
  inFlight: (workerId: string) => number;
  log?: (message: string) => void;
}

interface Watched {
  progress: readonly number[];
  /** Since when nothing moved while the gateway and the engine both had work there (router clock, ms). */
  quietSince: number;
  /** When it was found stalled, while it is. */
  stalledAt?: number;
  /** Stalls found so far (contextforge_worker_stalls_total). */
  stalls: number;
}

/**
 * Tells an engine that makes progress from one whose loop hangs (a GPU or NCCL stall) while its
 * HTTP server still answers /health and /metrics, from what each metrics scrape reads
 * (EngineLoad.progress). A worker is stalled when the gateway has requests in flight on it, the
 * engine reports requests running or waiting, and none of its progress readings has changed for
 * `timeoutMs`. Then it is held out of rotation (WorkerHealth source `stall`: the requests its
 * engine has not started answering move to another worker, as when any verdict takes it out),
 * logged once and counted; it comes back as soon as a reading changes (a restarted engine's
 * counters starting over change too). An engine whose page has none of the progress counters, or
 * a worker not scraped, is never judged.
 */
export class StallWatch {
  private readonly watched = new Map<string, Watched>();

  constructor(private readonly options: StallWatchOptions) {
    const t = options.timeoutMs;
    if (!Number.isInteger(t) || t < 0) throw new RangeError(`stall timeoutMs must be an integer >= 0, got ${t}`);
  }

  /**
   * One scrape's reading of a worker at `now` (router clock, ms): its progress readings (undefined:
   * the page has none of the counters) and the requests its engine reports running and waiting.
   */
  observe(workerId: string, progress: readonly number[] | undefined, engineRequests: number, now: number): void {
    if (this.options.timeoutMs === 0) return;
    const w = this.watched.get(workerId);
    if (progress === undefined) {
      // the engine no longer exports them (restarted as another release): nothing to judge by
      if (w?.stalledAt !== undefined) this.resume(workerId, w, now);
      if (w !== undefined) w.progress = [];
      return;
    }
    if (w === undefined) {
      this.watched.set(workerId, { progress, quietSince: now, stalls: 0 });
      return;
    }
    const moved = !sameReadings(w.progress, progress);
    w.progress = progress;
    if (moved) {
      w.quietSince = now;
      if (w.stalledAt !== undefined) this.resume(workerId, w, now);
      return;
    }
    if (w.stalledAt !== undefined) return;
    // the clock runs only while both sides have work there: an idle engine moves nothing, and one
    // that just got a request may not have stepped yet when it is read
    if (engineRequests <= 0 || this.options.inFlight(workerId) <= 0) {
      w.quietSince = now;
      return;
    }
    const quietMs = now - w.quietSince;
    if (quietMs < this.options.timeoutMs) return;
    w.stalledAt = now;
    w.stalls++;
    const seconds = Math.round(quietMs / 1000);
    this.options.log?.(
      `${workerId}: its engine shows no progress for ${seconds} s with requests running or waiting (metrics answer, counters still): out of rotation until they move`,
    );
    this.options.health.set(workerId, 'stall', false, `no engine progress for ${seconds} s`);
  }

  private resume(workerId: string, w: Watched, now: number): void {
    const seconds = Math.round((now - (w.stalledAt ?? now)) / 1000);
    w.stalledAt = undefined;
    this.options.log?.(`${workerId}: its engine progresses again (held out ${seconds} s as stalled)`);
    this.options.health.set(workerId, 'stall', true);
  }

  /**
   * What the worker's engine read until now says nothing of its progress from here on (it was put
   * to sleep, or woke: a paused engine's gauges keep their last values, and one woken with nothing
   * to do moves none): its readings start over from the next observe(), and a stall verdict is
   * lifted (logged). Its stall count stays.
   */
  reset(workerId: string): void {
    const w = this.watched.get(workerId);
    if (w === undefined) return;
    // no reading has this length: the next one counts as moved, and the quiet starts then
    w.progress = [];
    if (w.stalledAt === undefined) return;
    w.stalledAt = undefined;
    this.options.log?.(
      `${workerId}: no longer held out as stalled (its engine slept or woke: its readings start over)`,
    );
    this.options.health.set(workerId, 'stall', true);
  }

  /** Whether the worker is held out as stalled now. */
  stalled(workerId: string): boolean {
    return this.watched.get(workerId)?.stalledAt !== undefined;
  }

  /** Stalls found per watched worker (each worker once seen, 0 before its first). */
  *stallCounts(): IterableIterator<[string, number]> {
    for (const [id, w] of this.watched) yield [id, w.stalls];
  }

  /** The worker was removed: its readings and count go (its verdict goes with WorkerHealth.forget). */
  forget(workerId: string): void {
    this.watched.delete(workerId);
  }
}

/** Whether two scrapes read the same (NaN, a counter the page lacks, equals NaN). */
function sameReadings(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (!Object.is(a[i], b[i])) return false;
  return true;
}
