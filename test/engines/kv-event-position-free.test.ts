import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, describe, test } from 'node:test';
import { decodeEventBatch, type KvEvent } from '../../src/engines/kv-events/decode.js';
import { cpythonTupleHash, KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { KvEventPublisher } from '../../src/engines/kv-events/publisher.js';
import { KvEventSubscriber } from '../../src/engines/kv-events/subscriber.js';
import { KVAwareRouter } from '../../src/index.js';
import { storedTokens, tokenRange } from '../helpers/kv-event-builders.js';
import { until } from '../helpers/wait.js';

// SGLang's first page events (sgl-project/sglang#6824) hash a page as Python's
// hash(tuple(page_tokens)), the same at any position, and some releases leave every radix node's
// first page without a parent. Chained by the router from those parents, a page stored again after
// another one keeps the hash of its first position, its children land under the wrong chain, and
// a node's first page lands at the root: false hits. A worker whose engine hashes so is refused.
const BS = 4;
const tokens = tokenRange;
const stored = (hashes: bigint[], parent: bigint | null, toks: number[]): KvEvent =>
  storedTokens(hashes, parent, toks, BS);
const batch = (...events: KvEvent[]) => ({ ts: 1, events, dataParallelRank: null });
const fixtureDir = new URL('../fixtures/kv-events/', import.meta.url);
const fixture = (name: string) => new Uint8Array(readFileSync(new URL(`${name}.bin`, fixtureDir)));
const closers: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

function setup() {
  const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise', speculativeBlocks: 0 });
  router.registerWorker('w0');
  router.registerWorker('w1');
  return { router, applier: new KvEventApplier(router) };
}

describe('KV events of an engine whose block hashes are not chained to their position', () => {
  test('an engine hash stored again under another parent refuses the worker: its entries go, none come', () => {
    const { router, applier } = setup();
    applier.apply('w1', batch(stored([90n], null, tokens(0, 4))));
    // [P, Q], then [R, P, S]: P's hash again, after R
    applier.apply('w0', batch(stored([10n, 11n], null, tokens(0, 8))));
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 8);
    const c = applier.apply(
      'w0',
      batch(stored([20n], null, tokens(100, 4)), stored([10n], 20n, tokens(0, 4)), stored([30n], 10n, tokens(200, 4))),
    );
    assert.equal(c.positionFreeHashes, 1);
    assert.equal(c.skipped.position_free_hash, 2, 'the store that repeated, and the one after it');
    assert.equal(c.duplicateCopies, 0);
    // nothing of w0 stays: what it stored may sit under the wrong chain
    assert.equal(applier.trackedBlocks('w0'), 0);
    assert.equal(router.route({ tokens: [...tokens(0, 4), ...tokens(200, 4)] }, { dryRun: true }).cachedTokens, 4);
    assert.equal(
      router.route({ tokens: [...tokens(0, 4), ...tokens(200, 4)] }, { dryRun: true }).workerId,
      'w1',
      "only w1's own block",
    );
    assert.equal(router.route({ tokens: tokens(100, 4) }, { dryRun: true }).cachedTokens, 0);
    // later stores of w0 are refused, even well-formed ones
    const later = applier.apply('w0', batch(stored([40n], null, tokens(300, 4))));
    assert.equal(later.storedBlocks, 0);
    assert.equal(later.skipped.position_free_hash, 1);
    assert.equal(later.positionFreeHashes, 0, 'the worker was found out once');
    assert.equal(router.route({ tokens: tokens(300, 4) }, { dryRun: true }).cachedTokens, 0);
    // w1 is untouched
    assert.equal(applier.apply('w1', batch(stored([91n], 90n, tokens(4, 4)))).storedBlocks, 1);
    // its entries cleared (a restart, a removal), the worker is judged again
    applier.clearWorker('w0');
    assert.equal(applier.apply('w0', batch(stored([40n], null, tokens(300, 4)))).storedBlocks, 1);
  });

  test('a page that is its own parent is a position-free hash too', () => {
    const { applier } = setup();
    const c = applier.apply('w0', batch(stored([10n, 10n], null, [...tokens(0, 4), ...tokens(0, 4)])));
    assert.equal(c.positionFreeHashes, 1);
    assert.equal(c.storedBlocks, 0);
  });

  test('copies of one block under the same parent stay copies (vLLM caches several under one hash)', () => {
    const { router, applier } = setup();
    applier.apply('w0', batch(stored([10n], null, tokens(0, 4)), stored([11n], 10n, tokens(4, 4))));
    const c = applier.apply('w0', batch(stored([10n], null, tokens(0, 4)), stored([11n], 10n, tokens(4, 4))));
    assert.equal(c.duplicateCopies, 2);
    assert.equal(c.positionFreeHashes, 0);
    assert.deepEqual(c.skipped, {});
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 8);
  });

  test("a KV connector's copy (not GPU) naming another parent is not the engine's hashing: no refusal", () => {
    const { applier } = setup();
    applier.apply('w0', batch(stored([10n, 11n], null, tokens(0, 8))));
    const copy = storedTokens([11n], null, tokens(4, 4), BS, { medium: 'CPU' });
    const c = applier.apply('w0', batch(copy));
    assert.equal(c.positionFreeHashes, 0);
    assert.equal(applier.trackedBlocks('w0'), 2);
  });

  test("cpythonTupleHash is CPython's hash(tuple(page_tokens)), as SGLang's first page events hash", () => {
    const expected = JSON.parse(readFileSync(new URL('sglang-position-free.json', fixtureDir), 'utf8')) as {
      events: Array<{ blockHashes: Array<{ bigint: string }>; tokenIds: number[] }>;
    };
    assert.ok(expected.events.length > 0);
    for (const e of expected.events)
      assert.equal(BigInt.asUintN(64, cpythonTupleHash(e.tokenIds)).toString(), e.blockHashes[0].bigint);
  });

  test("SGLang's position-free page events are refused from the first page stored after another: no false hit", () => {
    const { router, applier } = setup();
    const c = applier.apply('w0', decodeEventBatch(fixture('sglang-position-free')));
    // P (a prompt's first page: any hash may start a chain), then Q after it: CPython's hash of Q alone
    assert.equal(c.storedBlocks, 1);
    assert.equal(c.positionFreeHashes, 1);
    assert.equal(c.skipped.position_free_hash, 5);
    assert.equal(applier.trackedBlocks('w0'), 0);
    const [P, Q, X, R, S] = [110, 120, 130, 140, 150].map((t) => tokens(t, 4));
    for (const prompt of [
      [...P, ...Q],
      [...P, ...X],
      X, // [X] went without a parent: rooted, it would be a false hit
      [...R, ...P, ...S],
      [...P, ...S], // chained from P's first position, it would be a false hit
    ])
      assert.equal(router.route({ tokens: prompt }, { dryRun: true }).cachedTokens, 0, prompt.join(','));
  });

  test('the subscriber says once which SGLang releases hash so, and counts the refused stores', async () => {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('w0');
    const applier = new KvEventApplier(router);
    const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
    closers.push(() => pub.close());
    const logs: string[] = [];
    const s = new KvEventSubscriber({ workerId: 'w0', endpoint: pub.endpoint, applier, log: (m) => logs.push(m) });
    s.start();
    closers.push(() => s.close());
    const events = decodeEventBatch(fixture('sglang-position-free')).events;
    await until(async () => {
      await pub.publish({ ts: Date.now() / 1000, events, dataParallelRank: null });
      return (s.stats.applied.skipped.position_free_hash ?? 0) >= 10;
    }, 'two batches of refused stores');
    const told = logs.filter((l) => l.includes('position_free_hash'));
    assert.equal(told.length, 1, logs.join('\n'));
    assert.match(told[0], /w0/);
    assert.match(told[0], /SGLang/);
    assert.match(told[0], /sha256/);
    assert.equal(applier.trackedBlocks('w0'), 0);
  });
});
