import { computeBounds, type Bounds } from './bounds.js';
import { simulate, type PolicyResult, type SimulationOptions } from './simulator.js';
import type { TraceRequest } from './trace.js';

/** The machine-readable comparison of docs/architecture.md §7 (`simulate --format json`). */
export interface ComparisonReport {
  trace: string;
  requests: number;
  workers: number;
  speed: number;
  bounds: Bounds;
  policies: Array<Omit<PolicyResult, 'outcomes' | 'workerBusySeconds' | 'loadTimeline'>>;
}

export interface Comparison {
  report: ComparisonReport;
  /** Full results, for assignments and the HTML report. */
  results: PolicyResult[];
}

const round = (x: number, d = 4) => Math.round(x * 10 ** d) / 10 ** d;

/** Variants a comparison may name besides the policies themselves. */
const PREFIX_ONLY = '-prefix-only';

/** Splits `cost-prefix-only` into the policy and the router options of the variant. */
export function policyVariant(name: string): { policy: string; router?: SimulationOptions['router'] } {
  if (name.endsWith(PREFIX_ONLY))
    return { policy: name.slice(0, -PREFIX_ONLY.length), router: { contentAnchorScoring: false } };
  return { policy: name };
}

/**
 * Runs every policy on the same requests, one after another, and summarises them. A name
 * ending in `-prefix-only` runs that policy with content-anchor scoring off.
 */
export function comparePolicies(
  traceName: string,
  trace: readonly TraceRequest[],
  policies: readonly string[],
  options: Omit<SimulationOptions, 'policy'>,
  onPolicy?: (policy: string, index: number) => void,
): Comparison {
  const results: PolicyResult[] = [];
  policies.forEach((policy, i) => {
    onPolicy?.(policy, i);
    const v = policyVariant(policy);
    results.push(
      simulate(trace, { ...options, policy: v.policy, label: policy, router: { ...options.router, ...v.router } }),
    );
  });
  const bounds = computeBounds(trace, options.engine, options.scenario?.workerKvTokens);
  return {
    results,
    report: {
      trace: traceName,
      requests: trace.length,
      workers: options.workers,
      speed: options.speed ?? 1,
      bounds: { infiniteCacheHitRate: round(bounds.infiniteCacheHitRate), idealTtftMean: round(bounds.idealTtftMean) },
      policies: results.map((r) => ({
        policy: r.policy,
        hitRate: round(r.hitRate),
        ttft: { mean: round(r.ttft.mean), p50: round(r.ttft.p50), p90: round(r.ttft.p90), p99: round(r.ttft.p99) },
        e2e: { mean: round(r.e2e.mean), p99: round(r.e2e.p99) },
        throughputTokPerS: Math.round(r.throughputTokPerS),
        loadImbalance: round(r.loadImbalance),
        prefillTokens: r.prefillTokens,
        rejected: r.rejected,
        preemptions: r.preemptions,
        cancelled: r.cancelled,
        failed: r.failed,
        retried: r.retried,
        eventBatchesLost: r.eventBatchesLost,
      })),
    },
  };
}

/** One JSON line per request and policy (docs/architecture.md §7 `--assignments`). */
export function* assignmentLines(results: readonly PolicyResult[]): Generator<string> {
  for (const r of results) {
    for (const o of r.outcomes) {
      yield JSON.stringify({
        policy: r.policy,
        request: o.request,
        worker: o.worker,
        cachedTokens: o.cachedTokens,
        promptTokens: o.promptTokens,
        ttft: round(o.ttft, 6),
        e2e: round(o.e2e, 6),
      });
    }
  }
}
