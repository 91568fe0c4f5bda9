// The package as its users import it: by its own name, through package.json "exports" (the
// built dist/, so `npm run build` first; `npm test` does).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  KVAwareRouter,
  NO_CHOICE,
  NoEndpointsError,
  type Candidate,
  type NoWorkerReason,
  type PolicyChoice,
  type RouteFeatures,
  type RoutingPolicy,
  type WorkerState,
} from 'contextforge-router';

/** Chooses the last candidate and records what the router told it. */
class LastWorker implements RoutingPolicy {
  readonly name = 'last-worker';
  readonly routed: Array<{ worker: string; ticket: number; promptTokens: number }> = [];
  readonly released: number[] = [];
  readonly removed: string[] = [];

  choose(candidates: readonly Candidate[]): PolicyChoice {
    if (candidates.length === 0) return NO_CHOICE;
    return { index: candidates.length - 1, confidence: 0.25, reason: 'rotation' };
  }
  onRouted(worker: WorkerState, request: RouteFeatures, ticket: number): void {
    this.routed.push({ worker: worker.id, ticket, promptTokens: request.promptTokens });
  }
  onReleased(ticket: number): void {
    this.released.push(ticket);
  }
  onWorkerRemoved(worker: WorkerState): void {
    this.removed.push(worker.id);
  }
}

const tokens = (n: number, base = 0) => Array.from({ length: n }, (_, i) => base + i);

test('the package name resolves to the built entry point', () => {
  assert.match(import.meta.resolve('contextforge-router'), /\/dist\/index\.js$/);
});

test('a policy object of its own routes, and its hooks see the decisions', () => {
  const policy = new LastWorker();
  const router = new KVAwareRouter({ policy });
  for (const id of ['a', 'b', 'c']) router.registerWorker(id);
  const r = router.route({ tokens: tokens(64) });
  assert.equal(r.noWorker, undefined);
  assert.equal(r.workerId, 'c');
  assert.equal(r.policy, 'last-worker');
  assert.equal(r.reason, 'rotation');
  assert.equal(r.confidence, 0.25);
  assert.deepEqual(policy.routed, [{ worker: 'c', ticket: r.ticket, promptTokens: 64 }]);
  router.release(r.ticket);
  assert.deepEqual(policy.released, [r.ticket]);
  router.removeWorker('c');
  assert.deepEqual(policy.removed, ['c']);
  assert.equal(router.route({ tokens: tokens(64) }).workerId, 'b');
  assert.equal(router.getStats().policy, 'last-worker');
});

test('a policy object missing a member is rejected with a TypeError naming it', () => {
  const choose = () => NO_CHOICE;
  assert.throws(() => new KVAwareRouter({ policy: { choose } as unknown as RoutingPolicy }), {
    name: 'TypeError',
    message: /policy\.name must be a non-empty string/,
  });
  assert.throws(() => new KVAwareRouter({ policy: { name: 'x' } as unknown as RoutingPolicy }), {
    name: 'TypeError',
    message: /policy\.choose must be a function/,
  });
  assert.throws(() => new KVAwareRouter({ policy: { name: 'x', choose, onRouted: 1 } as unknown as RoutingPolicy }), {
    name: 'TypeError',
    message: /policy\.onRouted must be a function/,
  });
  assert.throws(
    () => new KVAwareRouter({ policy: { name: 'x', choose, readsBlocks: 'yes' } as unknown as RoutingPolicy }),
    { name: 'TypeError', message: /policy\.readsBlocks must be a boolean/ },
  );
  assert.throws(
    () => new KVAwareRouter({ policy: { name: 'x', choose, speculative: 'always' } as unknown as RoutingPolicy }),
    { name: 'TypeError', message: /policy\.speculative must be a boolean or 'untracked'/ },
  );
  assert.throws(() => new KVAwareRouter({ policy: 7 as unknown as RoutingPolicy }), {
    name: 'TypeError',
    message: /policy must be a policy name or an object implementing RoutingPolicy/,
  });
  assert.throws(() => new KVAwareRouter({ policy: 'nope' }), /policy must be one of/);
});

