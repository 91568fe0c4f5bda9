/**
 * Reads an engine's load from its Prometheus text (/metrics). Names are the current ones of
 * vLLM (vllm/v1/metrics/loggers.py) and SGLang (python/sglang/srt/metrics/collector.py,
 * served with --enable-metrics), each followed by the deprecated name it replaced, read only
 * when the current one is absent: requests running and waiting (SGLang's waiting for their
 * grammar included), KV-cache usage as a 0-1
 * fraction (vllm:kv_cache_usage_perc, formerly vllm:gpu_cache_usage_perc; SGLang:
 * token_usage), prefix-cache queries and hits (vllm:prefix_cache_*, formerly
 * vllm:gpu_prefix_cache_*).
 *
 * A name's series are read as the engines mean them (see `quantities`): the data-parallel
 * ranks' (vLLM's `engine`, SGLang's `dp_rank`) are parts of the engine, summed, except usage,
 * which is averaged; a rank's series that differ in any other label (processes, TP ranks, a
 * stale model name) are one reading, their largest. Read for one data-parallel rank, only that rank's series
 * count (`parsePrometheusText`).
 */
import { MAX_ENGINE_REQUESTS } from '../../core/worker-registry.js';

export interface EngineLoad {
  running: number;
  waiting: number;
  kvUsage: number;
  /** Prefix-cache queries and hits (vLLM counters), when exported. */
  prefixCacheQueries?: number;
  prefixCacheHits?: number;
  /**
   * KV-cache capacity in tokens: vLLM's cache_config_info kv_cache_size_tokens (else
   * num_gpu_blocks × block_size, on releases without it), or SGLang's sglang:max_total_num_tokens.
   */
  kvCapacityTokens?: number;
  /**
   * What moves while the engine works (`PROGRESS_COUNTERS`, then the running and waiting counts and
   * the KV usage as read): undefined when the page has none of the counters. Compared between two
   * scrapes only (stall.ts): any change is progress.
   */
  progress?: readonly number[];
  /** The first load metric whose sample was out of its range, read as its worst (see readEngineLoad). */
  outOfRange?: string;
  /**
   * How the engine sleeps, when its page says it does (vLLM's sleep mode, `SLEEP_STATE`):
   * "weights_offloaded" (level 1), "discard_all" (level 2), or "asleep" (its `awake` series at 0
   * with no level set). Undefined when it is awake or the page does not say.
   */
  asleep?: string;
}

const RUNNING = ['vllm:num_requests_running', 'sglang:num_running_reqs'];
const WAITING = ['vllm:num_requests_waiting', 'sglang:num_queue_reqs'];
/**
 * SGLang's requests waiting for their constrained-decoding grammar to compile, held in its
 * grammar queue apart from the waiting queue sglang:num_queue_reqs counts, and moved there once
 * compiled (python/sglang/srt/metrics/collector.py SchedulerMetricsCollector,
 * `sglang:num_grammar_queue_reqs`, "The number of requests in the grammar waiting queue", at
 * sgl-project/sglang 00ae9c15; the scheduler sets it from its grammar queue's length beside
 * `num_queue_reqs` from its waiting queue's). They wait all the same: added to the waiting count.
 */
const GRAMMAR_WAITING = ['sglang:num_grammar_queue_reqs'];
/**
 * SGLang's prefill-decode disaggregation queues that hold requests waiting on the server before
 * its waiting queue, each name followed by the one it replaced, read only when the current one is
 * absent (python/sglang/srt/observability/metrics_collector.py SchedulerMetricsCollector; the
 * scheduler sets them from the queues' lengths beside num_queue_reqs, at sgl-project/sglang
 * c9cbe8f2 in managers/scheduler_components/metrics_reporter.py): on a prefill server its
 * bootstrap queue (disaggregation/prefill.py PrefillBootstrapQueue, "the requests in
 * bootstrapping"), whose requests join the waiting queue once the decode server has taken their KV
 * transfer on, `sglang:num_prefill_bootstrap_queue_reqs` ("The number of requests in the prefill
 * bootstrap queue.", at 016d8605), formerly `sglang:num_prefill_prealloc_queue_reqs` (at
 * 44cedc2b): a page has one or the other, and only the current one is read if it has both; on a
 * decode server `sglang:num_decode_prealloc_queue_reqs`, the requests waiting for this server's
 * KV memory (decode.py DecodePreallocQueue), and `sglang:num_decode_transfer_queue_reqs`, those
 * whose memory is held here while their KV arrives (DecodeTransferQueue), which then join its
 * waiting queue. Each is added to the waiting count, as the grammar queue is. At 016d8605 the four are
 * written as num_queue_reqs is (log_stats, _log_gauge_queue_count): with
 * --enable-priority-scheduling a total under priority="" and each priority's part under
 * priority="<n>", read as `quantities` reads them (the total, not the total and its parts). A
 * prefill server's `sglang:num_prefill_inflight_queue_reqs` is left out: its requests were
 * prefilled and only their KV is still being sent, no work of that server's left to wait for.
 */
const PD_WAITING: readonly (readonly string[])[] = [
  ['sglang:num_prefill_bootstrap_queue_reqs', 'sglang:num_prefill_prealloc_queue_reqs'],
  ['sglang:num_decode_prealloc_queue_reqs'],
  ['sglang:num_decode_transfer_queue_reqs'],
];
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

/**
 * vLLM's sleep mode (vllm-project/vllm#24176): `vllm:engine_sleep_state`, one gauge per
 * `sleep_state` label ("awake", "weights_offloaded", "discard_all") beside the engine's
 * `engine` and `model_name` labels (vllm/v1/metrics/loggers.py PrometheusStatLogger,
 * record_sleep_state: awake 1 and the others 0 while awake; after `POST /sleep?level=N`,
 * awake 0 and weights_offloaded 1 for level 1 or discard_all 1 for level 2, the same on every
 * engine index of the server; at level 0, which only pauses the scheduler, awake 0 alone). While
 * asleep the engine's /health still answers 200 and its load gauges keep what its last step set
 * (no step runs), yet a request sent there waits until `POST /wake_up`. vLLM writes awake 1 on
 * any wake, a partial one (`tags=weights`, the KV cache still asleep) too.
 */
