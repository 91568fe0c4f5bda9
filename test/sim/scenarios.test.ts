import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, mock, test } from 'node:test';
import { KVAwareRouter } from '../../src/core/router/index.js';
import { parseWorkerEvent, parseWorkerEvents, RouterFleet } from '../../src/sim/scenarios.js';
import { simulate, type PolicyResult } from '../../src/sim/simulator.js';
import { loadMooncakeTrace, type TraceRequest } from '../../src/sim/trace.js';
import { generateWorkflowTrace } from '../../src/sim/workflows.js';
import { tiers } from '../helpers/prompts.js';
import { CLI } from '../helpers/cli-entry.js';

const head = await loadMooncakeTrace(
  fileURLToPath(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url)),
);
const lastArrival = (head[head.length - 1].timestamp - head[0].timestamp) / 1000;

/** Every request is accounted for exactly once: answered (completed, failed, cancelled after its first token), cancelled before it, or rejected. */
function assertAccounted(r: PolicyResult, total: number): void {
  const answered = r.outcomes.filter(Boolean);
  const cancelledBeforeFirstToken = r.cancelled - answered.filter((o) => o.status === 'cancelled').length;
  assert.equal(answered.length + cancelledBeforeFirstToken + r.rejected, total);
  assert.equal(answered.filter((o) => o.status === 'failed').length, r.failed);
}

/** A fake event loop for RouterFleet: timers run when the clock is advanced past them. */
function loop() {
  let now = 0;
  const timers: Array<{ at: number; run: () => void }> = [];
  return {
    clock: () => now,
    schedule: (at: number, run: () => void) => void timers.push({ at, run }),
    advance(to: number) {
      timers.sort((a, b) => a.at - b.at);
      while (timers.length > 0 && timers[0].at <= to) {
        const t = timers.shift()!;
        now = t.at;
        t.run();
      }
      now = to;
    },
  };
}

const routers = (n: number) =>
  Array.from(
    { length: n },
    (_, i) => new KVAwareRouter({ policy: 'cost', indexMode: 'precise', blockSize: 16, instanceId: `r${i}` }),
  );

