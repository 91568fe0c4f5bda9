import { Counter, Gauge, type Registry } from 'prom-client';
import type { KVAwareRouter } from '../core/router/index.js';
import type { HealthVerdictSource, WorkerHealth } from '../engines/health.js';

/** Every source that can hold a worker out of rotation: each gets a series, 0 or 1, so dashboards never see gaps. */
const OUT_OF_ROTATION_REASONS: readonly HealthVerdictSource[] = [
  'health-check',
  'metrics',
  'breaker',
  'stall',
  'sleep',
];

export interface WorkerStateMetricsSource {
  router: KVAwareRouter;
  health: WorkerHealth;
  /** The KV-event lag of a worker's subscription (seconds), undefined without one. */
  eventLagSeconds(workerId: string): number | undefined;
  /** Stalls found so far per router worker whose engine's progress is watched (metrics/stall.ts). */
  stallCounts(): Iterable<[string, number]>;
}

/**
 * Per-worker state the dashboards chart beside the gateway's request metrics: the engine's
 * waiting queue, availability, why a worker is out of rotation (the circuit breaker among
 * them) and how far its KV events trail. Gauges read the live state when scraped.
 */
export function registerWorkerStateMetrics(registry: Registry, source: WorkerStateMetricsSource): void {
  const { router, health } = source;
  const registers = [registry];
  new Gauge({
    name: 'contextforge_worker_waiting_requests',
    help: "The engine's waiting requests per worker, as last scraped (vllm:num_requests_waiting).",
    labelNames: ['worker'],
    aggregator: 'average',
    registers,
    collect() {
      this.reset();
      for (const w of router.listWorkers()) this.set({ worker: w.id }, w.waitingRequests);
    },
  });
  new Gauge({
    name: 'contextforge_worker_available',
    help: 'Whether a worker takes new requests (1) or is out of rotation or draining (0).',
    labelNames: ['worker'],
    aggregator: 'min',
    registers,
    collect() {
      this.reset();
      for (const w of router.listWorkers()) this.set({ worker: w.id }, w.available ? 1 : 0);
    },
  });
  new Gauge({
    name: 'contextforge_worker_out_of_rotation',
    help: 'Whether a check holds a worker out of rotation, by reason (health-check, metrics, breaker: an open circuit, stall: its engine shows no progress, sleep: its engine says it sleeps).',
    labelNames: ['worker', 'reason'],
    aggregator: 'max',
    registers,
    collect() {
      this.reset();
      for (const w of router.listWorkers()) {
        const held = health.reasons(w.id);
        for (const reason of OUT_OF_ROTATION_REASONS) this.set({ worker: w.id, reason }, held.includes(reason) ? 1 : 0);
      }
    },
  });
  new Gauge({
    name: 'contextforge_kv_event_lag_seconds',
    help: "Age of a worker's newest KV-event batch when it arrived (engine timestamp to router clock).",
    labelNames: ['worker'],
    aggregator: 'max',
    registers,
    collect() {
      this.reset();
      for (const w of router.listWorkers()) {
        const lag = source.eventLagSeconds(w.id);
        if (lag !== undefined) this.set({ worker: w.id }, lag);
      }
    },
  });
  new Counter({
    name: 'contextforge_worker_stalls_total',
    help: 'Times a worker was held out of rotation because its engine showed no progress in its metrics (counters still) while requests of the gateway waited on it and it reported requests running or waiting (--stall-timeout-ms).',
    labelNames: ['worker'],
    // each process of --processes N judges the engines on its own scrapes
    aggregator: 'max',
    registers,
    collect() {
      this.reset();
      const counts = new Map(source.stallCounts());
      for (const w of router.listWorkers()) this.inc({ worker: w.id }, counts.get(w.id) ?? 0);
    },
  });
}
