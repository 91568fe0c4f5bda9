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