const SLEEP_STATE = 'vllm:engine_sleep_state';
/** The sleep levels, deepest first: the one a page names is the one read. */
const SLEEP_LEVELS = ['discard_all', 'weights_offloaded'] as const;

/**
 * SGLang's KV capacity in tokens: the scheduler's token pool size, a gauge with the scheduler's
 * labels (dp_rank among them) (python/sglang/srt/observability/metrics_collector.py
 * SchedulerMetricsCollector, `sglang:max_total_num_tokens`, "Maximum total number of tokens in
 * the KV cache pool"). Current releases set it once when the scheduler starts (`emit_constants`);
 * older ones wrote it with each stats pass (scheduler_metrics_mixin.py
 * `self.stats.max_total_num_tokens = self.max_total_num_tokens`).
 */
const SGLANG_CAPACITY = ['sglang:max_total_num_tokens'];

/**
 * Counters an engine's own loop moves as it works, read to tell an engine that makes progress from
 * one whose loop hangs while its HTTP server still answers /health and /metrics (stall.ts). None of
 * them moves on every step of every engine, so the running and waiting counts and the KV usage,
 * which both engines set from their scheduler as it steps, count as progress too:
 * - vLLM (v1): `vllm:prompt_tokens_total` grows by a request's whole prompt once its prefill is
 *   complete, not per chunk (vllm/v1/metrics/stats.py IterationStats.update_from_output adds
 *   prompt_len when the first output of a prefilling request arrives; vllm/v1/core/sched/scheduler.py
 *   update_from_output makes no output for a partial prefill), `vllm:generation_tokens_total` with
 *   each token, and `vllm:iteration_tokens_total` (a histogram: its `_count`) once per batch of
 *   outputs: the API server's output handler makes iteration stats only when a step brought outputs
 *   (vllm/v1/engine/async_llm.py output_handler). So during a long chunked prefill with nothing else
 *   running none of them moves; the scheduler stats each step still sends, even without outputs
 *   (scheduler.py update_from_output: "We must return the stats even if there are no request
 *   outputs this step"), set the running and waiting gauges and vllm:kv_cache_usage_perc, which
 *   grows with each chunk's blocks (vllm/v1/metrics/loggers.py PrometheusStatLogger.record).
 *   `vllm:estimated_flops_per_gpu_total` (--enable-mfu-metrics, vllm/v1/metrics/perf.py) comes
 *   with those scheduler stats: it moves on every step.
 * - SGLang: `sglang:prompt_tokens_total` and `sglang:generation_tokens_total` grow when a request
 *   finishes (python/sglang/srt/observability/metrics_collector.py TokenizerMetricsCollector
 *   observe_one_finished_request); `sglang:realtime_tokens_total{mode}` with each prefill batch,
 *   every chunk of a chunked prefill among them (scheduler_metrics_mixin.py log_prefill_stats,
 *   increment_realtime_tokens with the batch's new and cached tokens), which also sets the running,
 *   queue and token-usage gauges (log_stats); decode batches set them every
 *   --decode-log-interval steps (40), and idle only 30 s after its last reading
 *   (scheduler_components/metrics_reporter.py _maybe_log_idle_metrics; scraper.ts isIdle reads
 *   an engine that did nothing between two scrapes as idle). `sglang:forward_execution_seconds_total` and
 *   `sglang:estimated_flops_per_gpu_total` grow with forward passes where the release has them.
 */
const PROGRESS_COUNTERS = [
  'vllm:iteration_tokens_total_count',
  'vllm:prompt_tokens_total',
  'vllm:generation_tokens_total',
  'vllm:estimated_flops_per_gpu_total',
  'sglang:realtime_tokens_total',
  'sglang:prompt_tokens_total',
  'sglang:generation_tokens_total',
  'sglang:forward_execution_seconds_total',
  'sglang:estimated_flops_per_gpu_total',
] as const;

const LOAD_NAMES: ReadonlySet<string> = new Set([
  ...PROGRESS_COUNTERS,
  ...RUNNING,
  ...WAITING,
  ...GRAMMAR_WAITING,
  ...PD_WAITING.flat(),
  ...USAGE,
  ...QUERIES,
  ...HITS,
  ...SGLANG_CAPACITY,
  SLEEP_STATE,
]);

export class MetricsFormatError extends Error {}

/** One sample of a name: its value and its labels (name → value, escapes read). */
export interface Sample {
  value: number;
  labels: ReadonlyMap<string, string>;
}

const NO_LABELS: ReadonlyMap<string, string> = new Map();

/**
 * The labels that name a data-parallel rank's series on an engine's one /metrics page: vLLM's
 * `engine="r"` (vllm/v1/metrics/loggers.py, one series per engine index) and SGLang's
 * `dp_rank="r"` (python/sglang/srt/observability/metrics_collector.py
 * SchedulerMetricsCollector.init_new: `if dp_rank is not None: labels["dp_rank"] = dp_rank`).
 */
const RANK_LABELS = ['engine', 'dp_rank'] as const;

/**
 * The most series of the load names a page may have, all names together: 8,192. An engine
 * writes one per name and data-parallel rank, model and process (hundreds on the largest
 * deployments: 64 ranks behind 8 API servers); a page with more is refused, its scrape failed,
 * as reading every one of them would hold the event loop for as long as the page's author
 * likes (100,000 series in 12 MB, under the page's size bound, took seconds per scrape).
 */
export const MAX_LOAD_SERIES = 8192;

