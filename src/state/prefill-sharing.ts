import type { KVAwareRouter, SharedDecision } from '../core/router/index.js';
import type { StateStore } from './state-store.js';

/**
 * Tells the other replicas when the router ends a shared decision's prefill itself, reading
 * it off the engine for an answer that is not streamed (RouteOptions.firstTokenReported), as
 * the gateway does at a streamed answer's first byte: without it they would count the
 * request's prompt as queued prefill until the whole answer.
 */
export class PrefillSharing {
  private readonly decisions = new Map<number, SharedDecision>();
  private readonly stop: () => void;

  constructor(
    router: KVAwareRouter,
    private readonly state: StateStore,
  ) {
    this.stop = router.onPrefillRead((ticket) => {
      const d = this.decisions.get(ticket);
      if (d) this.state.decisionPrefilled(d);
    });
  }

  /** A shared decision whose first token nobody reports: the end of its prefill goes to the others. */
  follow(ticket: number, decision: SharedDecision): void {
    if (ticket > 0) this.decisions.set(ticket, decision);
  }

  /** Its request ended (the ticket is released). */
  forget(ticket: number): void {
    this.decisions.delete(ticket);
  }

  /** Decisions followed now. */
  get size(): number {
    return this.decisions.size;
  }

  close(): void {
    this.stop();
    this.decisions.clear();
  }
}
