/**
 * The progress an engine's /metrics shows (EngineLoad.progress) and the stall rule read from it
 * (StallWatch): a worker is stalled when the gateway has requests on it, the engine reports
 * requests running or waiting, and nothing moved for the stall timeout.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { WorkerHealth } from '../../src/engines/health.js';
import { readEngineLoad } from '../../src/engines/metrics/prometheus.js';
import { StallWatch } from '../../src/engines/metrics/stall.js';
import { KVAwareRouter } from '../../src/index.js';

const vllmPage = (tokens: number, running = 1, usage = 0.5, engine = '0') =>
  [
    `vllm:num_requests_running{engine="${engine}",model_name="m"} ${running}.0`,
    `vllm:num_requests_waiting{engine="${engine}",model_name="m"} 0.0`,
    `vllm:kv_cache_usage_perc{engine="${engine}",model_name="m"} ${usage}`,
    `vllm:generation_tokens_total{engine="${engine}",model_name="m"} ${tokens}.0`,
    `vllm:iteration_tokens_total_count{engine="${engine}",model_name="m"} ${tokens}.0`,
    `vllm:iteration_tokens_total_sum{engine="${engine}",model_name="m"} ${tokens}.0`,
  ].join('\n');

test("a page with vLLM's or SGLang's token counters has progress readings; one without has none", () => {
  const a = readEngineLoad(vllmPage(5));
  const b = readEngineLoad(vllmPage(6));
  assert.ok(a.progress && b.progress);
  assert.notDeepEqual(a.progress, b.progress);
  assert.deepEqual(readEngineLoad(vllmPage(5)).progress, a.progress);
  // a chunk of a prefill moves no token counter in vLLM, but its blocks move the KV usage
  assert.notDeepEqual(readEngineLoad(vllmPage(5, 1, 0.6)).progress, a.progress);
  assert.equal(readEngineLoad('vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n').progress, undefined);
  // SGLang's realtime tokens, one series per mode, summed: any mode moving is progress
  const sglang = (prefill: number, decode: number) =>
    readEngineLoad(
      [
        'sglang:num_running_reqs{model_name="m",tp_rank="0"} 1.0',
        'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 0.0',
        `sglang:realtime_tokens_total{mode="prefill_compute",model_name="m",tp_rank="0"} ${prefill}.0`,
        `sglang:realtime_tokens_total{mode="decode",model_name="m",tp_rank="0"} ${decode}.0`,
      ].join('\n'),
    ).progress;
  assert.ok(sglang(8192, 0));
  assert.notDeepEqual(sglang(8192, 0), sglang(16384, 0));
  assert.notDeepEqual(sglang(8192, 0), sglang(8192, 1));
});

test("a data-parallel rank's progress is its own counters'", () => {
  const page = `${vllmPage(5, 1, 0.5, '0')}\n${vllmPage(9, 1, 0.5, '1')}\n`;
  const moved = `${vllmPage(5, 1, 0.5, '0')}\n${vllmPage(10, 1, 0.5, '1')}\n`;
  assert.deepEqual(readEngineLoad(page, '0').progress, readEngineLoad(moved, '0').progress);
  assert.notDeepEqual(readEngineLoad(page, '1').progress, readEngineLoad(moved, '1').progress);
});

function watch(timeoutMs: number) {
  const router = new KVAwareRouter({ policy: 'round-robin' });
  router.registerWorker('w');
  const health = new WorkerHealth(router);
  const logs: string[] = [];
  let inFlight = 0;
  const stall = new StallWatch({ timeoutMs, health, inFlight: () => inFlight, log: (m) => logs.push(m) });
  return {
    stall,
    health,
    logs,
    setInFlight: (n: number) => (inFlight = n),
    count: () => new Map(stall.stallCounts()).get('w'),
  };
}

const still = [5, 7, 1, 0, 0.5];

test('stalled only after the timeout with work on both sides and nothing moving; back when a reading moves', () => {
  const { stall, health, logs, setInFlight, count } = watch(1000);
  setInFlight(1);
  stall.observe('w', still, 1, 0);
  stall.observe('w', still, 1, 999);
  assert.deepEqual(health.reasons('w'), []);
  stall.observe('w', still, 1, 1000);
  assert.deepEqual(health.reasons('w'), ['stall']);
  assert.equal(count(), 1);
  // held out though nothing of the gateway waits there any more (its requests moved away)
  setInFlight(0);
  stall.observe('w', still, 1, 5000);
  assert.deepEqual(health.reasons('w'), ['stall']);
  assert.equal(logs.length, 1, 'logged once');
  assert.match(logs[0], /^w: its engine shows no progress for 1 s/);
  stall.observe('w', [6, 7, 1, 0, 0.5], 1, 5100);
  assert.deepEqual(health.reasons('w'), []);
  assert.equal(count(), 1);
  assert.equal(health.heldOutBySlowProbesOnly('w'), false);
});

test('the quiet is counted only while the gateway has requests there and the engine reports some', () => {
  const { stall, health, setInFlight } = watch(1000);
  // an idle engine moves nothing for long: a request that just arrived is no stall
  stall.observe('w', still, 0, 0);
  stall.observe('w', still, 0, 60_000);
  setInFlight(1);
  stall.observe('w', still, 0, 60_001);
  stall.observe('w', still, 1, 60_002);
  stall.observe('w', still, 1, 60_900);
  assert.deepEqual(health.reasons('w'), []);
  // the engine busy with others' requests, none of the gateway's: not judged
  setInFlight(0);
  stall.observe('w', still, 3, 70_000);
  assert.deepEqual(health.reasons('w'), []);
  setInFlight(1);
  stall.observe('w', still, 3, 70_500);
  stall.observe('w', still, 3, 71_500);
  assert.deepEqual(health.reasons('w'), ['stall']);
});

test('no counters on the page, or a timeout of 0: never stalled', () => {
  const plain = watch(1000);
  plain.setInFlight(1);
  for (const at of [0, 5000, 10_000]) plain.stall.observe('w', undefined, 1, at);
  assert.deepEqual(plain.health.reasons('w'), []);
  const off = watch(0);
  off.setInFlight(1);
  for (const at of [0, 5000, 10_000]) off.stall.observe('w', still, 1, at);
  assert.deepEqual(off.health.reasons('w'), []);
});
