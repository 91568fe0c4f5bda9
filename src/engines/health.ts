import type { KVAwareRouter } from '../core/router/index.js';
import { readBoundedText } from './bounded-body.js';
import { recordOutcome, PollLoop, type CheckStreak } from './poll-loop.js';

/**
 * Why a worker is out of rotation. Several checks have a say — the active health check, the
 * metrics scrape, the gateway's circuit breaker, the engine's progress as its metrics show it
 * (`stall`, metrics/stall.ts), the engine's metrics saying it sleeps (`sleep`: vLLM's sleep
 * mode, metrics/prometheus.ts) — and a worker takes requests only when none of them holds it
 * out; one check recovering must not undo another's verdict.
 */
export type HealthVerdictSource = 'health-check' | 'metrics' | 'breaker' | 'stall' | 'sleep';

/**
 * Whether a failed probe's detail says it timed out or was aborted (AbortSignal.timeout's "The
 * operation was aborted due to timeout"): the engine was too slow to answer, which a busy engine
 * that serves can be, unlike an error status or a refused connection (it says it cannot serve,
 * or is gone).
 */
export function isProbeTimeout(detail: string): boolean {
  return /time(d)? ?out|aborted/i.test(detail);
}

export class WorkerHealth {
  /** The sources holding each worker out, each with whether its probe only timed out. */
  private readonly down = new Map<string, Map<HealthVerdictSource, boolean>>();
  /** Workers added while the gateway runs whose first health check has not passed or failed yet (holdUntilChecked). */
  private readonly unchecked = new Set<string>();
  /** When each worker out of rotation left it (Date.now()). */
  private readonly outSince = new Map<string, number>();
  private readonly listeners: Array<(workerId: string, available: boolean, detail: string) => void> = [];

  constructor(
    private readonly router: KVAwareRouter,
    private readonly log?: (message: string) => void,
  ) {}

  /**
   * Records one source's verdict and tells the router when the worker's availability changes.
   * A source that holds the worker out already may report again with a new detail (a probe that
   * timed out before is now refused): what it says is kept, nothing else changes.
   */
  set(workerId: string, source: HealthVerdictSource, healthy: boolean, detail = ''): void {
    // a verdict that comes after its worker was removed (a probe or scrape under way then) is not
    // kept: the worker added again under its id would start from it, out of rotation or not
    // without the router knowing, and its first health check would not hold it out
    if (!this.router.hasWorker(workerId)) return;
    let reasons = this.down.get(workerId);
    const wasUp = reasons === undefined || reasons.size === 0;
    if (healthy) reasons?.delete(source);
    else {
      if (!reasons) this.down.set(workerId, (reasons = new Map()));
      // the breaker counts the gateway's own requests failing, a stall the engine's own counters
      // standing still, a sleep what the engine says of itself: never a slow probe
      reasons.set(source, (source === 'health-check' || source === 'metrics') && isProbeTimeout(detail));
    }
    const isUp = reasons === undefined || reasons.size === 0;
    const first = source === 'health-check' && this.unchecked.delete(workerId);
    // a first check that failed keeps the worker where it was put, out: said once, as a flip is
    if (first && !healthy)
      this.log?.(`${workerId} stays out of rotation: its first health check failed${detail ? ` (${detail})` : ''}`);
    if (wasUp === isUp) return;
    try {
      this.router.setWorkerHealth(workerId, isUp);
    } catch {
      this.forget(workerId); // the worker was removed meanwhile
      return;
    }
    if (isUp) this.outSince.delete(workerId);
    else this.outSince.set(workerId, Date.now());
    this.log?.(
      `${workerId} is ${isUp ? (first ? 'in rotation (its first health check passed)' : 'back in rotation') : `out of rotation (${source}${detail ? `: ${detail}` : ''})`}`,
    );
    for (const listener of this.listeners) listener(workerId, isUp, detail);
  }

