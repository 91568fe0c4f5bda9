/**
 * A policy object of the caller's own runs inside route(): route() keeps the request's working
 * data (fields, hash namespace, prefix lookup, candidate list) on the router, so a choose() (or
 * scoreTerms()) that routes again or changes the router would overwrite the decision being
 * taken. Such calls are refused with a TypeError naming the call, and the router stays as it was.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Candidate, PolicyChoice, RouteFeatures, RoutingPolicy } from '../../src/core/policies/types.js';
import { KVAwareRouter } from '../../src/index.js';

const tokens = (from: number, n = 64): number[] => Array.from({ length: n }, (_, i) => from + i);

/** A policy picking `pick` (by worker id), first running `inside` (its error kept, not thrown). */
class Meddler implements RoutingPolicy {
  readonly name = 'meddler';
  inside: (() => unknown) | undefined;
  caught: unknown[] = [];
  pick = 'a';
  choose(candidates: readonly Candidate[]): PolicyChoice {
    const inside = this.inside;
    if (inside) {
      this.inside = undefined; // once
      try {
        inside();
      } catch (error) {
        this.caught.push(error);
      }
    }
    return { index: candidates.findIndex((c) => c.worker.id === this.pick), confidence: 0.5, reason: 'cost' };
  }
}

function make(): { router: KVAwareRouter; policy: Meddler } {
  const policy = new Meddler();
  const router = new KVAwareRouter({ policy, blockSize: 16 });
  router.registerWorker('a');
  router.registerWorker('b');
  return { router, policy };
}

function snapshot(router: KVAwareRouter) {
  const s = router.getStats();
  return {
    inFlight: s.inFlightRequests,
    entries: s.index.entries,
    workers: router.listWorkers().map((w) => `${w.id}@${w.slot}`),
    loads: router.listWorkers().map((w) => router.localLoad(w.id)),
    decisions: s.decisionsByReason,
  };
}