test('a policy choosing outside the candidates is reported, naming the policy', () => {
  const router = new KVAwareRouter({
    policy: { name: 'off-by-one', choose: (c) => ({ index: c.length, confidence: 0, reason: 'hash' }) },
  });
  router.registerWorker('a');
  assert.throws(() => router.route({ tokens: tokens(16) }), {
    name: 'RangeError',
    message: "policy 'off-by-one' chose index 1 of 1 candidates",
  });
  assert.equal(router.getStats().inFlightRequests, 0);
});

test('no worker available is a typed result saying why', () => {
  const why = (router: KVAwareRouter, exclude?: ReadonlySet<string>): NoWorkerReason | undefined =>
    router.route({ tokens: tokens(32) }, { exclude }).noWorker?.reason;
  const router = new KVAwareRouter();
  assert.equal(why(router), 'no-workers');
  router.registerWorker('a');
  router.registerWorker('b');
  assert.equal(why(router), undefined);
  assert.equal(why(router, new Set(['a', 'b'])), 'all-excluded');
  router.drainWorker('a');
  router.setWorkerHealth('b', false);
  assert.equal(why(router), 'none-available');
  const r = router.route({ tokens: tokens(32) }, { dryRun: true });
  assert.deepEqual(r.noWorker, { reason: 'none-available', workers: 2, unavailable: 2, excluded: 0 });
  assert.equal(r.workerId, '');
  assert.equal(r.reason, 'none');
  assert.equal(r.ticket, 0);

  const declining = new KVAwareRouter({ policy: { name: 'never', choose: () => NO_CHOICE } });
  declining.registerWorker('a');
  assert.equal(why(declining), 'policy-declined');
});

test('routeOrThrow throws a NoEndpointsError when no worker can take the request', async () => {
  const router = new KVAwareRouter();
  router.registerWorker('a');
  assert.equal(router.routeOrThrow({ tokens: tokens(32) }).workerId, 'a');
  router.drainWorker('a');
  assert.throws(
    () => router.routeOrThrow({ tokens: tokens(32) }),
    (err: unknown) =>
      err instanceof NoEndpointsError &&
      err.reason === 'none-available' &&
      err.message ===
        'no worker can take the request: none of the 1 registered workers is available (draining or unhealthy)',
  );
  // the seed-compatible API keeps its empty id
  assert.equal((await router.selectWorker('doc-1')).targetWorkerId, '');
});

test('the custom-policy example runs', () => {
  const example = fileURLToPath(new URL('../../examples/custom-policy.ts', import.meta.url));
  const r = spawnSync(process.execPath, ['--import', 'tsx', example], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(r.stdout.trim().split('\n'), [
    'request 1: gpu-0 (cache-match, 0 cached tokens)',
    'request 2: gpu-0 (cache-match, 1024 cached tokens)',
    'request 3: gpu-1 (cache-match, 0 cached tokens)',
    'request 4: no worker (none-available)',
    'request 5: NoEndpointsError (none-available)',
  ]);
});

test('a policy reading the request blocks gets every key, whether it says it does or not', () => {
  // readsBlocks is a hint (keys hashed in one go); without it keys are computed when first read
  const seen: Record<string, number[]> = {};
  for (const readsBlocks of [true, false, undefined]) {
    const policy: RoutingPolicy = {
      name: `keys-${String(readsBlocks)}`,
      readsBlocks,
      choose: (_candidates, request) => {
        const b = request.blocks!;
        seen[String(readsBlocks)] = Array.from({ length: b.length }, (_, i) => b.lo[i]);
        return { index: 0, confidence: 0, reason: 'hash' };
      },
    };
    const router = new KVAwareRouter({ policy, indexMode: 'precise', blockSize: 16 });
    router.registerWorker('a');
    router.route({ tokens: tokens(16 * 300) });
  }
  const expected = Array.from(new KVAwareRouter({ blockSize: 16 }).hashTokens(tokens(16 * 300)).lo);
  assert.equal(expected.length, 300);
  assert.deepEqual(seen['true'], expected);
  assert.deepEqual(seen['false'], expected);
  assert.deepEqual(seen['undefined'], expected);
});
