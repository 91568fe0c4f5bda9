import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Counter, Gauge, Registry } from 'prom-client';
import { MetricsAggregator, ProcessMetrics, type ProcessMetricsMessage } from '../../src/server/process-metrics.js';

/** A gateway process's registry: a request counter and a gauge of one quantity every process reads. */
function registry(requests: number, usage: number): Registry {
  const r = new Registry();
  new Counter({ name: 'requests_total', help: 'h', registers: [r] }).inc(requests);
  new Gauge({ name: 'usage', help: 'h', aggregator: 'average', registers: [r] }).set(usage);
  return r;
}

/** The primary and `n` processes, wired as node:cluster's channels would be (asynchronously). */
function cluster(registries: Registry[], answering = registries.map(() => true)) {
  const primary = new MetricsAggregator();
  const processes = registries.map((r, i) => {
    const id = String(i + 1);
    const pm: ProcessMetrics = new ProcessMetrics(r, {
      send: (m: ProcessMetricsMessage) => queueMicrotask(() => primary.receive(id, m)),
    });
    primary.add(id, {
      send: (m) =>
        queueMicrotask(() => {
          // a stuck process hears the collect request and never answers it
          if (answering[i] || m.cfMetrics !== 'collect') pm.receive(m);
        }),
    });
    return pm;
  });
  return { primary, processes };
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
});