/**
 * Parses exposition text into name → samples (comments and malformed lines skipped: a line
 * whose labels cannot be read as name="value" pairs (`readLabels`) or whose value is no number
 * (`sampleValue`) is malformed), up to its `# EOF` line if it has one (`exposition`). With `engine` (a
 * data-parallel rank), series labelled with another rank (`RANK_LABELS`: vLLM's `engine`,
 * SGLang's `dp_rank`) are left out; a series with neither label is kept. With `names`, only
 * those names are read: the other lines (most of a page: histograms) are passed over before
 * their labels are read.
 *
 * Throws MetricsFormatError for a page no engine writes: one with more than `maxSeries`
 * series (lines) of the names read; one where a label value runs past the end of its line. The
 * text format escapes a newline in a label value as `\n`: a raw one would make the rest of
 * the value read as lines of their own, samples the engine never wrote; every line's quotes
 * are followed, so it is found whatever the name.
 */
export function parsePrometheusText(
  text: string,
  engine?: string,
  names?: ReadonlySet<string>,
  maxSeries = Infinity,
): Map<string, Sample[]> {
  return parseExposition(exposition(text), engine, names, maxSeries);
}

function parseExposition(
  text: string,
  engine: string | undefined,
  names: ReadonlySet<string> | undefined,
  maxSeries: number,
): Map<string, Sample[]> {
  const series = new Map<string, Sample[]>();
  // the names read, by length: a line's name is looked for among those of its length in the
  // page's text, and only a name read is taken out of it (most lines of a page, histograms,
  // are passed over without a string made for them)
  const byLength = names === undefined ? undefined : namesByLength(names);
  let seen = 0;
  let lineNo = 0;
  let end: number;
  for (let start = 0; start < text.length; start = end + 1) {
    end = text.indexOf('\n', start);
    if (end < 0) end = text.length;
    lineNo++;
    // the line without the white space around it
    let from = start;
    let to = end;
    while (from < to && isWhiteSpace(text.charCodeAt(from))) from++;
    while (to > from && isWhiteSpace(text.charCodeAt(to - 1))) to--;
    if (from === to || text.charCodeAt(from) === HASH) continue;
    // name{labels} value [timestamp]; label values may contain spaces inside quotes
    let nameEnd = from;
    while (nameEnd < to && isMetricNameChar(text.charCodeAt(nameEnd))) nameEnd++;
    const open = nameEnd < to && text.charCodeAt(nameEnd) === BRACE_OPEN ? nameEnd : -1;
    const close = open < 0 ? -1 : findLabelsEnd(text, open, to);
    if (close === OPEN_QUOTE) {
      throw new MetricsFormatError(
        `line ${lineNo}: a label value runs past the end of its line (a raw newline; the text format writes \\n)`,
      );
    }
    if (nameEnd === from) continue;
    const name = byLength === undefined ? text.slice(from, nameEnd) : nameAt(text, from, byLength.get(nameEnd - from));
    if (name === undefined) continue;
    if (++seen > maxSeries) {
      throw new MetricsFormatError(
        `more than ${maxSeries} series of the load metrics (${name} among them): more than any engine writes`,
      );
    }
    let labels = NO_LABELS;
    let valueFrom = nameEnd;
    if (open >= 0) {
      // a label set no engine writes (theirs are a few names of tens of characters) is malformed
      if (close < 0 || close - open > MAX_LABELS_CHARS) continue;
      const read = readLabels(text, open + 1, close);
      if (read === undefined) continue;
      labels = read;
      if (engine !== undefined && ofOtherRank(labels, engine)) continue;
      valueFrom = close + 1;
    }
    // Prometheus's NaN and ±Inf are values (and "1e400" is infinite): kept, for the reader to
    // judge; a line whose value is no number as Prometheus reads one is malformed: skipped
    const value = sampleValue(firstWord(text, valueFrom, to));
    if (value === undefined) continue;
    const sample = { value, labels };
    const list = series.get(name);
    if (list) list.push(sample);
    else series.set(name, [sample]);
  }
  return series;
}

/** `names` grouped by their length. */
function namesByLength(names: ReadonlySet<string>): Map<number, string[]> {
  const out = new Map<number, string[]>();
  for (const n of names) {
    const list = out.get(n.length);
    if (list) list.push(n);
    else out.set(n.length, [n]);
  }
  return out;
}

/** The one of `candidates` (names of one length) that `text` has at `from`, or undefined. */
function nameAt(text: string, from: number, candidates: readonly string[] | undefined): string | undefined {
  if (candidates === undefined) return undefined;
  for (const name of candidates) if (text.startsWith(name, from)) return name;
  return undefined;
}

const HASH = 0x23;
const BRACE_OPEN = 0x7b;
const BRACE_CLOSE = 0x7d;

/** The characters String.prototype.trim takes off a line's ends (checked by code, ASCII first). */
function isWhiteSpace(c: number): boolean {
  if (c < 0x80) return c === 0x20 || (c >= 0x09 && c <= 0x0d);
  return /\s/.test(String.fromCharCode(c));
}

/** A character of a metric name as read (the characters read as one before: digits too). */
function isMetricNameChar(c: number): boolean {
  return isLabelNameChar(c, true) || c === 0x3a;
}

const EOF_LINE = '# EOF';

/**
 * The page up to its `# EOF` line, if it has one; all of it otherwise. OpenMetrics ends its
 * exposition with that line, and Prometheus's OpenMetrics parser refuses anything after it
 * ("unexpected data after # EOF": model/textparse/openmetricsparse.go Next, the lexer's
 * `<sComment>"EOF"\n?` in openmetricslex.l, prometheus/prometheus at d15adb9a). Its text-format
 * parser, picked for a text/plain page (model/textparse/interface.go New), reads the line as a
 * comment and goes on (promlex.l). The scraper asks for no format, and prometheus_client, with
 * which vLLM and SGLang serve /metrics, then writes the text format, which has no such line; a
 * page that has one is an OpenMetrics page whatever its Content-Type says, and what follows the
 * line is no part of it.
 */
