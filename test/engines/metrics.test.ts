import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, describe, test } from 'node:test';
import {
  MAX_LOAD_SERIES,
  MetricsFormatError,
  parsePrometheusText,
  readEngineLoad,
  readKvCapacityTokens,
} from '../../src/engines/metrics/prometheus.js';
import { MetricsScraper } from '../../src/engines/metrics/scraper.js';
import { WorkerHealth } from '../../src/engines/health.js';
import { MAX_ENGINE_REQUESTS } from '../../src/core/worker-registry.js';
import { KVAwareRouter } from '../../src/index.js';

const VLLM = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-32B"} 7.0
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-32B"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-32B"} 0.42
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-32B"} 12000.0
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-32B"} 9000.0
`;
const OLD_VLLM =
  'vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 0\nvllm:gpu_cache_usage_perc{model_name="m"} 0.9\nvllm:gpu_prefix_cache_queries_total{model_name="m"} 100\nvllm:gpu_prefix_cache_hits_total{model_name="m"} 40\n';
const SGLANG =
  'sglang:num_running_reqs{model_name="m",label="a b}"} 4\nsglang:num_queue_reqs{model_name="m"} 2\nsglang:token_usage{model_name="m"} 0.25\n';

describe('Prometheus load metrics', () => {
  test('vLLM, older vLLM and SGLang names', () => {
    assert.deepEqual(readEngineLoad(VLLM), {
      running: 7,
      waiting: 3,
      kvUsage: 0.42,
      prefixCacheQueries: 12000,
      prefixCacheHits: 9000,
    });
    assert.deepEqual(readEngineLoad(OLD_VLLM), {
      running: 1,
      waiting: 0,
      kvUsage: 0.9,
      prefixCacheQueries: 100,
      prefixCacheHits: 40,
    });
    // both names on one page (a release deprecating the old one): the current one is read
    assert.equal(readEngineLoad(`${VLLM}vllm:gpu_cache_usage_perc{engine="0"} 0.99\n`).kvUsage, 0.42);
    assert.deepEqual(readEngineLoad(SGLANG), { running: 4, waiting: 2, kvUsage: 0.25 });
  });

  test('several series of one name are summed (usage averaged); junk lines are skipped', () => {
    const text =
      'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 3\ngarbage line\nvllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.4\n';
    const load = readEngineLoad(text);
    assert.equal(load.running, 5);
    assert.ok(Math.abs(load.kvUsage - 0.3) < 1e-12);
    assert.deepEqual(parsePrometheusText('x{a="}"} 1 1700000000').get('x'), [
      { value: 1, labels: new Map([['a', '}']]) },
    ]);
    // with names, the other names are not read
    assert.deepEqual([...parsePrometheusText('x 1\ny{a="b"} 2\n', undefined, new Set(['y'])).keys()], ['y']);
    // one data-parallel rank's series (vLLM labels each rank's with engine="r")
    assert.equal(readEngineLoad(text, '1').running, 3);
    assert.equal(readEngineLoad(text, '1').kvUsage, 0.4);
  });

  test('a line without a number for its value is skipped, as any malformed line is', () => {
    const text = [
      'vllm:num_requests_running 2',
      'vllm:num_requests_waiting',
      'vllm:num_requests_waiting{engine="0"} ',
      'vllm:num_requests_waiting many',
      'vllm:num_requests_waiting 3',
      'vllm:kv_cache_usage_perc 0x',
      'vllm:kv_cache_usage_perc 0.5',
    ].join('\n');
    assert.deepEqual(readEngineLoad(text), { running: 2, waiting: 3, kvUsage: 0.5 });
  });

  test('an out-of-range load sample is read as the worst: usage 1, the queue and batch MAX_ENGINE_REQUESTS', () => {
    const page = (running: string, waiting: string, usage: string, usageName = 'vllm:kv_cache_usage_perc') =>
      `vllm:num_requests_running ${running}\nvllm:num_requests_waiting ${waiting}\n${usageName} ${usage}\n`;
    // Prometheus writes +Inf, -Inf and NaN; JavaScript's Number() reads "Infinity" and "1e400" too.
    // Usage is a 0-1 fraction in vLLM and SGLang alike: 42 is no percent, -5 no idle engine
    for (const usageName of ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc', 'sglang:token_usage'])
      for (const usage of ['+Inf', '-Inf', 'NaN', 'Infinity', '1e400', '-5', '-0.01', '1.01', '42'])
        assert.deepEqual(
          [
            readEngineLoad(page('1', '0', usage, usageName)).kvUsage,
            readEngineLoad(page('1', '0', usage, usageName)).outOfRange,
          ],
          [1, usageName],
          `${usageName} ${usage}`,
        );
    // a full engine is no sample out of range
    assert.equal(readEngineLoad(page('1', '0', '1')).outOfRange, undefined);
    // within rounding of the range: the nearest end of it
    assert.equal(readEngineLoad(page('1', '0', '1.0000000001')).kvUsage, 1);
    assert.equal(readEngineLoad(page('1', '0', '-1e-12')).kvUsage, 0);
    for (const count of ['+Inf', '-Inf', 'NaN', 'Infinity', '1e400', '-1']) {
      const load = readEngineLoad(page(count, count, '0.1'));
      assert.deepEqual(
        [load.running, load.waiting, load.kvUsage],
        [MAX_ENGINE_REQUESTS, MAX_ENGINE_REQUESTS, 0.1],
        count,
      );
      const sglang = readEngineLoad(`sglang:num_running_reqs ${count}\nsglang:num_queue_reqs ${count}\n`);
      assert.deepEqual([sglang.running, sglang.waiting], [MAX_ENGINE_REQUESTS, MAX_ENGINE_REQUESTS], count);
    }
    // one rank's series out of range makes the name's reading the worst, whatever the others say
    const ranks =
      'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_waiting{engine="1"} NaN\nvllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} -5\n';
    assert.deepEqual(readEngineLoad(ranks), {
      running: 0,
      waiting: MAX_ENGINE_REQUESTS,
      kvUsage: 1,
      outOfRange: 'vllm:num_requests_waiting',
    });
    assert.deepEqual(readEngineLoad(ranks, '0'), { running: 0, waiting: 1, kvUsage: 0.2 });
    // a current name out of range is not passed over for the deprecated one
    assert.equal(readEngineLoad(`${page('1', '0', 'NaN')}vllm:gpu_cache_usage_perc 0.1\n`).kvUsage, 1);
    // a huge count, and a sum past what a number holds: held at MAX_ENGINE_REQUESTS, never 0
    const overflowing =
      'vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\nvllm:num_requests_waiting 1e308\n';
    assert.deepEqual(readEngineLoad(overflowing), {
      running: MAX_ENGINE_REQUESTS,
      waiting: MAX_ENGINE_REQUESTS,
      kvUsage: 0,
    });
  });

  test('a page without load metrics is an error', () => {
    assert.throws(() => readEngineLoad('# nothing here\nprocess_cpu_seconds_total 3\n'), MetricsFormatError);
  });
});

/** A page scripts/gen-metrics-fixtures.py rendered with prometheus_client, as the engine renders it. */
const fixture = (name: string): string => readFileSync(new URL(`../fixtures/metrics/${name}`, import.meta.url), 'utf8');

describe('series of one quantity, as the engines export them', () => {
  test('vLLM with 4 API servers, kv_cache_usage_perc without a multiprocess mode: one series per process, the busy one is read', () => {
    const page = fixture('vllm-api-servers.txt');
    // the page the engines write: 4 pid series, the one process holding the engine's stats at 0.653
    assert.equal(page.match(/^vllm:kv_cache_usage_perc\{/gm)?.length, 4);
    const load = {
      running: 7,
      waiting: 3,
      kvUsage: 0.6530455880475035,
      prefixCacheQueries: 12000,
      prefixCacheHits: 9000,
      kvCapacityTokens: 17854 * 16,
    };
    assert.deepEqual(readEngineLoad(page), load);
    assert.deepEqual(readEngineLoad(page, '0'), load);
  });

  test("vLLM serving a hybrid model: the capacity is cache_config_info's kv_cache_size_tokens, not num_gpu_blocks × block_size", () => {
    const page = fixture('vllm-hybrid-kv-size.txt');
    assert.match(page, /kv_cache_size_tokens="463459".*num_gpu_blocks="320"/);
    assert.equal(readKvCapacityTokens(page), 463459);
    assert.equal(readEngineLoad(page).kvCapacityTokens, 463459);
    assert.equal(readEngineLoad(page, '0').kvCapacityTokens, 463459);
  });

  test('SGLang with priority scheduling: the priority="" total is read, not added to its breakdown', () => {
    const page = fixture('sglang-priority.txt');
    assert.match(page, /^sglang:num_running_reqs\{.*priority="5".*\} 4\.0$/m);
    assert.deepEqual(readEngineLoad(page), { running: 10, waiting: 8, kvUsage: 0.5 });
  });

  test('SGLang with metrics for all schedulers: TP ranks are one count, DP ranks are summed (usage averaged)', () => {
    // --tp 2 --dp 2: dp_rank 0 runs 10 and queues 4 at usage 0.5, dp_rank 1 runs 6 and queues 2 at 0.25
    assert.deepEqual(readEngineLoad(fixture('sglang-all-schedulers.txt')), { running: 16, waiting: 6, kvUsage: 0.375 });
    // --tp 2 --ep-size 2: the TP ranks differ in moe_ep_rank as well, and still say one thing
    assert.deepEqual(readEngineLoad(fixture('sglang-expert-parallel.txt')), { running: 5, waiting: 1, kvUsage: 0.7 });
  });

  test('process and rank series: the largest of a group is read, groups are summed (usage averaged)', () => {
    // vLLM data parallel with several API servers: pid series within each engine rank
    const dp = [
      'vllm:num_requests_running{engine="0",pid="11"} 0',
      'vllm:num_requests_running{engine="0",pid="12"} 4',
      'vllm:num_requests_running{engine="1",pid="11"} 2',
      'vllm:num_requests_running{engine="1",pid="12"} 0',
      'vllm:kv_cache_usage_perc{engine="0",pid="11"} 0.8',
      'vllm:kv_cache_usage_perc{engine="0",pid="12"} 0',
      'vllm:kv_cache_usage_perc{engine="1",pid="11"} 0',
      'vllm:kv_cache_usage_perc{engine="1",pid="12"} 0.4',
    ].join('\n');
    const load = readEngineLoad(dp);
    assert.deepEqual([load.running, load.waiting], [6, 0]);
    assert.ok(Math.abs(load.kvUsage - 0.6) < 1e-12, String(load.kvUsage));
    assert.deepEqual(readEngineLoad(dp, '1'), { running: 2, waiting: 0, kvUsage: 0.4 });
    // pp_rank too: pipeline stages of one scheduler report its one count
    assert.equal(
      readEngineLoad('sglang:num_queue_reqs{pp_rank="0"} 3\nsglang:num_queue_reqs{pp_rank="1"} 3\n').waiting,
      3,
    );
  });

  test('a sample out of range in a group of one quantity is still read as the worst', () => {
    const page = [
      'sglang:num_running_reqs{tp_rank="0"} 3',
      'sglang:num_running_reqs{tp_rank="1"} -1',
      'vllm:kv_cache_usage_perc{pid="1"} 0.5',
      'vllm:kv_cache_usage_perc{pid="2"} NaN',
    ].join('\n');
    const load = readEngineLoad(page);
    assert.deepEqual([load.running, load.kvUsage], [MAX_ENGINE_REQUESTS, 1]);
  });

  test('a priority breakdown without its total is the parts of it: summed', () => {
    const page = 'sglang:num_queue_reqs{priority="0"} 2\nsglang:num_queue_reqs{priority="5"} 3\n';
    assert.equal(readEngineLoad(page).waiting, 5);
  });

  test('label values are read with their escapes; a line whose labels cannot be read is skipped', () => {
    const page = [
      'vllm:num_requests_running{model_name="a\\"b,pid=\\"9",pid="1"} 2',
      'vllm:num_requests_running{model_name="a\\"b,pid=\\"9",pid="2"} 5',
      'vllm:num_requests_waiting{engine=0} 7',
      'vllm:num_requests_waiting{="x"} 7',
      'vllm:num_requests_waiting{engine="0"} 1',
    ].join('\n');
    assert.deepEqual(readEngineLoad(page), { running: 5, waiting: 1, kvUsage: 0 });
  });
});

describe('hostile label sets', () => {
  test('a line whose labels are longer than any engine writes is skipped, not a failed page', () => {
    const good = 'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_waiting{engine="0"} 1\n';
    // a label value of 12 million characters made the label pattern overflow the stack (a
    // RangeError that failed the whole scrape); the line is skipped as malformed, as the docs say
    for (const line of [
      `vllm:num_requests_waiting{engine="0",model_name="${'x'.repeat(12_000_000)}"} 7`,
      `vllm:num_requests_waiting{engine="0",model_name="${'\\"'.repeat(6_000_000)}"} 7`,
    ]) {
      const load = readEngineLoad(good + line + '\n');
      assert.equal(load.waiting, 1);
      assert.equal(load.running, 2);
    }
  });
});

