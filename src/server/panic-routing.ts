/**
 * Panic routing: when no worker that could take a request is in rotation, the request is routed
 * over the workers held out only because their active health check or their metrics scrape
 * timed out, rather than refused with 503. Those verdicts come from probes the gateway sends
 * beside the traffic, with short timeouts: on a loaded machine (many engines on few cores, a
 * gateway starved of CPU) every probe can time out while the engines serve, and the whole fleet
 * leaves rotation at once. A probe answered with an error status or refused is the engine saying
 * it cannot serve, or gone: such a worker stays out, as without panic routing.
 * Envoy answers the same situation with its panic threshold (below 50% healthy hosts it balances
 * over all of them); the SGLang model gateway and the llm-d endpoint picker do not (503), but the
 * latter only drops endpoints Kubernetes says are not ready, never for a failed metrics scrape.
 *
 * It stays conservative: only when no worker at all is in rotation for the request (not below a
 * share of the fleet, as Envoy's threshold), and never over a worker whose circuit is open (the
 * breaker's own half-open try tests it after its cooldown) or that is draining or removed (the
 * operator's decision). A request that fails on a panic-routed worker takes the usual way:
 * retried on another, counted by the breaker, 502 once every attempt failed.
 */
import type { KVAwareRouter, NoWorkerResult, RouteResult } from '../core/router/index.js';
import type { WorkerState } from '../core/worker-registry.js';
import type { WorkerHealth } from '../engines/health.js';

/**
 * Whether a worker outside `without` is in rotation: one a request could be routed to now, when
 * `without` holds the workers that do not serve its model. Panic routing starts for a request
 * only when none is.
 */
export function inRotationFor(workers: readonly WorkerState[], without: ReadonlySet<string>): boolean {
  return workers.some((w) => w.available && !without.has(w.id));
}

/** Most worker ids the log line at the start of panic routing names. */
const MAX_LOGGED_IDS = 8;

export interface PanicRoutingOptions {
  router: KVAwareRouter;
  health: WorkerHealth;
  /** One line when panic routing starts (a warning) and when it ends; never one per request. */
  log: (message: string) => void;
  /** A request routed over workers held out of rotation. */
  onRouted: () => void;
}

/** A request's decision with panic routing (PanicRouting.decide); `A`: what asking again answers. */
export interface PanicDecision<A extends RouteResult | undefined> {
  /** The decision taken (undefined only when asking again answered so: the caller refused the request). */
  decision: RouteResult | A;
  /** The workers it was panic-routed over: set only when it was (a retry or a fallback may take them too). */
  panicCandidates: ReadonlySet<string> | undefined;
}

export class PanicRouting {
  /** Whether requests are being panic-routed now: its start was logged and its end not yet. */
  private active = false;
  /**
   * While active, a worker found panic-eligible at the last look: as long as it still is, a
   * request routed in rotation needs no look over the fleet to know panic routing goes on.
   */
  private witness: WorkerState | undefined;

  constructor(private readonly options: PanicRoutingOptions) {
    // a worker back in rotation ends it (one line), even before the next request shows it
    options.health.onChange((id, available) => {
      if (available) this.end(`${id} is back in rotation`);
    });
  }

  /**
   * The workers a request may be routed over when none is in rotation for it: those outside
   * `without` (the workers that do not serve its model) held out only by a health check or a
   * metrics scrape that timed out, not draining. Undefined when a worker is in rotation for it
   * (nothing to panic about: its refusal or its failure is answered as usual) or none qualifies.
   */
  candidates(without: ReadonlySet<string>): Set<string> | undefined {
    const workers = this.options.router.listWorkers();
    if (inRotationFor(workers, without)) return undefined;
    let out: Set<string> | undefined;
    for (const w of workers) {
      if (without.has(w.id) || !this.eligible(w)) continue;
      (out ??= new Set()).add(w.id);
    }
    return out;
  }

  /**
   * A request's decision, for each front end (the proxy, the endpoint picker): `first`, route()'s
   * answer as usual, when it found a worker (which may end panic routing); when it found none
   * and workers outside `without()` (those that may not take the request) are held out only by
   * probes that timed out, route() asked again over them by `again`, which passes its arguments
   * as `panicCandidates` and `replaces` (one request, one decision in the router's stats).
   * A request routed so is counted and logged (routed()).
   */
  decide<A extends RouteResult | undefined>(
    first: RouteResult,
    without: () => ReadonlySet<string>,
    again: (panicCandidates: ReadonlySet<string>, replaces: NoWorkerResult) => A,
  ): PanicDecision<A> {
    if (!first.noWorker) {
      this.routedInRotation();
      return { decision: first, panicCandidates: undefined };
    }
    const heldOut = this.candidates(without());
    if (heldOut === undefined) return { decision: first, panicCandidates: undefined };
    const decision = again(heldOut, first);
    if (decision === undefined || decision.noWorker) return { decision, panicCandidates: undefined };
    this.routed(heldOut);
    return { decision, panicCandidates: heldOut };
  }

  /**
   * The workers requests could be panic-routed over now (held out only by probes that timed
   * out, not draining, circuit closed), for /readyz: the gateway can serve while some are.
   */
  eligibleWorkers(): number {
    let n = 0;
    for (const w of this.options.router.listWorkers()) if (this.eligible(w)) n++;
    return n;
  }

  /** A request was routed over `panicCandidates`: counted, and the start logged once. */
  routed(panicCandidates: ReadonlySet<string>): void {
    this.options.onRouted();
    if (this.active) return;
    this.active = true;
    const ids = [...panicCandidates];
    const named = ids.slice(0, MAX_LOGGED_IDS).join(', ') + (ids.length > MAX_LOGGED_IDS ? ', …' : '');
    this.options.log(
      `warning: panic routing starts: no worker is in rotation for a request; it goes to the ${ids.length} ` +
        `held out only by a health check or metrics scrape that timed out (${named}) instead of a 503 ` +
        '(--panic-routing false turns this off)',
    );
  }

  /**
   * A request was routed to a worker in rotation. While panic routing is on, this ends it once
   * no worker is panic-eligible any more (one added or resumed from draining, or the others
   * removed, drained or answering an error status: no rotation change tells of those); workers
   * of another model still out keep it on, so a fleet where one model panics does not log at
   * every request of another. The fleet is looked over only when the last eligible worker seen
   * no longer is: a request of another model costs a check of that one worker.
   */
  routedInRotation(): void {
    if (!this.active) return;
    if (this.witness !== undefined && this.eligible(this.witness)) return;
    this.witness = this.options.router.listWorkers().find((w) => this.eligible(w));
    if (this.witness === undefined) this.end('a worker is in rotation');
  }

  /** Out of rotation only because its probes timed out, not draining (removed: its verdicts are forgotten). */
  private eligible(w: WorkerState): boolean {
    return !w.available && !w.draining && this.options.health.heldOutBySlowProbesOnly(w.id);
  }

  private end(why: string): void {
    if (!this.active) return;
    this.active = false;
    this.witness = undefined;
    this.options.log(`panic routing ends: ${why}`);
  }
}
