import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { EngineModel, type EngineRequest } from '../../src/engine-model/engine-model.js';

// A toy engine with round numbers, so timelines can be computed by hand:
// step = 10 ms + 0.1 ms per prefilled token; no attention or decode-read terms.
const TOY = { blockTokens: 100, kvTokens: 10_000, stepBaseMs: 10, prefillMsPerToken: 0.1, attentionMsPerTokenPair: 0, decodeMsPerContextToken: 0 };

function req(id: number, blocks: number[], input: number, output: number): EngineRequest {
  return {
    id,
    keys: Float64Array.from(blocks),
    hashHi: Uint32Array.from(blocks),
    hashLo: Uint32Array.from(blocks),
    inputTokens: input,
    outputTokens: output,
  };
}

/** Runs an engine until idle; returns each request's first-token and finish times. */
function runAlone(engine: EngineModel, start: number) {
  const ttft = new Map<number, number>();
  const done = new Map<number, number>();
  let now = start;
  while (!engine.idle) {
    const s = engine.step(now, Infinity);
    for (const f of s.firstTokens) ttft.set(f.request.id, s.end);
    for (const f of s.finished) done.set(f.id, s.end);
    now = s.end;
  }
  return { ttft, done, now };
}

describe('engine model timelines', () => {
  test('one request: a 1,000-token prefill step, then two decode steps', () => {
    const e = new EngineModel(TOY);
    e.enqueue(req(1, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 1000, 3));
    const { ttft, done } = runAlone(e, 0);
    assert.equal(ttft.get(1), 110); // 10 + 1000 × 0.1
    assert.equal(done.get(1), 130); // + 2 decode steps of 10 ms
    assert.equal(e.prefillTokens, 1000);
  });

  test('two requests sharing a prefix: the second prefills only its new block', () => {
    const e = new EngineModel(TOY);
    e.enqueue(req(1, [1, 2, 3, 4], 400, 1));
    const first = runAlone(e, 0);
    assert.equal(first.ttft.get(1), 50); // 10 + 400 × 0.1
    e.enqueue(req(2, [1, 2, 3, 5], 400, 1));
    const second = runAlone(e, 100);
    assert.equal(second.ttft.get(2), 100 + 20); // 10 + 100 × 0.1
    assert.equal(e.prefillTokens, 500);
  });

  test('a fully cached prompt still computes its last token', () => {
    const e = new EngineModel(TOY);
    e.enqueue(req(1, [1, 2], 200, 1));
    runAlone(e, 0);
    e.enqueue(req(2, [1, 2], 200, 1));
    const r = runAlone(e, 100);
    assert.equal(r.ttft.get(2), 100 + 10.1);
  });

  test('a chunked prefill spreads over steps of the token budget', () => {
    const e = new EngineModel({ ...TOY, maxBatchTokens: 300 });
    e.enqueue(req(1, [1, 2, 3, 4, 5, 6, 7], 700, 1));
    const { ttft } = runAlone(e, 0);
    assert.equal(ttft.get(1), 3 * 10 + 700 * 0.1); // 300 + 300 + 100 tokens
  });

  test('decode steps slow down with the context the batch reads', () => {
    const e = new EngineModel({ ...TOY, decodeMsPerContextToken: 0.01 });
    e.enqueue(req(1, [1], 100, 3));
    const { ttft, done } = runAlone(e, 0);
    assert.equal(ttft.get(1), 20);
    // two decode steps reading 100 then 101 context tokens
    assert.ok(Math.abs(done.get(1)! - (20 + (10 + 1) + (10 + 1.01))) < 1e-9);
  });

  test('eviction at capacity: least recently used unreferenced blocks go, and are reported', () => {
    const removed: number[] = [];
    const stored: number[] = [];
    const e = new EngineModel({ ...TOY, kvTokens: 500 }, (hi) => stored.push(hi), (hi) => removed.push(hi));
    e.enqueue(req(1, [1, 2, 3, 4], 400, 1)); // 4 blocks + 1 for output = capacity
    runAlone(e, 0);
    assert.deepEqual(stored, [1, 2, 3, 4]);
    assert.deepEqual(e.cachedKeys().sort(), [1, 2, 3, 4]);
    e.enqueue(req(2, [6, 7, 8, 9], 400, 1));
    runAlone(e, 100);
    assert.deepEqual(removed, [1, 2, 3, 4]);
    assert.deepEqual(e.cachedKeys().sort(), [6, 7, 8, 9]);
    e.enqueue(req(3, [1, 2, 3, 4], 400, 1));
    runAlone(e, 200);
    assert.equal(e.prefillTokens, 1200, 'the evicted prefix is computed again');
  });

  test('blocks held by a running request are not evicted; the next request waits', () => {
    const e = new EngineModel({ ...TOY, kvTokens: 500 });
    e.enqueue(req(1, [1, 2, 3, 4], 400, 50)); // holds 5 blocks while decoding
    e.enqueue(req(2, [6, 7, 8, 9], 400, 1));
    const s1 = e.step(0, Infinity);
    assert.equal(s1.firstTokens.length, 1);
    assert.equal(e.waitingCount, 1, 'no room until the first request finishes');
    const { ttft } = runAlone(e, s1.end);
    assert.ok(ttft.get(2)! > s1.end + 49 * 10 - 1);
  });

  test('KV usage counts blocks held by running requests, not the evictable cache', () => {
    const e = new EngineModel({ ...TOY, kvTokens: 1000 });
    e.enqueue(req(1, [1, 2, 3, 4], 400, 150));
    e.step(0, Infinity);
    assert.equal(e.kvUsage, 0.6); // 4 prompt + 2 output blocks of 10
    runAlone(e, 100);
    assert.equal(e.kvUsage, 0);
  });
});