function exposition(text: string): string {
  for (let at = text.indexOf(EOF_LINE); at >= 0; at = text.indexOf(EOF_LINE, at + 1)) {
    const after = at + EOF_LINE.length;
    const next = text.charCodeAt(after);
    if (
      (at === 0 || text.charCodeAt(at - 1) === 0x0a) &&
      (after === text.length || next === 0x0a || (next === 0x0d && text.charCodeAt(after + 1) === 0x0a))
    )
      return text.slice(0, at);
  }
  return text;
}

/** The longest label set read, in characters (`{...}`): 64 KiB, a thousand times an engine's. */
const MAX_LABELS_CHARS = 64 * 1024;

/**
 * The most labels a series read may have: 64. SGLang's scheduler writes seven (model_name,
 * engine_type, tp_rank, pp_rank, moe_ep_rank, dp_rank, priority), vLLM's gauges two; a page
 * of series of thousands of labels each made millions of them to keep.
 */
const MAX_LABELS = 64;

const BLANK = 0x20;
const TAB = 0x09;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const EQUALS = 0x3d;
const LOWER_N = 0x6e;

/** The index of the first character from `i` (before `to`) that is no space or tab. */
function skipBlanks(s: string, i: number, to: number): number {
  while (i < to) {
    const c = s.charCodeAt(i);
    if (c !== BLANK && c !== TAB) break;
    i++;
  }
  return i;
}

/** Whether `c` may start a label name ([a-zA-Z_]), or with `more`, continue one ([a-zA-Z0-9_]). */
function isLabelNameChar(c: number, more: boolean): boolean {
  return (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || c === 0x5f || (more && c >= 0x30 && c <= 0x39);
}

/**
 * The labels of `s` between its braces (`from` after the `{`, `to` at the `}`), undefined when
 * they are not name="value" pairs or more than MAX_LABELS of them. Read in one pass over the
 * characters, a value with escapes then by JSON.parse, whose escapes `\\`, `\"` and `\n` are the
 * text format's (a pattern with an alternation inside a repetition, and a replace calling back
 * for each escape, took seconds over a page of label sets of tens of thousands of escapes, under
 * MAX_LABELS_CHARS and the page's size bound). Read as Prometheus reads the text format
 * (prometheus/prometheus model/textparse/promlex.l and promparse.go, at d15adb9a): a name is
 * [a-zA-Z_][a-zA-Z0-9_]*, spaces and tabs may stand around each name, `=`, value and comma, a
 * comma may follow the last pair; in a value `\\`, `\"` and `\n` are a backslash, a quote and a
 * newline (its `lvalReplacer`), and a backslash before any other character is kept as written,
 * the two characters both. Unlike Prometheus, which reads `a="1" b="2"` as two labels (its parser
 * notes this may be "an accidental bug"; OpenMetrics refuses it), pairs without a comma between
 * them are malformed.
 */
function readLabels(s: string, from: number, to: number): Map<string, string> | undefined {
  const labels = new Map<string, string>();
  let i = skipBlanks(s, from, to);
  for (let pairs = 1; i < to; pairs++) {
    if (pairs > MAX_LABELS) return undefined;
    const nameStart = i;
    if (!isLabelNameChar(s.charCodeAt(i), false)) return undefined;
    while (++i < to && isLabelNameChar(s.charCodeAt(i), true));
    const name = s.slice(nameStart, i);
    i = skipBlanks(s, i, to);
    if (i >= to || s.charCodeAt(i) !== EQUALS) return undefined;
    i = skipBlanks(s, i + 1, to);
    if (i >= to || s.charCodeAt(i) !== QUOTE) return undefined;
    const quote = i;
    i = valueEnd(s, quote + 1, to);
    if (i < 0) return undefined;
    labels.set(name, labelValue(s, quote + 1, i));
    i = skipBlanks(s, i + 1, to);
    if (i >= to) break;
    if (s.charCodeAt(i) !== COMMA) return undefined;
    i = skipBlanks(s, i + 1, to);
  }
  return labels;
}

/**
 * The index of the quote that ends the label value starting at `i` (after its opening quote),
 * -1 when there is none before `to`.
 */
function valueEnd(s: string, i: number, to: number): number {
  for (; i < to; i++) {
    const c = s.charCodeAt(i);
    if (c === QUOTE) return i;
    if (c === BACKSLASH) i++;
  }
  return -1;
}

/**
 * A label value (`from` to `to`, without its quotes) with its escapes read: its text as written
 * when it has none; read by JSON.parse when its escapes are all the text format's (`\\`, `\"`,
 * `\n`, JSON's too) and it has no control character; else one by one (unescape).
 */
function labelValue(s: string, from: number, to: number): string {
  let escaped = false;
  let json = true;
  for (let i = from; i < to; i++) {
    const c = s.charCodeAt(i);
    if (c === BACKSLASH) {
      escaped = true;
      const next = s.charCodeAt(++i);
      if (next !== BACKSLASH && next !== QUOTE && next !== LOWER_N) json = false;
    } else if (c < 0x20) json = false;
  }
  if (!escaped) return s.slice(from, to);
  return json ? (JSON.parse(s.slice(from - 1, to + 1)) as string) : unescape(s, from, to);
}

/**
 * A label value's text (`from` to `to`, without its quotes) with its escapes read, one by one:
 * for values JSON.parse cannot read as they are (an escape other than `\\`, `\"` and `\n`, which
 * is kept as written, or a control character), which no engine writes.
 */
function unescape(s: string, from: number, to: number): string {
  // character codes, made a string a chunk at a time: appended one escape at a time, a value of
  // tens of thousands of them took milliseconds, a page of such values more than a second
  const codes = new Uint16Array(to - from);
  let n = 0;
  for (let i = from; i < to; i++) {
    let c = s.charCodeAt(i);
    if (c === BACKSLASH) {
      const next = s.charCodeAt(i + 1);
      if (next === BACKSLASH || next === QUOTE || next === LOWER_N) {
        c = next === LOWER_N ? 0x0a : next;
        i++;
      }
    }
    codes[n++] = c;
  }
  let value = '';
  for (let at = 0; at < n; at += UNESCAPE_CHUNK)
    // (apply reads the typed array as it is; spread would go through its iterator)
    value += String.fromCharCode.apply(
      null,
      codes.subarray(at, Math.min(n, at + UNESCAPE_CHUNK)) as unknown as number[],
    );
  return value;
}

/** How many character codes unescape makes a string of at once (spread as arguments). */
const UNESCAPE_CHUNK = 8192;

/** findLabelsEnd's answer for a label set whose last quoted value is still open at the end. */
const OPEN_QUOTE = -2;

/**
 * The index of the `}` closing the label set whose `{` is at `open` in `s`, looked for before
 * `to`: -1 when there is none, OPEN_QUOTE when the text up to `to` ends inside a quoted value.
 */
function findLabelsEnd(s: string, open: number, to: number): number {
  let quoted = false;
  for (let i = open + 1; i < to; i++) {
    const c = s.charCodeAt(i);
    if (c === BACKSLASH) i++;
    else if (c === QUOTE) quoted = !quoted;
    else if (c === BRACE_CLOSE && !quoted) return i;
  }
  return quoted ? OPEN_QUOTE : -1;
}

const PLUS = 0x2b;
const MINUS = 0x2d;
const DOT = 0x2e;

function isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39;
}