describe('calls from inside a policy', () => {
  test('route() from choose() is refused, and the outer decision is recorded as chosen', () => {
    const { router, policy } = make();
    const open = router.route({ tokens: tokens(5000) }); // something in flight already
    const before = snapshot(router);
    policy.inside = () =>
      router.route({ tokens: tokens(1000, 32), workflowId: 'inner-wf', workflowStep: 7, anchor: 'inner-anchor' });
    const outer = router.route({ tokens: tokens(0), workflowId: 'outer-wf', workflowStep: 1, anchor: 'outer-anchor' });
    assert.equal(policy.caught.length, 1);
    assert.ok(policy.caught[0] instanceof TypeError);
    assert.match(
      (policy.caught[0] as Error).message,
      /^route\(\) called from inside the choose\(\) of policy 'meddler'/,
    );
    // the outer decision as the policy took it; nothing of the refused one
    assert.equal(outer.workerId, 'a');
    assert.deepEqual(router.workflowAffinity('outer-wf'), { workerId: 'a', step: 1 });
    assert.equal(router.getWorkerForAnchor('outer-anchor'), 'a');
    assert.equal(router.workflowAffinity('inner-wf'), undefined);
    assert.equal(router.getWorkerForAnchor('inner-anchor'), undefined);
    const after = snapshot(router);
    assert.equal(after.inFlight, before.inFlight + 1);
    assert.equal(after.entries, before.entries + 4); // the outer prompt's 4 blocks
    router.release(outer.ticket);
    router.release(open.ticket);
    assert.equal(router.getStats().inFlightRequests, 0);
  });

  test('an uncaught refusal fails the outer route(), which records nothing', () => {
    const policy: RoutingPolicy = {
      name: 'reenters',
      choose: () => {
        router.route({ tokens: tokens(1000) });
        return { index: 0, confidence: 1, reason: 'cost' };
      },
    };
    const router = new KVAwareRouter({ policy, blockSize: 16 });
    router.registerWorker('a');
    assert.throws(() => router.route({ tokens: tokens(0), workflowId: 'wf' }), {
      name: 'TypeError',
      message: /^route\(\) called from inside the choose\(\) of policy 'reenters'/,
    });
    assert.equal(router.getStats().inFlightRequests, 0);
    assert.equal(router.getStats().index.entries, 0);
    assert.equal(router.workflowAffinity('wf'), undefined);
  });

  test('every call that changes the router is refused from choose(), and changes nothing', async () => {
    const calls: Array<[string, (r: KVAwareRouter, ticket: number) => unknown]> = [
      ['registerWorker', (r) => r.registerWorker('c')],
      ['removeWorker', (r) => r.removeWorker('a')],
      ['drainWorker', (r) => r.drainWorker('b')],
      ['resumeWorker', (r) => r.resumeWorker('b')],
      ['setWorkerHealth', (r) => r.setWorkerHealth('b', false)],
      ['updateWorkerMetrics', (r) => r.updateWorkerMetrics('a', { kvUsage: 0.5 })],
      ['applyStored', (r) => r.applyStored('a', r.hashTokens(tokens(7000)))],
      ['applyRemoved', (r) => r.applyRemoved('a', r.hashTokens(tokens(0)))],
      ['applyCleared', (r) => r.applyCleared('a')],
      ['route', (r) => r.route({ tokens: tokens(0) })],
      ['routeOrThrow', (r) => r.routeOrThrow({ tokens: tokens(0) })],
      ['release', (r, t) => r.release(t)],
      ['markPrefillDone', (r, t) => r.markPrefillDone(t)],
      ['markRefused', (r, t) => r.markRefused(t)],
      [
        'setRemoteLoad',
        (r) => r.setRemoteLoad('a', { inFlightRequests: 3, queuedPrefillTokens: 1, activeDecodeTokens: 1 }),
      ],
      ['setWorkflowAffinity', (r) => r.setWorkflowAffinity('wf', 'b')],
      [
        'applySharedDecision',
        (r) =>
          r.applySharedDecision({
            workerId: 'b',
            hi: new Uint32Array(1),
            lo: new Uint32Array(1),
            claGroup: null,
            workflowStep: null,
          }),
      ],
      ['settleSharedDecision', (r) => r.settleSharedDecision({ id: 'x.1' })],
      ['refuseSharedDecision', (r) => r.refuseSharedDecision({ id: 'x.1' })],
    ];
    const asyncCalls: Array<[string, (r: KVAwareRouter) => Promise<unknown>]> = [
      ['selectWorker', (r) => r.selectWorker('anchor')],
      ['updateWorkerState', (r) => r.updateWorkerState('a', 0.5)],
      ['broadcastNewBlocks', (r) => r.broadcastNewBlocks('anchor', ['b1'], 'b')],
    ];
    for (const [name, call] of calls) {
      const { router, policy } = make();
      const open = router.route({ tokens: tokens(0) });
      const before = snapshot(router);
      policy.inside = () => call(router, open.ticket);
      const d = router.route({ tokens: tokens(3000) }, { dryRun: true });
      assert.equal(d.workerId, 'a', name);
      assert.equal(policy.caught.length, 1, `${name} was not refused`);
      assert.ok(policy.caught[0] instanceof TypeError, name);
      assert.match(
        (policy.caught[0] as Error).message,
        new RegExp(`^${name}\\(\\) called from inside the choose\\(\\)`),
      );
      assert.deepEqual(snapshot(router), before, name);
      assert.ok(
        router.listWorkers().every((w) => w.available),
        name,
      );
      // still usable, the refused call included
      call(router, open.ticket);
    }
    for (const [name, call] of asyncCalls) {
      const { router, policy } = make();
      const before = snapshot(router);
      let pending: Promise<unknown> | undefined;
      policy.inside = () => {
        pending = call(router);
      };
      router.route({ tokens: tokens(3000) }, { dryRun: true });
      await assert.rejects(pending!, { name: 'TypeError', message: new RegExp(`^${name}\\(\\) called from inside`) });
      assert.deepEqual(snapshot(router), before, name);
      assert.equal(router.getWorkerForAnchor('anchor'), undefined, name);
      await call(router);
    }
  });

  test('choose() cannot remove the chosen worker and leave its blocks to the next one registered', () => {
    const { router, policy } = make();
    policy.inside = () => router.removeWorker('a');
    const first = router.route({ tokens: tokens(500) });
    assert.equal(first.workerId, 'a');
    assert.ok(policy.caught[0] instanceof TypeError);
    assert.ok(router.hasWorker('a'));
    router.registerWorker('c');
    policy.pick = 'c';
    const next = router.route({ tokens: tokens(500) }, { explain: true });
    const c = next.explain!.find((e) => e.worker === 'c')!;
    assert.equal(c.overlapBlocks, 0, 'a worker registered later holds none of the blocks predicted on another');
    assert.equal(next.explain!.find((e) => e.worker === 'a')!.overlapBlocks, 4);
    // the removal made outside a decision drops the worker's blocks with it
    assert.equal(router.removeWorker('a'), true);
    router.registerWorker('d');
    policy.pick = 'd';
    const last = router.route({ tokens: tokens(500) }, { explain: true, dryRun: true });
    assert.equal(last.explain!.find((e) => e.worker === 'd')!.overlapBlocks, 0);
    router.release(first.ticket);
    router.release(next.ticket);
    assert.equal(router.getStats().inFlightRequests, 0);
  });

  test('scoreTerms() (explain) may not route either', () => {
    let caught: unknown;
    const policy: RoutingPolicy = {
      name: 'explains',
      choose: () => ({ index: 0, confidence: 1, reason: 'cost' }),
      scoreTerms: (_c: Candidate, _f: RouteFeatures) => {
        try {
          router.route({ tokens: tokens(900) });
        } catch (error) {
          caught ??= error;
        }
        return { total: 1 };
      },
    };
    const router = new KVAwareRouter({ policy, blockSize: 16 });
    router.registerWorker('a');
    router.registerWorker('b');
    const d = router.route({ tokens: tokens(0), workflowId: 'wf' }, { explain: true });
    assert.ok(caught instanceof TypeError);
    assert.match((caught as Error).message, /^route\(\) called from inside the scoreTerms\(\) of policy 'explains'/);
    assert.equal(d.workerId, 'a');
    assert.deepEqual(router.workflowAffinity('wf'), { workerId: 'a', step: null });
    assert.equal(router.getStats().inFlightRequests, 1);
  });

  test('a choose() that throws leaves the router usable', () => {
    let fail = true;
    const policy: RoutingPolicy = {
      name: 'flaky',
      choose: () => {
        if (fail) throw new Error('boom');
        return { index: 0, confidence: 1, reason: 'cost' };
      },
    };
    const router = new KVAwareRouter({ policy, blockSize: 16 });
    router.registerWorker('a');
    assert.throws(() => router.route({ tokens: tokens(0) }), /boom/);
    fail = false;
    router.registerWorker('b'); // not refused: no decision is being taken
    assert.equal(router.route({ tokens: tokens(0) }).workerId, 'a');
  });
});
