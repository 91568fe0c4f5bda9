/**
 * `/metrics` of `serve --processes N`: node:cluster hands each connection to one process, so a
 * scrape would read only that process's registry, and Prometheus, reading another process at
 * each scrape, would see every counter go back and forth (a reset at every scrape: rate() and
 * increase() wrong). The process that receives the scrape asks the primary, which collects
 * every process's registry over the cluster's IPC channels and merges them (prom-client's
 * AggregatorRegistry.aggregate: each metric by its `aggregator`, a sum unless the metric says
 * otherwise), and answers the merged page.
 *
 * A process that stops takes its registry with it, and the one started in its place counts
 * from 0: left at that, every merged counter would drop when a process is replaced (a reset to
 * Prometheus, and rate()/increase() would count the whole remaining total again). So what a
 * stopped process counted stays in the page: its last counters and histograms are added into
 * one retired registry that every page adds to the live processes'.
 *
 * A counter merged by 'first' is one every process counts of the same thing
 * (the KV events of a worker's engine, which every process hears): summed, it would count the
 * thing N times. It follows one process instead (CommonCounts), carried on by another when that
 * process stops, so that it neither jumps nor goes back when a process is replaced.
 *
 * A removed worker's series leave each process's registry; the process says so with its next
 * registry (`forgotten`), and the primary drops the worker's series from what it keeps for the
 * stopped processes too: a worker added again under the id counts from 0, as in one process.
 *
 * The messages carry `cfMetrics` (their kind) and no `cf`, so the state relay on the same
 * channels (cluster-state-store.ts) passes them over.
 */
import {
  type Aggregator,
  AggregatorRegistry,
  type MetricObjectWithValues,
  type MetricValue,
  type MetricValueWithName,
  type Registry,
} from 'prom-client';

/** How long the primary waits for every process's registry before it answers with those it has. */
export const COLLECT_TIMEOUT_MS = 2000;
/** How long a process waits for the primary's merged page before its scrape fails (503). */
export const AGGREGATE_TIMEOUT_MS = COLLECT_TIMEOUT_MS + 1000;

/** Label sets of one metric the retired registry keeps; past them a stopped process's series are dropped. */
export const MAX_RETIRED_LABEL_SETS = 10_000;

/** Removed workers a process remembers until the primary next collects its registry; past them the oldest are dropped. */
export const MAX_FORGOTTEN_WORKERS = 10_000;

type Metrics = MetricObjectWithValues<MetricValue<string>>[];
type Metric = Metrics[number];
type Sample = MetricValueWithName<string>;

/**
 * prom-client's default metrics merged otherwise than by the aggregator prom-client gives them
 * (a sum unless said): a limit of each process is no sum, and the start time, which prom-client
 * leaves out of a merged page, is the longest-running process's.
 */
export const MERGED_AS: Readonly<Record<string, Aggregator>> = {
  // each process's own limit (they inherit one): the lowest
  process_max_fds: 'min',
  // the fullest process: `process_open_fds / process_max_fds` stays the share of a process's limit in use
  process_open_fds: 'max',
  process_start_time_seconds: 'min',
};

/**
 * prom-client's event-loop delay gauges read from perf_hooks' histogram, which it empties at each
 * scrape. A process whose histogram took no sample since (one just started, or scraped twice
 * within its resolution, 10 ms) reads a mean and deviation of NaN, a minimum of 2^63 ns and
 * percentiles of its lowest bucket: none is a measure. It counts with the delay it read last,
 * and one that has read none yet is left out of all of them.
 */
const EVENT_LOOP_DELAY_GAUGES = new Set([
  'nodejs_eventloop_lag_min_seconds',
  'nodejs_eventloop_lag_max_seconds',
  'nodejs_eventloop_lag_mean_seconds',
  'nodejs_eventloop_lag_stddev_seconds',
  'nodejs_eventloop_lag_p50_seconds',
  'nodejs_eventloop_lag_p90_seconds',
  'nodejs_eventloop_lag_p99_seconds',
]);
const EVENT_LOOP_DELAY_MEAN = 'nodejs_eventloop_lag_mean_seconds';

/** Whether a registry's event-loop delay histogram took a sample since its last scrape. */
function delaySampled(metrics: Metrics): boolean {
  const mean = metrics.find((m) => m.name === EVENT_LOOP_DELAY_MEAN);
  return mean !== undefined && Array.isArray(mean.values) && mean.values.some((v) => Number.isFinite(v.value));
}