  /**
   * Holds a worker added while the gateway runs out of rotation until its first health check
   * passes (as Envoy's ignore_new_hosts_until_first_hc, and a Kubernetes readiness probe, keep a
   * new endpoint out): an engine that refuses, fails or leads back to the gateway must not take
   * requests before any check looked at it. Recorded as the health check's verdict, not a timed-out
   * one (panic routing passes it over); no listener is told: the worker never took a request. Its
   * first verdict from the health check is logged (set()).
   */
  holdUntilChecked(workerId: string): void {
    const held = this.down.get(workerId) ?? new Map<HealthVerdictSource, boolean>();
    const wasUp = held.size === 0;
    held.set('health-check', false);
    this.down.set(workerId, held);
    this.unchecked.add(workerId);
    if (wasUp) {
      this.router.setWorkerHealth(workerId, false);
      this.outSince.set(workerId, Date.now());
    }
  }

  /** How long the worker has been held out of rotation (ms), or undefined while it takes requests. */
  outFor(workerId: string, now = Date.now()): number | undefined {
    const since = this.outSince.get(workerId);
    return since === undefined ? undefined : now - since;
  }

  /** Whether the worker was added while the gateway runs and its first health check has not answered yet. */
  awaitingFirstCheck(workerId: string): boolean {
    return this.unchecked.has(workerId);
  }

  /** Calls `listener` whenever a worker enters or leaves rotation (with the verdict's detail). */
  onChange(listener: (workerId: string, available: boolean, detail: string) => void): void {
    this.listeners.push(listener);
  }

  /**
   * Whether a probe of the engine (its health check or metrics scrape, or its metrics showing it
   * stalled or asleep) holds the worker out; an open circuit alone does not: it counts the gateway's own
   * requests failing there. Allocates nothing.
   */
  heldOutByProbes(workerId: string): boolean {
    const reasons = this.down.get(workerId);
    if (reasons === undefined) return false;
    for (const source of reasons.keys()) if (source !== 'breaker') return true;
    return false;
  }

  /** The sources currently holding the worker out (empty when it takes requests). */
  reasons(workerId: string): HealthVerdictSource[] {
    return [...(this.down.get(workerId)?.keys() ?? [])];
  }

  /**
   * Whether the worker is out of rotation only because its health check or metrics scrape timed
   * out (or was aborted): a busy engine may be serving still. False when it takes requests, or
   * when a probe got an error status or a refused connection, or its circuit is open.
   */
  heldOutBySlowProbesOnly(workerId: string): boolean {
    const reasons = this.down.get(workerId);
    if (reasons === undefined || reasons.size === 0) return false;
    for (const timedOut of reasons.values()) if (!timedOut) return false;
    return true;
  }

  forget(workerId: string): void {
    this.down.delete(workerId);
    this.unchecked.delete(workerId);
    this.outSince.delete(workerId);
  }
}

/**
 * How long a health probe waits for its answer by default: well past what a healthy engine takes.
 * vLLM's /health answers at once (it reads whether its engine core died); SGLang's, with
 * SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION on (its default), sends a one-token generation and looks
 * for output once a second before it answers (sgl-project/sglang,
 * python/sglang/srt/entrypoints/http_server.py, health_generate), so a second at least, more under
 * load; a wedged one answers 503 by itself after SGLANG_HEALTH_CHECK_TIMEOUT (20 s). Tied to the probe
 * interval, a timeout of a second or less would hold every SGLang engine out. Longer only makes an
 * engine that accepts connections but never answers linger: one that is gone refuses at once.
 */
export const DEFAULT_HEALTH_CHECK_TIMEOUT_MS = 5000;

/** Largest /health answer read (vLLM's and SGLang's are empty). */
const MAX_HEALTH_BYTES = 64 * 1024;

export interface HealthCheckOptions {
  /** Between probes of one worker (default 2000 ms). */
  intervalMs?: number;
  timeoutMs?: number;
  /** Consecutive failed probes before the worker is taken out (default 2). */
  failuresToUnhealthy?: number;
  /** Consecutive good probes before it is taken back (default 1). */
  successesToHealthy?: number;
  /** Headers of every probe (the gateway's Via, so a gateway probed as a worker can tell who asks). */
  headers?: Readonly<Record<string, string>>;
}

