/**
 * Reads an engine's load from its Prometheus text (/metrics). Names are the current ones of
 * vLLM (vllm/v1/metrics/loggers.py) and SGLang (python/sglang/srt/metrics/collector.py,
 * served with --enable-metrics), each followed by the deprecated name it replaced, read only
 * when the current one is absent: requests running and waiting, KV-cache usage as a 0-1
 * fraction (vllm:kv_cache_usage_perc, formerly vllm:gpu_cache_usage_perc; SGLang:
 * token_usage), prefix-cache queries and hits (vllm:prefix_cache_*, formerly
 * vllm:gpu_prefix_cache_*). Series with labels (model_name, engine) are summed per name,
 * except usage, which is averaged.
 */
export interface EngineLoad {
  running: number;
  waiting: number;
  kvUsage: number;
  /** Prefix-cache queries and hits (vLLM counters), when exported. */
  prefixCacheQueries?: number;
  prefixCacheHits?: number;
  /** KV-cache capacity in tokens: vLLM's cache_config_info num_gpu_blocks × block_size. */
  kvCapacityTokens?: number;
}

const RUNNING = ['vllm:num_requests_running', 'sglang:num_running_reqs'];
const WAITING = ['vllm:num_requests_waiting', 'sglang:num_queue_reqs'];
const USAGE = ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc', 'sglang:token_usage'];
const QUERIES = [
  'vllm:prefix_cache_queries_total',
  'vllm:prefix_cache_queries',
  'vllm:gpu_prefix_cache_queries_total',
  'vllm:gpu_prefix_cache_queries',
];
const HITS = [
  'vllm:prefix_cache_hits_total',
  'vllm:prefix_cache_hits',
  'vllm:gpu_prefix_cache_hits_total',
  'vllm:gpu_prefix_cache_hits',
];

export class MetricsFormatError extends Error {}

/**
 * Parses exposition text into name → values (comments and malformed lines skipped). With
 * `engine`, series labelled with another `engine` are left out: vLLM with data-parallel
 * ranks exports one series per rank (engine="r") on its one /metrics page.
 */
export function parsePrometheusText(text: string, engine?: string): Map<string, number[]> {
  const series = new Map<string, number[]>();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    // name{labels} value [timestamp]; label values may contain spaces inside quotes
    let nameEnd = 0;
    while (nameEnd < line.length && /[a-zA-Z0-9_:]/.test(line[nameEnd])) nameEnd++;
    const name = line.slice(0, nameEnd);
    if (!name) continue;
    let rest = line.slice(nameEnd);
    if (rest.startsWith('{')) {
      const close = findLabelsEnd(rest);
      if (close < 0) continue;
      if (engine !== undefined) {
        const m = /(?:^|[{,])\s*engine="([^"]*)"/.exec(rest.slice(0, close + 1));
        if (m && m[1] !== engine) continue;
      }
      rest = rest.slice(close + 1);
    }
    // a sample that is not a finite number (Prometheus's NaN and ±Inf; Number() also reads an
    // empty one as 0, and "Infinity" or "1e400" as infinite) says nothing of the load: skipped,
    // as a malformed line is, rather than failing the scrape or reading as an empty queue
    const sample = rest.trim().split(/\s+/)[0];
    const value = sample === '' ? NaN : Number(sample);
    if (!Number.isFinite(value)) continue;
    const list = series.get(name);
    if (list) list.push(value);
    else series.set(name, [value]);
  }
  return series;
}

function findLabelsEnd(s: string): number {
  let quoted = false;
  for (let i = 1; i < s.length; i++) {
    const c = s[i];
    if (c === '\\') i++;
    else if (c === '"') quoted = !quoted;
    else if (c === '}' && !quoted) return i;
  }
  return -1;
}

function first(series: Map<string, number[]>, names: readonly string[], reduce: 'sum' | 'mean'): number | undefined {
  for (const n of names) {
    const v = series.get(n);
    if (v && v.length > 0) {
      const sum = v.reduce((a, b) => a + b, 0);
      // finite samples whose sum a number cannot hold: no reading of it
      if (!Number.isFinite(sum)) continue;
      return reduce === 'sum' ? sum : sum / v.length;
    }
  }
  return undefined;
}

/**
 * The engine load in a /metrics page (of one data-parallel rank when `engine` is given);
 * throws MetricsFormatError when none of the names is there.
 */
export function readEngineLoad(text: string, engine?: string): EngineLoad {
  const s = parsePrometheusText(text, engine);
  const running = first(s, RUNNING, 'sum');
  const waiting = first(s, WAITING, 'sum');
  const usage = first(s, USAGE, 'mean');
  if (running === undefined && waiting === undefined && usage === undefined) {
    throw new MetricsFormatError('no vLLM or SGLang load metrics in the page');
  }
  const load: EngineLoad = {
    running: Math.max(0, running ?? 0),
    waiting: Math.max(0, waiting ?? 0),
    // some exporters report percent; the contract is a 0-1 fraction
    kvUsage: Math.min(1, Math.max(0, usage !== undefined && usage > 1 ? usage / 100 : (usage ?? 0))),
  };
  const q = first(s, QUERIES, 'sum');
  const h = first(s, HITS, 'sum');
  if (q !== undefined) load.prefixCacheQueries = q;
  if (h !== undefined) load.prefixCacheHits = h;
  const capacity = readKvCapacityTokens(text);
  if (capacity !== undefined) load.kvCapacityTokens = capacity;
  return load;
}

const CACHE_CONFIG_INFO = 'vllm:cache_config_info{';

/**
 * The KV capacity in tokens from vLLM's info gauge, whose labels are the engine's
 * CacheConfig (`vllm:cache_config_info{block_size="16",…,num_gpu_blocks="17854",…} 1.0`);
 * undefined when the page has none or its labels are not positive integers.
 */
export function readKvCapacityTokens(text: string): number | undefined {
  const at = text.indexOf(CACHE_CONFIG_INFO);
  if (at < 0) return undefined;
  const end = findLabelsEnd(text.slice(at + CACHE_CONFIG_INFO.length - 1, at + CACHE_CONFIG_INFO.length + 4096));
  if (end < 0) return undefined;
  const labels = text.slice(at + CACHE_CONFIG_INFO.length, at + CACHE_CONFIG_INFO.length - 1 + end);
  const label = (name: string): number => {
    const m = new RegExp(`(?:^|,)\\s*${name}="(\\d+)"`).exec(labels);
    return m ? Number(m[1]) : NaN;
  };
  const tokens = label('num_gpu_blocks') * label('block_size');
  return Number.isSafeInteger(tokens) && tokens > 0 ? tokens : undefined;
}
