import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ENGINE_ARRIVAL_MS } from '../../src/core/router/in-flight.js';
import { KVAwareRouter, type KVAwareRouterOptions, type WorkerState } from '../../src/index.js';

// A request whose answer is not streamed arrives whole, so nobody reports its first token:
// the router reads the end of its prefill off the engine (its KV events, its waiting queue).

const BS = 16;
function fleet(n: number, opts: KVAwareRouterOptions = {}): { r: KVAwareRouter; clock: { now: number } } {
  const clock = { now: 1000 };
  const r = new KVAwareRouter({ blockSize: BS, indexMode: 'precise', clock: () => clock.now, ...opts });
  for (let i = 0; i < n; i++) r.registerWorker(`w${i}`);
  return { r, clock };
}
function prompt(family: number, blocks: number, tail: number[] = []): number[] {
  const t: number[] = [];
  for (let i = 0; i < blocks * BS; i++) t.push((family * 1_000_003 + i * 7) % 150_000);
  return [...t, ...tail];
}
function worker(r: KVAwareRouter, id: string): WorkerState {
  return r.listWorkers().find((w) => w.id === id)!;
}
/** The engine's KV event storing blocks [from, to) of `tokens`. */
function stored(r: KVAwareRouter, id: string, tokens: number[], from: number, to: number): void {
  const keys = r.hashTokens(tokens);
  keys.hi = keys.hi.slice(from, to);
  keys.lo = keys.lo.slice(from, to);
  keys.length = to - from;
  r.applyStored(id, keys);
}

