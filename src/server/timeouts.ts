/**
 * Timeouts shaped for LLM traffic. Client side: a client must send its headers and its whole
 * request promptly (a slow-body client cannot hold a connection), and an idle connection is
 * closed. Engine side, two different waits: the first byte of a streamed answer comes after
 * the request's queue and prefill — a few seconds past what this worker usually takes means
 * something is wrong, and nothing has reached the client yet, so another worker can take the
 * request; after the first byte, tokens arrive steadily and only a long gap between two chunks
 * (the inter-chunk timeout) means the engine stalled. A non-streamed answer's first byte is the
 * whole answer, after the whole generation: it is bounded by the inter-chunk timeout only, and
 * an engine that hangs on it is caught by its health check (the request then moves elsewhere).
 */
export interface GatewayTimeouts {
  /** Time for a client to send the request headers (Node's server.headersTimeout). */
  headersTimeoutMs: number;
  /** Time for a client to send the whole request (server.requestTimeout). */
  requestTimeoutMs: number;
  /** A client connection with no traffic this long is closed (server.timeout). */
  connectionTimeoutMs: number;
  /** Allowance past the worker's expected time to first byte of a streamed answer. */
  firstByteTimeoutMs: number;
  /** Longest gap between two chunks of an answer, and longest wait for a non-streamed answer. */
  interChunkTimeoutMs: number;
}

export const DEFAULT_TIMEOUTS: Readonly<GatewayTimeouts> = Object.freeze({
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 60_000,
  // above the inter-chunk timeout: a client waiting for a long non-streamed answer is idle
  connectionTimeoutMs: 330_000,
  firstByteTimeoutMs: 10_000,
  interChunkTimeoutMs: 300_000,
});

export function checkTimeouts(t: Partial<GatewayTimeouts> | undefined): GatewayTimeouts {
  const out: GatewayTimeouts = { ...DEFAULT_TIMEOUTS };
  for (const [key, v] of Object.entries(t ?? {})) if (v !== undefined) out[key as keyof GatewayTimeouts] = v;
  for (const [key, v] of Object.entries(out)) {
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1)
      throw new RangeError(`timeouts.${key} must be a positive integer (ms), got ${String(v)}`);
  }
  return out;
}

/**
 * Each worker's usual time to the first byte of a streamed answer (an exponentially weighted
 * mean over its recent requests, so it follows the queue as it grows and drains). The
 * deadline is twice that plus the allowance: a queue that doubles is still waited for.
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

  forget(workerId: string): void {
    this.meanMs.delete(workerId);
  }
}
