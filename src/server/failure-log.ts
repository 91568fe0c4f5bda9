import type { FailureReason } from './metrics.js';

/** How often one worker's failures of one kind are logged: the first, then a summary a window. */
export const FAILURE_LOG_WINDOW_MS = 10_000;
/** Kinds of failure kept apart (worker × reason × phase); past it the oldest windows are forgotten. */
const MAX_KEYS = 16_384;

/** Where in a request the engine failed it. */
export type FailurePhase = 'before-answer' | 'mid-answer';

/**
 * Log lines for engines failing requests, as operators read them: which worker, why, which
 * request (its client's x-request-id, when it sent one) and what the gateway did about it. The
 * counters (contextforge_upstream_failures_total, contextforge_stream_failures_total) say how
 * many; these say which request, so a client's report can be found. An engine failing every
 * request would write a line per request: each worker's failures of one kind are logged once
 * per window, the next line saying how many more there were.
 */
export class FailureLog {
  private readonly windows = new Map<string, { startedAt: number; suppressed: number }>();

  constructor(
    private readonly log: (message: string) => void,
    private readonly now: () => number = Date.now,
    private readonly windowMs = FAILURE_LOG_WINDOW_MS,
  ) {}

  /**
   * A worker failed a request. `next` says what happened to the request: retried on another
   * worker, answered with the gateway's error, or (mid-answer) cut with an error event.
   */
  failed(
    workerId: string,
    reason: FailureReason,
    phase: FailurePhase,
    requestId: string | undefined,
    next: 'retried' | 'answered with an error' | 'cut',
  ): void {
    const key = `${phase}\u0000${reason}\u0000${workerId}`;
    const t = this.now();
    const w = this.windows.get(key);
    if (w !== undefined && t - w.startedAt < this.windowMs && t >= w.startedAt) {
      w.suppressed++;
      return;
    }
    const earlier =
      w !== undefined && w.suppressed > 0 ? ` (and ${w.suppressed} more like it since the last line)` : '';
    if (w === undefined && this.windows.size >= MAX_KEYS) this.windows.clear();
    this.windows.set(key, { startedAt: t, suppressed: 0 });
    const id = requestId === undefined ? '' : ` ${JSON.stringify(requestId)}`;
    const what =
      phase === 'before-answer'
        ? `failed request${id} before its answer (${reason}): ${next}`
        : `broke off the answer to request${id} after it reached the client (${reason}): ${next}`;
    this.log(`worker ${workerId} ${what}${earlier}`);
  }
}
