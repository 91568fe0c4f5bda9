/**
 * KV is reusable only within its namespace: the same tokens under another LoRA adapter, cache
 * salt or CLA group make other KV. Content anchors are keyed by the request's namespace as its
 * prefix blocks are.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { MAX_ENTRIES_PER_ID } from '../../src/core/entry-lists.js';
import { ContentAnchorIndex } from '../../src/core/content-anchors.js';
import { chainRoot, type HashNamespace } from '../../src/core/hashing.js';
import { KVAwareRouter, type RouteRequest } from '../../src/index.js';

const passage = { id: 'passage-7', tokens: 900 };

function root(ns: HashNamespace): Uint32Array {
  const out = new Uint32Array(2);
  chainRoot(ns, out);
  return out;
}

/** The passage's tokens route() credits `workerId` with for a request of `ns` (a prefix of its own). */
function anchorTokensOn(
  router: KVAwareRouter,
  workerId: string,
  ns: Partial<RouteRequest>,
  text = 'another question',
): number {
  const d = router.route({ text, contentAnchors: [passage], ...ns }, { dryRun: true, explain: true });
  return d.explain!.find((e) => e.worker === workerId)!.anchorTokens;
}

describe('content anchors', () => {
  test('are credited only within the namespace they were recorded in', () => {
    const index = new ContentAnchorIndex(100, 1000);
    const a = root({ lora: 'adapter-a' });
    const b = root({ lora: 'adapter-b' });
    index.record(0, [passage], a, 0);
    assert.equal(index.heldTokens(0, [passage], a, 1), 900);
    assert.equal(index.heldTokens(0, [passage], b, 1), 0);
    index.record(0, [passage], b, 0);
    assert.equal(index.heldTokens(0, [passage], b, 1), 900);
    assert.equal(index.size, 2, 'one entry for each namespace');
  });

  for (const [what, made, other] of [
    ['LoRA adapter', { lora: 'adapter-a' }, { lora: 'adapter-b' }],
    ['cache salt', { cacheSalt: 'tenant-1' }, { cacheSalt: 'tenant-2' }],
    ['CLA group', { claGroup: 1 }, { claGroup: 2 }],
    ['namespace, against none', { lora: 'adapter-a', claGroup: 1 }, {}],
  ] as Array<[string, Partial<RouteRequest>, Partial<RouteRequest>]>) {
    test(`made under one ${what}, are no cached tokens under another`, () => {
      const router = new KVAwareRouter();
      router.registerWorker('w0');
      router.registerWorker('w1');
      const first = router.route({ text: 'a question on the passage', contentAnchors: [passage], ...made });
      assert.equal(anchorTokensOn(router, first.workerId, made), 900);
      assert.equal(anchorTokensOn(router, first.workerId, other), 0);
      // and the other namespace's own record does not disturb the first's
      const second = router.route({ text: 'a second question', contentAnchors: [passage], ...other });
      assert.equal(anchorTokensOn(router, second.workerId, other), 900);
      assert.equal(anchorTokensOn(router, first.workerId, made), 900);
    });
  }

  test('an anchor named under more namespaces than the capacity keeps the table within it', () => {
    const router = new KVAwareRouter({ contentAnchorCapacity: 8 });
    router.registerWorker('w0');
    for (let i = 0; i < 20; i++) router.route({ text: `q${i}`, contentAnchors: [passage], cacheSalt: `s${i}` });
    const stats = router.getStats();
    assert.equal(stats.contentAnchorsTracked, 8);
    // the latest namespaces are kept, the earliest gave way
    assert.equal(anchorTokensOn(router, 'w0', { cacheSalt: 's19' }), 900);
    assert.equal(anchorTokensOn(router, 'w0', { cacheSalt: 's0' }), 0);
  });

  test("travel in a shared decision with their namespace; one without it is the CLA group's alone", () => {
    const a = new KVAwareRouter();
    const b = new KVAwareRouter();
    for (const r of [a, b]) r.registerWorker('w0');
    const d = a.route({ text: 'q', contentAnchors: [passage], lora: 'adapter-a' }, { share: true, track: false });
    const [hi, lo] = root({ lora: 'adapter-a' });
    assert.equal(d.shared!.anchorNamespace, hi.toString(16).padStart(8, '0') + lo.toString(16).padStart(8, '0'));
    assert.equal(b.applySharedDecision(d.shared!), true);
    assert.equal(anchorTokensOn(b, 'w0', { lora: 'adapter-a' }), 900);
    assert.equal(anchorTokensOn(b, 'w0', { lora: 'adapter-b' }), 0);

    // a decision of an earlier release says no namespace: its anchors are its CLA group's
    const { anchorNamespace: _, ...earlier } = d.shared!;
    const c = new KVAwareRouter();
    c.registerWorker('w0');
    c.applySharedDecision({ ...earlier, claGroup: 3 });
    assert.equal(anchorTokensOn(c, 'w0', { claGroup: 3 }), 900);
    assert.equal(anchorTokensOn(c, 'w0', { claGroup: 4 }), 0);

    // anything but 16 hex digits is refused, naming the field, and nothing is applied
    for (const [bad, error] of [
      ['0123', RangeError],
      ['0123456789ABCDEF', RangeError],
      [12, TypeError],
    ] as const) {
      const e = new KVAwareRouter();
      e.registerWorker('w0');
      assert.throws(
        () => e.applySharedDecision({ ...d.shared!, anchorNamespace: bad as string }),
        (err: unknown) => err instanceof error && /^anchorNamespace must be /.test((err as Error).message),
      );
      assert.equal(e.getStats().contentAnchorsTracked, 0);
    }
  });
});

describe('an anchor named under many namespaces', () => {
  test('keeps its most recently used namespaces, at most MAX_ENTRIES_PER_ID of them', () => {
    const index = new ContentAnchorIndex(100_000, 1000);
    const salted = (i: number) => root({ cacheSalt: `salt-${i}` });
    // a client naming one id under a new salt for each request: the id keeps a bounded list
    for (let i = 0; i < 1000; i++) index.record(0, [passage], salted(i), 0);
    assert.equal(index.size, MAX_ENTRIES_PER_ID);
    assert.equal(index.heldTokens(0, [passage], salted(999), 1), 900, 'the newest namespace is kept');
    assert.equal(index.heldTokens(0, [passage], salted(0), 1), 0, 'the oldest made room');
    // a namespace used again goes first: the one unused longest makes room for the next
    const oldestKept = 1000 - MAX_ENTRIES_PER_ID;
    index.record(1, [passage], salted(oldestKept), 2);
    index.record(0, [passage], salted(5000), 3);
    assert.equal(index.heldTokens(0, [passage], salted(oldestKept), 4), 900, 'used again: kept');
    assert.equal(index.heldTokens(0, [passage], salted(oldestKept + 1), 4), 0, 'the least recently used went');
  });
});
