/**
 * "No worker can take the request" as data: why (for a typed result callers branch on) and
 * as an error for callers that prefer to throw (Dynamo's KvRouterError::NoEndpoints). Worked
 * out only when a decision finds no worker, so the route path pays nothing for it.
 */
import type { WorkerState } from '../worker-registry.js';
import type { NoWorker } from './types.js';
import { typeName } from '../validate.js';

/** Why `candidates` (the workers the policy saw) yielded no choice. */
export function diagnoseNoWorker(
  workers: Iterable<WorkerState>,
  candidates: number,
  exclude: ReadonlySet<string> | undefined,
): NoWorker {
  let registered = 0;
  let unavailable = 0;
  let excluded = 0;
  for (const w of workers) {
    registered++;
    if (!w.available) unavailable++;
    else if (exclude !== undefined && exclude.has(w.id)) excluded++;
  }
  const reason =
    registered === 0
      ? 'no-workers'
      : candidates > 0
        ? 'policy-declined'
        : excluded > 0
          ? 'all-excluded'
          : 'none-available';
  return { reason, workers: registered, unavailable, excluded };
}

/** A sentence for logs and errors. */
export function describeNoWorker(n: NoWorker, policy: string): string {
  switch (n.reason) {
    case 'no-workers':
      return 'no worker is registered';
    case 'none-available':
      return `none of the ${n.workers} registered workers is available (draining or unhealthy)`;
    case 'all-excluded':
      return `every available worker is excluded (${n.excluded} excluded, ${n.unavailable} unavailable, ${n.workers} registered)`;
    case 'policy-declined':
      return `policy '${policy}' chose none of the ${n.workers - n.unavailable - n.excluded} candidates`;
  }
}

/** Thrown by routeOrThrow() when no worker can take the request. */
export class NoEndpointsError extends Error {
  override readonly name = 'NoEndpointsError';
  readonly reason: NoWorker['reason'];

  constructor(
    readonly noWorker: NoWorker,
    readonly policy: string,
  ) {
    super(`no worker can take the request: ${describeNoWorker(checkNoWorker(noWorker), checkPolicyName(policy))}`);
    this.reason = noWorker.reason;
  }
}

const NO_WORKER_REASONS: ReadonlySet<string> = new Set<NoWorker['reason']>([
  'no-workers',
  'none-available',
  'all-excluded',
  'policy-declined',
]);

/** A NoWorker as route() gives it (`result.noWorker`), checked when a caller builds the error itself. */
function checkNoWorker(n: NoWorker): NoWorker {
  if (n === null || typeof n !== 'object')
    throw new TypeError(`noWorker must be a route() result's noWorker, got ${typeName(n)}`);
  if (!NO_WORKER_REASONS.has(n.reason))
    throw new TypeError(`noWorker.reason must be one of ${[...NO_WORKER_REASONS].join(', ')}`);
  return n;
}

function checkPolicyName(policy: string): string {
  if (typeof policy !== 'string')
    throw new TypeError(`policy must be a string (the policy's name), got ${typeof policy}`);
  return policy;
}