describe('pages no engine writes', () => {
  const M = (running: number, usage: number, labels: string): string =>
    `vllm:num_requests_running{${labels}} ${running}\nvllm:kv_cache_usage_perc{${labels}} ${usage}\n`;

  test('series differing in another label than the rank are one reading, their largest: a stale zero is no idle engine', () => {
    // a series left under another model_name (an earlier run's) at 0 beside the live one
    assert.deepEqual(readEngineLoad(M(8, 0.95, 'model_name="new"') + M(0, 0, 'model_name="old"')), {
      running: 8,
      waiting: 0,
      kvUsage: 0.95,
    });
    assert.equal(readEngineLoad(M(0, 0, 'model_name="old"') + M(8, 0.95, 'model_name="new"')).kvUsage, 0.95);
    // thousands of zero series under other labels: still the engine's 0.9
    const zeros: string[] = [];
    for (let i = 0; i < 2000; i++) zeros.push(M(0, 0, `model_name="m",shard="${i}"`));
    const load = readEngineLoad(M(40, 0.9, 'model_name="m"') + zeros.join(''));
    assert.deepEqual([load.running, load.kvUsage], [40, 0.9]);
    // the data-parallel ranks are still the engine's parts, each read as its largest series
    const dp =
      M(3, 0.2, 'engine="0",model_name="new"') +
      M(0, 0, 'engine="0",model_name="old"') +
      M(5, 0.6, 'engine="1",model_name="new"');
    const both = readEngineLoad(dp);
    assert.equal(both.running, 8);
    assert.ok(Math.abs(both.kvUsage - 0.4) < 1e-12, String(both.kvUsage));
    assert.deepEqual(readEngineLoad(dp, '0'), { running: 3, waiting: 0, kvUsage: 0.2 });
  });

  test(`a page with more than ${MAX_LOAD_SERIES} series of the load names is refused, not read`, () => {
    const page = (n: number): string => {
      const lines: string[] = [];
      for (let i = 0; i < n; i++) lines.push(`vllm:num_requests_running{shard="${i}"} 1`);
      return `${lines.join('\n')}\nprocess_cpu_seconds_total 3\n`;
    };
    assert.equal(readEngineLoad(page(MAX_LOAD_SERIES)).running, 1);
    assert.throws(
      () => readEngineLoad(page(MAX_LOAD_SERIES + 1)),
      (err: Error) =>
        err instanceof MetricsFormatError &&
        err.message.includes(`more than ${MAX_LOAD_SERIES} series`) &&
        err.message.includes('vllm:num_requests_running'),
    );
    // the names are counted together
    const half = page(MAX_LOAD_SERIES / 2 + 1);
    assert.throws(() => readEngineLoad(half + half.replaceAll('running', 'waiting')), MetricsFormatError);
    // other names are not counted
    assert.equal(
      readEngineLoad(page(MAX_LOAD_SERIES).replaceAll('vllm:num_requests_running', 'x') + M(2, 0.5, '')).running,
      2,
    );
  });

  test('a label value with a raw newline (the text format escapes it) refuses the page', () => {
    // the rest of the value would read as a sample of its own: running 99 (the sum was 103)
    const forged = 'vllm:num_requests_running{model_name="a\nvllm:num_requests_running 99\n"} 4\n';
    for (const page of [
      forged + M(4, 0.4, 'model_name="a"'),
      forged.replace('vllm:num_requests_running{', 'other{') + M(4, 0.4, ''),
    ]) {
      assert.throws(
        () => readEngineLoad(page),
        (err: Error) =>
          err instanceof MetricsFormatError && /line 1: a label value runs past the end of its line/.test(err.message),
      );
    }
    // escaped, it is a label value like any other
    assert.equal(readEngineLoad(M(4, 0.4, 'model_name="a\\nb"')).running, 4);
    assert.equal(
      parsePrometheusText(M(4, 0.4, 'model_name="a\\nb"'))
        .get('vllm:num_requests_running')?.[0]
        .labels.get('model_name'),
      'a\nb',
    );
  });
});

