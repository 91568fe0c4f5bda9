import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { EngineModel, KeySlotTable, type EngineRequest } from '../../src/engine-model/index.js';

// A toy engine with round numbers, so timelines can be computed by hand: 100-token blocks,
// step = max(10 ms, 0.1 ms per token in the step); no attention or KV-read terms.
const TOY = {
  blockTokens: 100,
  kvTokens: 10_000,
  weightReadMs: 10,
  linearMsPerToken: 0.1,
  attentionMsPerTokenPair: 0,
  kvReadMsPerToken: 0,
};

function req(
  id: number,
  blocks: number[],
  input: number,
  output: number,
  anchors?: EngineRequest['anchors'],
): EngineRequest {
  return {
    id,
    keys: Float64Array.from(blocks),
    hashHi: Uint32Array.from(blocks),
    hashLo: Uint32Array.from(blocks),
    inputTokens: input,
    outputTokens: output,
    anchors,
  };
}

/** Runs an engine until idle; returns each request's first-token, finish and preemption times. */
function runAlone(engine: EngineModel, start: number) {
  const ttft = new Map<number, number>();
  const cached = new Map<number, number>();
  const done = new Map<number, number>();
  const preempted: Array<[number, number]> = [];
  let now = start;
  while (!engine.idle) {
    const s = engine.step(now, Infinity);
    for (const f of s.firstTokens) {
      ttft.set(f.request.id, s.end);
      cached.set(f.request.id, f.cachedTokens);
    }
    for (const f of s.finished) done.set(f.id, s.end);
    for (const p of s.preempted) preempted.push([p.id, now]);
    assert.ok(engine.kvUsage <= 1);
    now = s.end;
  }
  return { ttft, cached, done, preempted, now };
}

const close = (a: number, b: number) => Math.abs(a - b) < 1e-6;