/** A counter every process counts of the same thing: merged by its largest value, not summed. */
function isCommonCounter(m: Metric): boolean {
  return String(m.type) === 'counter' && m.aggregator === 'first';
}

/** Whether a sample is a removed worker's (its `worker` label). */
function ofWorker(v: Sample, worker: string): boolean {
  return v.labels?.worker === worker;
}

/** `metrics` without `worker`'s samples (the same array when it has none). */
function withoutWorker(metrics: Metrics, worker: string): Metrics {
  if (!metrics.some((m) => Array.isArray(m.values) && m.values.some((v) => ofWorker(v, worker)))) return metrics;
  return metrics.map((m) =>
    Array.isArray(m.values) && m.values.some((v) => ofWorker(v, worker))
      ? { ...m, values: m.values.filter((v) => !ofWorker(v, worker)) }
      : m,
  );
}

/** What the stopped processes counted of one counter or histogram, summed by sample. */
interface RetiredMetric {
  /** name, help, type, as the first process that stopped exported them */
  metric: Metric;
  /** label sets kept (a histogram's without `le`: its buckets, sum and count are kept together) */
  labelSets: Set<string>;
  /** by sample name and label set */
  samples: Map<string, Sample>;
}

/** One string per label set, whatever the order of its labels; `without` left out. */
function labelKey(labels: Record<string, unknown> | undefined, without?: string): string {
  const keys = Object.keys(labels ?? {})
    .filter((k) => k !== without)
    .sort();
  return JSON.stringify(keys.map((k) => [k, labels![k]]));
}

/** One counter every process counts of the same thing, as the merged page shows it. */
interface CommonSeries {
  labels: Record<string, string | number | undefined>;
  metricName?: string;
  /** what the last page showed; undefined until one showed it */
  value: number | undefined;
  /** by process: what to add to the process's count to read the page's */
  offsets: Map<string, number>;
}

/**
 * Counters every process counts of the same thing (merged by 'first': the KV events of a worker's
 * engine and the events it skipped, which each process hears on its own subscription). Summed, they would count the thing once per process; the largest would jump when
 * a process that replays the engine's buffer starts (it counts again what the others counted),
 * and go back when the one that counted longest stops. So each series follows one process: the
 * longest-running one that answered the scrape, its count plus an offset. At each page every
 * other process that answered is aligned to the page (its offset set to the page's value less its
 * count), so that when the one followed stops the next carries on from where they were at the
 * last page both answered, counting what came since; a process's first count (a replay among it)
 * is only its alignment. A page never shows less than the one before. The series of a new worker
 * start at the largest of the processes' counts, as one process would show them.
 */
class CommonCounts {
  private readonly metrics = new Map<string, { metric: Metric; series: Map<string, CommonSeries> }>();

  constructor(private readonly maxSeries: number) {}

  /** The merged metrics of the live processes' `latest` registries (`order`: the oldest first; `fresh`: those that answered this scrape). */
  merge(
    order: readonly string[],
    latest: ReadonlyMap<string, Metrics>,
    fresh: ReadonlySet<string>,
  ): Map<string, Metric> {
    // by metric and series: each process's count
    const counts = new Map<string, Map<string, Map<string, Sample>>>();
    for (const id of order)
      for (const m of latest.get(id) ?? []) {
        if (!isCommonCounter(m) || !Array.isArray(m.values)) continue;
        if (!this.metrics.has(m.name))
          this.metrics.set(m.name, {
            metric: { name: m.name, help: m.help, type: m.type, aggregator: 'first', values: [] } as unknown as Metric,
            series: new Map(),
          });
        let bySeries = counts.get(m.name);
        if (!bySeries) counts.set(m.name, (bySeries = new Map()));
        for (const v of m.values as Sample[]) {
          if (typeof v.value !== 'number' || !Number.isFinite(v.value)) continue;
          const key = `${v.metricName ?? ''} ${labelKey(v.labels)}`;
          let byProcess = bySeries.get(key);
          if (!byProcess) bySeries.set(key, (byProcess = new Map()));
          byProcess.set(id, v);
        }
      }
    const out = new Map<string, Metric>();
    for (const [name, { metric, series }] of this.metrics) {
      const values: Sample[] = [];
      for (const [key, byProcess] of counts.get(name) ?? []) {
        let s = series.get(key);
        if (!s) {
          const first = byProcess.values().next().value as Sample;
          if (series.size >= this.maxSeries) {
            // past the bound: the largest count, as prom-client merges it
            let value = -Infinity;
            for (const v of byProcess.values()) value = Math.max(value, v.value);
            values.push({ ...first, value });
            continue;
          }
          s = { labels: { ...first.labels }, value: undefined, offsets: new Map() };
          if (first.metricName !== undefined) s.metricName = first.metricName;
          series.set(key, s);
        }
        advance(s, order, byProcess, fresh);
      }
      for (const s of series.values()) {
        if (s.value === undefined) continue;
        const v: Sample = { value: s.value, labels: s.labels };
        if (s.metricName !== undefined) v.metricName = s.metricName;
        values.push(v);
      }
      out.set(name, { ...metric, values });
    }
    return out;
  }

