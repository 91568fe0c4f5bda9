import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { createServer, type AddressInfo, type Socket } from 'node:net';
import { encode } from '@msgpack/msgpack';
import { Dealer, Publisher, Router } from 'zeromq';
import { BlockHashes, hashTokenBlocks } from '../../src/core/hashing.js';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { bindEndpoint } from '../../src/engines/kv-events/bind.js';
import { decodeEventBatch, KV_EVENT_LIMITS, type KvEvent } from '../../src/engines/kv-events/decode.js';
import { encodeEventBatch } from '../../src/engines/kv-events/encode.js';
import { KvEventPublisher } from '../../src/engines/kv-events/publisher.js';
import {
  APPLY_SLICE_WORK,
  KvEventSubscriber,
  SESSION_CHECK_MS,
  YIELD_AFTER_MS,
} from '../../src/engines/kv-events/subscriber.js';
import { KVAwareRouter } from '../../src/index.js';
import { skippedEventCounts } from '../../src/server/engine-deployments.js';
import { eventBatch, sequenceFrame, storedEvent, storedTokens, tokenRange } from '../helpers/kv-event-builders.js';
import { until } from '../helpers/wait.js';

// Real ZeroMQ sockets on loopback: the publisher speaks vLLM's wire format, the subscriber
// is the production one.
const BS = 4;
const tokens = tokenRange;
const stored = (hashes: bigint[], parent: bigint | null, from: number) => storedEvent(hashes, parent, from, BS);
const batch = (...events: KvEvent[]) => eventBatch(0, ...events);

const closers: Array<() => Promise<void>> = [];

/** The event loop's turns, counted by a setImmediate chain from now until `stop()`. */
function loopTurns(): { readonly count: number; stop(): void } {
  let turns = 0;
  let ticking = true;
  const tick = () => {
    turns++;
    if (ticking) setImmediate(tick);
  };
  setImmediate(tick);
  return {
    get count() {
      return turns;
    },
    stop: () => void (ticking = false),
  };
}

/**
 * Counts the event loop's turns (a setImmediate chain) from the apply of the first store of
 * hash `first` to that of hash `last`; each apply costs at least a tenth of YIELD_AFTER_MS (it
 * spins on the clock), so that the subscriber's work between two turns passes its budget after
 * ten batches at most. `turns` is null until the last one applied.
 */
function countTurnsWhileApplying(applier: KvEventApplier, first: bigint, last: bigint): { turns: number | null } {
  const seen = { turns: null as number | null };
  let turns = -1;
  let ticking = true;
  const tick = () => {
    turns++;
    if (ticking) setImmediate(tick);
  };
  const apply = applier.apply.bind(applier);
  applier.apply = (worker, b, counts) => {
    const e = b.events[0];
    if (e?.type === 'BlockStored') {
      if (e.blockHashes[0] === first) {
        turns = 0;
        setImmediate(tick);
      }
      const spinUntil = performance.now() + YIELD_AFTER_MS / 10;
      while (performance.now() < spinUntil);
      if (e.blockHashes[0] === last) {
        ticking = false;
        seen.turns = turns;
      }
    }
    return apply(worker, b, counts);
  };
  return seen;
}
after(async () => {
  for (const c of closers) await c();
});

/** A started subscriber of worker `w0` to `endpoint`, whose log lines are kept, closed after the file. */
function loggedSubscriber(endpoint: string): { sub: KvEventSubscriber; logs: string[] } {
  const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
  router.registerWorker('w0');
  const logs: string[] = [];
  const sub = new KvEventSubscriber({
    workerId: 'w0',
    endpoint,
    applier: new KvEventApplier(router),
    idleReplayMs: 0,
    log: (m) => logs.push(m),
  }).start();
  closers.push(() => sub.close());
  return { sub, logs };
}

/**
 * A bare ZeroMQ publisher (frames sent as given: no engine's publisher) and a subscriber of worker
 * `w0` whose log lines are kept, both closed after the file.
 */
async function rawPublisherRig(): Promise<{ pub: Publisher; sub: KvEventSubscriber; logs: string[] }> {
  const pub = new Publisher({ linger: 0 });
  await bindEndpoint(pub, 'tcp://127.0.0.1:*');
  const rig = { pub, ...loggedSubscriber(pub.lastEndpoint!) };
  closers.push(async () => pub.close());
  return rig;
}

/** PUB/SUB slow joiner: publish a probe until the subscription is live. */
async function untilSubscribed(pub: KvEventPublisher, sub: KvEventSubscriber): Promise<void> {
  const probe = batch({ type: 'AllBlocksCleared' });
  await until(
    async () => {
      if (sub.stats.batches > 0) return true;
      await pub.publish(probe);
      return false;
    },
    'the subscription to receive a probe',
    { intervalMs: 20 },
  );
}

/** Publishes a store until the subscriber has given up a replay (one the publisher never ends or never answers). */
async function publishUntilReplayGivenUp(
  pub: KvEventPublisher,
  sub: KvEventSubscriber,
  what: string,
  timeoutMs?: number,
): Promise<void> {
  await until(
    async () => {
      if (sub.stats.replayFailures > 0) return true;
      await pub.publish(batch(stored([1n], null, 0)));
      return false;
    },
    what,
    { intervalMs: 20, ...(timeoutMs !== undefined ? { timeoutMs } : {}) },
  );
}

/** Publishes a store of tokens 100–103 until the index has it (a subscriber reconnecting may miss the first). */
async function publishUntilApplied(router: KVAwareRouter, pub: KvEventPublisher, what: string): Promise<void> {
  await until(
    async () => {
      if (router.route({ tokens: tokens(100, 4) }, { dryRun: true }).cachedTokens === 4) return true;
      await pub.publish(batch(stored([7n], null, 100)));
      return false;
    },
    what,
    { intervalMs: 50, timeoutMs: 30_000 },
  );
}

async function rig(encoding: 'map' | 'array' = 'map', replay = true) {
  const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
  router.registerWorker('w0');
  const applier = new KvEventApplier(router);
  const pub = await new KvEventPublisher({
    endpoint: 'tcp://127.0.0.1:*',
    replayEndpoint: replay ? 'tcp://127.0.0.1:*' : undefined,
    encoding,
  }).start();
  const sub = new KvEventSubscriber({
    workerId: 'w0',
    endpoint: pub.endpoint,
    replayEndpoint: replay ? pub.replayEndpoint : undefined,
    applier,
  }).start();
  closers.push(
    () => sub.close(),
    () => pub.close(),
  );
  await untilSubscribed(pub, sub);
  return { router, applier, pub, sub };
}

const ownHex = (from: number, blocks: number) => {
  const h = hashTokenBlocks(tokens(from, blocks * BS), BS, undefined, new BlockHashes());
  return Array.from({ length: h.length }, (_, i) => h.toHex(i));
};

/**
 * A publisher bound again on the ports of one just closed, as an engine that restarts binds them:
 * ZeroMQ releases a closed socket's port on its own I/O thread, after close() returns, so the
 * bind is tried until the port is free (or the deadline).
 */
async function publisherAgainOn(endpoint: string, replayEndpoint?: string): Promise<KvEventPublisher> {
  let started: KvEventPublisher | undefined;
  await until(
    async () => {
      try {
        started = await new KvEventPublisher({ endpoint, replayEndpoint }).start();
        return true;
      } catch (err) {
        if ((err as { code?: unknown }).code !== 'EADDRINUSE') throw err;
        return false;
      }
    },
    `${endpoint} to be free to bind again`,
    { intervalMs: 20 },
  );
  return started!;
}

/**
 * A bare publisher, a replay ROUTER answered by `serve`, and a subscriber of worker `w0` of a
 * precise router reading both with `options`; all closed after the test.
 */
