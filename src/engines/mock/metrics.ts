import type { RankCore } from './rank-core.js';

/**
 * A label value as the Prometheus text format writes it: backslash, double quote and line feed
 * escaped (`\\`, `\"`, `\n`), so that a model named with one still makes a readable page.
 */
export function labelValue(value: string): string {
  return value.replace(/[\\"\n]/g, (c) => (c === '\n' ? '\\n' : `\\${c}`));
}

/** /metrics in vLLM's metric names, one series per engine core. */
export function metricsText(model: string, cores: readonly RankCore[]): string {
  const lines: string[] = [];
  const modelLabel = labelValue(model);
  const metric = (name: string, type: string, help: string, value: (c: RankCore) => number) => {
    lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    for (const c of cores)
      lines.push(
        `${name}${type === 'counter' ? '_total' : ''}{model_name="${modelLabel}",engine="${c.rank}"} ${value(c)}`,
      );
  };
  metric(
    'vllm:num_requests_running',
    'gauge',
    'Number of requests in model execution batches.',
    (c) => c.engine.runningCount,
  );
  metric(
    'vllm:num_requests_waiting',
    'gauge',
    'Number of requests waiting to be processed.',
    (c) => c.engine.waitingCount,
  );
  metric('vllm:kv_cache_usage_perc', 'gauge', 'KV-cache usage. 1 means 100 percent usage.', (c) => c.engine.kvUsage);
  metric(
    'vllm:prefix_cache_queries',
    'counter',
    'Prefix cache queries, in terms of number of queried tokens.',
    (c) => c.prefixQueries,
  );
  metric(
    'vllm:prefix_cache_hits',
    'counter',
    'Prefix cache hits, in terms of number of cached tokens.',
    (c) => c.prefixHits,
  );
  lines.push('');
  return lines.join('\n');
}

/** /v1/models as vLLM lists it: the base model, then each adapter with its parent (vLLM's ModelCard). */
export function modelList(
  model: string,
  loraModules: readonly string[],
  created: number,
  maxModelLen: number,
): { object: 'list'; data: unknown[] } {
  const card = (id: string, root: string, parent: string | null) => ({
    id,
    object: 'model',
    created,
    owned_by: 'vllm',
    root,
    parent,
    max_model_len: maxModelLen,
    permission: [],
  });
  return {
    object: 'list',
    data: [card(model, model, null), ...loraModules.map((name) => card(name, `/adapters/${name}`, model))],
  };
}
