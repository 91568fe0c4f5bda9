import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { BS, prompt, tiers } from '../helpers/prompts.js';
import { redisRouters } from '../helpers/redis-routers.js';
import { until } from '../helpers/wait.js';

// Two router replicas on the machine's Redis (127.0.0.1:6379, which .ci/run starts when
// nothing answers there), without gateways: a request A routed and its engine refused
// withdraws, at B too, the blocks B applied from A's decision. Nothing is mocked; nothing is
// skipped.
const routers = redisRouters();
after(() => routers.close());

async function replica(id: string, instanceId = id) {
  return routers.replica(id, { blockSize: BS, instanceId });
}

const times = <T>(n: number, v: T): T[] => Array.from({ length: n }, () => v);
const predictedAt = (r: KVAwareRouter, tokens: number[]) => tiers(r, 'e0', tokens).every((t) => t === 'predicted');
const goneAt = (r: KVAwareRouter, tokens: number[]) => tiers(r, 'e0', tokens).every((t) => t === null);

test("A's refused request withdraws at B what B applied of its decision; one past its prefill keeps its blocks", async () => {
  const a = await replica('ra');
  const b = await replica('rb');
  /** A routes, shares, and B has applied the decision. */
  const routedAtA = async (tokens: number[]) => {
    const d = a.router.route({ tokens }, { share: true });
    a.store.decisionMade(d.shared!);
    await until(() => predictedAt(b.router, tokens), 'B to apply the decision');
    return d;
  };
  /** A's engine refused it: as the gateway does. */
  const refusedAtA = (d: ReturnType<KVAwareRouter['route']>) => {
    a.router.markRefused(d.ticket);
    a.store.decisionRefused(d.shared!);
    a.router.release(d.ticket);
    a.store.decisionEnded(d.shared!);
  };

  const refused = await routedAtA(prompt(1, 6));
  refusedAtA(refused);
  await until(() => goneAt(b.router, prompt(1, 6)), "B to withdraw the refused decision's blocks");
  assert.equal(b.store.stats().refusalsWithdrawn, 1);

  // past its first token a decision is settled at B: a refusal named later withdraws nothing
  const prefilled = await routedAtA(prompt(2, 4));
  a.router.markPrefillDone(prefilled.ticket);
  a.store.decisionPrefilled(prefilled.shared!);
  a.store.decisionRefused(prefilled.shared!);
  // messages from one replica arrive in order: once this refusal is applied, so is the one before
  const last = await routedAtA(prompt(3, 3));
  refusedAtA(last);
  await until(() => goneAt(b.router, prompt(3, 3)), 'B to withdraw the last refused decision');
  assert.deepEqual(tiers(b.router, 'e0', prompt(2, 4)), times(4, 'predicted'));
  assert.equal(b.store.stats().refusalsWithdrawn, 2);
  assert.equal(b.store.stats().malformedMessages, 0);
});

test('replicas configured with one instance id: a refusal withdraws only its own decision at the others', async () => {
  const a = await replica('sa', 'same');
  const c = await replica('sc', 'same');
  const b = await replica('sb');
  const fromA = a.router.route({ tokens: prompt(4, 3) }, { share: true });
  const fromC = c.router.route({ tokens: prompt(5, 3) }, { share: true });
  assert.equal(fromA.shared!.id, fromC.shared!.id, 'the same ticket under the same instance id');
  a.store.decisionMade(fromA.shared!);
  c.store.decisionMade(fromC.shared!);
  await until(() => predictedAt(b.router, prompt(4, 3)) && predictedAt(b.router, prompt(5, 3)), 'B to apply both');
  a.router.markRefused(fromA.ticket);
  a.store.decisionRefused(fromA.shared!);
  await until(() => goneAt(b.router, prompt(4, 3)), "B to withdraw A's decision");
  assert.deepEqual(tiers(b.router, 'e0', prompt(5, 3)), times(3, 'predicted'));
});

test("a replica that joins later does not load a refused decision's blocks from Redis, and does load a later one's", async () => {
  const a = await replica('ca');
  const b = await replica('cb');
  const share = (tokens: number[]) => {
    const d = a.router.route({ tokens }, { share: true });
    a.store.decisionMade(d.shared!);
    return d;
  };
  share(prompt(6, 4));
  const refused = share(prompt(7, 5));
  await until(() => predictedAt(b.router, prompt(6, 4)) && predictedAt(b.router, prompt(7, 5)), 'B to apply both');
  // the same prompt routed again after the refusal (a retry the engine took) under the same chain key
  const first = share(prompt(8, 3));
  const retried = share(prompt(8, 3));
  assert.ok(retried.shared!.hi.length > 0, 'the retry records its blocks too');
  a.router.markRefused(refused.ticket);
  a.store.decisionRefused(refused.shared!);
  a.router.markRefused(first.ticket);
  a.store.decisionRefused(first.shared!);
  await until(() => goneAt(b.router, prompt(7, 5)), 'B to withdraw the refused decision');

  // C starts from what Redis keeps: the chains of the decisions not refused
  const c = await replica('cc');
  assert.deepEqual(tiers(c.router, 'e0', prompt(6, 4)), times(4, 'predicted'));
  assert.deepEqual(tiers(c.router, 'e0', prompt(8, 3)), times(3, 'predicted'));
  assert.deepEqual(tiers(c.router, 'e0', prompt(7, 5)), times(5, null));
  assert.equal(a.store.stats().errors, 0);
});
