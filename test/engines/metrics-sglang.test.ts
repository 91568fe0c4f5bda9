import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { MAX_ENGINE_REQUESTS } from '../../src/core/worker-registry.js';
import { readEngineLoad, readKvCapacityTokens } from '../../src/engines/metrics/prometheus.js';

// SGLang's scheduler labels (python/sglang/srt/observability/metrics_collector.py,
// SchedulerMetricsCollector.init_new): dp_rank only when the scheduler has one (--dp-size > 1)
const labels = (dp?: string, tp = '0') =>
  `${dp === undefined ? '' : `dp_rank="${dp}",`}engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="${tp}"`;
const rank = (dp: string | undefined, running: number, waiting: number, usage: number, capacity?: number) =>
  [
    `sglang:num_running_reqs{${labels(dp)}} ${running}.0`,
    `sglang:num_queue_reqs{${labels(dp)}} ${waiting}.0`,
    `sglang:token_usage{${labels(dp)}} ${usage}`,
    ...(capacity === undefined ? [] : [`sglang:max_total_num_tokens{${labels(dp)}} ${capacity}.0`]),
  ].join('\n');

/** A page scripts/gen-metrics-fixtures.py rendered with prometheus_client, as the engine renders it. */
const fixture = (name: string): string => readFileSync(new URL(`../fixtures/metrics/${name}`, import.meta.url), 'utf8');

const DP2 = `${rank('0', 1, 0, 0.1, 100000)}\n${rank('1', 30, 40, 0.9, 80000)}\n`;

test("a rank of a data-parallel SGLang worker reads only its dp_rank's series", () => {
  assert.deepEqual(readEngineLoad(DP2, '0'), { running: 1, waiting: 0, kvUsage: 0.1, kvCapacityTokens: 100000 });
  assert.deepEqual(readEngineLoad(DP2, '1'), { running: 30, waiting: 40, kvUsage: 0.9, kvCapacityTokens: 80000 });
  // the worker as one (no rank): the ranks are parts of it, summed (usage averaged)
  const whole = readEngineLoad(DP2);
  assert.equal(whole.running, 31);
  assert.equal(whole.waiting, 40);
  assert.equal(whole.kvCapacityTokens, 180000);
});

test("vLLM's engine label still selects a rank, and a page with neither label is read whole", () => {
  const vllm =
    'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 3\nvllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.4\n';
  assert.equal(readEngineLoad(vllm, '1').running, 3);
  assert.equal(readEngineLoad(vllm, '0').kvUsage, 0.2);
  // single-rank SGLang: no dp_rank at all, or dp_rank="0" only
  assert.deepEqual(readEngineLoad(`${rank(undefined, 4, 2, 0.25, 50000)}\n`), {
    running: 4,
    waiting: 2,
    kvUsage: 0.25,
    kvCapacityTokens: 50000,
  });
  assert.deepEqual(readEngineLoad(`${rank('0', 4, 2, 0.25, 50000)}\n`), {
    running: 4,
    waiting: 2,
    kvUsage: 0.25,
    kvCapacityTokens: 50000,
  });
  assert.equal(readEngineLoad(`${rank('0', 4, 2, 0.25)}\n`, '0').running, 4);
});