describe('engine model timelines', () => {
  test('one request: a 1,000-token prefill step, then two decode steps', () => {
    const e = new EngineModel(TOY);
    e.enqueue(req(1, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 1000, 3));
    const { ttft, done } = runAlone(e, 0);
    assert.equal(ttft.get(1), 100); // max(10, 1000 × 0.1)
    assert.equal(done.get(1), 120); // + 2 decode steps of max(10, 0.1)
    assert.equal(e.prefillTokens, 1000);
  });

  test('two requests sharing a prefix: the second prefills only its new block', () => {
    const e = new EngineModel(TOY);
    e.enqueue(req(1, [1, 2, 3, 4], 400, 1));
    const first = runAlone(e, 0);
    assert.equal(first.ttft.get(1), 40);
    e.enqueue(req(2, [1, 2, 3, 5], 400, 1));
    const second = runAlone(e, 100);
    assert.equal(second.cached.get(2), 300);
    assert.equal(second.ttft.get(2), 100 + 10); // max(10, 100 × 0.1)
    assert.equal(e.prefillTokens, 500);
  });

  test('two requests sharing a prefix admitted in one step: the blocks the first will compute are cached when it is scheduled, as vLLM', () => {
    // vLLM's allocate_slots caches a step's full blocks when it schedules them: a request
    // admitted after it in the same step finds them and computes only its own block
    const stored: number[] = [];
    const e = new EngineModel(TOY, (hi) => stored.push(hi));
    e.enqueue(req(1, [1, 2, 3, 4], 400, 1));
    e.enqueue(req(2, [1, 2, 3, 5], 400, 1));
    const end = e.startStep(0, Infinity);
    // one step computes 400 + 100 tokens
    assert.equal(end, 50);
    // the shared blocks are announced once, then the second's own full block
    assert.deepEqual(stored, [1, 2, 3, 4, 5]);
    const step = e.finishStep();
    assert.deepEqual(
      step.firstTokens.map((f) => [f.request.id, f.cachedTokens]),
      [
        [1, 0],
        [2, 300],
      ],
    );
    assert.equal(e.prefillTokens, 500);
  });

  test('a fully cached prompt recomputes its whole last block, as vLLM (hit ≤ prompt − 1, whole blocks)', () => {
    const e = new EngineModel(TOY);
    e.enqueue(req(1, [1, 2], 200, 1));
    runAlone(e, 0);
    e.enqueue(req(2, [1, 2], 200, 1));
    const r = runAlone(e, 100);
    assert.equal(r.cached.get(2), 100);
    assert.equal(r.ttft.get(2), 100 + 10);
    assert.equal(e.prefillTokens, 300);
  });

  test('a chunked prefill spreads over steps of the token budget', () => {
    const e = new EngineModel({ ...TOY, maxBatchTokens: 300 });
    e.enqueue(req(1, [1, 2, 3, 4, 5, 6, 7], 700, 1));
    const { ttft } = runAlone(e, 0);
    assert.equal(ttft.get(1), 30 + 30 + 10); // 300 + 300 + 100 tokens
  });

  test('step time: max(weight read, linear compute) plus attention per sequence (roofline)', () => {
    const e = new EngineModel({ ...TOY, attentionMsPerTokenPair: 0.001, kvReadMsPerToken: 0.01 });
    // 100 new tokens from position 0: 5,050 causal pairs (5.05 ms) beat reading 100 tokens (1 ms)
    assert.ok(close(e.stepTime([[100, 0]]), 10 + 5.05));
    // one decode token at context 999: reading 1,000 tokens (10 ms) beats 1,000 pairs (1 ms)
    assert.ok(close(e.stepTime([[1, 999]]), 10 + 10));
    // a large decode batch pays for the linear layers: 200 tokens × 0.1 > 10 ms of weights
    const batch = Array.from({ length: 200 }, () => [1, 0] as const);
    assert.ok(close(new EngineModel(TOY).stepTime(batch), 20));
  });

  test('decode steps slow down with the context the batch reads', () => {
    const e = new EngineModel({ ...TOY, kvReadMsPerToken: 0.01 });
    e.enqueue(req(1, [1], 100, 3));
    const { ttft, done } = runAlone(e, 0);
    assert.ok(close(ttft.get(1)!, 10 + 1)); // read 100 tokens
    // two decode steps reading 101 then 102 tokens
    assert.ok(close(done.get(1)!, 11 + (10 + 1.01) + (10 + 1.02)));
  });

  test('lazy allocation: KV usage counts the tokens computed so far, not the output to come', () => {
    const e = new EngineModel({ ...TOY, kvTokens: 1000 });
    e.enqueue(req(1, [1, 2, 3, 4], 400, 150));
    e.startStep(0, Infinity);
    assert.equal(e.kvUsage, 0.4, "the prefill step holds the prompt's 4 blocks");
    e.finishStep();
    // the first decode step writes position 400: a fifth block
    e.startStep(40, 50);
    assert.equal(e.kvUsage, 0.5);
    e.finishStep();
    runAlone(e, 100);
    assert.equal(e.kvUsage, 0);
  });

  test('a scrape during a step sees its admissions and allocations, not its outputs', () => {
    const e = new EngineModel(TOY);
    e.enqueue(req(1, [1, 2, 3], 300, 1));
    assert.equal(e.waitingCount, 1);
    const end = e.startStep(0, Infinity);
    assert.equal(end, 30);
    assert.equal(e.waitingCount, 0);
    assert.equal(e.runningCount, 1);
    assert.equal(e.kvUsage, 3 / 100);
    const s = e.finishStep();
    assert.deepEqual(
      s.finished.map((r) => r.id),
      [1],
    );
    assert.equal(e.runningCount, 0);
    assert.equal(e.kvUsage, 0);
  });

  test('tail-first free order: a finished prefix loses its last blocks first', () => {
    const removed: number[] = [];
    const stored: number[] = [];
    const e = new EngineModel(
      { ...TOY, kvTokens: 600 },
      (hi) => stored.push(hi),
      (hi) => removed.push(hi),
    );
    e.enqueue(req(1, [1, 2, 3, 4], 400, 1));
    runAlone(e, 0);
    assert.deepEqual(stored, [1, 2, 3, 4]);
    assert.deepEqual(e.cachedKeys().sort(), [1, 2, 3, 4]);
    // free queue now: 2 never-used blocks, then 4, 3, 2, 1 (freed in reverse)
    e.enqueue(req(2, [11, 12, 13, 14], 400, 1));
    runAlone(e, 100);
    assert.deepEqual(removed, [4, 3], 'the tail of the first prefix goes first');
    e.enqueue(req(3, [1, 2, 5], 300, 1));
    const r = runAlone(e, 200);
    assert.equal(r.cached.get(3), 200, 'its head is still cached');
  });

  test('preemption: the newest running request is recomputed when a step cannot get blocks', () => {
    const removed: number[] = [];
    const e = new EngineModel({ ...TOY, kvTokens: 600 }, undefined, (hi) => removed.push(hi));
    e.enqueue(req(1, [1, 2, 3], 300, 250));
    e.enqueue(req(2, [21, 22], 200, 250));
    const { ttft, done, preempted } = runAlone(e, 0);
    // step 1 (0–50 ms): both prefill (500 tokens), 5 of 6 blocks
    assert.equal(ttft.get(1), 50);
    assert.equal(ttft.get(2), 50);
    // step 2 at 50: request 1 takes the last block for position 300; request 2 needs one too
    // and is the newest: preempted, its 2 blocks freed
    assert.deepEqual(preempted, [[2, 50]]);
    // request 1 decodes alone, 10 ms a step, taking request 2's freed blocks as it grows
    // (evicting their cached prefix), and finishes its 250th token at 60 + 248 × 10
    assert.equal(done.get(1), 2540);
    // request 2 then recomputes its prompt and first token (201 tokens, 20.1 ms) and decodes
    // its 248 remaining tokens in one run of 10 ms steps
    assert.ok(close(done.get(2)!, 2540 + 20.1 + 2480));
    // evictions: request 2's prefix (tail first) while request 1 grew; then, as request 2
    // grows to 5 blocks, the tail of request 1's prefix: its head (key 1) stays
    assert.deepEqual(removed, [22, 21, 3, 2]);
    assert.equal(e.prefillTokens, 300 + 200 + 201);
    assert.equal(e.preemptions, 1);
  });

  test('cutRun ends a run of decode steps with the step under way, where a run of that many steps ends', () => {
    const e = new EngineModel(TOY);
    e.enqueue(req(1, [1, 2, 3], 300, 100));
    // the prefill step (0–30 ms) is a single step: nothing to cut
    assert.equal(e.startStep(0, Infinity), 30);
    assert.equal(e.cutRun(5), 30);
    e.finishStep();
    // 99 decode steps of 10 ms in one run; something reaches the engine at 45 ms: the run ends at 50
    assert.equal(e.startStep(30, Infinity), 1020);
    assert.equal(e.cutRun(45), 50);
    assert.equal(e.cutRun(45), 50, 'cut once, the run is a run of 2 steps');
    const s = e.finishStep();
    assert.deepEqual(
      s.decoded.map((d) => d.tokens),
      [2],
    );
    assert.equal(e.busyMs, 50);
    // the rest runs on from there, to the same end as the uncut run
    assert.equal(e.startStep(50, Infinity), 1020);
    assert.equal(e.cutRun(1020), 1020, 'at or past its end: left as it is');
    assert.equal(e.finishStep().finished.length, 1);
    assert.equal(e.busyMs, 1020);
    assert.equal(e.kvUsage, 0);
    assert.throws(() => e.cutRun(0), /no step under way/);
  });

  test("context limit: vLLM's refusals, capped by the KV capacity", () => {
    const e = new EngineModel({ ...TOY, kvTokens: 1000 });
    assert.equal(e.maxModelLen, 1000);
    assert.match(
      e.rejection({ inputTokens: 1000, outputTokens: 1 })!,
      /maximum context length is 1000 tokens\. However, your request has 1000 input tokens/,
    );
    assert.match(
      e.rejection({ inputTokens: 900, outputTokens: 200 })!,
      /'max_tokens' or 'max_completion_tokens' is too large: 200/,
    );
    assert.equal(e.rejection({ inputTokens: 900, outputTokens: 100 }), null);
    assert.throws(() => e.enqueue(req(1, [], 1000, 1)), RangeError);
    assert.equal(new EngineModel({ ...TOY, maxModelLen: 500 }).maxModelLen, 500);
  });

  test('content anchors: reused passages cost their blend-recompute share', () => {
    const e = new EngineModel(TOY);
    const passage = { tokens: 200, keys: Float64Array.from([101, 102]) };
    e.enqueue(req(1, [1, 2], 500, 1, [passage]));
    const first = runAlone(e, 0);
    assert.equal(first.cached.get(1), 0);
    assert.equal(first.ttft.get(1), 50);
    e.enqueue(req(2, [3, 4], 500, 1, [passage]));
    const second = runAlone(e, 100);
    // 200 passage tokens reused, 15% (30) recomputed: 170 cached, 330 computed
    assert.equal(second.cached.get(2), 170);
    assert.ok(close(second.ttft.get(2)!, 100 + 33));
  });

  test('content-anchor blocks share the LRU with prefix blocks', () => {
    const e = new EngineModel({ ...TOY, kvTokens: 600 });
    const passage = { tokens: 200, keys: Float64Array.from([101, 102]) };
    e.enqueue(req(1, [1, 2], 500, 1, [passage]));
    runAlone(e, 0);
    assert.ok(e.holds(101) && e.holds(102));
    // a request of 6 fresh blocks needs the whole pool: the passage goes like any block
    e.enqueue(req(2, [7, 8, 9, 10, 11], 550, 1));
    runAlone(e, 100);
    assert.ok(!e.holds(101) && !e.holds(102));
  });
});