async function replayRig(
  serve: (replay: Router) => Promise<void>,
  options: Partial<ConstructorParameters<typeof KvEventSubscriber>[0]>,
) {
  const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
  router.registerWorker('w0');
  const pub = new Publisher({ linger: 0 });
  const replay = new Router({ linger: 0 });
  await bindEndpoint(pub, 'tcp://127.0.0.1:*');
  await bindEndpoint(replay, 'tcp://127.0.0.1:*');
  const serving = serve(replay).catch(() => {});
  const sub = new KvEventSubscriber({
    workerId: 'w0',
    endpoint: pub.lastEndpoint!,
    replayEndpoint: replay.lastEndpoint!,
    applier: new KvEventApplier(router),
    ...options,
  }).start();
  closers.push(
    () => sub.close(),
    async () => {
      pub.close();
      replay.close();
      await serving;
    },
  );
  return { router, pub, sub };
}

describe('KV events over ZeroMQ', () => {
  for (const encoding of ['map', 'array'] as const) {
    test(`the index follows what the engine reports storing and evicting (${encoding} encoding)`, async () => {
      const { router, applier, pub, sub } = await rig(encoding);
      const seen = sub.stats.batches;
      await pub.publish(batch(stored([1n, 2n, 3n], null, 0)));
      await pub.publish(batch({ type: 'BlockRemoved', blockHashes: [3n], medium: 'GPU', groupIdx: null }));
      await until(() => sub.stats.batches >= seen + 2, 'two batches');
      assert.deepEqual(applier.trackedHashes('w0').sort(), ownHex(0, 2).sort());
      assert.equal(router.route({ tokens: tokens(0, 12) }, { dryRun: true }).cachedTokens, 8);
    });
  }

  test('a batch published as the publisher closes, or after, resolves: an engine stepping through its shutdown crashes nothing', async () => {
    const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
    const during = pub.publish(batch(stored([1n], null, 0)));
    await pub.close();
    const afterClose = pub.publish(batch(stored([2n], 1n, BS)));
    assert.deepEqual(await Promise.all([during, afterClose]), [0n, 1n]);
  });

  test('batches published back to back, none awaited before the next, are all sent in order', async () => {
    const { pub, sub } = await rig();
    const seen = sub.stats.batches;
    // an engine's steps publish each batch without waiting for the one before to be written
    const sent = [];
    for (let i = 0; i < 2000; i++) {
      const hashes = [BigInt(i + 1)];
      sent.push(pub.publish(batch(stored(hashes, null, 4 * i))));
    }
    const seqs = await Promise.all(sent);
    assert.deepEqual(
      seqs,
      seqs.map((_, i) => seqs[0] + BigInt(i)),
    );
    await until(() => sub.stats.batches >= seen + 2000, 'the 2,000 batches');
    assert.equal(sub.stats.gaps, 0);
  });

  test('lost messages are detected as a gap and replayed', async () => {
    const { router, pub, sub } = await rig();
    const replaysBefore = sub.stats.replays; // joining late may already have replayed once
    pub.loseNext(2);
    await pub.publish(batch(stored([1n, 2n], null, 0))); // lost
    await pub.publish(batch(stored([3n], 2n, 8))); // lost
    await pub.publish(batch(stored([4n], 3n, 12))); // arrives: seq jumps by 3
    await until(() => sub.stats.replays === replaysBefore + 1, 'the replay');
    assert.equal(sub.stats.gaps, 1);
    assert.equal(sub.stats.gapsLost, 0, 'the replay filled it');
    assert.equal(sub.stats.replayFailures, 0);
    assert.equal(router.route({ tokens: tokens(0, 16) }, { dryRun: true }).cachedTokens, 16);
  });

  test('without a replay endpoint a gap drops the entries, which are rebuilt from new events', async () => {
    const { router, applier, pub, sub } = await rig('map', false);
    const seen = sub.stats.batches;
    await pub.publish(batch(stored([1n, 2n], null, 0)));
    await until(() => sub.stats.batches > seen, 'first batch');
    pub.loseNext(1);
    await pub.publish(batch(stored([3n], 2n, 8))); // lost
    await pub.publish(batch(stored([7n], null, 100)));
    await until(() => sub.stats.gaps === 1 && sub.stats.batches > seen + 1, 'the gap');
    assert.equal(sub.stats.gapsLost, 1, 'no replay filled it');
    assert.deepEqual(applier.trackedHashes('w0'), ownHex(100, 1), 'only what came after the gap');
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 0);
  });

  test('an engine that restarts has its entries dropped and rebuilt', async () => {
    const { router, pub, sub } = await rig();
    const seen = sub.stats.batches;
    await pub.publish(batch(stored([1n, 2n], null, 0)));
    await until(() => sub.stats.batches > seen, 'before the restart');
    const endpoint = pub.endpoint;
    const replayEndpoint = pub.replayEndpoint;
    await pub.close();
    // the connection drops: the engine's state is unknown, its entries go
    await until(() => sub.stats.disconnects === 1, 'the disconnect');
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 0);
    const restarted = await publisherAgainOn(endpoint, replayEndpoint);
    closers.push(() => restarted.close());
    // one batch only: if it is lost while the subscriber reconnects, the replay recovers it
    await restarted.publish(batch(stored([9n], null, 200)));
    await until(
      () => router.route({ tokens: tokens(200, 4) }, { dryRun: true }).cachedTokens === 4,
      'the rebuilt entry',
    );
    assert.equal(
      router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens,
      0,
      'entries from before the restart are gone',
    );
  });

  test('a sequence that goes back without a disconnect (a fast restart) also drops the entries', async () => {
    const { router, pub, sub } = await rig();
    const seen = sub.stats.batches;
    await pub.publish(batch(stored([1n, 2n], null, 0)));
    await until(() => sub.stats.batches > seen, 'the first batch');
    const zero = Buffer.alloc(8);
    const { encodeEventBatch } = await import('../../src/engines/kv-events/encode.js');
    await pub.sendRaw(['', zero, encodeEventBatch(batch(stored([9n], null, 200)))]);
    await until(() => sub.stats.restarts === 1, 'the restart');
    await until(() => router.route({ tokens: tokens(200, 4) }, { dryRun: true }).cachedTokens === 4, 'the new entry');
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 0);
  });

  test("a data-parallel rank's endpoint takes its rank's batches only: another rank's is skipped as unknown", async () => {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('w#0');
    router.registerWorker('w#1');
    const applier = new KvEventApplier(router);
    // rank 1's port (vLLM offsets each rank's publisher by its rank)
    const pub = await new KvEventPublisher({
      endpoint: 'tcp://127.0.0.1:*',
      replayEndpoint: 'tcp://127.0.0.1:*',
    }).start();
    const logs: string[] = [];
    const sub = new KvEventSubscriber({
      workerId: 'w#1',
      endpoint: pub.endpoint,
      replayEndpoint: pub.replayEndpoint,
      applier,
      dataParallel: { rank: 1, size: 2 },
      log: (m) => logs.push(m),
    }).start();
    closers.push(
      () => sub.close(),
      () => pub.close(),
    );
    await pub.publish({ ts: Date.now() / 1000, events: [stored([1n], null, 0)], dataParallelRank: 1 });
    await pub.publish({ ts: Date.now() / 1000, events: [stored([2n], null, 20)], dataParallelRank: 0 });
    await pub.publish({ ts: Date.now() / 1000, events: [stored([5n], null, 40)], dataParallelRank: 7 });
    await pub.publish({ ts: Date.now() / 1000, events: [stored([6n], null, 60)], dataParallelRank: null });
    await until(() => applier.trackedBlocks('w#1') === 2 && sub.stats.unknownRanks === 2, 'the four batches');
    const d = router.route({ tokens: tokens(0, 4) }, { dryRun: true });
    assert.equal(d.workerId, 'w#1');
    assert.equal(d.cachedTokens, 4);
    assert.equal(
      router.route({ tokens: tokens(60, 4) }, { dryRun: true }).cachedTokens,
      4,
      "an unstamped batch is the port's",
    );
    assert.equal(applier.trackedBlocks('w#0'), 0, "rank 0's batch on rank 1's port is not rank 0's");
    assert.equal(router.route({ tokens: tokens(20, 4) }, { dryRun: true }).cachedTokens, 0);
    assert.equal(logs.filter((l) => /unknown_rank/.test(l)).length, 1, `logged once: ${logs.join(' | ')}`);
  });

  test('a worker indexed from a KV group of kind unknown is logged once', async () => {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('w');
    const applier = new KvEventApplier(router);
    const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
    const logs: string[] = [];
    const sub = new KvEventSubscriber({
      workerId: 'w',
      endpoint: pub.endpoint,
      applier,
      log: (m) => logs.push(m),
    }).start();
    closers.push(
      () => sub.close(),
      () => pub.close(),
    );
    await untilSubscribed(pub, sub);
    const unknown = (h: bigint, from: number): KvEvent =>
      storedTokens([h], null, tokens(from, BS), BS, { groupIdx: 0, kvCacheSpecKind: 'unknown' });
    await pub.publish(batch(unknown(1n, 0)));
    await pub.publish(batch(unknown(2n, 20)));
    await until(() => applier.trackedBlocks('w') === 2, 'both stores');
    assert.equal(router.route({ tokens: tokens(20, 4) }, { dryRun: true }).cachedTokens, 4);
    assert.equal(logs.filter((l) => /"unknown"/.test(l)).length, 1, `logged once: ${logs.join(' | ')}`);
  });

  test(
    'events skipped at every step are all counted, and each reason logged once a minute, not once a batch',
    { timeout: 60_000 },
    async (t) => {
      // an engine that sends an event the router skips in every batch (an event type of a newer
      // release beside each step's stores; SGLang's EAGLE token pairs)
      const { pub, sub, logs } = await rawPublisherRig();
      let seq = 0n;
      const send = (events: unknown[]) => pub.send(['', sequenceFrame(seq++), Buffer.from(encode([1.5, events]))]);
      await until(
        async () => {
          if (sub.stats.batches > 0) return true;
          await send([['AllBlocksCleared']]);
          return false;
        },
        'the subscription to receive a probe',
        { intervalMs: 20 },
      );
      const step = async (i: number) =>
        send([
          { type: 'BlockInactive', block_hashes: [i + 1], medium: 'GPU', group_idx: 0 },
          {
            type: 'BlockStored',
            block_hashes: [i + 1],
            parent_block_hash: null,
            token_ids: [
              [1, 2],
              [2, 3],
              [3, 4],
              [4, 5],
            ],
            block_size: BS,
            lora_id: null,
            medium: 'GPU',
          },
        ]);
      const STEPS = 200;
      for (let i = 0; i < STEPS; i++) await step(i);
      const skipped = sub.stats.applied.skipped;
      await until(() => skipped.unknown_type === STEPS && skipped.bigram_tokens === STEPS, `the ${STEPS} batches`);
      // each reason's line names the reason and quotes its first event's message
      const lines = (reason: string) =>
        logs.filter((l) => (reason === 'unknown_type' ? /"BlockInactive"/ : /token pair/).test(l));
      assert.equal(lines('unknown_type').length, 1, logs.join(' | '));
      assert.equal(lines('bigram_tokens').length, 1, logs.join(' | '));
      assert.match(lines('unknown_type')[0], /reason unknown_type/);
      assert.match(lines('bigram_tokens')[0], /reason bigram_tokens/);
      // a minute later the next such batch is logged again, with how many were not
      t.mock.timers.enable({ apis: ['Date'], now: Date.now() + 61_000 });
      await step(STEPS);
      await until(() => skipped.unknown_type === STEPS + 1 && skipped.bigram_tokens === STEPS + 1, 'the next batch');
      t.mock.timers.reset();
      assert.equal(lines('unknown_type').length, 2, logs.join(' | '));
      assert.match(
        lines('unknown_type')[1],
        new RegExp(`and ${STEPS - 1} more skipped for this reason since the last line`),
      );
      assert.equal(lines('bigram_tokens').length, 2, logs.join(' | '));
      assert.equal(sub.stats.applied.storedBlocks, 0);
    },
  );

  test('malformed messages at every step are all counted, and logged once a minute, not once a message', async () => {
    // a publisher that is not an engine, or an engine whose every batch the router cannot read
    const { pub, sub, logs } = await rawPublisherRig();
    await until(
      async () => {
        if (sub.stats.malformed > 0) return true;
        await pub.send(['', 'not a sequence frame', 'x']);
        return false;
      },
      'the subscription to receive a probe',
      { intervalMs: 20 },
    );
    const before = sub.stats.malformed;
    const MESSAGES = 200;
    let seq = 0n;
    for (let i = 0; i < MESSAGES; i++) {
      await pub.send(['', sequenceFrame(seq++), Buffer.from('not msgpack of a batch')]);
      await pub.send(['only', 'two frames']);
    }
    await until(() => sub.stats.malformed === before + 2 * MESSAGES, `the ${2 * MESSAGES} messages`);
    // one line per kind of fault: the probe's and the loop's bad frames are one kind, its batches another
    assert.equal(logs.filter((l) => /sequence frame/.test(l)).length, 1, logs.join(' | '));
    assert.equal(logs.filter((l) => /3 frames|frame count|of 2 frames/.test(l)).length, 1, logs.join(' | '));
    assert.equal(logs.filter((l) => /malformed batch/.test(l)).length, 1, logs.join(' | '));
    assert.equal(sub.stats.applied.storedBlocks, 0);
  });

  test('an event of a type no check foresaw (a uint64) skips itself alone, counted; the rest of its batch applies, logged once', async () => {
    const { pub, sub, logs } = await rawPublisherRig();
    let seq = 0n;
    const send = (events: unknown[]) =>
      pub.send(['', sequenceFrame(seq++), encode([1.5, events], { useBigInt64: true })]);
    const storedOne = (h: number) => ['BlockStored', [h], null, tokens(100 * h, BS), BS, null, 'GPU', null];
    await until(
      async () => {
        if (sub.stats.batches > 0) return true;
        await send([storedOne(1)]);
        return false;
      },
      'the subscription to receive a probe',
      { intervalMs: 20 },
    );
    const BATCHES = 200;
    for (let i = 0; i < BATCHES; i++) {
      // a store, then its removal before the bad event, in one batch: the removal must not be lost
      await send([storedOne(i + 2), ['BlockRemoved', [i + 2], 'GPU'], [2n ** 64n - 1n], storedOne(1000 + i)]);
    }
    await until(() => (sub.stats.applied.skipped.unknown_type ?? 0) === BATCHES, `the ${BATCHES} bad events`);
    await until(() => sub.stats.lastSeq === Number(seq) - 1, 'every batch');
    assert.equal(sub.stats.malformed, 0, 'no batch dropped whole');
    assert.equal(sub.stats.applied.removedBlocks, BATCHES, 'every removal before a bad event applied');
    assert.ok(sub.stats.applied.storedBlocks >= 2 * BATCHES, 'every store around a bad event applied');
    assert.equal(logs.filter((l) => /unknown_type/.test(l)).length, 1, logs.join(' | '));
    assert.match(
      logs.find((l) => /unknown_type/.test(l))!,
      /unknown event type 18446744073709551615/,
    );
    assert.equal(logs.filter((l) => /handler failed/.test(l)).length, 0, logs.join(' | '));
  });

  test("copies on storage that is not the engine's own (locality REMOTE) are skipped, counted and logged once", async () => {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('w0');
    const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
    const logs: string[] = [];
    const sub = new KvEventSubscriber({
      workerId: 'w0',
      endpoint: pub.endpoint,
      applier: new KvEventApplier(router),
      log: (m) => logs.push(m),
    }).start();
    closers.push(
      () => sub.close(),
      () => pub.close(),
    );
    await untilSubscribed(pub, sub);
    const seen = sub.stats.batches;
    const remote = (h: bigint): KvEvent => ({
      type: 'BlockStored',
      blockHashes: [h],
      parentBlockHash: null,
      tokenIds: [],
      blockSize: 0,
      loraId: null,
      medium: 'STORAGE',
      loraName: null,
      groupIdx: null,
      locality: 'REMOTE',
    });
    await pub.publish(batch(stored([1n, 2n], null, 0), remote(2n)));
    await pub.publish(batch(remote(1n), { type: 'BlockRemoved', blockHashes: [2n], medium: 'GPU', groupIdx: null }));
    await until(() => sub.stats.batches >= seen + 2, 'two batches');
    assert.equal(sub.stats.applied.skipped.remote_locality, 2);
    assert.equal(sub.stats.applied.offloadBlocks, 0);
    // block 2 left the GPU and no copy of the worker's own holds it
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 4);
    assert.equal(logs.filter((l) => /remote_locality/.test(l)).length, 1, logs.join(' | '));
  });

  test('malformed messages are counted and skipped; the index and the subscriber survive', async () => {
    const { router, pub, sub } = await rig();
    const seen = sub.stats.batches;
    await pub.publish(batch(stored([1n, 2n], null, 0)));
    await until(() => sub.stats.batches > seen, 'the good batch');
    const seq = (n: number) => {
      const b = Buffer.alloc(8);
      b.writeBigInt64BE(BigInt(n));
      return b;
    };
    const next = sub.stats.lastSeq! + 1;
    await pub.sendRaw(['', 'not-a-seq', 'x']); // wrong seq frame
    await pub.sendRaw(['', seq(next)]); // wrong frame count
    await pub.sendRaw(['', seq(next), Buffer.from([0x92, 0xcb, 1])]); // truncated msgpack
    await pub.sendRaw(['', seq(next + 1), Buffer.from(encode({ ts: 'x', events: 5 }))]); // wrong types
    // an unknown event type is skipped alone, and counted by reason: its batch still applies
    await pub.sendRaw([
      '',
      seq(next + 2),
      Buffer.from(
        encode([
          1.5,
          [
            ['BlockMoved', [1]],
            ['BlockRemoved', [99], 'GPU'],
          ],
        ]),
      ),
    ]);
    await until(
      () => sub.stats.malformed >= 4 && sub.stats.applied.skipped.unknown_type === 1,
      'four malformed messages and a skipped event',
    );
    await until(() => sub.stats.applied.unknownRemovals === 1, 'the event after the unknown one');
    assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 8, 'the index is intact');
    // and the subscriber still applies good batches. (The raw frames used sequence numbers
    // the publisher will use again, so its next batch reads as an engine restart: entries are
    // dropped and rebuilt through a replay of its buffer.)
    const before = router.getStats().index.entries;
    await pub.publish(batch(stored([3n], 2n, 8)));
    await until(() => router.getStats().index.entries > before, 'a good batch after the bad ones');
  });

  // ZeroMQ buffers a whole frame before handing it over: without a transport limit a frame
  // far over the decode limit would be held in memory just to be refused.
  const oversized = () => Buffer.alloc(KV_EVENT_LIMITS.maxPayloadBytes + 1);
  const seqFrame = (n: bigint) => {
    const b = Buffer.alloc(8);
    b.writeBigInt64BE(n);
    return b;
  };

  test('a frame over the decode limit is refused by the socket, not buffered; the subscriber goes on', async () => {
    const { router, pub, sub } = await rig();
    const seen = sub.stats.batches;
    await pub.publish(batch(stored([1n, 2n], null, 0)));
    await until(() => sub.stats.batches > seen, 'the good batch');
    const [malformed, disconnects] = [sub.stats.malformed, sub.stats.disconnects];
    await pub.sendRaw(['', seqFrame(BigInt(sub.stats.lastSeq! + 1)), oversized()]);
    await until(
      () => sub.stats.malformed > malformed || sub.stats.disconnects > disconnects,
      'the oversized frame to be refused',
      { timeoutMs: 60_000 },
    );
    assert.equal(sub.stats.malformed, malformed, 'refused by ZeroMQ before it was received whole');
    assert.equal(sub.stats.disconnects, disconnects + 1, 'the sending engine was disconnected');
    // the subscriber reconnects and applies new batches
    await publishUntilApplied(router, pub, 'a batch after the oversized frame');
  });

  test('after a frame over the limit, live batches come again without a replay: the closed session is made again', async () => {
    // libzmq ends a session for good on a protocol error (the oversized message): with no replay
    // endpoint to poll, the worker had no KV events from then on
    const { router, pub, sub } = await rig('map', false);
    const seen = sub.stats.batches;
    await pub.publish(batch(stored([1n, 2n], null, 0)));
    await until(() => sub.stats.batches > seen, 'the good batch');
    const disconnects = sub.stats.disconnects;
    await pub.sendRaw(['', seqFrame(BigInt(sub.stats.lastSeq! + 1)), oversized()]);
    await until(() => sub.stats.disconnects > disconnects, 'the oversized frame to be refused', { timeoutMs: 60_000 });
    await publishUntilApplied(router, pub, 'a live batch after the oversized frame');
    assert.equal(sub.stats.sessionsRestarted, 1);
    assert.equal(sub.stats.replays, 0, 'no replay endpoint: it came live');
  });

  test('an endpoint that is no ZeroMQ publisher is logged once, not at every one of its disconnects', async () => {
    // an engine's HTTP port given as its events endpoint: connected to and dropped many times a second
    const sockets = new Set<Socket>();
    const server = createServer((socket) => {
      sockets.add(socket.on('close', () => sockets.delete(socket)));
      socket.end('HTTP/1.1 400 Bad Request\r\n\r\n');
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const { sub, logs } = loggedSubscriber(`tcp://127.0.0.1:${(server.address() as AddressInfo).port}`);
    closers.push(
      () =>
        new Promise<void>((r) => {
          server.close(() => r());
          for (const socket of sockets) socket.destroy();
        }),
    );
    await until(() => sub.stats.disconnects >= 5, 'five disconnects', { timeoutMs: 30_000 });
    const lines = logs.filter((l) => /disconnected|does not speak/.test(l));
    assert.ok(lines.length >= 1 && lines.length <= 2, lines.join(' | '));
  });

  test('a replay frame over the decode limit is refused by the socket: the replay fails, nothing is decoded', async () => {
    const { sub } = await replayRig(
      async (replay) => {
        for await (const [id] of replay) {
          await replay.send([id, '', seqFrame(0n), oversized()]);
          await replay.send([id, '', seqFrame(-1n), '']);
        }
      },
      { idleReplayMs: 0, replayTimeoutMs: 1000 },
    );
    // connecting asks for a replay from 0, answered with the oversized frame
    await until(() => sub.stats.replays + sub.stats.replayFailures > 0, 'the replay to end', { timeoutMs: 60_000 });
    assert.equal(sub.stats.malformed, 0, 'refused by ZeroMQ before it was received whole');
    assert.equal(sub.stats.replayFailures, 1);
    assert.equal(sub.stats.lastSeq, null);
  });

  test('a large batch applies in slices, the loop turning between them, and before the next batch', async () => {
    const { router, applier, pub, sub } = await rig();
    // count the loop's turns, and note at each apply how many had passed
    const turns = loopTurns();
    const calls: Array<{ events: number; turn: number }> = [];
    const apply = applier.apply.bind(applier);
    applier.apply = (worker, b, counts) => {
      // (the rig's probes, AllBlocksCleared, may still be arriving)
      if (b.events[0]?.type !== 'AllBlocksCleared') calls.push({ events: b.events.length, turn: turns.count });
      return apply(worker, b, counts);
    };
    const n = 20_000;
    const hashes = Array.from({ length: n }, (_, i) => BigInt(1_000 + i));
    const [stores, removals] = [sub.stats.applied.storedBlocks, sub.stats.applied.removedBlocks];
    await pub.publish(batch(...hashes.map((h, i) => stored([h], null, i * BS))));
    await pub.publish(batch({ type: 'BlockRemoved', blockHashes: hashes, medium: 'GPU', groupIdx: null }));
    await until(() => sub.stats.applied.removedBlocks - removals === n, 'both batches');
    turns.stop();
    assert.equal(sub.stats.applied.storedBlocks - stores, n);
    assert.equal(sub.stats.applied.unknownRemovals, 0, 'every removal came after its store');
    assert.equal(router.getStats().index.entries, 0);
    const slices = calls.slice(0, -1);
    assert.ok(slices.length > 1, `the stores applied in ${slices.length} call(s)`);
    assert.equal(
      slices.reduce((t, c) => t + c.events, 0),
      n,
    );
    assert.ok(slices.at(-1)!.turn > slices[0].turn, 'the loop turned while the batch applied');
    assert.deepEqual(calls.at(-1), { events: 1, turn: calls.at(-1)!.turn });
  });

  test('clears on a worker keeping offload copies apply in slices weighed by the blocks they walk; a run of clears walks once', async () => {
    const { router, applier, pub, sub } = await rig();
    const n = 20_000;
    const hashes = Array.from({ length: n }, (_, i) => BigInt(1_000 + i));
    const seen = sub.stats.batches;
    // n GPU blocks, and the offload connector's tokenless copies of them (kept through a clear)
    await pub.publish(batch(stored(hashes, null, 0), storedTokens(hashes, null, [], 0, { medium: 'CPU' })));
    await until(() => sub.stats.batches > seen, 'the stores');
    assert.equal(sub.stats.applied.offloadBlocks, n);
    const turns = loopTurns();
    // (stopped however the test ends: a tick left running would keep the process alive)
    try {
      const calls: Array<{ clears: number; turn: number }> = [];
      let walks = 0;
      const applyCleared = router.applyCleared.bind(router);
      router.applyCleared = (...args: Parameters<typeof router.applyCleared>) => {
        walks++;
        applyCleared(...args);
      };
      const apply = applier.apply.bind(applier);
      applier.apply = (worker, b, counts) => {
        calls.push({ clears: b.events.filter((e) => e.type === 'AllBlocksCleared').length, turn: turns.count });
        return apply(worker, b, counts);
      };
      // 8 clears, each after a store of a new GPU block: each walks the n blocks kept offloaded
      const clears = 8;
      const cleared = sub.stats.applied.cleared;
      const events: KvEvent[] = [];
      for (let k = 0; k < clears; k++)
        events.push(stored([BigInt(900_000 + k)], null, 200_000 + k * BS), { type: 'AllBlocksCleared' });
      await pub.publish(batch(...events));
      await until(() => sub.stats.applied.cleared === cleared + clears, 'the clears');
      assert.equal(walks, clears);
      const perCall = Math.floor(APPLY_SLICE_WORK / n);
      assert.ok(
        calls.length >= Math.ceil(clears / perCall) && calls.every((c) => c.clears <= perCall),
        `at most ${perCall} clears of ${n} blocks per slice: ${JSON.stringify(calls)}`,
      );
      assert.ok(calls.at(-1)!.turn > calls[0].turn, 'the loop turned between the slices');
      // a run of clears with nothing between walks once, and applies in one slice
      calls.length = 0;
      walks = 0;
      await pub.publish(batch(...Array.from({ length: 4000 }, () => ({ type: 'AllBlocksCleared' }) as const)));
      await until(() => sub.stats.applied.cleared === cleared + clears + 4000, 'the run of clears');
      assert.equal(walks, 0, 'nothing stored since the last clear: nothing walked');
      assert.deepEqual(
        calls.map((c) => c.clears),
        [4000],
      );
      assert.equal(router.getStats().index.entries, n, 'the offload copies stay');
    } finally {
      turns.stop();
    }
  });

  test('a burst of queued batches lets the event loop turn between them, not once per hundreds ZeroMQ hands over', async () => {
    const { applier, pub, sub } = await rig();
    const n = 2000;
    const counted = countTurnsWhileApplying(applier, 1n, BigInt(n));
    const seen = sub.stats.batches;
    // published back to back: ZeroMQ queues them, and hands over up to 512 at once
    const sent = [];
    for (let i = 0; i < n; i++) sent.push(pub.publish(batch(stored([BigInt(i + 1)], null, 4 * i))));
    await Promise.all(sent);
    await until(() => sub.stats.batches >= seen + n, 'the burst', { timeoutMs: 60_000 });
    assert.equal(sub.stats.gaps, 0);
    // ten batches or so between turns: 200; the loop turning only between ZeroMQ's handovers
    // (or when its queue runs dry): a few
    assert.ok(counted.turns! >= n / 20, `the loop turned ${counted.turns} times while ${n} batches applied`);
  });

  test('an event whose extra_keys nest 100,000 deep is skipped alone: the rest of its batch and the next batch apply', async () => {
    const { router, pub, sub } = await rig();
    const seen = sub.stats.batches;
    await pub.publish(batch(stored([1n, 2n], null, 0)));
    await until(() => sub.stats.batches > seen, 'the good batch');
    // a well-formed msgpack batch (array form) of two BlockStored events: the first's
    // extra_keys entry is 100,000 arrays nested in one another (msgpack reads any depth; the
    // decoding stops at the depth limit instead of running out of stack), the second is good
    const deep = Buffer.concat([
      Buffer.from([0x92]), // [ts, events]
      encode(1.5),
      Buffer.from([0x92, 0x99]), // events: two, the first of nine fields
      ...['BlockStored', [7], null, tokens(100, BS), BS, null, 'GPU', null].map((v) => encode(v)),
      Buffer.from([0x91]), // extra_keys: one entry, for the one block
      Buffer.alloc(100_000, 0x91),
      Buffer.from([0xc0]),
      encode(['BlockStored', [3], 2, tokens(8, BS), BS, null, 'GPU', null]),
    ]);
    assert.deepEqual(
      decodeEventBatch(deep).skipped?.map(({ index, reason }) => ({ index, reason })),
      [{ index: 0, reason: 'bad_field' }],
      'the deep event is skipped by the decoding, as a bad field',
    );
    const seq = (n: number) => {
      const b = Buffer.alloc(8);
      b.writeBigInt64BE(BigInt(n));
      return b;
    };
    const next = sub.stats.lastSeq! + 1;
    const { batches, restarts, gaps, malformed } = sub.stats;
    const entries = router.getStats().index.entries;
    await pub.sendRaw(['', seq(next), deep]);
    // the next batch in sequence (raw as well: the publisher's own count did not move)
    await pub.sendRaw(['', seq(next + 1), encodeEventBatch(batch(stored([4n], 3n, 12)))]);
    await until(() => sub.stats.lastSeq === next + 1, 'the batch after the one with the deep event');
    assert.equal(sub.stats.batches, batches + 2, 'both batches apply');
    assert.equal(sub.stats.malformed, malformed, 'no batch is dropped whole');
    assert.deepEqual(
      skippedEventCounts([['w0', sub.stats]]),
      [{ worker: 'w0', reason: 'bad_field', count: 1 }],
      'the deep event is exported under its reason, and no malformed_batch',
    );
    assert.deepEqual([sub.stats.restarts, sub.stats.gaps], [restarts, gaps], 'no restart, no gap');
    assert.equal(router.getStats().index.entries, entries + 2, 'the good events changed the index');
    assert.equal(router.route({ tokens: tokens(0, 16) }, { dryRun: true }).cachedTokens, 16);
    assert.equal(router.route({ tokens: tokens(100, BS) }, { dryRun: true }).cachedTokens, 0);
  });

  // vLLM's ROUTER answers a replay with [topic, seq, payload] after the empty delimiter and
  // ends with ["", END_SEQ, ""] (vllm-project/vllm#45177, in releases since June 2026); SGLang
  // and older vLLM send [seq, payload] and [END_SEQ, ""]. The engine here is a bare ROUTER
  // answering as each does, so the test does not depend on this project's publisher.
  for (const layout of ['with the topic (vLLM)', 'without the topic (SGLang, older vLLM)'] as const) {
    test(`a replay answered ${layout} is applied`, async () => {
      const withTopic = layout.startsWith('with the topic');
      const buffered = [
        encodeEventBatch(batch(stored([1n], null, 0)), 'array'),
        encodeEventBatch(batch(stored([2n], 1n, 4)), 'array'),
      ];
      const { router, sub } = await replayRig(
        async (replay) => {
          for await (const [id, , start] of replay) {
            const from = Number(start.readBigUInt64BE());
            for (let s = from; s < buffered.length; s++)
              await replay.send(
                withTopic
                  ? [id, '', 'kv-events', sequenceFrame(BigInt(s)), buffered[s]]
                  : [id, '', sequenceFrame(BigInt(s)), buffered[s]],
              );
            await replay.send(withTopic ? [id, '', '', sequenceFrame(-1n), ''] : [id, '', sequenceFrame(-1n), '']);
          }
        },
        { idleReplayMs: 0 },
      );
      // connecting asks for everything from 0: both buffered batches arrive by replay
      await until(() => sub.stats.lastSeq === 1, 'the replayed batches');
      assert.equal(sub.stats.replayFailures, 0);
      assert.equal(sub.stats.replays, 1);
      assert.equal(router.route({ tokens: tokens(0, 8) }, { dryRun: true }).cachedTokens, 8);
    });
  }

  for (const replayTopic of [true, false]) {
    test(`the publisher answers a replay ${replayTopic ? 'with the topic, as vLLM does' : 'without the topic, as SGLang does'}`, async () => {
      const pub = await new KvEventPublisher({
        endpoint: 'tcp://127.0.0.1:*',
        replayEndpoint: 'tcp://127.0.0.1:*',
        topic: 'kv-events',
        replayTopic,
      }).start();
      const dealer = new Dealer({ linger: 0, receiveTimeout: 5000 });
      closers.push(async () => {
        dealer.close();
        await pub.close();
      });
      await pub.publish(batch(stored([1n], null, 0)));
      await pub.publish(batch(stored([2n], 1n, 4)));
      dealer.connect(pub.replayEndpoint);
      const start = Buffer.alloc(8);
      start.writeBigUInt64BE(1n);
      await dealer.send(['', start]);
      const reply = (await dealer.receive()).map((f) => Buffer.from(f));
      const end = (await dealer.receive()).map((f) => Buffer.from(f));
      const seq1 = Buffer.alloc(8);
      seq1.writeBigUInt64BE(1n);
      const endSeq = Buffer.alloc(8, 0xff);
      if (replayTopic) {
        assert.deepEqual(reply.slice(0, 3), [Buffer.alloc(0), Buffer.from('kv-events'), seq1]);
        assert.deepEqual(end, [Buffer.alloc(0), Buffer.alloc(0), endSeq, Buffer.alloc(0)]);
      } else {
        assert.deepEqual(reply.slice(0, 2), [Buffer.alloc(0), seq1]);
        assert.deepEqual(end, [Buffer.alloc(0), endSeq, Buffer.alloc(0)]);
      }
      const events = decodeEventBatch(reply.at(-1)!).events;
      assert.deepEqual(
        events.map((e) => (e.type === 'BlockStored' ? e.blockHashes : [])),
        [[2n]],
      );
    });
  }

  test('a router that joins late accepts a replay from the oldest batch the engine still buffers', async () => {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('w0');
    const applier = new KvEventApplier(router);
    // the engine keeps 3 batches: 0-2 are gone by the time the router connects
    const pub = await new KvEventPublisher({
      endpoint: 'tcp://127.0.0.1:*',
      replayEndpoint: 'tcp://127.0.0.1:*',
      bufferSize: 3,
    }).start();
    await pub.publish(batch(stored([1n], null, 0)));
    await pub.publish(batch(stored([2n], 1n, 4)));
    await pub.publish(batch(stored([3n], 2n, 8)));
    await pub.publish(batch(stored([10n], null, 100)));
    await pub.publish(batch(stored([11n], 10n, 104)));
    await pub.publish(batch(stored([20n], null, 200)));
    const sub = new KvEventSubscriber({
      workerId: 'w0',
      endpoint: pub.endpoint,
      replayEndpoint: pub.replayEndpoint,
      applier,
      idleReplayMs: 0,
    }).start();
    closers.push(
      () => sub.close(),
      () => pub.close(),
    );
    await until(() => sub.stats.lastSeq === 5, 'the replay of the buffered batches');
    assert.equal(sub.stats.lateJoins, 1);
    assert.equal(sub.stats.replayFailures, 0);
    assert.equal(router.route({ tokens: tokens(100, 8) }, { dryRun: true }).cachedTokens, 8);
    assert.equal(router.route({ tokens: tokens(200, 4) }, { dryRun: true }).cachedTokens, 4);
    // the store whose parent was in the dropped part is an orphan: counted, not guessed
    await pub.publish(batch(stored([4n], 3n, 12)));
    await until(() => sub.stats.applied.orphanEvents === 1, 'the orphan');
    assert.equal(sub.stats.replays, 1, 'the buffer was pulled once, not on every message');
  });

  test('a replay that never ends is given up at its deadline: live events apply again, the entries rebuilt from them', async () => {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('w0');
    const applier = new KvEventApplier(router);
    const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
    // a replay endpoint that answers every request with batches numbered on without end, never
    // the end marker: each one well within the receive timeout
    // (mandatory: a full queue to the subscriber makes it wait, never drops a batch, which would end the replay)
    const endless = new Router({ linger: 0, mandatory: true });
    await bindEndpoint(endless, 'tcp://127.0.0.1:*');
    let serving = true;
    const empty = encodeEventBatch(batch());
    const served = (async () => {
      for await (const [identity, , start] of endless) {
        for (let seq = start.readBigInt64BE(); serving; seq++) {
          await endless.send([identity, '', sequenceFrame(seq), empty]);
          await new Promise((r) => setImmediate(r));
        }
      }
    })().catch(() => {});
    const sub = new KvEventSubscriber({
      workerId: 'w0',
      endpoint: pub.endpoint,
      replayEndpoint: endless.lastEndpoint!,
      applier,
      idleReplayMs: 0,
      replayDeadlineMs: 300,
    }).start();
    closers.push(
      () => sub.close(),
      () => pub.close(),
      async () => {
        serving = false;
        endless.close();
        await served;
      },
    );
    // the first batch that arrives after a lost one asks for a replay, which never ends
    pub.loseNext(1);
    await publishUntilReplayGivenUp(pub, sub, 'the endless replay to be given up');
    await pub.publish(batch(stored([7n], null, 100)));
    await until(() => applier.trackedHashes('w0').includes(ownHex(100, 1)[0]), 'a live event after the replay');
    assert.equal(router.route({ tokens: tokens(100, 4) }, { dryRun: true }).cachedTokens, 4);
  });
});