interface ProbeState extends CheckStreak {
  url: string;
  probes: number;
  failures: number;
  lastError?: string;
  /** A probe of it is under way (checkNow() and a round do not probe it twice at once). */
  probing: boolean;
}

/**
 * Active health checks: GET `{base}/health` (vLLM's and SGLang's liveness endpoint) per worker
 * on an interval. Separate from the metrics scrape because an engine can serve /metrics while
 * its model loop is wedged, and some deployments expose no /metrics to the router at all.
 */
export class HealthChecker {
  private readonly probes = new Map<string, ProbeState>();
  private readonly pollLoop: PollLoop;
  private readonly timeoutMs: number;
  private readonly failuresToUnhealthy: number;
  private readonly successesToHealthy: number;
  private readonly headers: Readonly<Record<string, string>> | undefined;
  /** Between start() and stop(): checkNow() probes only then. */
  private running = false;

  constructor(
    private readonly health: WorkerHealth,
    options: HealthCheckOptions = {},
  ) {
    const intervalMs = options.intervalMs ?? 2000;
    if (!(intervalMs > 0)) throw new RangeError(`intervalMs must be > 0, got ${intervalMs}`);
    this.timeoutMs = options.timeoutMs ?? Math.min(2000, intervalMs);
    this.pollLoop = new PollLoop(() => this.probeAll(), intervalMs);
    this.failuresToUnhealthy = options.failuresToUnhealthy ?? 2;
    this.successesToHealthy = options.successesToHealthy ?? 1;
    this.headers = options.headers;
  }

  /**
   * Probes the worker from the next round on. `untilChecked`: it starts unhealthy (the caller
   * holds it out, WorkerHealth.holdUntilChecked), and `successesToHealthy` good probes in a row
   * bring it in; a failed one keeps it out, saying why.
   */
  add(workerId: string, baseUrl: string, untilChecked = false): void {
    this.probes.set(workerId, {
      url: `${baseUrl.replace(/\/+$/, '')}/health`,
      consecutiveFailures: 0,
      consecutiveSuccesses: 0,
      healthy: !untilChecked,
      probes: 0,
      failures: 0,
      probing: false,
    });
  }

  /** Probes the worker now, not at the next round (a worker just added); nothing once stopped. */
  checkNow(workerId: string): void {
    if (this.running) void this.probe(workerId);
  }

  remove(workerId: string): void {
    this.probes.delete(workerId);
  }

  state(workerId: string): Readonly<ProbeState> | undefined {
    return this.probes.get(workerId);
  }

  start(): this {
    this.running = true;
    this.pollLoop.start();
    return this;
  }

  stop(): void {
    this.running = false;
    this.pollLoop.stop();
  }

  async probeAll(): Promise<void> {
    await Promise.all([...this.probes.keys()].map((id) => this.probe(id)));
  }

  private async probe(workerId: string): Promise<void> {
    const p = this.probes.get(workerId);
    if (!p || p.probing) return;
    p.probing = true;
    p.probes++;
    let error: string | undefined;
    try {
      // a redirect is not followed (it fails the probe): the gateway follows none of a proxied
      // request's either, so an engine that redirects is not one that can serve
      const res = await fetch(p.url, {
        headers: this.headers,
        redirect: 'manual',
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      await readBoundedText(res.body, MAX_HEALTH_BYTES, '/health');
      if (!res.ok) error = `HTTP ${res.status}`;
    } catch (err) {
      error = (err as Error).message;
    }
    p.probing = false;
    if (this.probes.get(workerId) !== p) return; // removed while probing
    if (error !== undefined) {
      p.failures++;
      p.lastError = error;
    }
    const flipped = recordOutcome(p, error === undefined, this.failuresToUnhealthy, this.successesToHealthy);
    if (flipped !== undefined) this.health.set(workerId, 'health-check', flipped, error ?? '');
    // still out: the latest failure says why (a probe that timed out may now be refused)
    else if (error !== undefined && !p.healthy) this.health.set(workerId, 'health-check', false, error);
  }
}
