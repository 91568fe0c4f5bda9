/**
 * vLLM's sleep mode on its /metrics page (`vllm:engine_sleep_state`, vllm/v1/metrics/loggers.py):
 * asleep, an engine answers /health and its gauges keep what its last step set, yet a request
 * sent there waits until it is woken. The scraper holds such a worker out of rotation (source `sleep`) from the scrape that
 * reads it asleep, and takes it back with the first that reads it awake.
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { readEngineLoad } from '../../src/engines/metrics/prometheus.js';
import { MetricsScraper } from '../../src/engines/metrics/scraper.js';
import { WorkerHealth } from '../../src/engines/health.js';
import { StallWatch } from '../../src/engines/metrics/stall.js';
import { KVAwareRouter } from '../../src/index.js';

/** A vLLM page as PrometheusStatLogger writes it: idle gauges, and the sleep state of each engine index. */
function vllmPage(state: 'awake' | 'weights_offloaded' | 'discard_all', engines = ['0']): string {
  const lines: string[] = [];
  for (const e of engines) {
    const l = `engine="${e}",model_name="m"`;
    lines.push(
      `vllm:num_requests_running{${l}} 0.0`,
      `vllm:num_requests_waiting{${l}} 0.0`,
      `vllm:kv_cache_usage_perc{${l}} 0.0`,
    );
  }
  lines.push(
    '# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.',
    '# TYPE vllm:engine_sleep_state gauge',
  );
  for (const s of ['awake', 'weights_offloaded', 'discard_all'])
    for (const e of engines)
      lines.push(
        `vllm:engine_sleep_state{engine="${e}",model_name="m",sleep_state="${s}"} ${(s === state ? 1 : 0).toFixed(1)}`,
      );
  return `${lines.join('\n')}\n`;
}

test('vllm:engine_sleep_state says whether and how the engine sleeps', () => {
  assert.equal(readEngineLoad(vllmPage('awake')).asleep, undefined);
  assert.equal(readEngineLoad(vllmPage('weights_offloaded')).asleep, 'weights_offloaded');
  assert.equal(readEngineLoad(vllmPage('discard_all')).asleep, 'discard_all');
  // every engine index of the server sleeps alike; a rank reads its own series
  assert.equal(readEngineLoad(vllmPage('weights_offloaded', ['0', '1']), '1').asleep, 'weights_offloaded');
  assert.equal(readEngineLoad(vllmPage('awake', ['0', '1'])).asleep, undefined);
  // awake at 0 with no level named is asleep all the same
  assert.equal(
    readEngineLoad('vllm:num_requests_running 0\nvllm:engine_sleep_state{sleep_state="awake"} 0\n').asleep,
    'asleep',
  );
  // a page without the gauge (SGLang, older vLLM) says nothing of sleep
  assert.equal(readEngineLoad('vllm:num_requests_running 0\n').asleep, undefined);
  assert.equal(readEngineLoad('sglang:num_running_reqs 0\n').asleep, undefined);
});

test('each label set is one sleep state: the engine sleeps only when none reads awake', () => {
  const state = (model: string, awake: number, offloaded: number) => [
    `vllm:engine_sleep_state{engine="0",model_name="${model}",sleep_state="awake"} ${awake}.0`,
    `vllm:engine_sleep_state{engine="0",model_name="${model}",sleep_state="weights_offloaded"} ${offloaded}.0`,
    `vllm:engine_sleep_state{engine="0",model_name="${model}",sleep_state="discard_all"} 0.0`,
  ];
  const page = (...states: string[][]) =>
    ['vllm:num_requests_running{engine="0",model_name="new"} 0.0', ...states.flat(), ''].join('\n');
  // a stale state under the model name served before a restart (the multiprocess directory kept)
  assert.equal(readEngineLoad(page(state('new', 1, 0), state('old', 0, 1))).asleep, undefined);
  assert.equal(readEngineLoad(page(state('old', 0, 1), state('new', 1, 0))).asleep, undefined);
  // every state asleep: the deepest level any says
  assert.equal(readEngineLoad(page(state('new', 0, 1), state('old', 0, 1))).asleep, 'weights_offloaded');
  const discard = [
    'vllm:engine_sleep_state{engine="0",model_name="old",sleep_state="awake"} 0.0',
    'vllm:engine_sleep_state{engine="0",model_name="old",sleep_state="discard_all"} 1.0',
  ];
  assert.equal(readEngineLoad(page(state('new', 0, 1), discard)).asleep, 'discard_all');
  assert.equal(readEngineLoad(page(state('new', 0, 0), state('old', 0, 1))).asleep, 'weights_offloaded');
  // labels in another order are the same state
  assert.equal(
    readEngineLoad(
      page([
        'vllm:engine_sleep_state{sleep_state="awake",model_name="m",engine="0"} 0.0',
        'vllm:engine_sleep_state{engine="0",sleep_state="weights_offloaded",model_name="m"} 1.0',
      ]),
    ).asleep,
    'weights_offloaded',
  );
  // ranks of a data-parallel server, all awake or all asleep alike
  assert.equal(readEngineLoad(vllmPage('discard_all', ['0', '1'])).asleep, 'discard_all');
});