  /** A removed worker's series go: one added again under its id counts from the processes' counts. */
  forget(worker: string): void {
    for (const { series } of this.metrics.values())
      for (const [key, s] of series) if (s.labels.worker === worker) series.delete(key);
  }

  /** A process stopped: the next one in line carries its series on. */
  remove(id: string): void {
    for (const { series } of this.metrics.values()) for (const s of series.values()) s.offsets.delete(id);
  }
}

/** One scrape of series `s`: its value from the process it follows, the other processes that answered aligned to it. */
function advance(
  s: CommonSeries,
  order: readonly string[],
  counts: ReadonlyMap<string, Sample>,
  fresh: ReadonlySet<string>,
): void {
  const followed = order.find((id) => fresh.has(id) && counts.has(id) && s.offsets.has(id));
  let value: number;
  if (followed !== undefined)
    value = Math.max(s.value ?? -Infinity, counts.get(followed)!.value + s.offsets.get(followed)!);
  // none of the processes it followed answered: where it was (the next page follows one that answered now)
  else if (s.value !== undefined) value = s.value;
  else {
    // a series no page showed yet: the largest count, as one process would show it
    value = -Infinity;
    for (const v of counts.values()) value = Math.max(value, v.value);
  }
  for (const [id, v] of counts) if (id !== followed && fresh.has(id)) s.offsets.set(id, value - v.value);
  s.value = value;
}

/**
 * A live process's registry as it enters the merge: each common counter (`common`, merged
 * already) in the first registry that holds it (`placed`) and out of the others, gauge samples of
 * NaN left out (a process that has nothing to read yet), the event-loop delay gauges of a process
 * whose histogram took no sample left out, and the aggregators of MERGED_AS.
 */
function mergeable(metrics: Metrics, common: ReadonlyMap<string, Metric>, placed: Set<string>): Metrics {
  const sampled = delaySampled(metrics);
  const out: Metrics = [];
  for (const m of metrics) {
    const merged = common.get(m.name);
    if (merged) {
      if (!placed.has(m.name)) out.push(merged);
      placed.add(m.name);
      continue;
    }
    if (EVENT_LOOP_DELAY_GAUGES.has(m.name) && !sampled) continue;
    let metric = m;
    if (String(m.type) === 'gauge' && Array.isArray(m.values) && m.values.some((v) => Number.isNaN(v.value)))
      metric = { ...metric, values: m.values.filter((v) => !Number.isNaN(v.value)) };
    const as = MERGED_AS[m.name];
    if (as !== undefined && metric.aggregator !== as) metric = { ...metric, aggregator: as };
    out.push(metric);
  }
  return out;
}

/** A gateway process asks the primary for the merged page. */
interface RequestMessage {
  cfMetrics: 'request';
  id: number;
}
/** The primary asks every gateway process for its registry. */
interface CollectMessage {
  cfMetrics: 'collect';
  id: number;
}
/** A gateway process's registry, as JSON. */
interface CollectedMessage {
  cfMetrics: 'collected';
  id: number;
  metrics: Metrics;
  /** router worker ids whose series left the registry since the last one sent (removed workers) */
  forgotten?: string[];
}
/** The merged page, or why there is none. */
interface AggregatedMessage {
  cfMetrics: 'aggregated';
  id: number;
  text?: string;
  error?: string;
}
export type ProcessMetricsMessage = RequestMessage | CollectMessage | CollectedMessage | AggregatedMessage;

function isMetricsMessage(m: unknown): m is ProcessMetricsMessage {
  return (
    m !== null &&
    typeof m === 'object' &&
    typeof (m as { cfMetrics?: unknown }).cfMetrics === 'string' &&
    Number.isSafeInteger((m as { id?: unknown }).id)
  );
}

/** One IPC channel: to a gateway process (in the primary), or to the primary (in a gateway process). */
export interface MetricsChannel {
  send(m: ProcessMetricsMessage): void;
}