test("SGLang's KV capacity is sglang:max_total_num_tokens; every TP rank writes the same one", () => {
  const allSchedulers = [
    `sglang:max_total_num_tokens{${labels('0', '0')}} 100000.0`,
    `sglang:max_total_num_tokens{${labels('0', '1')}} 100000.0`,
    `sglang:max_total_num_tokens{${labels('1', '0')}} 90000.0`,
    `sglang:max_total_num_tokens{${labels('1', '1')}} 90000.0`,
    `sglang:num_running_reqs{${labels('0')}} 0`,
    `sglang:num_running_reqs{${labels('1')}} 0`,
  ].join('\n');
  assert.equal(readKvCapacityTokens(allSchedulers, '0'), 100000);
  assert.equal(readKvCapacityTokens(allSchedulers, '1'), 90000);
  assert.equal(readKvCapacityTokens(allSchedulers), 190000);
  assert.equal(readEngineLoad(allSchedulers, '1').kvCapacityTokens, 90000);
  // before the scheduler's first stats the gauge reads 0 (SchedulerStats' default): no capacity
  assert.equal(
    readEngineLoad(`sglang:max_total_num_tokens{${labels()}} 0\nsglang:num_running_reqs 1\n`).kvCapacityTokens,
    undefined,
  );
  for (const bad of ['NaN', '+Inf', '-5', '1e400'])
    assert.equal(readKvCapacityTokens(`sglang:max_total_num_tokens{${labels()}} ${bad}\n`), undefined, bad);
  // vLLM's cache_config_info is read as before, and wins on a page with both
  assert.equal(
    readKvCapacityTokens(
      `vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1\nsglang:max_total_num_tokens{${labels()}} 5\n`,
    ),
    1600,
  );
});

test("SGLang's requests waiting for their grammar count as waiting beside its waiting queue", () => {
  // sglang:num_grammar_queue_reqs (python/sglang/srt/metrics/collector.py): requests whose
  // constrained-decoding grammar is still compiling, held apart from the waiting queue
  const grammar = (dp: string | undefined, n: number, tp = '0') =>
    `sglang:num_grammar_queue_reqs{${labels(dp, tp)}} ${n}.0`;
  assert.equal(readEngineLoad(`${rank(undefined, 4, 2, 0.25)}\n${grammar(undefined, 3)}\n`).waiting, 5);
  // per data-parallel rank, and the TP ranks of one scheduler as one reading
  const dp2 = [rank('0', 1, 1, 0.1), grammar('0', 2), grammar('0', 2, '1'), rank('1', 1, 0, 0.1), grammar('1', 6)];
  assert.equal(readEngineLoad(`${dp2.join('\n')}\n`, '0').waiting, 3);
  assert.equal(readEngineLoad(`${dp2.join('\n')}\n`, '1').waiting, 6);
  assert.equal(readEngineLoad(`${dp2.join('\n')}\n`).waiting, 9);
  // a grammar count out of range reads as the worst, and is named
  const bad = readEngineLoad(`${rank(undefined, 0, 0, 0)}\n${grammar(undefined, -1)}\n`);
  assert.equal(bad.outOfRange, 'sglang:num_grammar_queue_reqs');
  assert.equal(bad.waiting, MAX_ENGINE_REQUESTS);
});

test("SGLang's disaggregation pages as a prefill and a decode server render them: the queues that wait on the server count as waiting", () => {
  // --disaggregation-mode prefill: bootstrap (prealloc) queue 6, waiting queue 4, inflight 9 whose
  // KV is being sent; the scheduler writes the decode queues too, at 0
  const prefill = fixture('sglang-pd-prefill.txt');
  assert.match(prefill, /^sglang:num_prefill_inflight_queue_reqs\{engine_type="prefill",[^}]*\} 9\.0$/m);
  assert.match(prefill, /^sglang:num_decode_transfer_queue_reqs\{engine_type="prefill",[^}]*\} 0\.0$/m);
  assert.deepEqual(readEngineLoad(prefill), { running: 3, waiting: 6 + 4, kvUsage: 0.25, kvCapacityTokens: 262144 });
  // --disaggregation-mode decode: prealloc queue 5, transfer queue 7, waiting queue 2, 48 running
  const decode = fixture('sglang-pd-decode.txt');
  assert.match(decode, /^sglang:num_prefill_prealloc_queue_reqs\{engine_type="decode",[^}]*\} 0\.0$/m);
  assert.deepEqual(readEngineLoad(decode), {
    running: 48,
    waiting: 5 + 7 + 2,
    kvUsage: 0.75,
    kvCapacityTokens: 524288,
  });
});

