/**
 * A data-parallel SGLang worker (`dp-size=2`) through the gateway: its one /metrics page labels
 * each rank's series `dp_rank` (python/sglang/srt/observability/metrics_collector.py), and each
 * rank's router worker reads its own load and KV capacity (sglang:max_total_num_tokens).
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { listening } from '../helpers/listening.js';
import { until } from '../helpers/wait.js';

const labels = (dp: number) =>
  `dp_rank="${dp}",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"`;
const PAGE = [
  [0, 1, 0, 0.1, 100000],
  [1, 30, 40, 0.9, 80000],
]
  .flatMap(([dp, running, waiting, usage, capacity]) => [
    `sglang:num_running_reqs{${labels(dp)}} ${running}.0`,
    `sglang:num_queue_reqs{${labels(dp)}} ${waiting}.0`,
    `sglang:token_usage{${labels(dp)}} ${usage}`,
    `sglang:max_total_num_tokens{${labels(dp)}} ${capacity}.0`,
  ])
  .join('\n');

test("each rank of a dp-size SGLang worker reads its own dp_rank's load and KV capacity", async () => {
  const engine = await listening(
    createServer((req, res) => {
      req.resume();
      if (req.url === '/metrics') return void res.writeHead(200, { 'content-type': 'text/plain' }).end(`${PAGE}\n`);
      if (req.url === '/v1/models')
        return void res
          .writeHead(200, { 'content-type': 'application/json' })
          .end(JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model' }] }));
      res.writeHead(200).end();
    }),
  );
  const router = new KVAwareRouter();
  const gateway = await createGateway({
    router,
    workers: [{ id: 's', url: engine.url, dpSize: 2 }],
    healthCheckIntervalMs: 0,
    metricsIntervalMs: 20,
  });
  try {
    const rank = (id: string) => router.listWorkers().find((w) => w.id === id)!;
    await until(() => rank('s#0').kvCapacityTokens > 0 && rank('s#1').kvCapacityTokens > 0, 'both ranks scraped');
    const read = (id: string) => {
      const w = rank(id);
      return { running: w.runningRequests, waiting: w.waitingRequests, usage: w.load, capacity: w.kvCapacityTokens };
    };
    assert.deepEqual(read('s#0'), { running: 1, waiting: 0, usage: 0.1, capacity: 100000 });
    assert.deepEqual(read('s#1'), { running: 30, waiting: 40, usage: 0.9, capacity: 80000 });
  } finally {
    await gateway.close(0);
    await engine.close();
  }
});