/**
 * The primary's side: merges the registries of the live gateway processes for the one that
 * was scraped. A process that does not answer within COLLECT_TIMEOUT_MS (busy, or stuck)
 * counts with the last registry it sent: left out, its counters would drop from the page and
 * read as a reset. One that never answered yet has counted nothing a scrape has seen.
 *
 * A process that stops leaves its last counters and histograms (every sample: buckets, sum and
 * count) in `retired`, added to what the live processes count: a merged counter does not go
 * back when a process is replaced. Its gauges leave with it (a gauge is what a live process
 * reads now), and so do its summaries (quantiles do not add). The fold is synchronous, so a
 * page is merged either before it (the stopped process in `latest`) or after it (in `retired`),
 * never with both or neither. `retired` is one sum, however many processes stop, of the label
 * sets the processes exported, at most `maxRetiredLabelSets` per metric. Counters every process
 * counts of the same thing (aggregator 'first') are not summed but followed (CommonCounts).
 *
 * A process that removed a worker says so with its next registry: the worker's series leave
 * `retired` and the common counts, and the processes that have not said so yet (their last
 * registries count it from before) leave theirs out of `retired` if they stop first.
 */
export class MetricsAggregator {
  /** The live processes, the longest-running first. */
  private readonly processes = new Map<string, MetricsChannel>();
  /** Each live process's latest registry. */
  private readonly latest = new Map<string, Metrics>();
  /** The collect request each live process last answered. */
  private readonly answered = new Map<string, number>();
  /** Each live process's event-loop delay gauges, as it last read them with a sample. */
  private readonly delays = new Map<string, Metrics>();
  /** What the stopped processes counted, by metric name. */
  private readonly retired = new Map<string, RetiredMetric>();
  private readonly common: CommonCounts;
  /** Removed workers, by router worker id: the live processes that have not said yet that they removed it. */
  private readonly forgetting = new Map<string, Set<string>>();
  /** `retired` as a registry for AggregatorRegistry.aggregate, until the next fold. */
  private retiredMetrics: Metrics | undefined;
  private readonly maxRetiredLabelSets: number;
  private readonly log: (m: string) => void;
  private readonly pending = new Map<
    number,
    { from: string; id: number; waiting: Set<string>; timer: NodeJS.Timeout }
  >();
  private nextId = 1;

  constructor(options: { maxRetiredLabelSets?: number; log?: (m: string) => void } = {}) {
    this.maxRetiredLabelSets = options.maxRetiredLabelSets ?? MAX_RETIRED_LABEL_SETS;
    this.common = new CommonCounts(this.maxRetiredLabelSets);
    this.log = options.log ?? ((m) => process.stderr.write(`${m}\n`));
  }

  add(id: string, channel: MetricsChannel): void {
    this.processes.set(id, channel);
  }

  /** A process stopped: what it counted stays in the page, and no page waits for it any more. */
  remove(id: string): void {
    this.processes.delete(id);
    this.answered.delete(id);
    this.delays.delete(id);
    const last = this.latest.get(id);
    if (last) {
      this.latest.delete(id);
      this.retire(id, last);
    }
    this.common.remove(id);
    for (const [worker, waiting] of this.forgetting)
      if (waiting.delete(id) && waiting.size === 0) this.forgetting.delete(worker);
    for (const [key, p] of this.pending) {
      p.waiting.delete(id);
      if (p.from === id) this.drop(key);
      else if (p.waiting.size === 0) this.finish(key);
    }
  }

  /** A message from gateway process `from`; true when it was one of these (the caller passes the others on). */
  receive(from: string, m: unknown): boolean {
    if (!isMetricsMessage(m)) return false;
    if (m.cfMetrics === 'request') this.start(from, m.id);
    else if (m.cfMetrics === 'collected') {
      const p = this.pending.get(m.id);
      if (Array.isArray(m.metrics) && this.processes.has(from)) {
        this.latest.set(from, this.withEventLoopDelay(from, m.metrics));
        this.answered.set(from, m.id);
        if (Array.isArray(m.forgotten))
          for (const worker of m.forgotten) if (typeof worker === 'string') this.forget(from, worker);
      }
      if (p && p.waiting.delete(from) && p.waiting.size === 0) this.finish(m.id);
    }
    return true;
  }