describe('scenarios', () => {
  test('--fail: the worker gets nothing after it dies; its requests are retried before their first token, failed after', () => {
    const at = lastArrival / 3;
    const r = simulate(head, { workers: 4, policy: 'cost', scenario: { fail: [{ worker: 1, atMs: at * 1000 }] } });
    assertAccounted(r, head.length);
    assert.ok(r.failed + r.retried > 0, 'the worker had work when it died');
    for (const o of r.outcomes.filter(Boolean)) {
      if (o.worker === 1) assert.ok(o.arrival <= at, `request ${o.request} sent to the dead worker`);
      if (o.status === 'failed') assert.equal(o.worker, 1);
    }
  });

  test('--drain: no new request reaches the drained worker, and nothing it had fails', () => {
    const at = lastArrival / 3;
    const r = simulate(head, { workers: 4, policy: 'dynamo', scenario: { drain: [{ worker: 2, atMs: at * 1000 }] } });
    assertAccounted(r, head.length);
    assert.equal(r.failed + r.retried, 0);
    const afterwards = r.outcomes.filter((o) => o.arrival > at + 1e-9);
    assert.ok(afterwards.length > 100);
    assert.ok(afterwards.every((o) => o.worker !== 2));
    assert.ok(
      r.outcomes.some((o) => o.worker === 2),
      'it worked before the drain',
    );
  });

  test('every worker failed: requests are rejected, counted, and left out of TTFT', () => {
    const fail = [0, 1].map((worker) => ({ worker, atMs: 0 }));
    const r = simulate(head, { workers: 2, policy: 'llmd', scenario: { fail } });
    assert.equal(r.rejected, head.length);
    assert.deepEqual(r.ttft, { mean: 0, p50: 0, p90: 0, p99: 0 });
  });

  test('--event-jitter-ms delays each batch by at most the jitter, per replica', () => {
    const l = loop();
    const fleet = new RouterFleet(routers(2), { eventJitterMs: 100, seed: 3 }, l.schedule, l.clock);
    fleet.registerWorker('w0');
    const hashes = fleet.replicas[0].hashTokens(Array.from({ length: 64 }, (_, k) => k));
    const list: number[] = [];
    for (let i = 0; i < hashes.length; i++) list.push(hashes.hi[i], hashes.lo[i]);
    fleet.deliverEvents('w0', list, []);
    assert.ok(
      fleet.replicas.every((r) => r.index.entriesFor(0) === 0),
      'nothing applied at once',
    );
    l.advance(100);
    assert.ok(
      fleet.replicas.every((r) => r.index.entriesFor(0) === 4),
      'all applied within the jitter',
    );
  });

  test("one step's KV events apply in the engine's order: a block evicted when the step starts and stored again when it ends is held", () => {
    // the engine evicts while it schedules a step (allocation) and stores the blocks the step
    // computed when it ends: a batch's removals come before its stores
    const l = loop();
    const fleet = new RouterFleet(routers(1), {}, l.schedule, l.clock);
    fleet.registerWorker('w0');
    const hashes = fleet.replicas[0].hashTokens(Array.from({ length: 64 }, (_, k) => k));
    const list: number[] = [];
    for (let i = 0; i < hashes.length; i++) list.push(hashes.hi[i], hashes.lo[i]);
    fleet.deliverEvents('w0', list, []);
    assert.equal(fleet.replicas[0].index.entriesFor(0), 4);
    const last = list.slice(-2);
    fleet.deliverEvents('w0', last, last);
    assert.equal(fleet.replicas[0].index.entriesFor(0), 4, 'the block evicted and computed again is held');
  });

  test('--event-loss: a lost batch never reaches the router; the simulation counts it and still completes', () => {
    const l = loop();
    const fleet = new RouterFleet(routers(1), { eventLoss: 1 }, l.schedule, l.clock);
    fleet.registerWorker('w0');
    fleet.deliverEvents('w0', [1, 2, 3, 4], []);
    l.advance(1000);
    assert.equal(fleet.replicas[0].index.entriesFor(0), 0);
    assert.equal(fleet.counts.eventBatchesLost, 1);
    const none = simulate(head, { workers: 4, policy: 'cost' });
    const half = simulate(head, { workers: 4, policy: 'cost', scenario: { eventLoss: 0.5 } });
    assert.equal(none.eventBatchesLost, 0);
    assert.ok(half.eventBatchesLost > 100);
    assertAccounted(half, head.length);
  });

  test('--replicas with --state-lag-ms: a decision reaches the other replicas after the lag, through applySharedDecision and setRemoteLoad', () => {
    const l = loop();
    const fleet = new RouterFleet(routers(3), { stateLagMs: 20 }, l.schedule, l.clock);
    fleet.registerWorker('w0');
    fleet.registerWorker('w1');
    const { replica, result } = fleet.route({
      tokens: Array.from({ length: 64 }, (_, k) => k),
      workflowId: 'wf-1',
      workflowStep: 0,
    });
    assert.equal(replica, 0);
    const other = fleet.replicas[1];
    assert.equal(other.workflowAffinity('wf-1'), undefined, 'not before the lag');
    l.advance(19);
    assert.equal(other.workflowAffinity('wf-1'), undefined);
    l.advance(20);
    assert.equal(other.workflowAffinity('wf-1')?.workerId, result.workerId);
    const w = other.listWorkers().find((x) => x.id === result.workerId)!;
    assert.equal(w.inFlightRequests, 1, "the other replica counts replica 0's request");
    fleet.release(replica, result.ticket, result.shared);
    l.advance(40);
    assert.equal(w.inFlightRequests, 0, 'and forgets it after the release reaches it');
    // the next request goes to the next replica (round-robin in front)
    assert.equal(fleet.route({ tokens: [1, 2, 3] }).replica, 1);
  });

  test("--replicas: a request's first token moves it from queued prefill to decode at the other replicas, after the lag", () => {
    const l = loop();
    const fleet = new RouterFleet(routers(2), { stateLagMs: 20 }, l.schedule, l.clock);
    fleet.registerWorker('w0');
    const { replica, result } = fleet.route({ tokens: Array.from({ length: 64 }, (_, k) => k) });
    l.advance(20);
    const w = fleet.replicas[1].listWorkers()[0];
    const seen = () => [w.inFlightRequests, w.queuedPrefillTokens, w.activeDecodeTokens];
    assert.deepEqual(seen(), [1, 64, 0]);
    l.advance(30);
    fleet.markPrefillDone(replica, result.ticket, result.shared);
    l.advance(49);
    assert.deepEqual(seen(), [1, 64, 0], 'not before the lag');
    l.advance(50);
    assert.deepEqual(seen(), [1, 0, 64]);
    fleet.release(replica, result.ticket, result.shared);
    l.advance(70);
    assert.deepEqual(seen(), [0, 0, 0]);
  });

  test('--replicas: a prefill a replica reads off the engine reaches the others once, after the lag', () => {
    const l = loop();
    const fleet = new RouterFleet(routers(2), { stateLagMs: 20 }, l.schedule, l.clock);
    fleet.registerWorker('w0');
    const tokens = Array.from({ length: 64 }, (_, k) => k);
    const { replica, result } = fleet.route({ tokens }, { firstTokenReported: false });
    l.advance(20);
    const w = fleet.replicas[1].listWorkers()[0];
    const seen = () => [w.inFlightRequests, w.queuedPrefillTokens, w.activeDecodeTokens];
    assert.deepEqual(seen(), [1, 64, 0]);
    // the engine stores the prompt's last block: replica 0 ends the prefill, and tells replica 1
    const keys = fleet.replicas[0].hashTokens(tokens);
    fleet.deliverEvents('w0', [keys.hi[3], keys.lo[3]], []);
    l.advance(39);
    assert.deepEqual(seen(), [1, 64, 0], 'not before the lag');
    l.advance(40);
    assert.deepEqual(seen(), [1, 0, 64]);
    // the whole answer: its first byte tells nobody anything new, its release frees it
    fleet.markPrefillDone(replica, result.ticket, result.shared);
    fleet.release(replica, result.ticket, result.shared);
    l.advance(80);
    assert.deepEqual(seen(), [0, 0, 0]);
  });

  test("--replicas: a refused request's blocks leave the other replicas after the lag, as its decision reached them", () => {
    const l = loop();
    const fleet = new RouterFleet(routers(2), { stateLagMs: 20 }, l.schedule, l.clock);
    fleet.registerWorker('w0');
    const tokens = Array.from({ length: 64 }, (_, k) => k);
    const { replica, result } = fleet.route({ tokens });
    const other = fleet.replicas[1 - replica];
    l.advance(20);
    assert.deepEqual(tiers(other, 'w0', tokens), Array(4).fill('predicted'));
    l.advance(30);
    fleet.markRefused(replica, result.ticket, result.shared);
    fleet.release(replica, result.ticket, result.shared);
    l.advance(49);
    assert.deepEqual(tiers(other, 'w0', tokens), Array(4).fill('predicted'), 'not before the lag');
    l.advance(50);
    assert.deepEqual(tiers(other, 'w0', tokens), Array(4).fill(null));
  });

  test('--replicas in a simulation: every request accounted for, decisions shared', () => {
    const trace = generateWorkflowTrace({ workflows: 30, seed: 5 });
    const r = simulate(trace, { workers: 4, policy: 'cost', scenario: { replicas: 3, stateLagMs: 20 } });
    assertAccounted(r, trace.length);
    assert.equal(r.rejected + r.failed + r.cancelled, 0);
  });

  test('--cancel-rate: cancelled requests leave the engine and the router; the rest complete', () => {
    const r = simulate(head, {
      workers: 2,
      policy: 'cost',
      speed: 4,
      scenario: { cancelRate: 0.3, cancelWithinMs: 2000, seed: 9 },
    });
    assertAccounted(r, head.length);
    assert.ok(r.cancelled > 30 && r.cancelled < 120, `cancelled ${r.cancelled}`);
    assert.ok(r.outcomes.filter((o) => o && o.status === undefined).length >= head.length - r.cancelled);
    // deterministic for a seed
    const again = simulate(head, {
      workers: 2,
      policy: 'cost',
      speed: 4,
      scenario: { cancelRate: 0.3, cancelWithinMs: 2000, seed: 9 },
    });
    assert.equal(again.cancelled, r.cancelled);
  });

  test('--non-streaming-share: whole answers; the router reads their prefill off the engine, as if it saw their first token', () => {
    const mean = (r: PolicyResult) => {
      const t = r.outcomes.filter(Boolean).map((o) => o.ttft);
      return t.reduce((a, b) => a + b, 0) / t.length;
    };
    const streamed = simulate(head, { workers: 8, policy: 'cost' });
    const whole = simulate(head, { workers: 8, policy: 'cost', scenario: { nonStreamingShare: 1 } });
    assertAccounted(whole, head.length);
    // counted as queued prefill until the whole answer instead, it was 2.75 s against 2.02 s
    const off = Math.abs(mean(whole) - mean(streamed)) / mean(streamed);
    assert.ok(off < 0.05, `mean TTFT ${mean(whole)} s with whole answers, ${mean(streamed)} s streamed`);
    // nothing of a whole answer reaches its client before the end: a failed worker's are all retried
    const failed = simulate(head, {
      workers: 3,
      policy: 'cost',
      speed: 4,
      scenario: { nonStreamingShare: 1, fail: [{ worker: 1, atMs: 20_000 }] },
    });
    assertAccounted(failed, head.length);
    assert.equal(failed.failed, 0);
    assert.ok(failed.retried > 0);
    assert.throws(
      () => simulate(head, { workers: 2, policy: 'cost', scenario: { nonStreamingShare: 1.5 } }),
      /nonStreamingShare must be within/,
    );
  });

  test("--closed-loop: a session's next request is sent once its previous one has ended, the others at their times", () => {
    // two sessions of three turns 100 ms apart, answers of 400 tokens (seconds each), and
    // requests of no session between them; the second session's first turn is over every
    // engine's context (refused at once)
    const turn = (index: number, timestamp: number, sessionId?: string, inputLength = 2000): TraceRequest => ({
      index,
      timestamp,
      inputLength,
      outputLength: 400,
      hashIds: Array.from({ length: Math.ceil(inputLength / 16) }, (_, i) => index * 100_000 + i),
      blockSize: 16,
      ...(sessionId === undefined ? {} : { sessionId }),
    });
    const trace = [
      turn(0, 0, 'a'),
      turn(1, 50, undefined),
      turn(2, 100, 'a'),
      turn(3, 120, 'b', 400_000),
      turn(4, 150, undefined),
      turn(5, 200, 'a'),
      turn(6, 220, 'b'),
    ];
    const run = (closedLoop: boolean) =>
      simulate(trace, { workers: 2, policy: 'round-robin', speed: 1, scenario: { closedLoop } });
    const open = run(false);
    const closed = run(true);
    assertAccounted(closed, trace.length);
    assert.equal(closed.rejected, 1);
    const at = (r: PolicyResult, i: number) => r.outcomes.find((o) => o?.request === i)!;
    const end = (r: PolicyResult, i: number) => at(r, i).arrival + at(r, i).e2e;
    // open-loop, session a's turns overlap; closed-loop each waits for the one before it
    assert.ok(at(open, 2).arrival < end(open, 0), 'open loop: the second turn is sent before the first has ended');
    assert.ok(Math.abs(at(closed, 2).arrival - end(closed, 0)) < 1e-6);
    assert.ok(Math.abs(at(closed, 5).arrival - end(closed, 2)) < 1e-6);
    // requests of no session, and a turn whose previous one was refused, go at their times
    assert.equal(at(closed, 1).arrival, 0.05);
    assert.equal(at(closed, 4).arrival, 0.15);
    assert.equal(at(closed, 6).arrival, 0.22);
    // a turn its client cancels ends too: the next one is sent, and every request is accounted for
    const cancelled = simulate(trace, {
      workers: 2,
      policy: 'round-robin',
      speed: 1,
      scenario: { closedLoop: true, cancelRate: 1, cancelWithinMs: 10 },
    });
    assertAccounted(cancelled, trace.length);
    assert.equal(cancelled.cancelled, trace.length - 1);
  });

  test('--worker-kv-tokens: each worker gets its own KV capacity', () => {
    // round-robin assigns the same requests whatever the caches: only worker 0's capacity differs
    const mixed = simulate(head, {
      workers: 2,
      policy: 'round-robin',
      scenario: { workerKvTokens: [16_384, 2_000_000] },
    });
    const large = simulate(head, {
      workers: 2,
      policy: 'round-robin',
      scenario: { workerKvTokens: [2_000_000, 2_000_000] },
    });
    const cachedOn = (r: PolicyResult, w: number) =>
      r.outcomes.filter((o) => o.worker === w).reduce((a, o) => a + o.cachedTokens, 0);
    assert.ok(
      cachedOn(mixed, 0) < 0.8 * cachedOn(large, 0),
      `small ${cachedOn(mixed, 0)} vs large ${cachedOn(large, 0)}`,
    );
    assert.equal(cachedOn(mixed, 1), cachedOn(large, 1));
    assert.throws(
      () => simulate(head, { workers: 2, policy: 'cost', scenario: { workerKvTokens: [1000] } }),
      /workerKvTokens lists 1 workers/,
    );
  });

  test('a request the chosen worker refuses withdraws what its router predicted there, as the gateway does', () => {
    // round-robin ignores capacity: every other request goes to the 1,000-token worker, which refuses it
    const trace = Array.from({ length: 12 }, (_, i) => ({
      index: i,
      timestamp: i * 200,
      inputLength: 1500,
      outputLength: 10,
      hashIds: Array.from({ length: 24 }, (_, k) => k + 1),
      blockSize: 64,
    }));
    const refused = mock.method(KVAwareRouter.prototype, 'markRefused');
    try {
      const r = simulate(trace, { workers: 2, policy: 'round-robin', scenario: { workerKvTokens: [1000, 2_000_000] } });
      assert.equal(r.rejected, 6);
      assert.equal(refused.mock.callCount(), 6, 'one withdrawal per refused request');
      assert.ok(refused.mock.calls.every((c) => typeof c.arguments[0] === 'number' && c.arguments[0] > 0));
    } finally {
      refused.mock.restore();
    }
  });

  test('worker events parse as WORKER@TIME and name the flag when wrong', () => {
    assert.deepEqual(parseWorkerEvent('w3@600s', '--fail', 8), { worker: 3, atMs: 600_000 });
    assert.deepEqual(parseWorkerEvent('2@1.5m', '--fail', 8), { worker: 2, atMs: 90_000 });
    assert.deepEqual(parseWorkerEvent('w0@250ms', '--drain', 8), { worker: 0, atMs: 250 });
    assert.throws(() => parseWorkerEvent('w9@1s', '--fail', 8), /--fail: worker w9 does not exist/);
    assert.throws(() => parseWorkerEvent('w1', '--drain', 8), /--drain: expected WORKER@TIME/);
    assert.deepEqual(parseWorkerEvent('w1@10', '--fail', 8), { worker: 1, atMs: 10_000 }, 'no unit: seconds');
    // no replay lasts longer than 31 days; a time past it would never come (or overflow to Infinity)
    assert.throws(
      () => parseWorkerEvent(`w1@${'9'.repeat(400)}s`, '--fail', 8),
      /--fail: the time must be at most 31 days/,
    );
    assert.throws(() => parseWorkerEvent('w1@2678401s', '--fail', 8), /at most 31 days/);
    assert.deepEqual(parseWorkerEvent('w1@2678400s', '--fail', 8), { worker: 1, atMs: 2_678_400_000 });
    assert.throws(() => parseWorkerEvents(['w1@10s', 'w1@20s'], '--fail', 8), /--fail: worker w1 is named twice/);
    assert.equal(parseWorkerEvents(['w1@10s', 'w2@20s'], '--drain', 8).length, 2);
    assert.throws(
      () =>
        simulate(head, {
          workers: 2,
          policy: 'cost',
          scenario: {
            fail: [
              { worker: 1, atMs: 1 },
              { worker: 1, atMs: 2 },
            ],
          },
        }),
      /fail: worker w1 is named twice/,
    );
    assert.throws(
      () => simulate(head, { workers: 2, policy: 'cost', scenario: { drain: [{ worker: 1, atMs: 1e300 }] } }),
      /drain\.atMs must be at most/,
    );
    assert.throws(
      () => simulate(head, { workers: 2, policy: 'cost', scenario: { eventLoss: 2 } }),
      /eventLoss must be within/,
    );
  });

  test('the CLI takes the scenario flags and rejects bad ones with a message', () => {
    const trace = fileURLToPath(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url));
    const cli = (...args: string[]) =>
      spawnSync(process.execPath, [...CLI, 'simulate', '--trace', trace, '--policies', 'cost', ...args], {
        encoding: 'utf8',
      });
    const ok = cli(
      '--workers',
      '3',
      '--fail',
      'w1@20s',
      '--drain',
      'w2@40s',
      '--event-jitter-ms',
      '20',
      '--event-loss',
      '0.1',
      '--replicas',
      '2',
      '--state-lag-ms',
      '20',
      '--cancel-rate',
      '0.05',
      '--non-streaming-share',
      '0.5',
      '--worker-kv-tokens',
      '100000,200000,300000',
      '--closed-loop',
      '--format',
      'json',
    );
    assert.equal(ok.status, 0, ok.stderr);
    const p = JSON.parse(ok.stdout).policies[0];
    for (const k of ['rejected', 'cancelled', 'failed', 'retried', 'eventBatchesLost'])
      assert.equal(typeof p[k], 'number', k);
    const bad = cli('--workers', '3', '--fail', 'w7@20s');
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /--fail: worker w7 does not exist/);
    const mismatch = cli('--workers', '3', '--worker-kv-tokens', '1,2');
    assert.notEqual(mismatch.status, 0);
    assert.match(mismatch.stderr, /--worker-kv-tokens lists 2 workers/);
    const loss = cli('--event-loss', '1.5');
    assert.notEqual(loss.status, 0);
    assert.match(loss.stderr, /--event-loss must be a number from 0 to 1/);
    const share = cli('--non-streaming-share', '2');
    assert.notEqual(share.status, 0);
    assert.match(share.stderr, /--non-streaming-share must be a number from 0 to 1/);
  });
});
