import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { SubscriberStats } from '../../src/engines/kv-events/subscriber.js';
import { registerKvEventMetrics } from '../../src/server/metrics.js';
import { MetricsAggregator, ProcessMetrics, type ProcessMetricsMessage } from '../../src/server/process-metrics.js';

/** A gateway process's registry: a request counter and a gauge of one quantity every process reads. */
function registry(requests: number, usage: number): Registry {
  const r = new Registry();
  new Counter({ name: 'requests_total', help: 'h', registers: [r] }).inc(requests);
  new Gauge({ name: 'usage', help: 'h', aggregator: 'average', registers: [r] }).set(usage);
  return r;
}

/** A gateway process wired to the primary as node:cluster's channel would be (asynchronously). */
function join(
  primary: MetricsAggregator,
  id: string,
  r: Registry,
  answers: () => boolean = () => true,
): ProcessMetrics {
  const pm: ProcessMetrics = new ProcessMetrics(r, {
    send: (m: ProcessMetricsMessage) => queueMicrotask(() => primary.receive(id, m)),
  });
  primary.add(id, {
    send: (m) =>
      queueMicrotask(() => {
        // a stuck process hears the collect request and never answers it
        if (answers() || m.cfMetrics !== 'collect') pm.receive(m);
      }),
  });
  return pm;
}

/** The primary and `n` processes. */
function cluster(registries: Registry[], answering = registries.map(() => true)) {
  const primary = new MetricsAggregator();
  const processes = registries.map((r, i) => join(primary, String(i + 1), r, () => answering[i]));
  return { primary, processes };
}

/** A gateway process's registry with requests by worker, a request-duration histogram and a gauge. */
function served(requests: Record<string, number>, durations: number[], usage: number): Registry {
  const r = new Registry();
  const c = new Counter({ name: 'requests_total', help: 'h', labelNames: ['worker'], registers: [r] });
  for (const [worker, n] of Object.entries(requests)) c.inc({ worker }, n);
  const h = new Histogram({ name: 'duration_seconds', help: 'h', buckets: [0.1, 1], registers: [r] });
  for (const d of durations) h.observe(d);
  new Gauge({ name: 'usage', help: 'h', aggregator: 'average', registers: [r] }).set(usage);
  return r;
}