  /**
   * Process `from` removed `worker`: the registry it sent with that may still count it (from
   * before), and what stopped processes counted of it leaves the page, as the worker's series
   * left each process's registry.
   */
  private forget(from: string, worker: string): void {
    const last = this.latest.get(from);
    if (last) this.latest.set(from, withoutWorker(last, worker));
    this.common.forget(worker);
    for (const r of this.retired.values()) {
      const histogram = String(r.metric.type) === 'histogram';
      for (const [key, v] of r.samples)
        if (ofWorker(v, worker)) {
          r.samples.delete(key);
          r.labelSets.delete(labelKey(v.labels, histogram ? 'le' : undefined));
        }
    }
    this.retiredMetrics = undefined;
    let waiting = this.forgetting.get(worker);
    if (!waiting) {
      // the others' last registries count it until they say they removed it too
      waiting = new Set([...this.processes.keys()].filter((id) => id !== from));
      if (this.forgetting.size >= this.maxRetiredLabelSets)
        this.forgetting.delete(this.forgetting.keys().next().value as string);
      this.forgetting.set(worker, waiting);
    } else waiting.delete(from);
    if (waiting.size === 0) this.forgetting.delete(worker);
  }

  /**
   * Process `from`'s registry with the event-loop delay it read last, when its histogram took
   * no sample since (scraped again within its resolution): the delay is not unknown for that.
   */
  private withEventLoopDelay(from: string, metrics: Metrics): Metrics {
    const gauges = metrics.filter((m) => EVENT_LOOP_DELAY_GAUGES.has(m.name));
    if (gauges.length === 0) return metrics;
    if (delaySampled(metrics)) {
      this.delays.set(from, gauges);
      return metrics;
    }
    const last = this.delays.get(from);
    if (!last) return metrics;
    return [...metrics.filter((m) => !EVENT_LOOP_DELAY_GAUGES.has(m.name)), ...last];
  }

  private start(from: string, requestId: number): void {
    const key = this.nextId++;
    const waiting = new Set(this.processes.keys());
    const timer = setTimeout(() => this.finish(key), COLLECT_TIMEOUT_MS);
    this.pending.set(key, { from, id: requestId, waiting, timer });
    for (const [, channel] of this.processes) channel.send({ cfMetrics: 'collect', id: key });
    if (waiting.size === 0) this.finish(key);
  }

  private finish(key: number): void {
    const p = this.pending.get(key);
    if (!p) return;
    this.drop(key);
    const to = this.processes.get(p.from);
    if (!to) return;
    const fail = (err: unknown) => to.send({ cfMetrics: 'aggregated', id: p.id, error: String(err) });
    try {
      const order = [...this.processes.keys()];
      const fresh = new Set(order.filter((id) => this.answered.get(id) === key));
      const common = this.common.merge(order, this.latest, fresh);
      const placed = new Set<string>();
      const pages = order.flatMap((id) => {
        const metrics = this.latest.get(id);
        return metrics ? [mergeable(metrics, common, placed)] : [];
      });
      // common counts no live registry holds now (those that counted them replaced, their replacements yet to answer)
      const unplaced = [...common.values()].filter((m) => !placed.has(m.name));
      if (unplaced.length > 0) pages.push(unplaced);
      // the page is written here and crosses the channel as text: the scraped process answers it as it is
      // the retired registry last: a metric takes its help and aggregator from a live process
      AggregatorRegistry.aggregate([...pages, this.retiredPage()])
        .metrics()
        .then((text) => to.send({ cfMetrics: 'aggregated', id: p.id, text }), fail);
    } catch (err) {
      fail(err);
    }
  }

  /** Samples the retired registry holds (the same however many processes stopped with the same label sets). */
  get retiredSeries(): number {
    let n = 0;
    for (const r of this.retired.values()) n += r.samples.size;
    return n;
  }