describe('metrics scraper', () => {
  let page = VLLM;
  let status = 200;
  const server: Server = createServer((_, res) => {
    res.writeHead(status, { 'content-type': 'text/plain' });
    res.end(page);
  });
  after(() => server.close());

  test('feeds the router, marks a failing worker unhealthy and healthy again', async () => {
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/metrics`;
    const router = new KVAwareRouter();
    router.registerWorker('w0');
    router.registerWorker('w1');
    const scraper = new MetricsScraper(router, [{ workerId: 'w0', url }], {
      failuresToUnhealthy: 3,
      successesToHealthy: 2,
    });
    await scraper.scrapeAll();
    const w0 = router.listWorkers()[0];
    assert.equal(w0.load, 0.42);
    assert.equal(w0.waitingRequests, 3);
    assert.equal(w0.runningRequests, 7);

    status = 503;
    await scraper.scrapeAll();
    await scraper.scrapeAll();
    assert.equal(w0.healthy, true, 'two failures are not enough');
    await scraper.scrapeAll();
    assert.equal(w0.healthy, false);
    for (let i = 0; i < 5; i++)
      assert.equal(router.route({ tokens: Array.from({ length: 32 }, (_, k) => k + i) }).workerId, 'w1');

    status = 200;
    page = 'not metrics at all';
    await scraper.scrapeAll();
    assert.equal(w0.healthy, false, 'a page without metrics is a failure');
    page = SGLANG;
    await scraper.scrapeAll();
    await scraper.scrapeAll();
    assert.equal(w0.healthy, true);
    assert.equal(w0.load, 0.25);
    assert.equal(scraper.state('w0')!.failures, 4);
  });

  test('an engine that did nothing between two scrapes, with no request of the router on it, is read as idle', async () => {
    // SGLang's gauges as its last decode log left them: it refreshes them 30 s after going idle
    const frozen = (realtime: number) =>
      'sglang:num_running_reqs{model_name="m"} 3\nsglang:num_queue_reqs{model_name="m"} 2\n' +
      'sglang:token_usage{model_name="m"} 0.97\nsglang:max_total_num_tokens{model_name="m"} 200000\n' +
      `sglang:realtime_tokens_total{model_name="m",mode="decode"} ${realtime}\n`;
    const idle = createServer((_, res) => res.end(page));
    await new Promise<void>((r) => idle.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${(idle.address() as AddressInfo).port}/metrics`;
      const router = new KVAwareRouter({ blockSize: 16 });
      router.registerWorker('w0');
      const w0 = router.listWorkers()[0];
      const scraper = new MetricsScraper(router, [{ workerId: 'w0', url }]);
      page = frozen(500);
      await scraper.scrapeAll();
      assert.equal(w0.load, 0.97, 'a first reading is taken as it is');
      await scraper.scrapeAll();
      assert.equal(w0.load, 0, 'nothing moved and nothing of the router there: idle');
      assert.equal(w0.runningRequests, 0);
      assert.equal(w0.waitingRequests, 0);
      assert.equal(w0.kvCapacityTokens, 200_000);
      // a request of the router's in flight there: the engine's gauges are what it has
      const d = router.route({ tokens: Array.from({ length: 64 }, (_, i) => i) });
      await scraper.scrapeAll();
      assert.equal(w0.load, 0.97);
      router.release(d.ticket);
      // working for others (its counter moved): its gauges are read as they are
      page = frozen(900);
      await scraper.scrapeAll();
      assert.equal(w0.load, 0.97);
      assert.equal(w0.runningRequests, 3);
    } finally {
      idle.close();
      page = VLLM;
    }
  });

  test("an engine whose page did not move is not idle while another replica's requests are on it", async () => {
    // SGLang decoding: its gauges and counters move every 40 decode steps, seconds apart at a
    // large batch, so two scrapes 200 ms apart often read the same page of a busy engine
    const busy =
      'sglang:num_running_reqs{model_name="m"} 48\nsglang:num_queue_reqs{model_name="m"} 9\n' +
      'sglang:token_usage{model_name="m"} 0.93\n' +
      'sglang:realtime_tokens_total{model_name="m",mode="decode"} 7000\n';
    const engine = createServer((_, res) => res.end(busy));
    await new Promise<void>((r) => engine.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${(engine.address() as AddressInfo).port}/metrics`;
      const router = new KVAwareRouter({ blockSize: 16 });
      router.registerWorker('w0');
      const w0 = router.listWorkers()[0];
      // the requests another gateway process (--processes N) or replica has on it, as shared
      router.setRemoteLoad('w0', { inFlightRequests: 57, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
      const scraper = new MetricsScraper(router, [{ workerId: 'w0', url }]);
      await scraper.scrapeAll();
      await scraper.scrapeAll();
      assert.equal(w0.load, 0.93, "the fleet's requests hold its KV: not idle");
      assert.equal(w0.runningRequests, 48);
      assert.equal(w0.waitingRequests, 9);
      // once no replica has any there, the same still page is an idle engine's
      router.setRemoteLoad('w0', { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
      await scraper.scrapeAll();
      assert.equal(w0.load, 0);
    } finally {
      engine.close();
    }
  });

  test('a metrics URL with credentials is scraped with them as Basic authorization, never shown', async () => {
    const seen: (string | undefined)[] = [];
    const guarded = createServer((req, res) => {
      seen.push(req.headers.authorization);
      res.writeHead(req.headers.authorization === `Basic ${Buffer.from('user:s3cret').toString('base64')}` ? 200 : 401);
      res.end(VLLM);
    });
    await new Promise<void>((r) => guarded.listen(0, '127.0.0.1', r));
    try {
      const port = (guarded.address() as AddressInfo).port;
      const router = new KVAwareRouter();
      router.registerWorker('w0');
      const logged: string[] = [];
      const scraper = new MetricsScraper(
        router,
        [{ workerId: 'w0', url: `http://user:s3cret@127.0.0.1:${port}/metrics` }],
        { failuresToUnhealthy: 1, log: (m) => logged.push(m) },
      );
      await scraper.scrapeAll();
      assert.equal(scraper.state('w0')!.lastError, undefined, scraper.state('w0')!.lastError);
      assert.equal(router.listWorkers()[0].load, 0.42);
      assert.equal(seen.length, 1);
      // a scrape that fails says so without the password
      const down = new MetricsScraper(router, [{ workerId: 'w0', url: 'http://user:s3cret@127.0.0.1:1/metrics' }], {
        failuresToUnhealthy: 1,
        timeoutMs: 500,
        log: (m) => logged.push(m),
      });
      await down.scrapeAll();
      assert.ok(down.state('w0')!.lastError);
      assert.doesNotMatch(`${down.state('w0')!.lastError} ${logged.join(' ')}`, /s3cret/);
    } finally {
      guarded.close();
    }
  });

  test('an engine reporting a load sample out of range is logged when it starts and when it stops, not every scrape', async () => {
    let body = VLLM;
    const server = createServer((_req, res) => res.writeHead(200).end(body));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const router = new KVAwareRouter();
      router.registerWorker('w0');
      const logged: string[] = [];
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/metrics`;
      const scraper = new MetricsScraper(router, [{ workerId: 'w0', url }], { log: (m) => logged.push(m) });
      await scraper.scrapeAll();
      assert.deepEqual(logged, []);
      body = VLLM.replace(/^vllm:num_requests_waiting(\{[^}]*\})? .*$/m, 'vllm:num_requests_waiting -3');
      await scraper.scrapeAll();
      await scraper.scrapeAll();
      assert.equal(router.listWorkers()[0].waitingRequests, MAX_ENGINE_REQUESTS, 'read as the worst');
      assert.deepEqual(logged, [
        'metrics: w0 reports vllm:num_requests_waiting out of its range (negative, NaN or infinite): read as its worst load while it does',
      ]);
      body = VLLM;
      await scraper.scrapeAll();
      assert.deepEqual(logged.slice(1), ['metrics: w0 reports vllm:num_requests_waiting in range again']);
    } finally {
      server.close();
    }
  });

  test('a worker the scrape takes out of rotation is logged once with the scrape error, named once as metrics', async () => {
    const router = new KVAwareRouter();
    router.registerWorker('w0');
    const logged: string[] = [];
    const health = new WorkerHealth(router, (m) => logged.push(m));
    const scraper = new MetricsScraper(router, [{ workerId: 'w0', url: 'http://127.0.0.1:1/metrics' }], {
      failuresToUnhealthy: 1,
      timeoutMs: 500,
      health,
    });
    await scraper.scrapeAll();
    assert.equal(router.listWorkers()[0].healthy, false);
    const line = logged.find((l) => l.startsWith('w0 is out of rotation'));
    assert.ok(line, logged.join('\n'));
    assert.match(line, /^w0 is out of rotation \(metrics: (?!metrics:)/);
  });

  test('a short scrape interval does not make the scrape time out sooner than an engine answers', async () => {
    // the page comes 30 ms after the request: slow for a 1 ms interval, quick for an engine
    const slow = createServer((_, res) => void setTimeout(() => res.end(VLLM), 30));
    await new Promise<void>((r) => slow.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${(slow.address() as AddressInfo).port}/metrics`;
      const router = new KVAwareRouter();
      router.registerWorker('w0');
      const scraper = new MetricsScraper(router, [{ workerId: 'w0', url }], { intervalMs: 1, failuresToUnhealthy: 1 });
      await scraper.scrapeAll();
      assert.equal(scraper.state('w0')!.lastError, undefined);
      assert.equal(router.listWorkers()[0].healthy, true);
      assert.equal(router.listWorkers()[0].load, 0.42);
    } finally {
      slow.close();
    }
  });

  test('engines reporting impossible load are never preferred to healthy ones, and a good reading does not outlive it', async () => {
    const healthy = 'vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n';
    const pages: Record<string, string> = {
      h0: healthy,
      h1: healthy,
      inf: 'vllm:num_requests_running 0\nvllm:num_requests_waiting 1e308\nvllm:gpu_cache_usage_perc +Inf\n',
      nan: 'vllm:num_requests_running NaN\nvllm:num_requests_waiting -3\nvllm:kv_cache_usage_perc -5\n',
      sglang: 'sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:token_usage NaN\n',
    };
    const server = createServer((req, res) => res.end(pages[(req.url ?? '').slice(1)]));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      const router = new KVAwareRouter();
      for (const id of Object.keys(pages)) router.registerWorker(id);
      const scraper = new MetricsScraper(
        router,
        Object.keys(pages).map((id) => ({ workerId: id, url: `${base}/${id}` })),
      );
      await scraper.scrapeAll();
      const chosen: string[] = [];
      for (let i = 0; i < 12; i++) {
        const d = router.route({ tokens: Array.from({ length: 64 }, (_, k) => k + 1000 * i) });
        chosen.push(d.workerId);
        router.release(d.ticket);
      }
      assert.deepEqual(
        chosen.filter((id) => !id.startsWith('h')),
        [],
        `chosen: ${chosen.join(' ')}`,
      );
      const byId = new Map(router.listWorkers().map((w) => [w.id, w]));
      for (const id of ['inf', 'nan', 'sglang']) assert.equal(byId.get(id)!.load, 1, id);
      assert.equal(byId.get('inf')!.waitingRequests, MAX_ENGINE_REQUESTS);
      assert.equal(byId.get('nan')!.waitingRequests, MAX_ENGINE_REQUESTS);
      assert.equal(byId.get('nan')!.runningRequests, MAX_ENGINE_REQUESTS);
      // an engine read well before is not kept at its last good reading once it reports nonsense
      pages.h0 = 'vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc NaN\n';
      await scraper.scrapeAll();
      assert.equal(byId.get('h0')!.load, 1);
      assert.equal(byId.get('h0')!.healthy, true, 'the engine answers: it stays in rotation, as the least attractive');
    } finally {
      server.close();
    }
  });

  test('an engine that does not answer counts as a failure', async () => {
    const router = new KVAwareRouter();
    router.registerWorker('gone');
    const scraper = new MetricsScraper(router, [{ workerId: 'gone', url: 'http://127.0.0.1:1/metrics' }], {
      failuresToUnhealthy: 1,
      timeoutMs: 500,
    });
    await scraper.scrapeAll();
    assert.equal(router.listWorkers()[0].healthy, false);
    assert.ok(scraper.state('gone')!.lastError);
  });
});
