/**
 * The mock engine's KV events in the order its engine made them: a step that evicts a cached
 * block and caches it again for a later request (blocks are cached when a step is scheduled, as
 * vLLM's allocate_slots caches them) says so as BlockRemoved, then BlockStored, so a subscriber
 * applying the batch in order ends holding the block, as the engine does.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { EngineRequest } from '../../src/engine-model/index.js';
import type { KvEventBatch } from '../../src/engines/kv-events/decode.js';
import { createRankCore, flushEvents } from '../../src/engines/mock/rank-core.js';
import type { KvEventPublisher } from '../../src/engines/kv-events/publisher.js';

// 100-token blocks, four of them: small enough that one step's admissions evict what another caches
const TOY = {
  blockTokens: 100,
  kvTokens: 400,
  weightReadMs: 10,
  linearMsPerToken: 0.1,
  attentionMsPerTokenPair: 0,
  kvReadMsPerToken: 0,
};

function req(id: number, blocks: number[], input: number): EngineRequest {
  return {
    id,
    keys: Float64Array.from(blocks),
    hashHi: new Uint32Array(blocks.length),
    hashLo: Uint32Array.from(blocks),
    inputTokens: input,
    outputTokens: 1,
  };
}

test('a step that evicts a block and caches it again publishes its removal before its store', () => {
  const core = createRankCore(0, TOY, {});
  const batches: string[][] = [];
  core.publisher = {
    publish: async (batch: KvEventBatch) => {
      batches.push(batch.events.map((e) => ('blockHashes' in e ? `${e.type}[${e.blockHashes.join(',')}]` : e.type)));
    },
  } as unknown as KvEventPublisher;
  // block 10's record, as the mock keeps one for every block a request it holds may compute
  core.blocks.set(10, { hash: 10n, parent: null, tokens: [], lora: null, loraId: null, extraKeys: null });
  core.liveKeys.set(10, 1);
  const engine = core.engine;
  let now = 0;
  const step = () => {
    now = engine.startStep(now, Infinity);
    engine.finishStep();
    flushEvents(core, 100);
  };
  engine.enqueue(req(1, [10], 150)); // caches 10 and finishes: 10 is free and cached
  step();
  engine.enqueue(req(2, [], 150)); // two blocks of its own
  step();
  engine.enqueue(req(3, [], 150)); // takes the free blocks, block 10's among them: evicts it
  engine.enqueue(req(4, [10], 150)); // computes 10 again in the same step
  step();
  assert.ok(engine.holds(10));
  assert.deepEqual(batches, [['BlockStored[10]'], ['BlockRemoved[10]', 'BlockStored[10]']]);
});