  /** Adds the counters and histograms of stopped process `id`'s last registry into `retired`. */
  private retire(id: string, metrics: Metrics): void {
    const dropped = new Map<string, Set<string>>();
    for (const m of metrics) {
      // the JSON carries the type as its name ('counter'), which the typings call an enum
      const type = String(m.type);
      // a counter merged other than by its sum would not add up either: the followed counts
      // ('first') carry their own on, and one merged by 'max' (each process's own judgement) is
      // what the live processes met
      if ((type !== 'counter' && type !== 'histogram') || (m.aggregator ?? 'sum') !== 'sum') continue;
      if (!Array.isArray(m.values)) continue;
      let r = this.retired.get(m.name);
      if (!r) {
        r = {
          metric: { name: m.name, help: m.help, type: m.type, aggregator: 'sum', values: [] } as unknown as Metric,
          labelSets: new Set(),
          samples: new Map(),
        };
        this.retired.set(m.name, r);
      }
      if (String(r.metric.type) !== type) continue;
      for (const v of m.values as Sample[]) {
        if (typeof v.value !== 'number' || Number.isNaN(v.value)) continue;
        // a worker it had not yet removed when another process did: that count left the page with the others'
        const worker = v.labels?.worker;
        if (typeof worker === 'string' && this.forgetting.get(worker)?.has(id)) continue;
        const set = labelKey(v.labels, type === 'histogram' ? 'le' : undefined);
        if (!r.labelSets.has(set)) {
          if (r.labelSets.size >= this.maxRetiredLabelSets) {
            let d = dropped.get(m.name);
            if (!d) dropped.set(m.name, (d = new Set()));
            d.add(set);
            continue;
          }
          r.labelSets.add(set);
        }
        const key = `${v.metricName ?? ''} ${labelKey(v.labels)}`;
        const sample = r.samples.get(key);
        if (sample) sample.value += v.value;
        else {
          const kept: Sample = { value: v.value, labels: { ...v.labels } };
          if (v.metricName !== undefined) kept.metricName = v.metricName;
          r.samples.set(key, kept);
        }
      }
    }
    this.retiredMetrics = undefined;
    if (dropped.size > 0) {
      let n = 0;
      for (const d of dropped.values()) n += d.size;
      this.log(
        `gateway process ${id} stopped: ${n} label sets of ${[...dropped.keys()].join(', ')} left out of the counts kept of stopped processes (at most ${this.maxRetiredLabelSets} per metric)`,
      );
    }
  }

  private retiredPage(): Metrics {
    this.retiredMetrics ??= [...this.retired.values()].map((r) => ({ ...r.metric, values: [...r.samples.values()] }));
    return this.retiredMetrics;
  }

  private drop(key: number): void {
    const p = this.pending.get(key);
    if (!p) return;
    clearTimeout(p.timer);
    this.pending.delete(key);
  }
}

/**
 * A gateway process's side: answers the primary's collect requests with its registry, and
 * asks it for the merged page when scraped (`mergedMetrics`).
 */
export class ProcessMetrics {
  private readonly waiting = new Map<number, { resolve: (text: string) => void; reject: (err: Error) => void }>();
  private nextId = 1;
  /** Workers removed since the registry last sent, told with the next. */
  private readonly forgotten = new Set<string>();

  constructor(
    private readonly registry: Registry,
    private readonly primary: MetricsChannel,
  ) {}

  /** A message from the primary; true when it was one of these. */
  receive(m: unknown): boolean {
    if (!isMetricsMessage(m)) return false;
    if (m.cfMetrics === 'collect') {
      const id = m.id;
      // the workers removed up to the moment the registry is sent: one removed while it was read
      // may still be in it, and the primary leaves it out
      const send = (metrics: Metrics) => {
        const forgotten = [...this.forgotten];
        this.forgotten.clear();
        this.primary.send({ cfMetrics: 'collected', id, metrics, ...(forgotten.length > 0 ? { forgotten } : {}) });
      };
      void this.registry.getMetricsAsJSON().then(send, () => send([]));
    } else if (m.cfMetrics === 'aggregated') {
      const w = this.waiting.get(m.id);
      if (!w) return true;
      this.waiting.delete(m.id);
      if (typeof m.text === 'string') w.resolve(m.text);
      else w.reject(new Error(m.error ?? 'no merged metrics'));
    }
    return true;
  }

  /**
   * Router worker `workerId` was removed and its series left the registry: the primary drops
   * what stopped processes counted of it too. Told with the next registry collected.
   */
  forgetWorker(workerId: string): void {
    this.forgotten.delete(workerId);
    // never scraped, a process that sees workers come and go keeps the latest removals
    if (this.forgotten.size >= MAX_FORGOTTEN_WORKERS)
      this.forgotten.delete(this.forgotten.values().next().value as string);
    this.forgotten.add(workerId);
  }

  /** Every process's metrics merged into one page; rejects when the primary does not answer in time. */
  mergedMetrics(): Promise<string> {
    const id = this.nextId++;
    return new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        reject(new Error(`the primary process did not merge the metrics within ${AGGREGATE_TIMEOUT_MS} ms`));
      }, AGGREGATE_TIMEOUT_MS);
      this.waiting.set(id, {
        resolve: (text) => {
          clearTimeout(timer);
          resolve(text);
        },
        reject: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      });
      this.primary.send({ cfMetrics: 'request', id });
    });
  }
}