test("SGLang's disaggregation queues that wait on the server count as waiting; the prefill inflight queue does not", () => {
  // python/sglang/srt/observability/metrics_collector.py SchedulerMetricsCollector: the
  // scheduler of a prefill server sets the prefill queues, a decode server's the decode ones
  const gauge = (name: string, n: number, dp?: string) => `sglang:${name}{${labels(dp)}} ${n}.0`;
  const prefill = [
    gauge('num_running_reqs', 2),
    gauge('num_queue_reqs', 3),
    gauge('num_prefill_prealloc_queue_reqs', 5),
    gauge('num_prefill_inflight_queue_reqs', 7),
    `sglang:token_usage{${labels()}} 0.5`,
  ].join('\n');
  assert.deepEqual(readEngineLoad(`${prefill}\n`), { running: 2, waiting: 8, kvUsage: 0.5 });
  const decode = [
    gauge('num_running_reqs', 20, '0'),
    gauge('num_queue_reqs', 1, '0'),
    gauge('num_decode_prealloc_queue_reqs', 4, '0'),
    gauge('num_decode_transfer_queue_reqs', 6, '0'),
    gauge('num_queue_reqs', 0, '1'),
    gauge('num_decode_prealloc_queue_reqs', 9, '1'),
  ].join('\n');
  assert.equal(readEngineLoad(`${decode}\n`, '0').waiting, 11);
  assert.equal(readEngineLoad(`${decode}\n`, '1').waiting, 9);
  assert.equal(readEngineLoad(`${decode}\n`).waiting, 20);
  // out of its range, a disaggregation queue is read as the worst, and named
  const bad = readEngineLoad(`${gauge('num_queue_reqs', 0)}\nsglang:num_decode_transfer_queue_reqs{${labels()}} NaN\n`);
  assert.deepEqual([bad.waiting, bad.outOfRange], [MAX_ENGINE_REQUESTS, 'sglang:num_decode_transfer_queue_reqs']);
});

test("SGLang's renamed prefill bootstrap gauge with priority scheduling: its total counts as waiting, not its parts too", () => {
  // release 016d8605, --disaggregation-mode prefill --enable-priority-scheduling: the bootstrap queue
  // is sglang:num_prefill_bootstrap_queue_reqs, and each queue gauge has its total under
  // priority="" beside its parts (bootstrap 6 = 4 + 2, waiting 4 = 1 + 3, inflight 9 not waiting)
  const prefill = fixture('sglang-pd-prefill-priority.txt');
  assert.match(prefill, /^sglang:num_prefill_bootstrap_queue_reqs\{[^}]*priority="",[^}]*\} 6\.0$/m);
  assert.match(prefill, /^sglang:num_prefill_bootstrap_queue_reqs\{[^}]*priority="5",[^}]*\} 2\.0$/m);
  assert.doesNotMatch(prefill, /num_prefill_prealloc_queue_reqs/);
  assert.deepEqual(readEngineLoad(prefill), { running: 3, waiting: 6 + 4, kvUsage: 0.25, kvCapacityTokens: 262144 });
  // a page with both names (a multiprocess directory kept across an upgrade) counts the queue once
  const both = `${prefill}sglang:num_prefill_prealloc_queue_reqs{${labels()}} 5.0\n`;
  assert.equal(readEngineLoad(both).waiting, 6 + 4);
  // out of its range, the bootstrap queue is read as the worst, and named
  const bad = prefill.replace(/(num_prefill_bootstrap_queue_reqs\{[^}]*priority="",[^}]*\}) 6\.0/, '$1 NaN');
  assert.deepEqual(
    [readEngineLoad(bad).waiting, readEngineLoad(bad).outOfRange],
    [MAX_ENGINE_REQUESTS, 'sglang:num_prefill_bootstrap_queue_reqs'],
  );
});
