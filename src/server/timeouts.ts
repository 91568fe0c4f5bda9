/**
 * Timeouts shaped for LLM traffic. Client side: a client must send its headers and its whole
 * request promptly (a slow-body client cannot hold a connection), and an idle connection is
 * closed. Engine side, two different waits: the first byte of a streamed answer comes after
 * the request's queue and prefill — a few seconds past what this worker usually takes means
 * something is wrong, and nothing has reached the client yet, so another worker can take the
 * request; after the first event, tokens arrive steadily and only a long gap between two
 * whole events (the inter-chunk timeout) means the engine stalled. Both count whole events, not
 * bytes: an engine that trickles bytes that never end an event is not answering. A non-streamed
 * answer's first byte is the whole answer, after the whole generation: it is bounded by the
 * inter-chunk timeout only (and so is its rest, once its first byte came: an engine writes it at
 * once, and so is the rest of a whole answer to a streamed request), and an engine that hangs on
 * it is caught by its health check (the request then moves elsewhere).
 */
import { z } from 'zod';
import { describeIssue, firstIssue, issueError } from '../core/schema-issues.js';

export interface GatewayTimeouts {
  /** Time for a client to send the request headers (Node's server.headersTimeout). */
  headersTimeoutMs: number;
  /** Time for a client to send the whole request (server.requestTimeout). */
  requestTimeoutMs: number;
  /** A client connection with no traffic this long is closed (server.timeout). */
  connectionTimeoutMs: number;
  /** Allowance past the worker's expected time to first byte of a streamed answer. */
  firstByteTimeoutMs: number;
  /**
   * Longest gap between two whole events of a streamed answer, longest wait for a non-streamed
   * answer, and for the rest of any answer that is no event stream after its first byte.
   */
  interChunkTimeoutMs: number;
}

export const DEFAULT_TIMEOUTS: Readonly<GatewayTimeouts> = Object.freeze({
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 60_000,
  // above the inter-chunk timeout: a client reading an answer waits that long between its parts
  // (a request still waiting for its answer to begin is not idle: gateway.ts)
  connectionTimeoutMs: 330_000,
  firstByteTimeoutMs: 10_000,
  interChunkTimeoutMs: 300_000,
});

/**
 * The longest delay a Node timer takes (2^31 - 1 ms, about 24.8 days): a longer one fires
 * after 1 ms instead, so every setting that ends up in a timer is bounded by it.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** A delay in ms that a timer can hold: an integer from `min` to MAX_TIMER_MS. */
export const timerMs = (min: number) => z.int().min(min).max(MAX_TIMER_MS);

/**
 * The timeouts' types and ranges (positive integers, ms, at most MAX_TIMER_MS), declared once: checkTimeouts parses
 * through it and `serve`'s settings take their entries from it.
 */
export const TIMEOUTS_SCHEMA = z.strictObject({
  headersTimeoutMs: timerMs(1).default(DEFAULT_TIMEOUTS.headersTimeoutMs),
  requestTimeoutMs: timerMs(1).default(DEFAULT_TIMEOUTS.requestTimeoutMs),
  connectionTimeoutMs: timerMs(1).default(DEFAULT_TIMEOUTS.connectionTimeoutMs),
  firstByteTimeoutMs: timerMs(1).default(DEFAULT_TIMEOUTS.firstByteTimeoutMs),
  interChunkTimeoutMs: timerMs(1).default(DEFAULT_TIMEOUTS.interChunkTimeoutMs),
});

/** How much longer than the inter-chunk timeout a client connection is kept when its timeout is not given. */
export const CONNECTION_MARGIN_MS = 30_000;

/**
 * Fills in the defaults and throws a RangeError or TypeError naming the timeout that is not a
 * positive integer. A client waiting for an answer is idle up to the inter-chunk timeout, so
 * the connection timeout must be longer: when it is not given it is raised past the
 * inter-chunk timeout (by CONNECTION_MARGIN_MS), and when it is given shorter it is refused.
 */
export function checkTimeouts(t: Partial<GatewayTimeouts> | undefined): GatewayTimeouts {
  // a timeout given as undefined means "not given"
  const given = Object.fromEntries(Object.entries(t ?? {}).filter(([, v]) => v !== undefined));
  const parsed = TIMEOUTS_SCHEMA.safeParse(given, { error: describeIssue });
  if (!parsed.success) throw issueError(firstIssue(parsed.error.issues), TIMEOUTS_SCHEMA, 'timeouts');
  const timeouts = parsed.data;
  const problem = connectionTimeoutProblem(
    timeouts,
    given.connectionTimeoutMs !== undefined,
    'timeouts.connectionTimeoutMs',
    'timeouts.interChunkTimeoutMs',
  );
  if (problem !== undefined) throw new RangeError(problem);
  return timeouts;
}

