import type { KVAwareRouter } from '../../core/router/index.js';
import { redactUserinfo } from '../../core/shown-text.js';
import { readBoundedText } from '../bounded-body.js';
import type { WorkerHealth } from '../health.js';
import { recordOutcome, PollLoop, type CheckStreak } from '../poll-loop.js';
import { splitCredentials } from '../url-credentials.js';
import { readEngineLoad, type EngineLoad } from './prometheus.js';
import type { StallWatch } from './stall.js';

/**
 * Default interval of the load-metrics scrape (ms; `--metrics-interval-ms`). The routing figures
 * the project reports are simulated with load read this often (the simulator's
 * DEFAULT_SCRAPE_INTERVAL_MS, the same value): read every second instead, `cost`'s mean TTFT on
 * the tenant traces at ×3 is 1.22× as long (docs/simulator.md, "The router in the loop"). llm-d's
 * endpoint picker reads every 50 ms.
 */
export const DEFAULT_METRICS_INTERVAL_MS = 200;

/** Largest /metrics page read (vLLM's, with every histogram and adapter label, is well under it). */
export const MAX_METRICS_BYTES = 16 * 1024 * 1024;

/**
 * Scrapes each worker's /metrics on an interval and feeds the router: KV usage, waiting and
 * running requests. A worker is marked unhealthy after `failuresToUnhealthy` consecutive
 * failed scrapes (no answer, HTTP error, no load metrics in the page) and healthy again after
 * `successesToHealthy` consecutive good ones. A worker whose page says its engine sleeps
 * (EngineLoad.asleep: vLLM's sleep mode) is held out of rotation from that scrape on (source
 * `sleep`) and comes back with the first good scrape that no longer says so: asleep, the engine
 * answers /health and its gauges keep what its last step set, and a request sent there waits
 * until it is woken.
 */
export interface MetricsTarget {
  workerId: string;
  url: string;
  /** The data-parallel rank whose series to read (vLLM's `engine` label); default: all, summed. */
  engine?: string;
}

export interface ScraperOptions {
  intervalMs?: number;
  timeoutMs?: number;
  failuresToUnhealthy?: number;
  successesToHealthy?: number;
  log?: (message: string) => void;
  /** Where health verdicts go when other checks share the say (the gateway); else straight to the router. */
  health?: WorkerHealth;
  /** Headers of every scrape (the gateway's Via, so a gateway scraped as a worker can tell who asks). */
  headers?: Readonly<Record<string, string>>;
  /** Judges from each good scrape whether the engine makes progress (the gateway). */
  stall?: StallWatch;
}

export interface TargetState extends CheckStreak {
  lastLoad?: EngineLoad;
  /** The load metric the engine last reported out of range (logged when it starts and when it stops). */
  outOfRange?: string;
  /** How the engine sleeps, as its last good scrape said (EngineLoad.asleep); undefined while awake. */
  asleep?: string;
  scrapes: number;
  failures: number;
  lastError?: string;
}

/**
 * Whether an engine read twice, `before` then `now`, did nothing in between: its progress
 * readings (EngineLoad.progress: its counters, and the gauges its scheduler sets) all the same.
 * Its gauges may then be its last busy step's: SGLang sets them with each prefill batch and every
 * 40 decode steps, and refreshes them only 30 s after it goes idle
 * (scheduler_components/metrics_reporter.py, _maybe_log_idle_metrics); vLLM sets them with each
 * step, and none runs after every request was aborted. With none of the gateway's requests there
 * either (those of every process and replica sharing the state: a busy SGLang engine's page may
 * not move between two scrapes while it decodes), nothing holds KV or waits on it: what the
 * gauges say is from before. An engine whose page has no progress readings is never taken as idle.
 */
function isIdle(before: EngineLoad | undefined, now: EngineLoad): boolean {
  const a = before?.progress;
  const b = now.progress;
  if (a === undefined || b === undefined || a.length !== b.length) return false;
  // NaN: a reading the page does not have, in both
  for (let i = 0; i < a.length; i++) if (!Object.is(a[i], b[i])) return false;
  return true;
}

/**
 * A scrape's deadline for an interval: at least half a second, as a health probe's (a scrape
 * timing out after a short interval's few ms would take every worker out of rotation; rounds
 * never overlap: the next one waits), at most two.
 */