describe('a first token nobody reports', () => {
  test('a new prompt: its prefill ends with the KV event storing its last full block', () => {
    const { r } = fleet(1);
    const tokens = prompt(1, 8, [1, 2, 3]); // 8 full blocks and a partial one
    const d = r.route({ tokens }, { firstTokenReported: false });
    const w = worker(r, 'w0');
    assert.equal(w.queuedPrefillTokens, 8 * BS + 3);
    // the first chunks: still in prefill
    stored(r, 'w0', tokens, 0, 7);
    assert.equal(w.queuedPrefillTokens, 8 * BS + 3);
    assert.equal(w.activeDecodeTokens, 0);
    // the last full block: done, and decoding with its whole prompt
    stored(r, 'w0', tokens, 7, 8);
    assert.equal(w.queuedPrefillTokens, 0);
    assert.equal(w.activeDecodeTokens, 8 * BS + 3);
    // the whole answer, when it comes, changes nothing more; release frees it
    r.markPrefillDone(d.ticket);
    assert.equal(w.activeDecodeTokens, 8 * BS + 3);
    r.release(d.ticket);
    assert.equal(w.activeDecodeTokens, 0);
    assert.equal(w.inFlightRequests, 0);
  });

  test('the block stored on another worker, or another block, ends nothing', () => {
    const { r } = fleet(2);
    const tokens = prompt(2, 4);
    const d = r.route({ tokens }, { firstTokenReported: false });
    const other = d.workerId === 'w0' ? 'w1' : 'w0';
    stored(r, other, tokens, 0, 4);
    stored(r, d.workerId, prompt(3, 4), 0, 4);
    assert.equal(worker(r, d.workerId).queuedPrefillTokens, 4 * BS);
    stored(r, d.workerId, tokens, 3, 4);
    assert.equal(worker(r, d.workerId).queuedPrefillTokens, 0);
  });

  test('a released request no longer awaits its block', () => {
    const { r } = fleet(1);
    const tokens = prompt(4, 4);
    const d = r.route({ tokens }, { firstTokenReported: false });
    r.release(d.ticket);
    const after = r.route({ tokens: prompt(5, 2) });
    stored(r, 'w0', tokens, 0, 4);
    // the later request, reported the usual way, is untouched by the earlier one's block
    assert.equal(worker(r, 'w0').queuedPrefillTokens, 2 * BS);
    assert.equal(worker(r, 'w0').activeDecodeTokens, 0);
    r.release(after.ticket);
  });

  test('a held prompt: its prefill ends when the waiting queue the engine reports has admitted it', () => {
    const { r, clock } = fleet(1);
    const held = prompt(6, 4);
    r.applyStored('w0', r.hashTokens(held));
    const a = r.route({ tokens: [...held, 9, 9] }, { firstTokenReported: false });
    clock.now += 10;
    const b = r.route({ tokens: [...held, 8, 8] }, { firstTokenReported: false });
    const w = worker(r, 'w0');
    assert.equal(w.queuedPrefillTokens, 4);
    // an empty queue read 5 ms after b was routed: b may not have reached the engine yet
    r.updateWorkerMetrics('w0', { waitingRequests: 0, sampledAt: clock.now + 5 });
    assert.equal(w.queuedPrefillTokens, 4);
    clock.now += ENGINE_ARRIVAL_MS;
    // both still waiting
    r.updateWorkerMetrics('w0', { waitingRequests: 2 });
    assert.equal(w.queuedPrefillTokens, 4);
    // one admitted: the older one (first come, first served)
    r.updateWorkerMetrics('w0', { waitingRequests: 1 });
    assert.equal(w.queuedPrefillTokens, 2);
    assert.equal(w.activeDecodeTokens, 4 * BS + 2);
    r.release(a.ticket);
    // a reading taken before b could reach the engine says nothing about b
    r.updateWorkerMetrics('w0', { waitingRequests: 0, sampledAt: clock.now - 1 });
    assert.equal(w.queuedPrefillTokens, 2);
    r.updateWorkerMetrics('w0', { waitingRequests: 0, sampledAt: clock.now });
    assert.equal(w.queuedPrefillTokens, 0);
    r.release(b.ticket);
    assert.equal(w.inFlightRequests, 0);
  });

  test('a new prompt is not taken as done at admission: it may take many chunks', () => {
    const { r } = fleet(1);
    const tokens = prompt(7, 8);
    r.route({ tokens }, { firstTokenReported: false });
    r.updateWorkerMetrics('w0', { waitingRequests: 0 });
    assert.equal(worker(r, 'w0').queuedPrefillTokens, 8 * BS);
  });

  test('requests whose first token is reported are left to markPrefillDone', () => {
    const { r } = fleet(1);
    const held = prompt(8, 4);
    r.applyStored('w0', r.hashTokens(held));
    const tokens = prompt(9, 4);
    r.route({ tokens });
    r.route({ tokens: [...held, 1] });
    r.updateWorkerMetrics('w0', { waitingRequests: 0 });
    stored(r, 'w0', tokens, 0, 4);
    assert.equal(worker(r, 'w0').queuedPrefillTokens, 4 * BS + 1);
  });

  test('approximate mode has no engine events to read: the whole answer ends the prefill', () => {
    const { r } = fleet(1, { indexMode: 'approximate' });
    const d = r.route({ tokens: prompt(10, 4) }, { firstTokenReported: false });
    r.updateWorkerMetrics('w0', { waitingRequests: 0 });
    r.applyStored('w0', r.hashTokens(prompt(10, 4)));
    assert.equal(worker(r, 'w0').queuedPrefillTokens, 4 * BS);
    r.markPrefillDone(d.ticket);
    assert.equal(worker(r, 'w0').queuedPrefillTokens, 0);
  });

  test('the cost policy forgets the queued attention of a prefill read off the engine', () => {
    const { r } = fleet(2, { policy: 'cost' });
    const long = prompt(11, 64);
    const d = r.route({ tokens: long }, { firstTokenReported: false });
    const terms = () =>
      r.route({ tokens: prompt(12, 2) }, { dryRun: true, explain: true }).explain!.find((e) => e.worker === d.workerId)!
        .terms;
    assert.ok(Number(terms().queuedAttentionTokens) > 0);
    stored(r, d.workerId, long, 0, 64);
    assert.equal(terms().queuedAttentionTokens, 0);
  });

  test('onPrefillRead hears of the prefills the router read off the engine, not of those reported to it', () => {
    const { r } = fleet(1);
    const heard: number[] = [];
    const stop = r.onPrefillRead((ticket) => heard.push(ticket));
    const tokens = prompt(13, 4);
    const read = r.route({ tokens }, { firstTokenReported: false });
    const reported = r.route({ tokens: prompt(14, 4) });
    r.markPrefillDone(reported.ticket);
    stored(r, 'w0', tokens, 0, 4);
    assert.deepEqual(heard, [read.ticket]);
    stop();
    const again = r.route({ tokens: prompt(15, 4) }, { firstTokenReported: false });
    stored(r, 'w0', prompt(15, 4), 0, 4);
    assert.equal(worker(r, 'w0').queuedPrefillTokens, 0, 'still read off the engine');
    assert.deepEqual(heard, [read.ticket], 'but no longer heard');
    assert.ok(again.ticket > 0);
    assert.throws(() => r.onPrefillRead(42 as unknown as (t: number) => void), /listener must be a function/);
  });

  test('a listener that throws keeps no prefill the reading ends from being ended or heard of', () => {
    const { r, clock } = fleet(1);
    const tokens = prompt(16, 4);
    const a = r.route({ tokens }, { firstTokenReported: false });
    const b = r.route({ tokens }, { firstTokenReported: false });
    const w = worker(r, 'w0');
    assert.equal(w.queuedPrefillTokens, 2 * 4 * BS);
    const failure = new Error('listener');
    const first: number[] = [];
    const second: number[] = [];
    r.onPrefillRead((ticket) => {
      first.push(ticket);
      if (first.length === 1) throw failure;
    });
    r.onPrefillRead((ticket) => {
      second.push(ticket);
      throw new Error('later');
    });
    // the one KV event ends both; the first error is thrown once both are ended and heard of
    assert.throws(
      () => stored(r, 'w0', tokens, 0, 4),
      (e) => e === failure,
    );
    assert.equal(w.queuedPrefillTokens, 0);
    assert.equal(w.activeDecodeTokens, 2 * 4 * BS);
    assert.deepEqual(first, [a.ticket, b.ticket]);
    assert.deepEqual(second, [a.ticket, b.ticket]);
    // the error is not thrown again by a later call
    stored(r, 'w0', tokens, 0, 4);
    assert.deepEqual(first, [a.ticket, b.ticket]);

    // likewise for the waiting queue: every field of the reading is applied before the error
    const held = prompt(17, 4);
    r.applyStored('w0', r.hashTokens(held));
    const c = r.route({ tokens: [...held, 1] }, { firstTokenReported: false });
    const d = r.route({ tokens: [...held, 2] }, { firstTokenReported: false });
    clock.now += ENGINE_ARRIVAL_MS;
    first.length = 0;
    second.length = 0;
    assert.throws(
      () => r.updateWorkerMetrics('w0', { waitingRequests: 0, runningRequests: 3, kvCapacityTokens: 4096 }),
      (e) => e === failure,
    );
    assert.equal(w.queuedPrefillTokens, 0);
    assert.deepEqual(first, [c.ticket, d.ticket]);
    assert.deepEqual(second, [c.ticket, d.ticket]);
    assert.equal(w.runningRequests, 3);
    assert.equal(w.kvCapacityTokens, 4096);
    assert.equal(w.metricsAt, clock.now);
  });

  test('a bad sampledAt is refused, naming it', () => {
    const { r } = fleet(1);
    assert.throws(() => r.updateWorkerMetrics('w0', { waitingRequests: 0, sampledAt: -1 }), /sampledAt/);
    assert.throws(() => r.updateWorkerMetrics('w0', { waitingRequests: 0, sampledAt: Number.NaN }), /sampledAt/);
  });
});
