/**
 * A faulty KV-event stream as the gateway sees it: lost batches (a gap), a publisher that
 * restarts, and 10,000 fuzzed payloads. The index changes only through valid events.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { encode } from '@msgpack/msgpack';
import fc from 'fast-check';
import { Router } from 'zeromq';
import { WorkerHealth } from '../../src/engines/health.js';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { bindEndpoint } from '../../src/engines/kv-events/bind.js';
import {
  decodeEventBatch,
  KvEventFormatError,
  type KvEvent,
  type KvEventBatch,
} from '../../src/engines/kv-events/decode.js';
import { encodeEventBatch } from '../../src/engines/kv-events/encode.js';
import { KvEventPublisher } from '../../src/engines/kv-events/publisher.js';
import { KvEventSubscriber } from '../../src/engines/kv-events/subscriber.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { WorkerConnections } from '../../src/server/worker-connections.js';
import {} from './harness.js';
import { eventBatch, sequenceFrame, storedEvent, tokenRange } from '../helpers/kv-event-builders.js';
import { until } from '../helpers/wait.js';

const BS = 4;
const tokens = tokenRange;
const batch = (...events: KvEvent[]) => eventBatch(null, ...events);
const stored = (hashes: bigint[], parent: bigint | null, from: number) => storedEvent(hashes, parent, from, BS);

test('through the gateway: a gap is replayed, a restarted publisher has its old entries dropped', async () => {
  const pub = await new KvEventPublisher({
    endpoint: 'tcp://127.0.0.1:*',
    replayEndpoint: 'tcp://127.0.0.1:*',
  }).start();
  const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise', speculativeBlocks: 0 });
  const gateway = await createGateway({
    router,
    tokenize: 'engine',
    kvEvents: true,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    adminToken: 'fault-suite-admin',
    workers: [{ id: 'w0', url: 'http://127.0.0.1:1', events: pub.endpoint, replay: pub.replayEndpoint }],
  });
  const cached = (from: number, n: number) => router.route({ tokens: tokens(from, n) }, { dryRun: true }).cachedTokens;
  // PUB/SUB slow joiner: publish until the subscription is live
  await until(
    async () => {
      if (cached(0, 8) > 0) return true;
      await pub.publish(batch({ type: 'AllBlocksCleared' }, stored([1n, 2n], null, 0)));
      return false;
    },
    'the subscription to be live',
    { intervalMs: 20 },
  );
  assert.equal(cached(0, 8), 8);
  pub.loseNext(2);
  await pub.publish(batch(stored([3n], 2n, 8))); // lost
  await pub.publish(batch(stored([4n], 3n, 12))); // lost
  await pub.publish(batch(stored([5n], 4n, 16))); // arrives: the gap is replayed
  await until(() => cached(0, 20) === 20, 'the replayed blocks');

  const { endpoint, replayEndpoint } = pub;
  await pub.close();
  await until(() => cached(0, 20) === 0, 'the entries of the vanished publisher dropped');
  const restarted = await new KvEventPublisher({ endpoint, replayEndpoint }).start();
  await restarted.publish(batch(stored([9n], null, 200)));
  await until(() => cached(200, 4) === 4, 'events of the restarted publisher');
  assert.equal(cached(0, 20), 0, 'nothing from before the restart');
  await gateway.close();
  await restarted.close();
});

test("a removed worker's replay still under way applies nothing to a worker added again under its id", async () => {
  const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
  // the replay endpoint: answers at once, except for the lost batch, whose replay delivers one
  // batch, then waits for `gate` before the next one and its end
  const replay = new Router({ linger: 0 });
  await bindEndpoint(replay, 'tcp://127.0.0.1:*');
  let lostSeq = -1n;
  let openGate = () => {};
  const gate = new Promise<void>((resolve) => (openGate = resolve));
  const serving = (async () => {
    for await (const [id, , start] of replay) {
      const from = start.readBigInt64BE();
      if (from === lostSeq) {
        await replay.send([id, '', sequenceFrame(from), encodeEventBatch(batch(stored([1n, 2n], null, 0)))]);
        await gate;
        await replay.send([id, '', sequenceFrame(from + 1n), encodeEventBatch(batch(stored([3n], null, 100)))]);
      }
      await replay.send([id, '', sequenceFrame(-1n), '']);
    }
  })().catch(() => {});
  const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise', speculativeBlocks: 0 });
  const applier = new KvEventApplier(router);
  const connections = new WorkerConnections({
    router,
    applier,
    health: new WorkerHealth(router),
    kvEvents: true,
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    modelsIntervalMs: 0,
    log: () => {},
    env: {},
  });
  const cached = (from: number, n: number) => router.route({ tokens: tokens(from, n) }, { dryRun: true }).cachedTokens;
  try {
    connections.add({ id: 'w0', url: 'http://127.0.0.1:1', events: pub.endpoint, replay: replay.lastEndpoint! });
    const sub = connections.get('w0')!.subscriber!;
    await until(
      async () => {
        if (sub.stats.batches > 0) return true;
        await pub.publish(batch());
        return false;
      },
      'the subscription to be live',
      { intervalMs: 20 },
    );
    pub.loseNext(1);
    lostSeq = await pub.publish(batch()); // lost: the next batch asks for its replay
    await pub.publish(batch());
    await until(() => cached(0, 8) === 8, "the replay's first batch");
    // removed and added again, without events, while the replay waits for its engine
    connections.remove('w0');
    connections.add({ id: 'w0', url: 'http://127.0.0.1:1' });
    applier.apply('w0', batch(stored([9n], null, 300)));
    openGate();
    await connections.close(); // waits for the removed worker's subscriber to end
    assert.equal(cached(0, 8), 0, "the old worker's entries are gone");
    assert.equal(cached(100, 4), 0, "the rest of the old worker's replay applied nothing");
    assert.equal(cached(300, 4), 4, "the new worker's own entries stay");
  } finally {
    openGate();
    await connections.close();
    await pub.close();
    replay.close();
    await serving;
  }
});

/** Payloads: random bytes, random msgpack values, and valid-shaped batches with hostile field values. */
function payloadArbitrary(): fc.Arbitrary<Uint8Array> {
  const u64 = fc.bigInt({ min: 0n, max: 2n ** 64n - 1n });
  const hostileNumber = fc.oneof(
    fc.integer(),
    fc.double(),
    fc.constantFrom(-1, 2 ** 32, 2 ** 53, NaN, Infinity),
    u64.map((b) => b),
  );
  const hash = fc.oneof(
    u64,
    fc.constantFrom(1n, 2n, 3n),
    fc.uint8Array({ minLength: 0, maxLength: 40 }),
    fc.string(),
    fc.constant(null),
  );
  const storedEvent = fc.record(
    {
      type: fc.constantFrom('BlockStored', 'BlockStored', 'BlockRemoved', 'AllBlocksCleared', 'blockstored', ''),
      block_hashes: fc.oneof(fc.array(hash, { maxLength: 4 }), hash),
      parent_block_hash: hash,
      token_ids: fc.oneof(
        fc.array(fc.oneof(fc.nat(1000), hostileNumber), { maxLength: 16 }),
        fc.constant(tokens(0, BS)),
        fc.constant(null),
      ),
      block_size: fc.oneof(fc.constant(BS), hostileNumber),
      medium: fc.oneof(fc.constantFrom('GPU', 'CPU', null), fc.string()),
      lora_name: fc.oneof(fc.constant(null), fc.string({ maxLength: 5 })),
    },
    { requiredKeys: ['type'] },
  );
  const asArray = storedEvent.map((e) => [
    e.type,
    e.block_hashes,
    e.parent_block_hash,
    e.token_ids,
    e.block_size,
    null,
    e.medium,
    e.lora_name,
  ]);
  const batchShape = fc.oneof(
    fc.record(
      {
        ts: fc.oneof(fc.double(), fc.string()),
        events: fc.array(fc.oneof(storedEvent, asArray, fc.anything()), { maxLength: 4 }),
        data_parallel_rank: fc.oneof(fc.constant(null), fc.integer()),
      },
      { requiredKeys: ['events'] },
    ),
    fc.tuple(fc.double(), fc.array(fc.oneof(storedEvent, asArray), { maxLength: 4 })),
  );
  return fc.oneof(
    fc.uint8Array({ maxLength: 64 }),
    fc.anything().map((v) => safeEncode(v)),
    batchShape.map((v) => safeEncode(v)),
  );
}

