/**
 * A per-worker circuit breaker: a worker that fails `failures` times in a row (connection
 * error or 5xx before the first byte, or an answer it broke off after the client got part of
 * it) is taken out of rotation for `cooldownMs`, then tried
 * again; one more failure opens it again. The proxy decides what is a failure: a 5xx answer is
 * reported only once another worker answered the same request (proxy.ts). It acts through WorkerHealth (source 'breaker'), so
 * the breaker, the health check and the metrics scrape agree on who is out and why.
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

  /** The worker answered: its failure streak ends. */
  answered(id: string): void {
    this.failures.delete(id);
  }

  /** The worker was removed: its streak is dropped. */
  forget(id: string): void {
    this.failures.delete(id);
  }

  /** Cancels pending cooldowns (the gateway is closing). */
  close(): void {
    for (const t of this.cooldowns) clearTimeout(t);
  }
}
