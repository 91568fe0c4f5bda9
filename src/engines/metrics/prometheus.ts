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
import { MAX_ENGINE_REQUESTS } from '../../core/worker-registry.js';

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
    // Prometheus's NaN and ±Inf are values (and "1e400" is infinite): kept, for the reader to
    // judge; a line whose value is no number at all (Number() would read an empty one as 0) is
    // malformed: skipped
    const value = sampleValue(rest.trim().split(/\s+/)[0]);
    if (value === undefined) continue;
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

/**
 * A sample's value as Prometheus reads it (Go's strconv.ParseFloat: NaN, Inf and Infinity in
 * any case, signed or not, besides decimal numbers), or undefined when it is none.
 */
function sampleValue(sample: string): number | undefined {
  const special = /^([+-]?)(?:(nan)|inf(?:inity)?)$/i.exec(sample);
  if (special) return special[2] !== undefined ? NaN : special[1] === '-' ? -Infinity : Infinity;
  const value = sample === '' ? NaN : Number(sample);
  return Number.isNaN(value) ? undefined : value;
}

/** The samples of the first of `names` the page has, or undefined. */
function firstSeries(series: Map<string, number[]>, names: readonly string[]): number[] | undefined {
  for (const n of names) {
    const v = series.get(n);
    if (v && v.length > 0) return v;
  }
  return undefined;
}

/**
 * A counter's total (prefix-cache queries, hits: shown, never routed on): its finite samples
 * summed; a sum a number cannot hold is no reading.
 */
function counter(series: Map<string, number[]>, names: readonly string[]): number | undefined {
  for (const n of names) {
    const v = series.get(n)?.filter(Number.isFinite);
    if (v && v.length > 0) {
      const sum = v.reduce((a, b) => a + b, 0);
      if (!Number.isFinite(sum)) continue;
      return sum;
    }
  }
  return undefined;
}

/**
 * How far past 0 and 1 a usage may be and still be read as the nearest of them: 1 − free/total
 * in floating point may land a rounding error outside the range, never more.
 */
const USAGE_ROUNDING = 1e-6;

/** The sum of a count's series, the worst when one is out of range; capped. */
function count(series: Map<string, number[]>, names: readonly string[]): number | undefined {
  const v = firstSeries(series, names);
  if (v === undefined) return undefined;
  let sum = 0;
  for (const x of v) {
    // (NaN fails the test too)
    if (!(x >= 0 && x < Infinity)) return MAX_ENGINE_REQUESTS;
    sum += x;
  }
  // a sum past what a number holds (Infinity) is held at the bound as well
  return Math.min(sum, MAX_ENGINE_REQUESTS);
}

/** The mean of the usage series, 1 when one is out of range. */
function usage(series: Map<string, number[]>, names: readonly string[]): number | undefined {
  const v = firstSeries(series, names);
  if (v === undefined) return undefined;
  let sum = 0;
  for (const x of v) {
    if (!(x >= -USAGE_ROUNDING && x <= 1 + USAGE_ROUNDING)) return 1;
    sum += Math.min(1, Math.max(0, x));
  }
  return sum / v.length;
}

/**
 * The engine load in a /metrics page (of one data-parallel rank when `engine` is given);
 * throws MetricsFormatError when none of the names is there.
 *
 * A load sample out of its range (a usage not from 0 to 1 within rounding, a count not a
 * finite number >= 0: NaN, ±Inf, -5) is read as the worst its name can say, usage 1 or
 * MAX_ENGINE_REQUESTS requests, whatever the name's other series say. Skipped or clamped, it
 * would read as an idle engine (usage 0, no queue), the most attractive of all. It is not
 * ignored either (the last good reading kept, the scrape failed): a worker added a moment ago
 * has no good reading, only the registry's idle zeros, which it would keep until enough failed
 * scrapes took it out; and a release whose exporter wrote such values on every engine would
 * take the whole fleet out of rotation, where the worst reading leaves every worker in it (the
 * pressure ceiling leaves out a full worker only while another is below it). Read as the worst,
 * the sample can only move requests away from its engine, and only while the engine says it.
 */
export function readEngineLoad(text: string, engine?: string): EngineLoad {
  const s = parsePrometheusText(text, engine);
  const running = count(s, RUNNING);
  const waiting = count(s, WAITING);
  const kvUsage = usage(s, USAGE);
  if (running === undefined && waiting === undefined && kvUsage === undefined) {
    throw new MetricsFormatError('no vLLM or SGLang load metrics in the page');
  }
  // a name the engine does not export says nothing: read as 0, as before any scrape
  const load: EngineLoad = { running: running ?? 0, waiting: waiting ?? 0, kvUsage: kvUsage ?? 0 };
  const q = counter(s, QUERIES);
  const h = counter(s, HITS);
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