function safeEncode(v: unknown): Uint8Array {
  try {
    return encode(v, { useBigInt64: true });
  } catch {
    return new Uint8Array([0xc1]); // never used by msgpack: a malformed payload
  }
}

test('10,000 fuzzed event payloads: malformed ones change nothing, the index is what the valid ones make it', async () => {
  const payloads = fc.sample(payloadArbitrary(), { numRuns: 10_000, seed: 14 });
  // interleave valid batches that really store blocks, so there is an index to damage
  for (let i = 0; i < 50; i++)
    payloads.splice(i * 200, 0, encodeEventBatch(batch(stored([BigInt(1000 + i)], null, 1000 * i))));
  // last, a sentinel: ZeroMQ keeps order, so once it is applied every payload before it was handled
  payloads.push(encodeEventBatch(batch(stored([99_999n], null, 500_000))));

  // the reference: only the payloads that decode, applied directly
  const reference = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
  reference.registerWorker('w0');
  const referenceApplier = new KvEventApplier(reference);
  let valid = 0;
  for (const p of payloads) {
    let decoded: KvEventBatch;
    try {
      decoded = decodeEventBatch(p);
    } catch (err) {
      assert.ok(err instanceof KvEventFormatError, `only format errors: ${String(err)}`);
      continue;
    }
    valid++;
    referenceApplier.apply('w0', decoded);
  }
  assert.ok(valid >= 50 && valid < payloads.length, `${valid} valid payloads`);

  // the system: every payload over ZeroMQ into the subscriber
  const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
  const router = new KVAwareRouter({ blockSize: BS, indexMode: 'precise' });
  router.registerWorker('w0');
  const applier = new KvEventApplier(router);
  const sub = new KvEventSubscriber({ workerId: 'w0', endpoint: pub.endpoint, applier }).start();
  // a valid, empty probe until the subscription is live (it changes nothing)
  const probe = encodeEventBatch(batch());
  let seq = 0n;
  const send = async (payload: Uint8Array) => {
    const s = Buffer.alloc(8);
    s.writeBigUInt64BE(seq++);
    await pub.sendRaw(['', s, payload]);
  };
  await until(
    async () => {
      if (sub.stats.batches > 0) return true;
      await send(probe);
      return false;
    },
    'the subscription to be live',
    { intervalMs: 20 },
  );
  for (const p of payloads) await send(p);
  await until(
    () => router.route({ tokens: tokens(500_000, BS) }, { dryRun: true }).cachedTokens === BS,
    'every payload handled (the sentinel applied)',
    { timeoutMs: 30_000 },
  );
  assert.ok(sub.stats.malformed > 1000, `${sub.stats.malformed} malformed payloads counted and skipped`);
  assert.equal(sub.stats.gaps, 0);
  assert.deepEqual(applier.trackedHashes('w0').sort(), referenceApplier.trackedHashes('w0').sort());
  assert.equal(router.index.entryCount, reference.index.entryCount);
  assert.ok(router.index.entryCount > 0);
  for (let i = 0; i < 50; i++) {
    assert.equal(
      router.route({ tokens: tokens(1000 * i, BS) }, { dryRun: true }).cachedTokens,
      reference.route({ tokens: tokens(1000 * i, BS) }, { dryRun: true }).cachedTokens,
    );
  }
  await sub.close();
  await pub.close();
});
