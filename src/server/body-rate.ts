/**
 * A minimum data rate for request bodies. A body with a Content-Length takes its whole length
 * from the body budget when its headers arrive (body-budget.ts), so a client that declares a
 * large body and then sends a byte now and then holds that much of the budget for nothing: a
 * few of them, reconnecting as they are cut at the request timeout, would keep every other
 * client refused. Once a grace period has passed, a body must have arrived at an average of at
 * least the minimum rate since its headers, or it is cut (Kestrel's MinRequestBodyDataRate:
 * 240 bytes/s after 5 s). Time during which the gateway itself does not read the connection
 * (its socket paused: the request's reader is not ready yet, or the client does not read its
 * answers) does not count against the client, nor does the wait of a client that asked to be
 * told to send its body (Expect: 100-continue) while that 100 is queued behind earlier answers.
 * The bytes are counted from the connection's total after the read that brought the headers:
 * Node hands the request over before it has parsed the body bytes of that read, and does not
 * say how many they are, so those do not count.
 *
 * One timer for all the bodies being read, not one per request or per chunk: it looks at each
 * body's connection's byte count (kept by Node) once per tick.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { MAX_TIMER_MS } from './timeouts.js';

/** The default minimum rate of a request body, bytes per second (Kestrel's). */
export const DEFAULT_MIN_BODY_RATE = 240;

/** The default time a request body may take before its rate is checked, ms (Kestrel's). */
export const DEFAULT_MIN_BODY_RATE_GRACE_MS = 5000;

/** How often the bodies' rates are checked: about once a second, more often for a short grace period. */
const tickMs = (graceMs: number) => Math.min(1000, Math.max(100, graceMs));

/** One body being read. */
export interface WatchedBody {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  /** The connection's byte count when the request's headers had arrived. */
  readonly startBytes: number;
  /** Time the gateway was reading the connection since then (ms). */
  readingMs: number;
  /** When the body was last looked at (ms, performance.now()). */
  seenAt: number;
  /** The client asked to be told to send its body (Expect: 100-continue). */
  readonly expectsContinue: boolean;
}

export class BodyRates {
  private readonly bodies = new Set<WatchedBody>();
  private timer: NodeJS.Timeout | undefined;
  private readonly tickMs: number;

  /**
   * `bytesPerSecond`: the minimum average rate (0: none, nothing is watched); `graceMs`: the
   * time a body may take before its rate is checked; `cut`: called with a body that is too slow
   * (no longer watched by then).
   */
  constructor(
    readonly bytesPerSecond: number,
    readonly graceMs: number,
    private readonly cut: (body: WatchedBody) => void,
  ) {
    if (!Number.isSafeInteger(bytesPerSecond) || bytesPerSecond < 0)
      throw new RangeError(
        `minBodyRate must be an integer number of bytes per second, 0 or more (got ${bytesPerSecond})`,
      );
    if (!Number.isInteger(graceMs) || graceMs < 1 || graceMs > MAX_TIMER_MS)
      throw new RangeError(`minBodyRateGraceMs must be an integer from 1 to ${MAX_TIMER_MS} (got ${graceMs})`);
    this.tickMs = tickMs(graceMs);
  }

  /** Watches the body of `req` from now until it has arrived; undefined when there is no minimum rate. */
  watch(req: IncomingMessage, res: ServerResponse): WatchedBody | undefined {
    if (this.bytesPerSecond === 0) return undefined;
    const body: WatchedBody = {
      req,
      res,
      startBytes: req.socket.bytesRead,
      readingMs: 0,
      seenAt: performance.now(),
      expectsContinue: req.headers.expect !== undefined && req.headers.expect.toLowerCase() === '100-continue',
    };
    this.bodies.add(body);
    if (this.timer === undefined) {
      this.timer = setInterval(() => this.check(), this.tickMs);
      // the watch alone does not keep the process alive
      this.timer.unref();
    }
    return body;
  }

  /** Stops watching a body (its response closed). */
  forget(body: WatchedBody | undefined): void {
    if (body !== undefined) this.bodies.delete(body);
  }

  /** Stops the timer; nothing is watched any more. */
  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    this.bodies.clear();
  }

  private check(): void {
    const now = performance.now();
    for (const body of this.bodies) {
      const { req, res } = body;
      const socket = req.socket;
      // arrived whole, answered already (the rest is read and dropped), or the client gone
      if (req.complete || res.writableEnded || socket.destroyed) {
        this.bodies.delete(body);
        continue;
      }
      // a paused socket is the gateway not reading, not the client not sending; nor does a
      // client that waits for its 100 Continue, queued behind earlier answers on the connection
      // (the response gets the socket, and the 100 goes out, once they are written)
      const toldToWait = body.expectsContinue && res.socket !== socket;
      if (!socket.isPaused() && !toldToWait) body.readingMs += now - body.seenAt;
      body.seenAt = now;
      if (body.readingMs <= this.graceMs) continue;
      const bytes = socket.bytesRead - body.startBytes;
      if (bytes * 1000 >= this.bytesPerSecond * body.readingMs) continue;
      this.bodies.delete(body);
      try {
        this.cut(body);
      } catch {
        // a timer's throw would end the process: a body that cannot be answered is cut unanswered
        socket.destroy();
      }
    }
    if (this.bodies.size === 0) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  }
}
