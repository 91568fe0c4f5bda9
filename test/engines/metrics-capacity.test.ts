import assert from 'node:assert/strict';
import { test } from 'node:test';
import { readEngineLoad, readKvCapacityTokens } from '../../src/engines/metrics/prometheus.js';

// the label set vLLM exports for its CacheConfig (vllm/config CacheConfig.metrics_info())
const page = [
  '# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig',
  '# TYPE vllm:cache_config_info gauge',
  'vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="17854",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0',
  'vllm:num_requests_running{model_name="m"} 3.0',
  'vllm:kv_cache_usage_perc{model_name="m"} 0.25',
  '',
].join('\n');

test("the KV capacity is read from vLLM's cache_config_info: num_gpu_blocks × block_size", () => {
  assert.equal(readKvCapacityTokens(page), 17854 * 16);
  assert.equal(readEngineLoad(page).kvCapacityTokens, 17854 * 16);
  // num_gpu_blocks_override="None" must not be taken for num_gpu_blocks
  assert.equal(
    readKvCapacityTokens('vllm:cache_config_info{num_gpu_blocks_override="9",block_size="16",num_gpu_blocks="100"} 1'),
    1600,
  );
});

test('kv_cache_size_tokens (the group-aware capacity) is read before num_gpu_blocks × block_size, when it is a positive number', () => {
  const info = (size: string) =>
    `vllm:cache_config_info{block_size="8",kv_cache_size_tokens="${size}",num_gpu_blocks="320"} 1.0\n`;
  assert.equal(readKvCapacityTokens(info('463459')), 463459);
  assert.equal(readEngineLoad(`${info('463459')}vllm:num_requests_running 1\n`).kvCapacityTokens, 463459);
  // vLLM writes "None" until the KV cache is initialised (and for models without one)
  for (const size of ['None', '0', '-5', '', 'nan', 'inf', '1e400'])
    assert.equal(readKvCapacityTokens(info(size)), 320 * 8, size);
  // a label that only ends in the name is not it
  assert.equal(
    readKvCapacityTokens('vllm:cache_config_info{block_size="8",max_kv_cache_size_tokens="9",num_gpu_blocks="320"} 1'),
    2560,
  );
  assert.equal(
    readKvCapacityTokens('vllm:cache_config_info{kv_cache_size_tokens="1000",num_gpu_blocks="None"} 1'),
    1000,
  );
});

test('no capacity when the gauge is missing or its labels are not counts', () => {
  assert.equal(readKvCapacityTokens('vllm:num_requests_running 1'), undefined);
  assert.equal(readEngineLoad('vllm:num_requests_running 1').kvCapacityTokens, undefined);
  assert.equal(readKvCapacityTokens('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1'), undefined);
  assert.equal(readKvCapacityTokens('vllm:cache_config_info{block_size="16"'), undefined);
});

test("vLLM with data parallelism: num_gpu_blocks is every engine's together, kv_cache_size_tokens one engine's", () => {
  // the API server sums num_gpu_blocks over the engines it manages and keeps kv_cache_size_tokens
  // as the first engine's (vllm/v1/engine/core_client.py MPClient._apply_ready_response), and
  // writes the one CacheConfig once per engine index (loggers.py log_metrics_info)
  const info = (labels: string) =>
    ['0', '1', '2', '3'].map((e) => `vllm:cache_config_info{block_size="16",engine="${e}",${labels}} 1.0\n`).join('');
  const load = 'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_running{engine="1"} 1\n';
  // 4 engines of 1,000 blocks each
  const summed = info('num_gpu_blocks="4000"');
  assert.equal(readKvCapacityTokens(summed, '2'), 16_000, "a rank's own KV cache");
  assert.equal(readEngineLoad(load + summed, '1').kvCapacityTokens, 16_000);
  assert.equal(readKvCapacityTokens(summed), 64_000, 'the worker read whole: every rank');
  assert.equal(readEngineLoad(load + summed).kvCapacityTokens, 64_000);
  const sized = info('kv_cache_size_tokens="16000",num_gpu_blocks="4000"');
  assert.equal(readKvCapacityTokens(sized, '0'), 16_000);
  assert.equal(readKvCapacityTokens(sized), 64_000);
  // one series per API-server process of the same engine (no multiprocess mode): still one engine
  const perProcess =
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000",pid="11"} 1.0\n' +
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000",pid="12"} 1.0\n';
  assert.equal(readKvCapacityTokens(perProcess), 16_000);
  assert.equal(readKvCapacityTokens(perProcess, '0'), 16_000);
});
