import { boundsOver, type Bounds } from './bounds.js';
import { simulate, type PolicyResult, type SimulationOptions } from './simulator.js';
import type { TraceRequest } from './trace.js';

/** The machine-readable comparison of docs/architecture.md §7 (`simulate --format json`). */
export interface ComparisonReport {
  trace: string;
  requests: number;
  workers: number;
  speed: number;
  bounds: Bounds;
  policies: PolicySummary[];
}

/** One policy of a comparison, as `--format json` prints it. */
export type PolicySummary = Omit<PolicyResult, 'outcomes' | 'workerBusySeconds' | 'loadTimeline' | 'refused'> & {
  /** Requests that got a first token: the ones `hitRate` and `ttft` cover. */
  answered: number;
  /**
   * The bounds over the requests this policy did not reject, present only when it rejected
   * requests the run's `bounds` count (the chosen worker too small, or no worker to take
   * them): its figures cover fewer requests, and only these bounds hold for them.
   */
  bounds?: Bounds;
};

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
  const workerKvTokens = options.scenario?.workerKvTokens;
  const { bounds, counted } = boundsOver(trace, options.engine, workerKvTokens);
  // the run's bounds leave out only what every worker refuses; a policy that rejected more
  // answered fewer requests, and is held to the bounds of those
  const ownBounds = (r: PolicyResult): Bounds | undefined =>
    trace.length - r.rejected < counted
      ? roundBounds(boundsOver(trace, options.engine, workerKvTokens, new Set(r.refused)).bounds)
      : undefined;
  return {
    results,
    report: {
      trace: traceName,
      requests: trace.length,
      workers: options.workers,
      speed: options.speed ?? 1,
      bounds: roundBounds(bounds),
      policies: results.map((r) => {
        const own = ownBounds(r);
        return {
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
          answered: r.outcomes.length,
          ...(own ? { bounds: own } : {}),
        };
      }),
    },
  };
}

const roundBounds = (b: Bounds): Bounds => ({
  infiniteCacheHitRate: round(b.infiniteCacheHitRate),
  idealTtftMean: round(b.idealTtftMean),
});

/**
 * What a reader of a comparison must not miss, one sentence each (the CLI prints them on
 * stderr, the table and the HTML report show them): policies that rejected different numbers
 * of requests were measured on different requests, so their hit rates and TTFTs do not
 * compare as they stand; a policy that answered no request has figures of 0 that measure nothing.
 */
export function comparisonWarnings(report: ComparisonReport): string[] {
  const warnings: string[] = [];
  const counts = report.policies.map((p) => p.rejected);
  if (counts.some((c) => c !== counts[0])) {
    const listed = report.policies.map((p) => `${p.policy} ${p.rejected}`).join(', ');
    const own = report.policies.filter((p) => p.bounds).map((p) => p.policy);
    warnings.push(
      `the policies were measured on different requests: they rejected different numbers (${listed}), ` +
        `and hit rate and TTFT cover only the requests each answered` +
        (own.length > 0 ? `; hold ${own.join(', ')} to the bounds over what each answered (policies[].bounds)` : ''),
    );
  }
  for (const p of report.policies)
    if (p.answered === 0)
      warnings.push(`${p.policy} answered no request: its hit rate and TTFT are 0 for want of any, not measured`);
  return warnings;
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