/** An engine serving `page()` on /metrics, with the HTTP status `status()`. */
async function engineServing(page: () => string, status = () => 200) {
  const server = createServer((_, res) => res.writeHead(status(), { 'content-type': 'text/plain' }).end(page()));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/metrics`, close: () => server.close() };
}

const tokens = (i: number) => Array.from({ length: 32 }, (_, k) => k + i * 100);

/**
 * A scraper without the gateway's verdicts over one engine serving `page()` with `status()`: its
 * worker `w0` is out after one failed scrape and back after one good one.
 */
async function bareScraper(page: () => string, status: () => number) {
  const engine = await engineServing(page, status);
  const router = new KVAwareRouter();
  router.registerWorker('w0');
  const scraper = new MetricsScraper(router, [{ workerId: 'w0', url: engine.url }], {
    failuresToUnhealthy: 1,
    successesToHealthy: 1,
  });
  return { engine, url: engine.url, scraper, w0: () => router.listWorkers()[0] };
}

test('a worker whose engine sleeps leaves rotation at once, says why, and comes back when it wakes', async () => {
  let state: 'awake' | 'weights_offloaded' | 'discard_all' = 'awake';
  const engine = await engineServing(() => vllmPage(state));
  try {
    const router = new KVAwareRouter({ policy: 'round-robin' });
    router.registerWorker('sleepy');
    router.registerWorker('other');
    const logs: string[] = [];
    const health = new WorkerHealth(router, (m) => logs.push(m));
    const scraper = new MetricsScraper(router, [{ workerId: 'sleepy', url: engine.url }], {
      health,
      log: (m) => logs.push(m),
    });
    await scraper.scrapeAll();
    assert.deepEqual(health.reasons('sleepy'), []);

    state = 'weights_offloaded';
    await scraper.scrapeAll();
    assert.deepEqual(health.reasons('sleepy'), ['sleep'], 'one scrape is enough: the engine says so itself');
    assert.equal(router.listWorkers().find((w) => w.id === 'sleepy')!.healthy, false);
    for (let i = 0; i < 4; i++) assert.equal(router.route({ tokens: tokens(i) }).workerId, 'other');
    assert.ok(
      logs.some((m) => /sleepy.*asleep.*weights_offloaded/.test(m)),
      `the log says why: ${logs.join(' | ')}`,
    );
    const said = logs.length;
    await scraper.scrapeAll();
    assert.equal(logs.length, said, 'said once, not on every scrape');

    state = 'awake';
    await scraper.scrapeAll();
    assert.deepEqual(health.reasons('sleepy'), []);
    assert.equal(router.listWorkers().find((w) => w.id === 'sleepy')!.healthy, true);
    assert.ok(logs.some((m) => /sleepy.*awake again/.test(m)));
    assert.equal(scraper.state('sleepy')!.failures, 0, 'a sleeping engine is no failed scrape');
  } finally {
    engine.close();
  }
});

test("without the gateway's verdicts, the scraper itself holds a sleeping worker out, whatever its scrapes do", async () => {
  let state: 'awake' | 'discard_all' = 'discard_all';
  let status = 200;
  const { engine, scraper, w0 } = await bareScraper(
    () => vllmPage(state),
    () => status,
  );
  try {
    await scraper.scrapeAll();
    assert.equal(w0().healthy, false, 'asleep');
    // its scrapes failing and recovering while it sleeps do not bring it back
    status = 503;
    await scraper.scrapeAll();
    status = 200;
    await scraper.scrapeAll();
    assert.equal(w0().healthy, false, 'still asleep');
    state = 'awake';
    await scraper.scrapeAll();
    assert.equal(w0().healthy, true);
  } finally {
    engine.close();
  }
});

/**
 * A vLLM engine paused with what it holds, as its page reads: `POST /sleep?level=0` (the scheduler
 * paused, nothing offloaded: awake 0, no level set), or mode `keep`/`wait`. No step runs, so its
 * gauges and counters keep their last values: `running` requests and the same token count.
 */
function frozenPage(awake: boolean, running = 1): string {
  const l = 'engine="0",model_name="m"';
  return [
    `vllm:num_requests_running{${l}} ${running}.0`,
    `vllm:num_requests_waiting{${l}} 0.0`,
    `vllm:kv_cache_usage_perc{${l}} 0.25`,
    `vllm:generation_tokens_total{${l}} 100.0`,
    `vllm:engine_sleep_state{${l},sleep_state="awake"} ${awake ? 1 : 0}.0`,
    `vllm:engine_sleep_state{${l},sleep_state="weights_offloaded"} 0.0`,
    `vllm:engine_sleep_state{${l},sleep_state="discard_all"} 0.0`,
    '',
  ].join('\n');
}

/** A scraper over one engine serving `page()`, with the gateway's verdicts and stall watch on a clock of the test's. */
async function watchedScraper(page: () => string) {
  const engine = await engineServing(page);
  const clock = { now: 0, inFlight: 1 };
  const router = new KVAwareRouter({ policy: 'round-robin', clock: () => clock.now });
  router.registerWorker('w');
  const logs: string[] = [];
  const health = new WorkerHealth(router, (m) => logs.push(m));
  const stall = new StallWatch({ timeoutMs: 60_000, health, inFlight: () => clock.inFlight, log: (m) => logs.push(m) });
  const scraper = new MetricsScraper(router, [{ workerId: 'w', url: engine.url }], {
    health,
    stall,
    log: (m) => logs.push(m),
  });
  /** One scrape `ms` after the last. */
  const scrapeAfter = async (ms: number) => {
    clock.now += ms;
    await scraper.scrapeAll();
  };
  return {
    engine,
    clock,
    router,
    health,
    stall,
    logs,
    scrapeAfter,
    stalls: () => new Map(stall.stallCounts()).get('w') ?? 0,
  };
}

test('a paused engine, its gauges still with the requests it holds, is asleep, never stalled, and back when it wakes', async () => {
  let awake = false;
  const w = await watchedScraper(() => frozenPage(awake));
  try {
    // asleep past the stall timeout, a request of the gateway kept there all along
    for (let i = 0; i < 4; i++) await w.scrapeAfter(61_000);
    assert.deepEqual(w.health.reasons('w'), ['sleep']);
    assert.equal(w.stalls(), 0, 'a sleeping engine is no stall');
    assert.ok(!w.logs.some((m) => /no progress/.test(m)), w.logs.join(' | '));
    // woken with nothing left to do (the kept request gave up): no step runs, nothing moves
    w.clock.inFlight = 0;
    awake = true;
    await w.scrapeAfter(1000);
    assert.deepEqual(w.health.reasons('w'), []);
    assert.equal(w.router.listWorkers()[0].healthy, true);
    // awake, it is watched again from its first reading
    w.clock.inFlight = 1;
    await w.scrapeAfter(59_000);
    assert.deepEqual(w.health.reasons('w'), []);
    await w.scrapeAfter(1000);
    assert.deepEqual(w.health.reasons('w'), ['stall']);
    assert.equal(w.stalls(), 1);
  } finally {
    w.engine.close();
  }
});

test('a stall verdict taken before the engine slept is lifted by the sleep and does not outlive the wake', async () => {
  let awake = true;
  const w = await watchedScraper(() => frozenPage(awake));
  try {
    await w.scrapeAfter(0);
    await w.scrapeAfter(61_000);
    assert.deepEqual(w.health.reasons('w'), ['stall']);
    awake = false;
    await w.scrapeAfter(1000);
    assert.deepEqual(w.health.reasons('w'), ['sleep'], 'the engine says why it is still');
    assert.ok(
      w.logs.some((m) => /w: no longer held out as stalled/.test(m)),
      w.logs.join(' | '),
    );
    // woken with the same readings and nothing of the gateway's there: nothing would ever move them
    w.clock.inFlight = 0;
    awake = true;
    await w.scrapeAfter(1000);
    assert.deepEqual(w.health.reasons('w'), []);
    assert.equal(w.stalls(), 1, 'the stall found stays counted');
  } finally {
    w.engine.close();
  }
});

test("without the gateway's verdicts, a target added again while its worker is held out follows its new scrapes", async () => {
  let state: 'awake' | 'weights_offloaded' = 'weights_offloaded';
  let status = 200;
  const { engine, url, scraper, w0 } = await bareScraper(
    () => vllmPage(state),
    () => status,
  );
  try {
    // out as asleep, the target removed and added again; the engine wakes
    await scraper.scrapeAll();
    assert.equal(w0().healthy, false, 'asleep');
    scraper.remove('w0');
    scraper.add({ workerId: 'w0', url });
    await scraper.scrapeAll();
    assert.equal(w0().healthy, false, 'added again, its engine still asleep');
    scraper.remove('w0');
    scraper.add({ workerId: 'w0', url });
    state = 'awake';
    await scraper.scrapeAll();
    assert.equal(w0().healthy, true, 'added again, its engine awake');

    // out as its scrapes failed, the target removed and added again; the scrapes succeed
    status = 503;
    await scraper.scrapeAll();
    assert.equal(w0().healthy, false, 'its scrape failing');
    scraper.remove('w0');
    scraper.add({ workerId: 'w0', url });
    status = 200;
    await scraper.scrapeAll();
    assert.equal(w0().healthy, true, 'added again, its scrape good');
  } finally {
    engine.close();
  }
});