/**
 * A sample's value as Prometheus reads it, or undefined when it is none. Prometheus reads it
 * with strconv.ParseFloat after refusing any `p`, `P` or `_` ("Keep to pre-Go 1.13 float
 * formats": model/textparse/promparse.go parseFloat, prometheus/prometheus at d15adb9a), so what
 * it takes is a decimal number (a sign, digits with at most one `.` among them and at least one
 * digit, then an optional `e`/`E`, sign and digits) or ParseFloat's specials: "Inf" and
 * "Infinity", signed or not, and "NaN" unsigned, in any case. Number() takes more: "0x10", "0b1"
 * and "0o7", which ParseFloat refuses (a hexadecimal number without its `p` exponent, no binary or
 * octal at all), and "" as 0; those are no value. A number past the largest double (`1e400`),
 * for which ParseFloat says ErrRange beside ±Inf, is read as that infinity: out of its range, the
 * reader takes it as the worst (readEngineLoad) where refused it would read as no load at all.
 */
function sampleValue(token: string): number | undefined {
  const n = token.length;
  let i = token.charCodeAt(0) === PLUS || token.charCodeAt(0) === MINUS ? 1 : 0;
  let digits = false;
  let dot = false;
  for (; i < n; i++) {
    const c = token.charCodeAt(i);
    if (isDigit(c)) digits = true;
    else if (c === DOT && !dot) dot = true;
    else break;
  }
  if (!digits) return specialValue(token);
  if (i < n && (token.charCodeAt(i) | 0x20) === 0x65) {
    if (++i < n && (token.charCodeAt(i) === PLUS || token.charCodeAt(i) === MINUS)) i++;
    if (!(i < n && isDigit(token.charCodeAt(i)))) return undefined;
    while (i < n && isDigit(token.charCodeAt(i))) i++;
  }
  return i === n ? Number(token) : undefined;
}

/** ParseFloat's specials (strconv/atof.go special): [+-]?(inf|infinity) and nan, in any case. */
function specialValue(token: string): number | undefined {
  if (token.length > 9) return undefined;
  switch (token.toLowerCase()) {
    case 'nan':
      return NaN;
    case 'inf':
    case '+inf':
    case 'infinity':
    case '+infinity':
      return Infinity;
    case '-inf':
    case '-infinity':
      return -Infinity;
    default:
      return undefined;
  }
}

/** The first word of `s` from `i` on, before `to` (after spaces and tabs, up to the next). */
function firstWord(s: string, i: number, to: number): string {
  const from = skipBlanks(s, i, to);
  let end = from;
  while (end < to) {
    const c = s.charCodeAt(end);
    if (c === BLANK || c === TAB) break;
    end++;
  }
  return s.slice(from, end);
}

/** The samples of the first of `names` the page has, or undefined. */
function firstSeries(series: Map<string, Sample[]>, names: readonly string[]): Sample[] | undefined {
  const n = firstSeriesName(series, names);
  return n === undefined ? undefined : series.get(n);
}

/** The first of `names` the page has samples of. */
function firstSeriesName(series: Map<string, Sample[]>, names: readonly string[]): string | undefined {
  for (const n of names) {
    const v = series.get(n);
    if (v && v.length > 0) return n;
  }
  return undefined;
}