export function scrapeTimeoutMs(intervalMs: number): number {
  return Math.min(2000, Math.max(500, intervalMs));
}

/**
 * How old a worker's last reading gets between two scrapes that succeed, at most: a round waits
 * for its slowest scrape (up to its deadline), the next starts an interval after, and its
 * reading lands up to a deadline later.
 */
export function scrapeGapMs(intervalMs: number): number {
  return intervalMs + 2 * scrapeTimeoutMs(intervalMs);
}

export class MetricsScraper {
  private readonly states = new Map<string, TargetState>();
  /** Each target as it is fetched: its URL's credentials (fetch refuses them in a URL) as a header. */
  private readonly targets = new Map<string, { url: string; engine?: string; headers?: Record<string, string> }>();
  private readonly pollLoop: PollLoop;
  private readonly timeoutMs: number;
  private readonly failuresToUnhealthy: number;
  private readonly successesToHealthy: number;
  /**
   * Without the gateway's verdicts: each target's state (as add() made it) until the router is
   * told the worker's health from it. A target added again starts healthy and awake, while the
   * router's worker may still be held out by what its last state said (its engine asleep, its
   * scrapes failing); the first good scrape of the new state says it.
   */
  private readonly untold = new WeakSet<TargetState>();

  constructor(
    private readonly router: KVAwareRouter,
    targets: MetricsTarget[],
    private readonly options: ScraperOptions = {},
  ) {
    const intervalMs = options.intervalMs ?? DEFAULT_METRICS_INTERVAL_MS;
    this.timeoutMs = options.timeoutMs ?? scrapeTimeoutMs(intervalMs);
    this.pollLoop = new PollLoop(() => this.scrapeAll(), intervalMs);
    this.failuresToUnhealthy = options.failuresToUnhealthy ?? 3;
    this.successesToHealthy = options.successesToHealthy ?? 2;
    for (const t of targets) this.add(t);
  }

  add(t: MetricsTarget): void {
    const { url, authorization } = splitCredentials(t.url);
    const headers = authorization === undefined ? this.options.headers : { ...this.options.headers, authorization };
    this.targets.set(t.workerId, { url, engine: t.engine, headers });
    this.options.stall?.forget(t.workerId);
    const state: TargetState = {
      consecutiveFailures: 0,
      consecutiveSuccesses: 0,
      healthy: true,
      scrapes: 0,
      failures: 0,
    };
    this.states.set(t.workerId, state);
    if (!this.options.health) this.untold.add(state);
  }

  remove(workerId: string): void {
    this.targets.delete(workerId);
    this.states.delete(workerId);
    this.options.stall?.forget(workerId);
  }

  state(workerId: string): TargetState | undefined {
    return this.states.get(workerId);
  }

  start(): this {
    this.pollLoop.start();
    return this;
  }

  stop(): void {
    this.pollLoop.stop();
  }

  /** One round over every target (also what start() repeats). */
  async scrapeAll(): Promise<void> {
    await Promise.all([...this.targets].map(([workerId, t]) => this.scrape(workerId, t)));
  }

