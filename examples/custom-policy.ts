// A routing policy of one's own, plugged into the router as an object.
// Run after `npm run build`: node --import tsx examples/custom-policy.ts (a test keeps it running)
import {
  KVAwareRouter,
  NO_CHOICE,
  NoEndpointsError,
  type Candidate,
  type PolicyChoice,
  type RoutingPolicy,
} from 'contextforge-router';

/** The worker holding the most of the prompt, unless it already runs `maxInFlight` requests: then the least busy. */
class CachedUnlessBusy implements RoutingPolicy {
  readonly name = 'cached-unless-busy';

  constructor(private readonly maxInFlight: number) {}

  choose(candidates: readonly Candidate[]): PolicyChoice {
    if (candidates.length === 0) return NO_CHOICE;
    let cached = -1;
    let idle = 0;
    for (let i = 0; i < candidates.length; i++) {
      const c = candidates[i];
      const busy = c.worker.inFlightRequests >= this.maxInFlight;
      if (!busy && (cached < 0 || c.cachedTokens > candidates[cached].cachedTokens)) cached = i;
      if (c.worker.inFlightRequests < candidates[idle].worker.inFlightRequests) idle = i;
    }
    // candidates are reused between decisions: keep indices, never the objects
    if (cached >= 0) return { index: cached, confidence: candidates[cached].cachedFraction, reason: 'cache-match' };
    return { index: idle, confidence: candidates[idle].cachedFraction, reason: 'least-loaded' };
  }
}

const router = new KVAwareRouter({ policy: new CachedUnlessBusy(2) });
router.registerWorker('gpu-0');
router.registerWorker('gpu-1');

const systemPrompt = Array.from({ length: 1024 }, (_, i) => (i * 7919) % 150_000);
const ask = (question: number) => ({ tokens: [...systemPrompt, ...Array.from({ length: 32 }, () => question)] });

// the first request lands on gpu-0; the next one follows its cached prefix until gpu-0 has 2 in flight
for (let q = 1; q <= 3; q++) {
  const r = router.route(ask(q));
  if (r.noWorker) throw new Error(`unexpected: ${r.noWorker.reason}`);
  console.log(`request ${q}: ${r.workerId} (${r.reason}, ${r.cachedTokens} cached tokens)`);
}

// no worker available is a result to branch on, or an error with routeOrThrow()
router.drainWorker('gpu-0');
router.drainWorker('gpu-1');
const none = router.route(ask(4));
if (none.noWorker) console.log(`request 4: no worker (${none.noWorker.reason})`);
try {
  router.routeOrThrow(ask(5));
} catch (err) {
  if (!(err instanceof NoEndpointsError)) throw err;
  console.log(`request 5: ${err.name} (${err.reason})`);
}
