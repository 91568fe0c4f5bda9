import type { KVAwareRouter } from '../core/router/index.js';
import type { StateStore } from './state-store.js';

/**
 * Tells the other replicas when the router ends a shared decision's prefill itself, reading
 * it off the engine for an answer that is not streamed (RouteOptions.firstTokenReported), as
 * a front end does at a streamed answer's first byte: without it they would count the
 * request's prompt as queued prefill until the whole answer. Returns a function that stops.
 */
export function sharePrefillReads(router: KVAwareRouter, state: StateStore): () => void {
  return router.onPrefillRead((_ticket, shared) => {
    if (shared) state.decisionPrefilled(shared);
  });
}
