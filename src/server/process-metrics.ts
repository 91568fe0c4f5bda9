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
 * The messages carry `cfMetrics` (their kind) and no `cf`, so the state relay on the same
 * channels (cluster-state-store.ts) passes them over.
 */
import {
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

type Metrics = MetricObjectWithValues<MetricValue<string>>[];
type Metric = Metrics[number];
type Sample = MetricValueWithName<string>;

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
 * sets the processes exported, at most `maxRetiredLabelSets` per metric.
 */
export class MetricsAggregator {
  private readonly processes = new Map<string, MetricsChannel>();
  /** Each live process's latest registry. */
  private readonly latest = new Map<string, Metrics>();
  /** What the stopped processes counted, by metric name. */
  private readonly retired = new Map<string, RetiredMetric>();
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
    this.log = options.log ?? ((m) => process.stderr.write(`${m}\n`));
  }

  add(id: string, channel: MetricsChannel): void {
    this.processes.set(id, channel);
  }

  /** A process stopped: what it counted stays in the page, and no page waits for it any more. */
  remove(id: string): void {
    this.processes.delete(id);
    const last = this.latest.get(id);
    if (last) {
      this.latest.delete(id);
      this.retire(id, last);
    }
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
      if (Array.isArray(m.metrics) && this.processes.has(from)) this.latest.set(from, m.metrics);
      if (p && p.waiting.delete(from) && p.waiting.size === 0) this.finish(m.id);
    }
    return true;
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
      // the page is written here and crosses the channel as text: the scraped process answers it as it is
      // the retired registry last: a metric takes its help and aggregator from a live process
      AggregatorRegistry.aggregate([...this.latest.values(), this.retiredPage()])
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
      // a counter merged other than by its sum would not add up either (none is)
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

  constructor(
    private readonly registry: Registry,
    private readonly primary: MetricsChannel,
  ) {}

  /** A message from the primary; true when it was one of these. */
  receive(m: unknown): boolean {
    if (!isMetricsMessage(m)) return false;
    if (m.cfMetrics === 'collect') {
      const id = m.id;
      void this.registry.getMetricsAsJSON().then(
        (metrics) => this.primary.send({ cfMetrics: 'collected', id, metrics }),
        () => this.primary.send({ cfMetrics: 'collected', id, metrics: [] }),
      );
    } else if (m.cfMetrics === 'aggregated') {
      const w = this.waiting.get(m.id);
      if (!w) return true;
      this.waiting.delete(m.id);
      if (typeof m.text === 'string') w.resolve(m.text);
      else w.reject(new Error(m.error ?? 'no merged metrics'));
    }
    return true;
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