/**
 * A name's samples as the quantities they are parts of: one group per data-parallel rank
 * (`RANK_LABELS`: vLLM's `engine`, SGLang's `dp_rank`; the series with neither are a group of
 * their own) and, with `byPriority`, per `priority`. The samples of a group are one quantity,
 * read as their largest (by the caller): series that differ in any other label say the same
 * thing from several places, or one of them is stale:
 * - `pid`: prometheus_client's multiprocess collector labels a gauge's samples with the
 *   process that wrote them when the gauge has no multiprocess_mode (its default, "all").
 *   vLLM's vllm:kv_cache_usage_perc had none until vllm-project/vllm#28792 (2025-11-16;
 *   vllm/v1/metrics/loggers.py PrometheusStatLogger, e.g. at 005a810b, where the running and
 *   waiting gauges and gpu_cache_usage_perc are "mostrecent"): with --api-server-count > 1
 *   each API server exports a series, the one that receives the engine's scheduler stats
 *   holds the value and the others the 0 they initialized it to. The early V1 logger (e.g.
 *   at a6f0308c, one API server) gave no gauge a mode, running and waiting included: any name
 *   can come with pid series when the multiprocess directory is set, so the rule holds for
 *   all. Counters are summed by the collector and carry no pid.
 * - `tp_rank`, `pp_rank`, `moe_ep_rank`: SGLang's scheduler labels
 *   (python/sglang/srt/observability/metrics_collector.py SchedulerMetricsCollector.init_new,
 *   formerly set up in scheduler_metrics_mixin.py). Only attention-TP rank 0 writes them, but
 *   with --enable-metrics-for-all-schedulers every TP rank (and pipeline stage) of a
 *   scheduler writes the same counts; moe_ep_rank is tp_rank // (tp_size // ep_size) at
 *   scheduler launch, so it differs between those ranks too.
 * - `model_name` and any other: a series left by an earlier run (a multiprocess directory kept
 *   across a restart with another `--served-model-name`) holds what that run last wrote, 0 when
 *   it stopped idle. Summed or averaged with the live one, a full engine would read as idle.
 * The process holding the engine's state says it, the others say 0, the same or stale values:
 * the largest is the engine's, read as the worker's most loaded.
 *
 * When some sample has an empty `priority` label, the samples with a non-empty one are left
 * out: SGLang with --enable-priority-scheduling writes the queue and running totals under
 * priority="" and each priority's part under priority="<n>"
 * (metrics_collector.py SchedulerMetricsCollector._log_gauge_queue_count); without a total, the
 * parts are groups of their own (`byPriority`: the counts, summed).
 */
function quantities(samples: readonly Sample[], byPriority = true): number[][] {
  const totals = samples.some((s) => s.labels.get('priority') === '');
  const groups = new Map<string, number[]>();
  for (const s of samples) {
    const priority = s.labels.get('priority') ?? '';
    if (totals && priority !== '') continue;
    // the values joined by a character no key holds (undefined and "" differ: \u0000 for none)
    let id = '';
    for (const k of RANK_LABELS) id += `${s.labels.get(k) ?? '\u0000'}\u0001`;
    if (byPriority) id += priority;
    const group = groups.get(id);
    if (group) group.push(s.value);
    else groups.set(id, [s.value]);
  }
  return [...groups.values()];
}

/**
 * A counter's total (prefix-cache queries, hits: shown, never routed on): the largest finite
 * sample of each quantity, summed; a sum a number cannot hold is no reading.
 */
function counter(series: Map<string, Sample[]>, names: readonly string[]): number | undefined {
  for (const n of names) {
    const v = series.get(n);
    if (!v) continue;
    let sum: number | undefined;
    for (const group of quantities(v)) {
      let most = -Infinity;
      for (const x of group) if (Number.isFinite(x) && x > most) most = x;
      if (most > -Infinity) sum = (sum ?? 0) + most;
    }
    if (sum !== undefined && Number.isFinite(sum)) return sum;
  }
  return undefined;
}

/**
 * How far past 0 and 1 a usage may be and still be read as the nearest of them: 1 − free/total
 * in floating point may land a rounding error outside the range, never more.
 */
const USAGE_ROUNDING = 1e-6;

/** The sum of a count's quantities, the worst when a sample is out of range; capped. */
function count(series: Map<string, Sample[]>, names: readonly string[]): number | undefined {
  const v = firstSeries(series, names);
  if (v === undefined) return undefined;
  let sum = 0;
  for (const group of quantities(v)) {
    let most = 0;
    for (const x of group) {
      // (NaN fails the test too)
      if (!(x >= 0 && x < Infinity)) return MAX_ENGINE_REQUESTS;
      most = Math.max(most, x);
    }
    sum += most;
  }
  // a sum past what a number holds (Infinity) is held at the bound as well
  return Math.min(sum, MAX_ENGINE_REQUESTS);
}

/** The mean of the usage quantities, 1 when a sample is out of range. */
function usage(series: Map<string, Sample[]>, names: readonly string[]): number | undefined {
  const v = firstSeries(series, names);
  if (v === undefined) return undefined;
  // averaged over the ranks only: a stale series (another model_name) at 0 is not half the engine
  const groups = quantities(v, false);
  let sum = 0;
  for (const group of groups) {
    let most = 0;
    for (const x of group) {
      if (!(x >= -USAGE_ROUNDING && x <= 1 + USAGE_ROUNDING)) return 1;
      most = Math.max(most, Math.min(1, Math.max(0, x)));
    }
    sum += most;
  }
  return sum / groups.length;
}