/** A page's samples: `name{labels}` to value. */
function samples(page: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of page.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** Every counter and histogram sample of `before` is in `after`, not lower. */
function notLower(before: Map<string, number>, after: Map<string, number>): void {
  for (const [key, value] of before) {
    if (!key.startsWith('requests_total') && !key.startsWith('duration_seconds')) continue;
    assert.ok((after.get(key) ?? -1) >= value, `${key}: ${after.get(key)} after ${value}`);
  }
}

describe('serve --processes: one /metrics page for every process', () => {
  test('counters are summed over the processes, a gauge marked average is averaged', async () => {
    const { processes } = cluster([registry(3, 0.5), registry(2, 0.7)]);
    for (const p of processes) {
      const page = await p.mergedMetrics();
      assert.match(page, /^requests_total 5$/m);
      assert.match(page, /^usage 0\.6$/m);
    }
  });

  test('a process that does not answer within the collect timeout counts with its last page: no counter drops', async () => {
    const answering = [true, true];
    const registries = [registry(3, 0.5), registry(2, 0.7)];
    const { processes } = cluster(registries, answering);
    assert.match(await processes[0].mergedMetrics(), /^requests_total 5$/m);
    // the second process stalls: its counter stays in the page at what it last said
    answering[1] = false;
    (registries[0].getSingleMetric('requests_total') as Counter).inc(1);
    assert.match(await processes[0].mergedMetrics(), /^requests_total 6$/m);
  });

  test('a process that never answered is not in the page; the page still comes after the collect timeout', async () => {
    const { processes } = cluster([registry(3, 0.5), registry(2, 0.7)], [true, false]);
    assert.match(await processes[0].mergedMetrics(), /^requests_total 3$/m);
  });

  test('a process that stops while its registry is awaited no longer holds the page back', async () => {
    const { primary, processes } = cluster([registry(3, 0.5), registry(2, 0.7)], [true, false]);
    const page = processes[0].mergedMetrics();
    // the request reaches the primary, which asks both; process 2 stops before answering
    await new Promise<void>((resolve) => setImmediate(resolve));
    primary.remove('2');
    assert.match(await page, /^requests_total 3$/m);
  });

  test('messages of other kinds are not taken: the state relay on the same channel gets them', () => {
    const primary = new MetricsAggregator();
    assert.equal(primary.receive('1', { cf: 'batch', m: [] }), false);
    assert.equal(primary.receive('1', null), false);
    assert.equal(new ProcessMetrics(new Registry(), { send: () => {} }).receive({ cf: 'decision' }), false);
  });

  test('a process that stops leaves its counters and histograms in the page, not its gauges', async () => {
    const primary = new MetricsAggregator();
    const p1 = join(primary, '1', served({ a: 3, b: 1 }, [0.05, 0.5, 2], 0.5));
    join(primary, '2', served({ a: 2 }, [0.5], 0.7));
    const before = samples(await p1.mergedMetrics());
    assert.equal(before.get('requests_total{worker="a"}'), 5);
    assert.equal(before.get('usage'), 0.6);
    primary.remove('1');
    // its replacement has counted nothing yet
    const p3 = join(primary, '3', served({}, [], 0.9));
    const after = samples(await p3.mergedMetrics());
    notLower(before, after);
    assert.equal(after.get('requests_total{worker="a"}'), 5);
    assert.equal(after.get('requests_total{worker="b"}'), 1);
    assert.equal(after.get('duration_seconds_bucket{le="0.1"}'), 1);
    assert.equal(after.get('duration_seconds_bucket{le="1"}'), 3);
    assert.equal(after.get('duration_seconds_bucket{le="+Inf"}'), 4);
    assert.equal(after.get('duration_seconds_count'), 4);
    assert.equal(after.get('duration_seconds_sum'), 3.05);
    // the gauge is what the live processes read now: the stopped one's 0.5 is gone
    assert.equal(after.get('usage'), 0.8);
    // and what the survivors count next adds to it
    const requests = served({ a: 1 }, [], 0);
    const p4 = join(primary, '4', requests);
    assert.equal(samples(await p4.mergedMetrics()).get('requests_total{worker="a"}'), 6);
  });

  test('a process that never sent its registry leaves nothing behind', async () => {
    const primary = new MetricsAggregator();
    const p1 = join(primary, '1', served({ a: 3 }, [0.5], 0.5));
    join(primary, '2', served({ a: 2 }, [0.5], 0.7), () => false);
    primary.remove('2');
    assert.equal(primary.retiredSeries, 0);
    assert.equal(samples(await p1.mergedMetrics()).get('requests_total{worker="a"}'), 3);
  });

  test('processes replaced again and again are folded into one retired count, not kept one by one', async () => {
    const primary = new MetricsAggregator();
    const survivor = join(primary, '0', served({ a: 1 }, [0.5], 0.5));
    let size = -1;
    let series = -1;
    for (let i = 1; i <= 50; i++) {
      join(primary, String(i), served({ a: 1, b: 2 }, [0.05, 2], 0.5));
      const page = samples(await survivor.mergedMetrics());
      assert.equal(page.get('requests_total{worker="a"}'), i + 1);
      assert.equal(page.get('requests_total{worker="b"}'), 2 * i);
      assert.equal(page.get('duration_seconds_count'), 1 + 2 * i);
      if (series === -1) series = page.size;
      assert.equal(page.size, series);
      primary.remove(String(i));
      if (size === -1) size = primary.retiredSeries;
      assert.equal(primary.retiredSeries, size, `after ${i} processes stopped`);
    }
    assert.ok(size > 0);
    const page = samples(await survivor.mergedMetrics());
    assert.equal(page.get('requests_total{worker="a"}'), 51);
    assert.equal(page.get('requests_total{worker="b"}'), 100);
    assert.equal(page.size, series);
  });

  test('a scrape under way when a process stops answers no lower counters than the one before', async () => {
    // the removal lands at each step of the scrape in turn: request, collect, answers, merge
    for (let step = 0; step < 12; step++) {
      const primary = new MetricsAggregator();
      join(primary, '1', served({ a: 3 }, [0.5, 2], 0.5));
      const p2 = join(primary, '2', served({ a: 2, b: 4 }, [0.05], 0.7));
      const before = samples(await p2.mergedMetrics());
      const page = p2.mergedMetrics();
      for (let i = 0; i < step; i++) await Promise.resolve();
      primary.remove('1');
      const after = samples(await page);
      notLower(before, after);
      assert.equal(after.get('requests_total{worker="a"}'), 5, `removed at step ${step}`);
      // the next scrape, with the stopped process gone, too
      notLower(before, samples(await p2.mergedMetrics()));
    }
  });

  test('retired series of one metric are capped; the drops are logged once', async () => {
    const lines: string[] = [];
    const primary = new MetricsAggregator({ maxRetiredLabelSets: 3, log: (m) => lines.push(m) });
    const r = new Registry();
    const c = new Counter({ name: 'requests_total', help: 'h', labelNames: ['worker'], registers: [r] });
    for (const w of ['a', 'b', 'c', 'd', 'e']) c.inc({ worker: w });
    const h = new Histogram({
      name: 'duration_seconds',
      help: 'h',
      labelNames: ['worker'],
      buckets: [1],
      registers: [r],
    });
    for (const w of ['a', 'b', 'c', 'd']) h.observe({ worker: w }, 0.5);
    const p1 = join(primary, '1', r);
    const p2 = join(primary, '2', new Registry());
    await p1.mergedMetrics();
    primary.remove('1');
    const page = samples(await p2.mergedMetrics());
    for (const w of ['a', 'b', 'c']) {
      assert.equal(page.get(`requests_total{worker="${w}"}`), 1);
      // a histogram's label set is kept whole or not at all
      assert.equal(page.get(`duration_seconds_bucket{le="1",worker="${w}"}`), 1);
      assert.equal(page.get(`duration_seconds_count{worker="${w}"}`), 1);
    }
    assert.equal(page.has('requests_total{worker="d"}'), false);
    assert.equal(page.has('duration_seconds_count{worker="d"}'), false);
    assert.equal(lines.length, 1);
    assert.match(lines[0], /3 label sets/);
  });

  test("a worker's KV-event counters, which every process counts of the same engine, are counted once", async () => {
    // each process subscribes to the engine and hears the same 40 batches, 2 of them duplicates, 1 late join, 3 skipped events
    const stats = {
      batches: 40,
      duplicates: 2,
      lateJoins: 1,
      gaps: 3,
      gapsLost: 1,
      malformed: 0,
      unknownRanks: 0,
      applied: { skipped: { bad_hash: 3 } },
    } as unknown as SubscriberStats;
    const registries = [new Registry(), new Registry()];
    for (const r of registries) registerKvEventMetrics(r, () => [['w1', stats]]);
    const { processes } = cluster(registries);
    const page = samples(await processes[0].mergedMetrics());
    assert.equal(page.get('contextforge_kv_event_batches_total{worker="w1"}'), 40);
    assert.equal(page.get('contextforge_kv_event_duplicates_total{worker="w1"}'), 2);
    assert.equal(page.get('contextforge_kv_event_late_joins_total{worker="w1"}'), 1);
    assert.equal(page.get('contextforge_kv_event_gaps_total{worker="w1",outcome="replayed"}'), 2);
    assert.equal(page.get('contextforge_kv_event_gaps_total{worker="w1",outcome="lost"}'), 1);
    assert.equal(page.get('contextforge_kv_events_skipped_total{worker="w1",reason="bad_hash"}'), 3);
  });

  test('a count each process keeps of its own subscription (duplicates, late joins) shows the most any process met', async () => {
    // the same engine's batches, but the younger process's subscription met a duplicate the older one did not
    const stats = [0, 1].map(
      () =>
        ({
          batches: 40,
          duplicates: 0,
          lateJoins: 0,
          malformed: 0,
          unknownRanks: 0,
          applied: { skipped: {} },
        }) as unknown as SubscriberStats & { duplicates: number; lateJoins: number },
    );
    const registries = [new Registry(), new Registry()];
    registries.forEach((r, i) => registerKvEventMetrics(r, () => [['w1', stats[i]]]));
    const { processes } = cluster(registries);
    let page = samples(await processes[0].mergedMetrics());
    assert.equal(page.get('contextforge_kv_event_duplicates_total{worker="w1"}'), 0);
    stats[1].duplicates = 1;
    stats[1].lateJoins = 1;
    page = samples(await processes[0].mergedMetrics());
    assert.equal(page.get('contextforge_kv_event_duplicates_total{worker="w1"}'), 1);
    assert.equal(page.get('contextforge_kv_event_late_joins_total{worker="w1"}'), 1);
    assert.equal(page.get('contextforge_kv_event_batches_total{worker="w1"}'), 40);
  });

  test('a count every process keeps of one thing neither jumps nor goes back when processes are replaced', async () => {
    /** A process's count of the engine's batches, merged by its largest value. */
    const counting = () => {
      const r = new Registry();
      const c = new Counter({
        name: 'batches_total',
        help: 'h',
        labelNames: ['worker'],
        aggregator: 'first',
        registers: [r],
      });
      return { r, c };
    };
    const primary = new MetricsAggregator();
    const a = counting();
    const b = counting();
    const pa = join(primary, 'a', a.r);
    join(primary, 'b', b.r);
    const page = async (p: ProcessMetrics) => samples(await p.mergedMetrics()).get('batches_total{worker="w"}');
    /** The engine sends `n` batches; every live process hears them. */
    const send = (n: number, ...live: Array<{ c: Counter }>) => {
      for (const p of live) p.c.inc({ worker: 'w' }, n);
    };
    send(100, a, b);
    assert.equal(await page(pa), 100);
    // a replaces b: it replays the 30 batches the engine still buffers, which a counted already
    primary.remove('b');
    const c = counting();
    const pc = join(primary, 'c', c.r);
    send(30, c);
    assert.equal(await page(pc), 100, 'no jump by the replay');
    send(10, a, c);
    assert.equal(await page(pa), 110);
    // a, the one counting since the start, stops: c carries the count on, and what came since the last page counts
    send(5, a, c);
    primary.remove('a');
    assert.equal(await page(pc), 115, 'not back to the count of the younger process');
    send(5, c);
    assert.equal(await page(pc), 120);
    // the last of the first processes gone: a new one, replaying, joins; c stops; the new one carries on
    const d = counting();
    const pd = join(primary, 'd', d.r);
    send(30, d);
    assert.equal(await page(pd), 120);
    send(1, c, d);
    primary.remove('c');
    send(2, d);
    assert.equal(await page(pd), 123);
  });

  test("a removed worker's counts leave the page, those of stopped processes too; added again it counts from 0", async () => {
    /** A process's registry: requests per worker (summed) and the engine's batches per worker (every process's count of one thing). */
    const counting = (requests: Record<string, number>, batches: Record<string, number>) => {
      const r = new Registry();
      const req = new Counter({ name: 'requests_total', help: 'h', labelNames: ['worker'], registers: [r] });
      const bat = new Counter({
        name: 'batches_total',
        help: 'h',
        labelNames: ['worker'],
        aggregator: 'first',
        registers: [r],
      });
      for (const [worker, n] of Object.entries(requests)) req.inc({ worker }, n);
      for (const [worker, n] of Object.entries(batches)) bat.inc({ worker }, n);
      return { r, req, bat };
    };
    const primary = new MetricsAggregator();
    const a = counting({ w1: 1, w2: 3 }, { w1: 10, w2: 20 });
    const pa = join(primary, 'a', a.r);
    join(primary, 'b', counting({ w2: 4 }, { w1: 10, w2: 20 }).r);
    const before = samples(await pa.mergedMetrics());
    assert.equal(before.get('requests_total{worker="w2"}'), 7);
    assert.equal(before.get('batches_total{worker="w2"}'), 20);
    // b is killed and replaced: what it counted of w2 stays, in the stopped processes' sum
    primary.remove('b');
    const c = counting({}, { w1: 5, w2: 5 });
    const pc = join(primary, 'c', c.r);
    assert.equal(samples(await pa.mergedMetrics()).get('requests_total{worker="w2"}'), 7);
    // w2 is removed: each live process drops its series and says so
    for (const [p, x] of [
      [pa, a],
      [pc, c],
    ] as const) {
      x.req.remove({ worker: 'w2' });
      x.bat.remove({ worker: 'w2' });
      p.forgetWorker('w2');
    }
    const after = samples(await pa.mergedMetrics());
    assert.deepEqual(
      [...after.keys()].filter((k) => k.includes('w2')),
      [],
      'no series of the removed worker stays',
    );
    assert.equal(after.get('requests_total{worker="w1"}'), 1);
    assert.equal(after.get('batches_total{worker="w1"}'), 10);
    // added again under the id: it counts from 0
    a.req.inc({ worker: 'w2' }, 0);
    a.bat.inc({ worker: 'w2' }, 0);
    c.bat.inc({ worker: 'w2' }, 0);
    let page = samples(await pc.mergedMetrics());
    assert.equal(page.get('requests_total{worker="w2"}'), 0);
    assert.equal(page.get('batches_total{worker="w2"}'), 0);
    a.req.inc({ worker: 'w2' }, 2);
    a.bat.inc({ worker: 'w2' }, 6);
    c.bat.inc({ worker: 'w2' }, 6);
    page = samples(await pc.mergedMetrics());
    assert.equal(page.get('requests_total{worker="w2"}'), 2);
    assert.equal(page.get('batches_total{worker="w2"}'), 6);
  });

  test('a process that stops before it removed a worker another removed does not bring its counts back', async () => {
    const primary = new MetricsAggregator();
    const ra = served({ w1: 1, w2: 3 }, [], 0);
    const pa = join(primary, 'a', ra);
    join(primary, 'b', served({ w2: 4 }, [], 0));
    await pa.mergedMetrics();
    // a removes w2; b has not yet (its registry still counts it)
    (ra.getSingleMetric('requests_total') as Counter).remove({ worker: 'w2' });
    pa.forgetWorker('w2');
    assert.equal(samples(await pa.mergedMetrics()).get('requests_total{worker="w2"}'), 4);
    // b is killed before it removed w2: its count of it does not stay
    primary.remove('b');
    const page = samples(await pa.mergedMetrics());
    assert.equal(page.has('requests_total{worker="w2"}'), false);
    assert.equal(page.get('requests_total{worker="w1"}'), 1);
  });

  test('a worker removed while a registry was read is left out of that registry', async () => {
    const primary = new MetricsAggregator();
    const r = served({ w2: 3 }, [], 0);
    const pa = new ProcessMetrics(r, { send: (m) => queueMicrotask(() => primary.receive('a', m)) });
    // the registry is read before the removal, sent after it
    primary.add('a', {
      send: (m) =>
        queueMicrotask(() => {
          pa.receive(m);
          if (m.cfMetrics === 'collect') pa.forgetWorker('w2');
        }),
    });
    const page = samples(await pa.mergedMetrics());
    assert.equal(page.has('requests_total{worker="w2"}'), false);
  });

  test('a process whose event-loop histogram took no sample yet is left out of the delay gauges: no NaN', async () => {
    /** prom-client's event-loop delay gauges as a process reads them (seconds), with their aggregators. */
    const delays = (read: Record<string, number>) => {
      const r = new Registry();
      for (const [name, aggregator] of [
        ['min', 'min'],
        ['max', 'max'],
        ['mean', 'average'],
        ['stddev', 'average'],
        ['p50', 'average'],
        ['p90', 'average'],
        ['p99', 'average'],
      ] as const)
        new Gauge({ name: `nodejs_eventloop_lag_${name}_seconds`, help: 'h', aggregator, registers: [r] }).set(
          read[name],
        );
      return r;
    };
    const measured = { min: 0.01, max: 0.05, mean: 0.02, stddev: 0.005, p50: 0.02, p90: 0.03, p99: 0.04 };
    // what perf_hooks' histogram reads with no sample: 2^63 ns, 0, NaN and its lowest bucket
    const unsampled = {
      min: 9223372036.854776,
      max: 0,
      mean: NaN,
      stddev: NaN,
      p50: 5.11e-7,
      p90: 5.11e-7,
      p99: 5.11e-7,
    };
    const { processes } = cluster([delays(measured), delays(unsampled)]);
    const text = await processes[0].mergedMetrics();
    assert.doesNotMatch(text, /NaN/);
    const page = samples(text);
    for (const [name, value] of Object.entries(measured))
      assert.equal(page.get(`nodejs_eventloop_lag_${name}_seconds`), value, name);
    // and none is shown while no process has a sample
    const none = samples(await cluster([delays(unsampled), delays(unsampled)]).processes[0].mergedMetrics());
    assert.deepEqual([...none.keys()], []);
  });

  test('a process scraped again before its event-loop histogram took a sample counts with the delay it read last', async () => {
    const r1 = new Registry();
    const r2 = new Registry();
    const mean1 = new Gauge({
      name: 'nodejs_eventloop_lag_mean_seconds',
      help: 'h',
      aggregator: 'average',
      registers: [r1],
    });
    const mean2 = new Gauge({
      name: 'nodejs_eventloop_lag_mean_seconds',
      help: 'h',
      aggregator: 'average',
      registers: [r2],
    });
    const max2 = new Gauge({ name: 'nodejs_eventloop_lag_max_seconds', help: 'h', aggregator: 'max', registers: [r2] });
    mean1.set(0.25);
    mean2.set(0.75);
    max2.set(0.2);
    const { processes } = cluster([r1, r2]);
    let page = samples(await processes[0].mergedMetrics());
    assert.equal(page.get('nodejs_eventloop_lag_mean_seconds'), 0.5);
    // the second process's histogram took no sample since: NaN, and a max of 0
    mean2.set(NaN);
    max2.set(0);
    page = samples(await processes[0].mergedMetrics());
    assert.equal(page.get('nodejs_eventloop_lag_mean_seconds'), 0.5);
    assert.equal(page.get('nodejs_eventloop_lag_max_seconds'), 0.2);
    mean2.set(1.25);
    max2.set(0.1);
    page = samples(await processes[0].mergedMetrics());
    assert.equal(page.get('nodejs_eventloop_lag_mean_seconds'), 0.75);
    assert.equal(page.get('nodejs_eventloop_lag_max_seconds'), 0.1);
  });

  test('a gauge a process reads as NaN is left out of its merge', async () => {
    const r1 = registry(1, 0.5);
    const r2 = registry(1, NaN);
    const { processes } = cluster([r1, r2]);
    assert.match(await processes[0].mergedMetrics(), /^usage 0\.5$/m);
  });

  test("prom-client's default metrics: a descriptor limit is not summed, the start time is shown", async () => {
    const registries = [new Registry(), new Registry()];
    for (const r of registries) collectDefaultMetrics({ register: r });
    const one = samples(await registries[0].metrics());
    const { processes } = cluster(registries);
    const page = samples(await processes[0].mergedMetrics());
    if (one.has('process_max_fds')) {
      // both read this process's limit: a limit, not twice it
      assert.equal(page.get('process_max_fds'), one.get('process_max_fds'));
    }
    assert.equal(page.get('process_start_time_seconds'), one.get('process_start_time_seconds'));
    // what the processes add up to is still summed
    assert.ok(page.get('process_cpu_user_seconds_total')! >= one.get('process_cpu_user_seconds_total')!);
  });

  test('a limit read differently by the processes merges to the lowest, open descriptors to the largest, the start to the earliest', async () => {
    /** A process's descriptor limit, open descriptors and start, with prom-client's aggregators. */
    const fds = (limit: number, open: number, start: number) => {
      const r = new Registry();
      new Gauge({ name: 'process_max_fds', help: 'h', registers: [r] }).set(limit);
      new Gauge({ name: 'process_open_fds', help: 'h', registers: [r] }).set(open);
      new Gauge({ name: 'process_start_time_seconds', help: 'h', aggregator: 'omit', registers: [r] }).set(start);
      return r;
    };
    const { processes } = cluster([fds(20000, 30, 1000), fds(10000, 40, 900)]);
    const page = samples(await processes[0].mergedMetrics());
    assert.equal(page.get('process_max_fds'), 10000);
    assert.equal(page.get('process_open_fds'), 40);
    assert.equal(page.get('process_start_time_seconds'), 900);
  });
});