describe('KV events: replays against the live stream, sequence numbers', () => {
  /**
   * A stream from this project's publisher whose replay endpoint is a bare ROUTER answering as
   * `answer` says (given the start it was asked for; the end marker follows).
   */
  async function rigWithReplay(answer: (from: bigint) => Array<[bigint, Uint8Array]>) {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('w0');
    const applier = new KvEventApplier(router);
    const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
    // (a ROUTER drops what passes its high-water mark: room for a replay of thousands)
    const replay = new Router({ linger: 0, sendHighWaterMark: 100_000 });
    await bindEndpoint(replay, 'tcp://127.0.0.1:*');
    const asked: bigint[] = [];
    const serving = (async () => {
      for await (const [id, , start] of replay) {
        const from = start.readBigInt64BE();
        asked.push(from);
        for (const [s, p] of answer(from)) await replay.send([id, '', '', sequenceFrame(s), p]);
        await replay.send([id, '', '', sequenceFrame(-1n), '']);
      }
    })().catch(() => {});
    const logs: string[] = [];
    const sub = new KvEventSubscriber({
      workerId: 'w0',
      endpoint: pub.endpoint,
      replayEndpoint: replay.lastEndpoint!,
      applier,
      idleReplayMs: 0,
      log: (m) => logs.push(m),
    }).start();
    closers.push(
      () => sub.close(),
      async () => {
        await pub.close();
        replay.close();
        await serving;
      },
    );
    await untilSubscribed(pub, sub);
    return { router, applier, pub, sub, logs, asked };
  }

  test('a replay answering batches numbered past the live batch that asked for it fails: the live stream goes on', async () => {
    let ahead = false;
    const { applier, pub, sub } = await rigWithReplay(() =>
      ahead ? [[2n ** 62n, encodeEventBatch(batch(stored([42n], null, 400)))]] : [],
    );
    ahead = true;
    const failuresBefore = sub.stats.replayFailures;
    pub.loseNext(1);
    await pub.publish(batch(stored([1n], null, 0))); // lost: the next one asks for a replay
    await pub.publish(batch(stored([2n], null, 8)));
    await until(() => sub.stats.replayFailures === failuresBefore + 1, 'the failed replay');
    const batchesBefore = sub.stats.batches;
    await pub.publish(batch(stored([3n], null, 16)));
    await pub.publish(batch(stored([4n], null, 24)));
    await until(() => sub.stats.batches >= batchesBefore + 2, 'the live batches after the replay');
    assert.ok(sub.stats.lastSeq! < 1000, `lastSeq ${sub.stats.lastSeq} follows the live stream`);
    assert.deepEqual(
      applier.trackedHashes('w0').sort(),
      [...ownHex(8, 1), ...ownHex(16, 1), ...ownHex(24, 1)].sort(),
      'the live batches are applied, the replayed one is not',
    );
  });

  test('a replay carrying batches published after the live one that asked applies up to it; the later ones apply live', async () => {
    const buffered = new Map<bigint, Uint8Array>();
    const { applier, pub, sub } = await rigWithReplay((from) => [...buffered].filter(([s]) => s >= from));
    const l = BigInt(sub.stats.lastSeq!);
    for (let i = 1n; i <= 4n; i++) buffered.set(l + i, encodeEventBatch(batch(stored([i], null, 8 * Number(i)))));
    const failures = sub.stats.replayFailures;
    // l + 1 is lost; l + 2 asks for a replay, which also has l + 3 and l + 4 (a busy engine)
    await pub.sendRaw(['', sequenceFrame(l + 2n), buffered.get(l + 2n)!]);
    await until(() => sub.stats.lastSeq === Number(l + 2n), 'the replay up to the live batch');
    assert.equal(sub.stats.replayFailures, failures);
    const batches = sub.stats.batches;
    await pub.sendRaw(['', sequenceFrame(l + 3n), buffered.get(l + 3n)!]);
    await pub.sendRaw(['', sequenceFrame(l + 4n), buffered.get(l + 4n)!]);
    await until(() => sub.stats.lastSeq === Number(l + 4n), 'the later batches, live');
    assert.equal(sub.stats.batches, batches + 2, 'applied live');
    assert.equal(sub.stats.duplicates, 0);
    assert.equal(applier.trackedHashes('w0').length, 4);
  });

  test('live copies of batches a replay delivered are counted as duplicates; one numbered below what it delivered is a restart', async () => {
    const buffered = new Map<bigint, Uint8Array>();
    const { pub, sub } = await rigWithReplay((from) => [...buffered].filter(([s]) => s >= from));
    const l = BigInt(sub.stats.lastSeq!);
    buffered.set(l + 1n, encodeEventBatch(batch(stored([5n], null, 40))));
    buffered.set(l + 2n, encodeEventBatch(batch(stored([6n], null, 48))));
    // l + 1 is lost: l + 2 asks for a replay from l + 1, which delivers both
    await pub.sendRaw(['', sequenceFrame(l + 2n), buffered.get(l + 2n)!]);
    await until(() => sub.stats.lastSeq === Number(l + 2n), 'the replayed batches');
    assert.equal(sub.stats.duplicates, 0, 'the batch that asked for the replay is not a duplicate');
    await pub.sendRaw(['', sequenceFrame(l + 1n), buffered.get(l + 1n)!]); // a late live copy
    await until(() => sub.stats.duplicates === 1, 'the duplicate counted');
    assert.equal(sub.stats.restarts, 0);
    // a number below the replay's first batch was never delivered by it: the engine restarted
    await pub.sendRaw(['', sequenceFrame(l), encodeEventBatch(batch(stored([9n], null, 200)))]);
    await until(() => sub.stats.restarts === 1, 'the restart');
    assert.equal(sub.stats.duplicates, 1);
  });

  test('a replay of thousands of batches lets the event loop turn between them', async () => {
    const n = 2000;
    const buffered = new Map<bigint, Uint8Array>();
    const { applier, pub, sub } = await rigWithReplay((from) => [...buffered].filter(([s]) => s >= from));
    const l = BigInt(sub.stats.lastSeq!);
    for (let i = 1; i <= n; i++) buffered.set(l + BigInt(i), encodeEventBatch(batch(stored([BigInt(i)], null, 4 * i))));
    const counted = countTurnsWhileApplying(applier, 1n, BigInt(n));
    // l + 1 … l + n are lost: l + n + 1 asks for a replay of them
    const next = encodeEventBatch(batch(stored([BigInt(n + 1)], null, 4 * (n + 1))));
    await pub.sendRaw(['', sequenceFrame(l + BigInt(n) + 1n), next]);
    await until(() => sub.stats.lastSeq === Number(l) + n + 1, 'the replay and the live batch', { timeoutMs: 60_000 });
    assert.equal(sub.stats.replayFailures, 0);
    assert.ok(counted.turns! >= n / 20, `the loop turned ${counted.turns} times while ${n} replayed batches applied`);
  });

  test('a replay endpoint that answers nothing is given up at the replay deadline, not after the receive timeout', async () => {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('w0');
    const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
    // a ROUTER that takes the request and never answers
    const silent = new Router({ linger: 0 });
    await bindEndpoint(silent, 'tcp://127.0.0.1:*');
    const logs: string[] = [];
    const sub = new KvEventSubscriber({
      workerId: 'w0',
      endpoint: pub.endpoint,
      replayEndpoint: silent.lastEndpoint!,
      applier: new KvEventApplier(router),
      idleReplayMs: 0,
      replayTimeoutMs: 600_000,
      replayDeadlineMs: 200,
      log: (m) => logs.push(m),
    }).start();
    closers.push(
      () => sub.close(),
      () => pub.close(),
      async () => silent.close(),
    );
    // the first batch comes after a lost one: it asks for a replay (or joining late did already)
    pub.loseNext(1);
    await publishUntilReplayGivenUp(pub, sub, 'the silent replay to be given up', 30_000);
    assert.ok(
      logs.some((m) => m.includes('did not end within 200 ms')),
      `the deadline is named: ${logs.join(' | ')}`,
    );
  });

  test("the connection watch reads ZeroMQ's events while a replay holds the stream: a reconnection is not taken for a session closed for good", async () => {
    const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
    router.registerWorker('w0');
    const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
    const endpoint = pub.endpoint;
    // a ROUTER that takes each request and never answers: each replay holds the stream until
    // its receive timeout, three times SESSION_CHECK_MS
    const silent = new Router({ linger: 0 });
    await bindEndpoint(silent, 'tcp://127.0.0.1:*');
    let asked = 0;
    const serving = (async () => {
      for await (const _ of silent) asked++;
    })().catch(() => {});
    const sub = new KvEventSubscriber({
      workerId: 'w0',
      endpoint,
      replayEndpoint: silent.lastEndpoint!,
      applier: new KvEventApplier(router),
      idleReplayMs: 0,
      replayTimeoutMs: 3 * SESSION_CHECK_MS,
    }).start();
    const restarted: { pub?: KvEventPublisher } = {};
    closers.push(
      () => sub.close(),
      async () => {
        await pub.close();
        await restarted.pub?.close();
        silent.close();
        await serving;
      },
    );
    // the connection's own replay (joining), then one a gap asks for: the stream is held
    await until(() => sub.stats.replayFailures === 1, "the connection's replay to fail", { timeoutMs: 20_000 });
    await until(
      async () => {
        if (asked >= 2) return true;
        pub.loseNext(1);
        await pub.publish(batch(stored([1n], null, 0)));
        await pub.publish(batch(stored([2n], null, 8)));
        return false;
      },
      'a replay asked for by a gap',
      { intervalMs: 50 },
    );
    // the engine restarts meanwhile: ZeroMQ reconnects at once, which the watch must see
    await pub.close();
    restarted.pub = await publisherAgainOn(endpoint);
    await until(() => sub.stats.disconnects === 1, 'the disconnect');
    await until(() => sub.stats.replayFailures >= 2, 'the replay holding the stream to end', { timeoutMs: 20_000 });
    assert.equal(sub.stats.sessionsRestarted, 0, 'ZeroMQ reconnected of itself');
  });

  test('a replay that covers the live batch asking for it starts its own duplicate window: a jump back before it is a restart', async () => {
    const buffered = new Map<bigint, Uint8Array>();
    const { pub, sub } = await rigWithReplay((from) => [...buffered].filter(([s]) => s >= from));
    const l = BigInt(sub.stats.lastSeq!);
    for (let i = 1n; i <= 4n; i++) buffered.set(l + i, encodeEventBatch(batch(stored([i], null, 8 * Number(i)))));
    const failures = sub.stats.replayFailures;
    // l + 1 is lost: l + 2 asks for a replay, which delivers l + 1 and l + 2
    await pub.sendRaw(['', sequenceFrame(l + 2n), buffered.get(l + 2n)!]);
    await until(() => sub.stats.lastSeq === Number(l + 2n), 'the first replay');
    // l + 3 is lost: l + 4 asks for a replay, which delivers l + 3 and l + 4
    await pub.sendRaw(['', sequenceFrame(l + 4n), buffered.get(l + 4n)!]);
    await until(() => sub.stats.lastSeq === Number(l + 4n), 'the second replay');
    assert.equal(sub.stats.replayFailures, failures);
    // l + 2 was delivered by the first replay, not by the second: the engine restarted
    await pub.sendRaw(['', sequenceFrame(l + 2n), encodeEventBatch(batch(stored([9n], null, 200)))]);
    await until(() => sub.stats.restarts === 1, 'the restart');
    assert.equal(sub.stats.duplicates, 0);
  });

  /**
   * A bare publisher and a replay ROUTER that records each replay asked for and answers it
   * (`answer`) or not, with a subscriber of worker `w0` polling it every 20 ms when idle.
   */
  async function pollingRig(answer: boolean) {
    const asked: bigint[] = [];
    const logs: string[] = [];
    const { pub, sub } = await replayRig(
      async (replay) => {
        for await (const [id, , start] of replay) {
          asked.push(start.readBigInt64BE());
          if (answer) await replay.send([id, '', sequenceFrame(-1n), '']);
        }
      },
      { idleReplayMs: 20, replayTimeoutMs: 20, replayDeadlineMs: 100, log: (m) => logs.push(m) },
    );
    return { pub, sub, logs, asked };
  }

  test('a replay endpoint that never answers fails every idle poll, logged once a minute, not once a poll', async () => {
    const { sub, logs, asked } = await pollingRig(false);
    await until(() => sub.stats.replayFailures >= 5 && asked.length >= 5, 'five failed replays');
    const lines = logs.filter((l) => /replay from \d+ failed/.test(l));
    assert.equal(lines.length, 1, logs.join(' | '));
    assert.match(lines[0], /timed out|did not end/);
  });

  test('after sequence number 2^63 − 1 the idle poll asks for nothing it could not write, and fails nothing', async () => {
    const { pub, sub, logs, asked } = await pollingRig(true);
    const max = (1n << 63n) - 1n;
    let polls = 0;
    const s = sub as unknown as { catchUp: () => Promise<void> };
    const catchUp = s.catchUp.bind(sub);
    s.catchUp = async () => {
      if (sub.stats.lastSeq === Number(max)) polls++;
      await catchUp();
    };
    await until(
      async () => {
        if (sub.stats.lastSeq === Number(max)) return true;
        await pub.send(['', sequenceFrame(max), encodeEventBatch(batch(stored([1n], null, 0)))]);
        return false;
      },
      'the batch numbered 2^63 − 1',
      { intervalMs: 20 },
    );
    const failures = sub.stats.replayFailures;
    const askedBefore = asked.length;
    await until(() => polls >= 5, 'five idle polls after it');
    assert.equal(sub.stats.replayFailures, failures, logs.join(' | '));
    assert.equal(asked.length, askedBefore, 'no replay asked from 2^63');
    assert.ok(!logs.some((l) => /RangeError|out of range/i.test(l)), logs.join(' | '));
  });

  test('a negative sequence number is a malformed message; a bad sequence frame is named in the log', async () => {
    const { pub, sub, logs } = await rigWithReplay(() => []);
    const malformed = sub.stats.malformed;
    const lastSeq = sub.stats.lastSeq;
    await pub.sendRaw(['', sequenceFrame(-5n), encodeEventBatch(batch(stored([1n], null, 0)))]);
    await pub.sendRaw(['', Buffer.alloc(4), encodeEventBatch(batch(stored([1n], null, 0)))]);
    await until(() => sub.stats.malformed === malformed + 2, 'both messages counted as malformed');
    assert.equal(sub.stats.lastSeq, lastSeq, 'the stream position did not move');
    assert.equal(sub.stats.restarts, 0);
    assert.ok(
      logs.some((l) => /sequence number/.test(l) && /-5|negative|2\^63/.test(l)),
      `the negative number is logged: ${logs.join(' | ')}`,
    );
    assert.ok(
      logs.some((l) => /sequence frame/.test(l) && /4 bytes/.test(l)),
      `the short seq frame is named: ${logs.join(' | ')}`,
    );
  });
});