/** The name of `names`' series read, when one of its samples is out of range (`usage`: 0 to 1 within rounding). */
function outOfRangeName(series: Map<string, Sample[]>, names: readonly string[], isUsage: boolean): string | undefined {
  const name = firstSeriesName(series, names);
  if (name === undefined) return undefined;
  for (const group of quantities(series.get(name)!))
    for (const x of group)
      if (isUsage ? !(x >= -USAGE_ROUNDING && x <= 1 + USAGE_ROUNDING) : !(x >= 0 && x < Infinity)) return name;
  return undefined;
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
export function readEngineLoad(page: string, engine?: string): EngineLoad {
  const text = exposition(page);
  const s = parseExposition(text, engine, LOAD_NAMES, MAX_LOAD_SERIES);
  const running = count(s, RUNNING);
  const queued = count(s, WAITING);
  // the queues besides the waiting queue (SGLang's grammar and disaggregation queues), each its own name
  let waiting = queued;
  for (const names of [GRAMMAR_WAITING, ...PD_WAITING]) {
    const more = count(s, names);
    if (more !== undefined) waiting = Math.min((waiting ?? 0) + more, MAX_ENGINE_REQUESTS);
  }
  const kvUsage = usage(s, USAGE);
  if (running === undefined && waiting === undefined && kvUsage === undefined) {
    throw new MetricsFormatError('no vLLM or SGLang load metrics in the page');
  }
  // a name the engine does not export says nothing: read as 0, as before any scrape
  const load: EngineLoad = { running: running ?? 0, waiting: waiting ?? 0, kvUsage: kvUsage ?? 0 };
  // the worst readings, of a sample out of range, named for the reader's log (they are rare)
  const outOfRange =
    running === MAX_ENGINE_REQUESTS
      ? outOfRangeName(s, RUNNING, false)
      : waiting === MAX_ENGINE_REQUESTS
        ? (outOfRangeName(s, WAITING, false) ??
          outOfRangeName(s, GRAMMAR_WAITING, false) ??
          PD_WAITING.map((names) => outOfRangeName(s, names, false)).find((n) => n !== undefined))
        : kvUsage === 1
          ? outOfRangeName(s, USAGE, true)
          : undefined;
  if (outOfRange !== undefined) load.outOfRange = outOfRange;
  const q = counter(s, QUERIES);
  const h = counter(s, HITS);
  if (q !== undefined) load.prefixCacheQueries = q;
  if (h !== undefined) load.prefixCacheHits = h;
  const capacity = vllmKvCapacityTokens(text, engine) ?? sglangKvCapacityTokens(s);
  if (capacity !== undefined) load.kvCapacityTokens = capacity;
  const progress = engineProgress(s, load);
  if (progress !== undefined) load.progress = progress;
  const asleep = sleepState(s);
  if (asleep !== undefined) load.asleep = asleep;
  return load;
}

/**
 * How the engine sleeps by `vllm:engine_sleep_state` (SLEEP_STATE), of the ranks the page was
 * read for; undefined when it does not say it sleeps (awake, or a page without the gauge). Each
 * set of the other labels (`engine`, `model_name`) is one state, whose series vLLM sets together
 * (record_sleep_state): the engine sleeps only when none of them reads `awake` 1 and some says it
 * sleeps; then it is the deepest level a state sets to 1, else "asleep" (`awake` 0, no level).
 * vLLM sets every engine index alike, from the API server that took `POST /sleep` (gauges in
 * "mostrecent" mode: one series per engine index); a state under another `model_name` can only be
 * stale (a multiprocess directory kept across a restart with another `--served-model-name`).
 * States that disagree are read as awake: held in rotation by mistake, a sleeping engine only
 * makes requests wait, as before its page was read at all; held out by mistake, an awake one
 * would stay out for as long as the stale state is there.
 */
function sleepState(series: Map<string, Sample[]>): string | undefined {
  const samples = series.get(SLEEP_STATE);
  if (samples === undefined) return undefined;
  const states = new Map<string, Map<string, number>>();
  for (const x of samples) {
    const which = x.labels.get('sleep_state');
    if (which === undefined) continue;
    const others = [...x.labels].filter(([name]) => name !== 'sleep_state').sort(([a], [b]) => (a < b ? -1 : 1));
    const key = JSON.stringify(others);
    let state = states.get(key);
    if (state === undefined) states.set(key, (state = new Map()));
    state.set(which, x.value);
  }
  const all = [...states.values()];
  if (all.some((state) => state.get('awake') === 1)) return undefined;
  for (const level of SLEEP_LEVELS) if (all.some((state) => state.get(level) === 1)) return level;
  return all.some((state) => state.get('awake') === 0) ? 'asleep' : undefined;
}

/**
 * The progress readings of a page (`EngineLoad.progress`): each of PROGRESS_COUNTERS (NaN when
 * the page lacks it), then the load as read; undefined when the page has none of the counters.
 */
function engineProgress(series: Map<string, Sample[]>, load: EngineLoad): number[] | undefined {
  let found = false;
  const readings: number[] = [];
  for (const name of PROGRESS_COUNTERS) {
    const v = progressTotal(series.get(name));
    if (v !== undefined) found = true;
    readings.push(v ?? NaN);
  }
  if (!found) return undefined;
  readings.push(load.running, load.waiting, load.kvUsage);
  return readings;
}

/**
 * A progress counter's reading: the sum of its finite samples (undefined when it has none).
 * Its series may be parts (SGLang's `sglang:realtime_tokens_total{mode}`) or copies (a TP rank's
 * each): compared between two scrapes only, the sum moves when any of them does.
 */
function progressTotal(samples: readonly Sample[] | undefined): number | undefined {
  let sum: number | undefined;
  for (const x of samples ?? []) if (Number.isFinite(x.value)) sum = (sum ?? 0) + x.value;
  return sum;
}

const CACHE_CONFIG_INFO = 'vllm:cache_config_info{';

/**
 * The KV capacity in tokens in a /metrics page (of one data-parallel rank when `engine` is
 * given): vLLM's cache_config_info, else SGLang's max_total_num_tokens; undefined when the page
 * has neither or they say no positive count.
 */
export function readKvCapacityTokens(page: string, engine?: string): number | undefined {
  const text = exposition(page);
  return (
    vllmKvCapacityTokens(text, engine) ??
    sglangKvCapacityTokens(parseExposition(text, engine, CAPACITY_NAMES, MAX_LOAD_SERIES))
  );
}

const CAPACITY_NAMES: ReadonlySet<string> = new Set(SGLANG_CAPACITY);

/**
 * SGLang's capacity: the largest sample of each quantity (the TP ranks of a scheduler write the
 * same pool size), summed over the dp_rank ranks the page was read for. Undefined when a
 * sample is no finite count or the sum is 0. Current releases set the gauge once at startup
 * (`emit_constants`), so it is never 0 on a serving engine; releases that wrote it with each
 * stats pass read 0 until the scheduler's first one (SchedulerStats.max_total_num_tokens
 * defaulted to 0), taken as no capacity yet.
 */
function sglangKvCapacityTokens(series: Map<string, Sample[]>): number | undefined {
  const v = firstSeries(series, SGLANG_CAPACITY);
  if (v === undefined) return undefined;
  let sum = 0;
  for (const group of quantities(v)) {
    let most = 0;
    for (const x of group) {
      if (!(x >= 0 && Number.isSafeInteger(Math.floor(x)))) return undefined;
      most = Math.max(most, Math.floor(x));
    }
    sum += most;
  }
  return Number.isSafeInteger(sum) && sum > 0 ? sum : undefined;
}

/**
 * The KV capacity in tokens from vLLM's info gauge, whose labels are the engine's
 * CacheConfig (`vllm:cache_config_info{block_size="16",…,num_gpu_blocks="17854",…} 1.0`), of
 * one data-parallel rank when `engine` is given, else of every rank on the page: one engine's
 * `kv_cache_size_tokens` when that is a positive number (releases that have it:
 * vllm/config/cache.py, the capacity counted over the KV cache groups, which
 * num_gpu_blocks × block_size gets wrong for hybrid models whose requests hold blocks in
 * several groups), else num_gpu_blocks × block_size (earlier releases; "None" before the KV
 * cache is set up); undefined when the page has none or its labels are not positive integers.
 *
 * With data parallelism the API server writes its one CacheConfig once per engine index
 * (`engine="r"`; vllm/v1/metrics/loggers.py PrometheusStatLogger.log_metrics_info), where
 * num_gpu_blocks is the sum over the engines it manages ("Sum num_gpu_blocks from all engines
 * in DP case") and kv_cache_size_tokens the first engine's ("Keep these as per-engine
 * cache_config_info values; do not sum across DP"): vllm/v1/engine/core_client.py
 * MPClient._apply_ready_response (at vllm-project/vllm 00080ee1; releases before it summed
 * num_gpu_blocks the same way in vllm/v1/engine/utils.py wait_for_engine_startup). So a rank's capacity is
 * kv_cache_size_tokens, or num_gpu_blocks × block_size over the engine indexes the page names,
 * and the whole page's that times their number, as SGLang's is summed over its ranks.
 */
function vllmKvCapacityTokens(text: string, engine?: string): number | undefined {
  const infos: string[] = [];
  const engines = new Set<string>();
  for (let at = text.startsWith(CACHE_CONFIG_INFO) ? 0 : text.indexOf(`\n${CACHE_CONFIG_INFO}`); at >= 0;) {
    if (text[at] === '\n') at++;
    const from = at + CACHE_CONFIG_INFO.length;
    // looked for on the line only, and at most 4 KiB of it
    let lineEnd = text.indexOf('\n', from);
    if (lineEnd < 0) lineEnd = text.length;
    const end = findLabelsEnd(text, from - 1, Math.min(lineEnd, from + 4096));
    if (end >= 0) {
      const labels = text.slice(from, end);
      infos.push(labels);
      const rank = infoLabel(labels, 'engine');
      engines.add(rank === undefined || rank.includes('\\') ? '' : rank);
      // more than any engine writes (one per engine index): no capacity is read from it
      if (infos.length > MAX_LOAD_SERIES) return undefined;
    }
    at = text.indexOf(`\n${CACHE_CONFIG_INFO}`, from);
  }
  const ranks = engines.size;
  if (ranks === 0) return undefined;
  let perEngine: number | undefined;
  for (const labels of infos) if ((perEngine = oneEngineKvTokens(labels, ranks)) !== undefined) break;
  if (perEngine === undefined) return undefined;
  const tokens = engine === undefined ? perEngine * ranks : perEngine;
  return Number.isSafeInteger(tokens) && tokens > 0 ? tokens : undefined;
}

/** One engine's KV capacity by a cache_config_info label set whose num_gpu_blocks is `ranks` engines'. */
function oneEngineKvTokens(labels: string, ranks: number): number | undefined {
  const label = (name: string): number => {
    const v = infoLabel(labels, name);
    return v !== undefined && /^\d+$/.test(v) ? Number(v) : NaN;
  };
  const size = infoLabel(labels, 'kv_cache_size_tokens');
  const sized = size !== undefined && size.trim() !== '' ? Math.floor(Number(size)) : NaN;
  if (Number.isSafeInteger(sized) && sized > 0) return sized;
  const tokens = Math.floor((label('num_gpu_blocks') * label('block_size')) / ranks);
  return Number.isSafeInteger(tokens) && tokens > 0 ? tokens : undefined;
}

/**
 * The text of label `name`'s value in cache_config_info's `labels` (up to the next quote, its
 * escapes as written), undefined when it has none. Found by the text's search for `name="`, not
 * by a pattern tried at every comma (the page's thousands of label sets, each up to 4 KiB, made
 * that a quarter of a second).
 */
function infoLabel(labels: string, name: string): string | undefined {
  const key = `${name}="`;
  for (let at = labels.indexOf(key); at >= 0; at = labels.indexOf(key, at + 1)) {
    let before = at;
    while (before > 0 && isWhiteSpace(labels.charCodeAt(before - 1))) before--;
    if (before > 0 && labels.charCodeAt(before - 1) !== COMMA) continue;
    const end = labels.indexOf('"', at + key.length);
    return end < 0 ? undefined : labels.slice(at + key.length, end);
  }
  return undefined;
}

/** A series of another rank than `engine`: by vLLM's `engine` label or SGLang's `dp_rank`. */
function ofOtherRank(labels: ReadonlyMap<string, string>, engine: string): boolean {
  for (const k of RANK_LABELS) {
    const v = labels.get(k);
    if (v !== undefined && v !== engine) return true;
  }
  return false;
}