test('the key → slot table agrees with a Map under random inserts and deletes', () => {
  const table = new KeySlotTable(500);
  const map = new Map<number, number>();
  let seed = 12345;
  const rand = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 4294967296;
  for (let op = 0; op < 20_000; op++) {
    // few distinct keys (many collisions), 53-bit values
    const key = Math.floor(rand() * 700) * 2 ** 40 + Math.floor(rand() * 3);
    if (map.has(key) || map.size >= 500) {
      const victim = map.has(key) ? key : [...map.keys()][Math.floor(rand() * map.size)];
      map.delete(victim);
      table.delete(victim);
    } else {
      map.set(key, op);
      table.set(key, op);
    }
    if (op % 1000 === 0) for (const [k, v] of map) assert.equal(table.get(k), v);
  }
  assert.equal(table.size, map.size);
  assert.deepEqual(new Map(table.entries()), map);
  assert.equal(table.get(-5), -1);
});

test('a key → slot table larger than a 31-bit shift can address is refused, not sized forever', () => {
  // 2^30 keys want 2^31 entries: `1 << 31` is negative, and sizing the table never ended
  assert.throws(
    () => new KeySlotTable(2 ** 30),
    /capacity must be an integer from 0 to 536870912 keys, got 1073741824/,
  );
  assert.throws(() => new KeySlotTable(1.5), RangeError);
  assert.throws(() => new KeySlotTable(-1), RangeError);
  // and an engine whose KV holds that many blocks says so
  assert.throws(
    () => new EngineModel({ blockTokens: 1, kvTokens: 2 ** 30 }, () => {}),
    /capacity must be an integer from 0 to 536870912 keys/,
  );
});
