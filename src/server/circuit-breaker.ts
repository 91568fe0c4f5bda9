/**
 * A per-worker circuit breaker: a worker that fails `failures` times in a row (connection
 * error or 5xx before the first byte, or an answer it broke off after the client got part of
 * it) is taken out of rotation for `cooldownMs`, then tried
 * again; one more failure opens it again. The proxy decides what is a failure: a 5xx answer is
 * reported only once another worker answered the same request (proxy.ts), or, when no other
 * worker answered that request, through serverErrorAnswerAlone; a streamed answer's first byte
 * overdue through firstByteOverdue; a connection that broke before any answer through
 * connectionLost (a burst of them on connections broken together counts once). An engine that
 * says it is busy (429, SGLang's or vLLM's queue-full refusal) is no failure at all. It acts through
 * WorkerHealth (source 'breaker'), so the breaker, the health check and the metrics scrape agree
 * on who is out and why.
 */
import type { WorkerHealth } from '../engines/health.js';

export interface CircuitBreakerConfig {
  /** Consecutive failures that open a worker's circuit (default 3). */
  failures?: number;
  /** How long an open circuit keeps the worker out (default 5 s). */
  cooldownMs?: number;
}

export class CircuitBreaker {
  private readonly threshold: number;
  private readonly cooldownMs: number;
  private readonly failures = new Map<string, number>();
  private readonly cooldowns = new Set<NodeJS.Timeout>();
  /** Answers below 400 given by any worker so far: a clock of the fleet serving requests. */
  private served = 0;
  /**
   * Per worker, its last server error answer that no other worker answered the request of (see
   * serverErrorAnswerAlone): the `served` clock then, and whether it was counted. Dropped when
   * the worker answers.
   */
  private readonly lastAlone = new Map<string, { servedAt: number; counted: boolean }>();
  /** Per worker, its last streamed answer whose first byte was overdue (firstByteOverdue), as `lastAlone`. */
  private readonly lastOverdue = new Map<string, { servedAt: number; counted: boolean }>();
  /** Attempts started on any worker so far (attemptStarted): a clock of the attempts. */
  private attempts = 0;
  /** Per worker, the `attempts` clock when its last counted lost connection was seen (connectionLost). */
  private readonly lastLost = new Map<string, number>();

  /** `isKnown` says whether a worker is still configured: removed workers are never reopened. */
  constructor(
    config: CircuitBreakerConfig,
    private readonly health: WorkerHealth,
    private readonly isKnown: (workerId: string) => boolean,
  ) {
    this.threshold = config.failures ?? 3;
    this.cooldownMs = config.cooldownMs ?? 5000;
  }

  /** The worker failed a request before answering. */
  failed(id: string): void {
    // a removed worker's failure (a request that was under way when it left) starts no streak:
    // nothing would ever drop it, and a worker added again under its id would inherit it
    if (!this.isKnown(id)) return;
    const n = (this.failures.get(id) ?? 0) + 1;
    this.failures.set(id, n);
    if (n < this.threshold) return;
    this.health.set(id, 'breaker', false, `${n} consecutive failures`);
    this.failures.set(id, this.threshold - 1);
    const t = setTimeout(() => {
      this.cooldowns.delete(t);
      if (this.isKnown(id)) this.health.set(id, 'breaker', true);
    }, this.cooldownMs);
    t.unref();
    this.cooldowns.add(t);
  }

  /**
   * An attempt is about to be sent to a worker: returns its place on the clock of attempts, which
   * connectionLost reads if its connection breaks.
   */
  attemptStarted(): number {
    return ++this.attempts;
  }

  /**
   * The connection of an attempt that started at `startedAt` (attemptStarted) broke before any
   * answer: reset, or closed by the engine's side. An engine that restarted, or something on the
   * way that dropped the connections without the gateway seeing it, leaves every connection the
   * gateway kept to it stale, and each breaks once a request is written on it: a burst of
   * requests sent on them breaks all at once, and counting each would open a healthy engine's
   * circuit. So such a break counts only when its attempt started after the worker's last
   * counted one was seen: an attempt already under way then may have been sent on a connection
   * broken with the others; the attempts retried go on new ones (undici drops a broken
   * connection). An answer to an attempt already under way then ends no streak either (answered
   * with `startedAt`): the attempts of that round, broken or answered, are one event, so an engine
   * that breaks most connections while many requests are under way still opens its circuit after
   * three rounds in which the first attempt to end broke. An engine that breaks every connection
   * counts once per round of attempts (each retry starts after the last counted break). Returns
   * whether it counted.
   */
  connectionLost(id: string, startedAt: number): boolean {
    if (!this.isKnown(id)) return false;
    const last = this.lastLost.get(id);
    if (last !== undefined && startedAt <= last) return false;
    this.lastLost.set(id, this.attempts);
    this.failed(id);
    return true;
  }

