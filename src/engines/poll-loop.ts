/**
 * The polling shared by the health checker and the metrics scraper: a loop that runs one
 * round over every worker at a fixed interval, and the hysteresis that turns a worker's
 * check outcomes into a verdict that does not flap.
 */

/**
 * Runs `round` now and then again `intervalMs` after each round ends (never two at once), on
 * unref'd timers so a poller never keeps the process alive by itself.
 */
export class PollLoop {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly round: () => Promise<void>,
    private readonly intervalMs: number,
  ) {}

  start(): void {
    const tick = async () => {
      await this.round();
      if (this.timer !== undefined) this.timer = setTimeout(tick, this.intervalMs).unref();
    };
    this.timer = setTimeout(tick, 0).unref();
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}

/** Consecutive outcomes of a check, and the verdict they lead to (hysteresis both ways). */
export interface CheckStreak {
  consecutiveFailures: number;
  consecutiveSuccesses: number;
  healthy: boolean;
}

/**
 * Counts one outcome; returns the new verdict when it flips (after `failuresToUnhealthy`
 * failures in a row, or `successesToHealthy` successes in a row), else undefined.
 */
export function recordOutcome(
  s: CheckStreak,
  ok: boolean,
  failuresToUnhealthy: number,
  successesToHealthy: number,
): boolean | undefined {
  if (ok) {
    s.consecutiveFailures = 0;
    s.consecutiveSuccesses++;
    if (!s.healthy && s.consecutiveSuccesses >= successesToHealthy) return (s.healthy = true);
  } else {
    s.consecutiveSuccesses = 0;
    s.consecutiveFailures++;
    if (s.healthy && s.consecutiveFailures >= failuresToUnhealthy) return (s.healthy = false);
  }
  return undefined;
}