/**
 * Raises `t.connectionTimeoutMs` past the inter-chunk timeout when it was not `given`; when it
 * was, and is not longer, the message saying so (naming the two settings as `connection` and
 * `interChunk`).
 */
export function connectionTimeoutProblem(
  t: Pick<GatewayTimeouts, 'connectionTimeoutMs' | 'interChunkTimeoutMs'>,
  given: boolean,
  connection: string,
  interChunk: string,
): string | undefined {
  if (t.connectionTimeoutMs > t.interChunkTimeoutMs) return undefined;
  if (!given) {
    t.connectionTimeoutMs = Math.min(t.interChunkTimeoutMs + CONNECTION_MARGIN_MS, MAX_TIMER_MS);
    return undefined;
  }
  return `${connection} (${t.connectionTimeoutMs}) must be more than ${interChunk} (${t.interChunkTimeoutMs}): a client reading an answer waits that long between its parts, and its connection would be closed under it`;
}

/**
 * Each worker's usual time to the first byte of a streamed answer (an exponentially weighted
 * mean over its recent requests, so it follows the queue as it grows and drains). The
 * deadline is twice that plus the allowance: a queue that doubles is still waited for, up to
 * the cap (the inter-chunk timeout).
 *
 * Learning from answers alone, the mean never learns that a fleet has become slow: when every
 * engine takes longer to its first byte than the deadline (a long queue, long prompts), no
 * streamed answer arrives within it and the deadline stays where it was, every request timing
 * out on every worker tried. So an attempt that waited out its deadline while the fleet did no
 * better (the proxy asks the breaker: CircuitBreaker.firstByteOverdue) teaches the worker a lower
 * bound (waitedAtLeast): its usual time is at least what was waited, and the next deadline is
 * twice that plus the allowance. One such wait at most triples a fresh worker's deadline, a
 * burst of them no more than one (they all waited the same), and answers bring the mean back
 * down as before. An attempt that timed out while other workers answered is the worker's
 * failure, not the fleet's pace: it teaches nothing and drops what the worker learned (overdue),
 * so an engine that hangs is not waited for longer each time it is tried, nor kept at a deadline
 * a stall of the whole fleet raised.
 */
export class FirstByteDeadlines {
  private readonly meanMs = new Map<string, number>();

  constructor(
    private readonly allowanceMs: number,
    private readonly capMs: number,
    private readonly weight = 0.2,
  ) {}

  deadlineMs(workerId: string): number {
    const mean = this.meanMs.get(workerId) ?? 0;
    return Math.min(this.capMs, Math.round(2 * mean + this.allowanceMs));
  }

  observe(workerId: string, ms: number): void {
    if (!(ms >= 0)) return;
    const prev = this.meanMs.get(workerId);
    this.meanMs.set(workerId, prev === undefined ? ms : prev + this.weight * (ms - prev));
  }

  /**
   * An attempt on the worker waited `ms` for its first byte and gave up: the worker's usual time
   * is taken to be at least that (a wait cut short is a lower bound of the time it would have
   * taken, not a sample of it to average in).
   */
  waitedAtLeast(workerId: string, ms: number): void {
    if (!(ms >= 0)) return;
    const prev = this.meanMs.get(workerId) ?? 0;
    if (ms > prev) this.meanMs.set(workerId, ms);
  }

  /**
   * An attempt on the worker waited `ms` for its first byte and gave up. `failed`: the breaker
   * counted it against the worker (the fleet served meanwhile, CircuitBreaker.firstByteOverdue).
   * Then what the worker learned of slow waits no longer stands for it: a stall of the whole
   * fleet may have raised its deadline to the cap, and an engine that stays hung once the others
   * serve again would keep it, each request sent to it waiting up to the cap before its retry.
   * It starts again from the allowance, as a worker not yet heard. Otherwise the wait is the
   * fleet's pace, and teaches a lower bound (waitedAtLeast).
   */
  overdue(workerId: string, ms: number, failed: boolean): void {
    if (failed) this.forget(workerId);
    else this.waitedAtLeast(workerId, ms);
  }

  forget(workerId: string): void {
    this.meanMs.delete(workerId);
  }
}