  /**
   * The worker answered: its failure streak ends. `served`: with a status below 400 (a client's
   * error shows nothing of whether the fleet can serve). `startedAt` (attemptStarted): an attempt
   * already under way when the worker's last counted lost connection was seen ends no streak of
   * lost connections (connectionLost: its round counted once, by that break).
   */
  answered(id: string, served = true, startedAt?: number): void {
    const lost = this.lastLost.get(id);
    if (startedAt === undefined || lost === undefined || startedAt > lost) this.failures.delete(id);
    this.lastAlone.delete(id);
    this.lastOverdue.delete(id);
    if (served) this.served++;
  }

  /**
   * The worker answered a request with a server error and no other worker answered that request:
   * retries are off, no other worker was in rotation, or the others failed it without an answer.
   * Alone, such an answer cannot tell an engine that fails from a request that makes engines fail
   * (an input that hits an engine bug), so it counts, together with the worker's previous one not
   * yet counted, only when the worker's previous answer was such a server error too and another
   * worker answered a request (below 400) in between: the worker kept failing while the fleet
   * served. A run of requests that fails everywhere with nothing served between (a client sending
   * such inputs in a quiet moment, a fleet whose engines all fail) counts against no worker, and
   * the only worker of a one-worker fleet is never counted so: opening its circuit would only turn
   * its clients' 502 into 503, and the health check still takes out an engine that is down.
   */
  serverErrorAnswerAlone(id: string): void {
    if (!this.isKnown(id)) return;
    this.countedInRun(this.lastAlone, id);
  }

  /**
   * The first byte of a streamed answer did not come within the worker's deadline. A deadline
   * missed while the rest of the fleet serves is the worker's failure (an engine stuck with the
   * request); one missed when nothing is served anywhere is the fleet's pace: a fleet that is
   * healthy but slower than the deadlines (a long queue on every engine, long prompts) misses
   * them on every worker alike, and counting that would open every circuit and leave the
   * clients with 503 while every engine works. So it is judged as serverErrorAnswerAlone judges
   * a server error answer: it counts, with the worker's previous overdue first byte not yet
   * counted, only when that previous one came with no answer of the worker since and another
   * worker answered a request (below 400) in between. Returns whether it is the worker's failure
   * (it counted, or the worker was removed: nothing to learn of it); when it is not,
   * the proxy lets the worker's first-byte deadline learn the wait (FirstByteDeadlines
   * .overdue), so the deadlines grow to the fleet's real latency and the fleet serves again.
   * A hung engine among serving ones still opens its circuit after as many overdue first bytes
   * as before (its first one held back until the second counts, and the only one that teaches its
   * deadline). A connection refused or reset counts at once, as ever: an engine that is down is
   * not slow.
   */
  firstByteOverdue(id: string): boolean {
    if (!this.isKnown(id)) return true;
    return this.countedInRun(this.lastOverdue, id);
  }

  /**
   * Records a failure of `id` in a run of such failures (`runs`, the worker's last one): counted,
   * with the previous one when that was not, when a request was served since the previous one.
   */
  private countedInRun(runs: Map<string, { servedAt: number; counted: boolean }>, id: string): boolean {
    const previous = runs.get(id);
    const counted = previous !== undefined && this.served > previous.servedAt;
    runs.set(id, { servedAt: this.served, counted });
    if (!counted) return false;
    // the previous one, held back until now, adds to the streak without opening it by itself
    if (!previous.counted) this.failures.set(id, (this.failures.get(id) ?? 0) + 1);
    this.failed(id);
    return true;
  }

  /** The worker was removed: its streak is dropped. */
  forget(id: string): void {
    this.failures.delete(id);
    this.lastAlone.delete(id);
    this.lastOverdue.delete(id);
    this.lastLost.delete(id);
  }

  /** Cancels pending cooldowns (the gateway is closing). */
  close(): void {
    for (const t of this.cooldowns) clearTimeout(t);
  }
}