  private async scrape(workerId: string, t: { url: string; engine?: string; headers?: Record<string, string> }) {
    const s = this.states.get(workerId);
    if (!s) return;
    s.scrapes++;
    // requests routed while the scrape is under way may not be in the engine's queue it reads
    const sampledAt = this.router.now();
    try {
      // a redirect is not followed (it fails the scrape): the page it leads to is not this worker's load
      const res = await fetch(t.url, {
        headers: t.headers,
        redirect: 'manual',
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      if (!res.ok) {
        // its body is let go of now: unread, it would hold the connection until the deadline
        // (or for ever, without one) on every scrape of an engine whose /metrics fails
        await res.body?.cancel().catch(() => {});
        throw new Error(`HTTP ${res.status}`);
      }
      const load = readEngineLoad(await readBoundedText(res.body, MAX_METRICS_BYTES, '/metrics'), t.engine);
      if (this.states.get(workerId) !== s) return; // removed while scraping
      // the requests of every gateway process and replica count (shared in-flight load): another's
      // on an engine whose page has not moved for a while (SGLang decoding) make it no idle one
      const idle = isIdle(s.lastLoad, load) && this.router.inFlightRequests(workerId) === 0;
      s.lastLoad = load;
      // an idle engine holds no request's KV and queues nothing, whatever its gauges still say
      this.router.updateWorkerMetrics(workerId, {
        kvUsage: idle ? 0 : load.kvUsage,
        waitingRequests: idle ? 0 : load.waiting,
        sampledAt,
        runningRequests: idle ? 0 : load.running,
        kvCapacityTokens: load.kvCapacityTokens,
      });
      // read as its worst load, the worker gets few requests or none: said once, not on every scrape
      if (load.outOfRange !== s.outOfRange) {
        if (load.outOfRange !== undefined)
          this.options.log?.(
            `metrics: ${workerId} reports ${load.outOfRange} out of its range (negative, NaN or infinite): read as its worst load while it does`,
          );
        else this.options.log?.(`metrics: ${workerId} reports ${s.outOfRange} in range again`);
        s.outOfRange = load.outOfRange;
      }
      if (load.asleep !== s.asleep) this.setAsleep(workerId, s, load.asleep);
      const flipped = recordOutcome(s, true, this.failuresToUnhealthy, this.successesToHealthy);
      if (flipped !== undefined) this.setHealth(workerId, s, flipped);
      else if (this.untold.has(s)) this.tellRouter(workerId, s);
      // asleep (or paused), the engine keeps its gauges as they were and the requests it holds
      // there: its stillness is no stall (its readings start over when it wakes, setAsleep)
      if (load.asleep === undefined)
        this.options.stall?.observe(workerId, load.progress, load.running + load.waiting, this.router.now());
    } catch (err) {
      s.failures++;
      // (an error may name the URL: it is shown, so without a password)
      s.lastError = redactUserinfo((err as Error).message);
      const flipped = recordOutcome(s, false, this.failuresToUnhealthy, this.successesToHealthy);
      if (flipped !== undefined) this.setHealth(workerId, s, flipped);
      // still out: the latest failure says why (a scrape that timed out may now be refused)
      else if (!s.healthy && this.states.get(workerId) === s)
        this.options.health?.set(workerId, 'metrics', false, s.lastError);
    }
  }

  private setHealth(workerId: string, s: TargetState, healthy: boolean): void {
    if (this.options.health) return this.options.health.set(workerId, 'metrics', healthy, healthy ? '' : s.lastError);
    if (this.tellRouter(workerId, s))
      this.options.log?.(`metrics: ${workerId} is ${healthy ? 'healthy again' : `unhealthy (${s.lastError})`}`);
  }

  /**
   * Without the gateway's verdicts: the router's worker takes requests when this target's scrapes
   * say it is healthy and its engine awake (a sleeping engine stays out however its scrapes go).
   * False when the router refused (the worker was removed meanwhile: logged).
   */
  private tellRouter(workerId: string, s: TargetState): boolean {
    this.untold.delete(s);
    try {
      this.router.setWorkerHealth(workerId, s.healthy && s.asleep === undefined);
      return true;
    } catch (err) {
      this.options.log?.(`metrics: ${workerId}: ${(err as Error).message}`);
      return false;
    }
  }

  /**
   * The engine's page says it went to sleep (`asleep`: how), or woke (undefined): the worker
   * leaves rotation or comes back (source `sleep`), said once per change. Either way what the
   * stall watch read of it says nothing from here on: it starts over, and a stall verdict is lifted
   * (a paused engine keeps its gauges and the requests it holds, so the watch would take it for
   * stalled, and nothing would lift that verdict once it woke with nothing to do). The stall
   * verdict goes after the sleep verdict holds the worker out, and before that verdict lets it back.
   */
  private setAsleep(workerId: string, s: TargetState, asleep: string | undefined): void {
    s.asleep = asleep;
    this.options.log?.(
      asleep !== undefined
        ? `metrics: ${workerId}'s engine is asleep (vllm:engine_sleep_state ${asleep}): out of rotation until it wakes`
        : `metrics: ${workerId}'s engine is awake again`,
    );
    if (asleep === undefined) this.options.stall?.reset(workerId);
    const detail = asleep === undefined ? '' : `engine asleep (${asleep})`;
    if (this.options.health) this.options.health.set(workerId, 'sleep', asleep === undefined, detail);
    else this.tellRouter(workerId, s);
    if (asleep !== undefined) this.options.stall?.reset(workerId);
  }
}
