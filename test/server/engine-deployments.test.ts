import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { after, describe, test } from 'node:test';
import { MockEngine, mockTokenize } from '../../src/engines/mock-engine.js';
import { KvEventPublisher } from '../../src/engines/kv-events/publisher.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayOptions } from '../../src/server/gateway.js';
import { listening } from '../helpers/listening.js';
import { until } from '../helpers/wait.js';

// The gateway in front of the mock engine's deployment shapes: data-parallel ranks, LoRA
// adapters, vLLM block hashes, the engine's /tokenize with tools; real ZeroMQ streams.
const cleanup: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanup.reverse()) await c();
});
const adminToken = 'deployments-admin-token';
const post = (base: string, path: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${base}${path}`, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}`, ...headers },
  });
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = Record<string, any>;

/** A mock engine whose ranks publish on consecutive ports (found by trying). */
async function engineOnPorts(options: ConstructorParameters<typeof MockEngine>[0]) {
  for (let attempt = 0; ; attempt++) {
    const base = 20_000 + Math.floor(Math.random() * 30_000);
    const engine = new MockEngine({
      ...options,
      events: `tcp://127.0.0.1:${base}`,
      replay: `tcp://127.0.0.1:${base + 1000}`,
    });
    try {
      const e = await engine.start();
      cleanup.push(() => e.close());
      return { e, events: `tcp://127.0.0.1:${base}`, replay: `tcp://127.0.0.1:${base + 1000}` };
    } catch (err) {
      if (attempt > 20) throw err;
    }
  }
}

/** A gateway with the admin token and no background polling, listening on a free port (closed after the file). */
async function listeningGateway(options: Omit<GatewayOptions, 'adminToken'>): Promise<string> {
  const gateway = await createGateway({ adminToken, metricsIntervalMs: 0, healthCheckIntervalMs: 0, ...options });
  cleanup.push(() => gateway.close());
  return gateway.app.listen({ host: '127.0.0.1', port: 0 });
}

/**
 * A KV-event publisher (with `publisher` options) and a gateway (tokenize engine, KV events, a
 * precise router of 4-token blocks, with `options` added) whose one worker 'w', at a port nothing
 * listens on, reads that publisher's stream; both closed after the file.
 */
async function gatewayOnPublisher(
  publisher: { encoding?: 'map' | 'array' } = {},
  worker: { dpSize?: number } = {},
  options: Partial<GatewayOptions> = {},
) {
  const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*', ...publisher }).start();
  cleanup.push(() => pub.close());
  const base = await listeningGateway({
    router: new KVAwareRouter({ blockSize: 4, indexMode: 'precise' }),
    tokenize: 'engine',
    kvEvents: true,
    ...options,
    workers: [{ id: 'w', url: 'http://127.0.0.1:1', events: pub.endpoint, ...worker }],
  });
  return { pub, base };
}

/** A BlockStored event of the engine's GPU cache, of no LoRA adapter. */
const blockStored = (fields: {
  blockHashes: bigint[];
  parentBlockHash: bigint | null;
  tokenIds: number[];
  blockSize: number;
}) => ({ type: 'BlockStored' as const, ...fields, loraId: null, medium: 'GPU', loraName: null, groupIdx: null });

const words = (n: number, seed: number) => Array.from({ length: n }, (_, i) => `w${(i * 13 + seed) % 991}`).join(' ');

/**
 * Sends `prompt` straight to the engine at `port`, to its core of index `index` there
 * (X-data-parallel-rank), waits until the gateway at `base` has that core's events, and checks
 * that /v1/route answers worker 'w' at global rank `rank`.
 */
async function routedAfterRankComputes(port: number, base: string, prompt: string, index: number, rank: number) {
  const direct = await post(
    `http://127.0.0.1:${port}`,
    '/v1/completions',
    { prompt, max_tokens: 1 },
    { 'x-data-parallel-rank': String(index) },
  );
  assert.equal(direct.status, 200);
  await until(
    async () => ((await (await post(base, '/v1/route', { prompt })).json()) as Json).cachedTokens > 0,
    `rank ${rank}'s events`,
  );
  const r = (await (await post(base, '/v1/route', { prompt })).json()) as Json;
  assert.equal(r.worker, 'w');
  assert.equal(r.rank, rank);
}

describe('gateway: engine deployment shapes', () => {
  test('dp-size: one index per rank; requests carry X-data-parallel-rank; /v1/route answers the rank', async () => {
    const { e, events, replay } = await engineOnPorts({ dataParallelSize: 2, blockSize: 4 });
    const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise', speculativeBlocks: 0 });
    const base = await listeningGateway({
      router,
      tokenize: 'engine',
      kvEvents: true,
      workers: [{ id: 'w', url: `http://127.0.0.1:${e.port}`, events, replay, dpSize: 2 }],
    });
    const prompt = words(60, 1);
    // the engine puts it on rank 1 (the header given by the client is the engine's business)
    await routedAfterRankComputes(e.port, base, prompt, 1, 1);
    // proxied: the router sends it to rank 1 with the header, where the engine finds its cache
    const res = await post(base, '/v1/completions', { prompt, max_tokens: 1 });
    const body = (await res.json()) as Json;
    assert.equal(res.headers.get('x-contextforge-worker'), 'w');
    assert.ok(body.usage.prompt_tokens_details.cached_tokens > 0, 'served by the rank holding the prefix');
    assert.equal(e.cacheListing(0).length, 0, 'rank 0 never saw it');
  });

  test('dp-start-rank: a node of ranks S… (hybrid load balancing) is indexed by global rank, named by local index in the header', async () => {
    // vLLM --data-parallel-size-local 2 --data-parallel-start-rank 4: ranks 4 and 5 publish on the
    // configured port + 4 and + 5, stamped 4 and 5; the API server takes them as header 0 and 1
    const { e, events, replay } = await engineOnPorts({ dataParallelSize: 2, dataParallelStartRank: 4, blockSize: 4 });
    assert.deepEqual(
      e.eventsEndpoints.map((x) => Number(x.split(':').pop()) - Number(events.split(':').pop())),
      [4, 5],
    );
    const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise', speculativeBlocks: 0 });
    const base = await listeningGateway({
      router,
      tokenize: 'engine',
      kvEvents: true,
      workers: [{ id: 'w', url: `http://127.0.0.1:${e.port}`, events, replay, dpSize: 2, dpStartRank: 4 }],
    });
    assert.deepEqual(
      router
        .listWorkers()
        .map((w) => w.id)
        .sort(),
      ['w#4', 'w#5'],
    );
    const prompt = words(60, 3);
    // the engine's second core (rank 5) computes it
    await routedAfterRankComputes(e.port, base, prompt, 1, 5);
    const listed = (await (
      await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${adminToken}` } })
    ).json()) as Json;
    for (const w of listed.workers as Json[]) {
      assert.equal(w.kvEvents.unknownRanks, 0, `${w.id}: every batch is its rank's`);
      assert.equal(w.worker, 'w');
      assert.equal(w.id, `w#${w.rank}`);
    }
    // proxied with the header the API server takes for rank 5 (1), where the cache is
    const res = await post(base, '/v1/completions', { prompt, max_tokens: 1 });
    const body = (await res.json()) as Json;
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('x-contextforge-rank'), '5');
    assert.ok(body.usage.prompt_tokens_details.cached_tokens > 0, 'served by the core holding the prefix');
    assert.equal(e.cacheListing(0).length, 0, 'rank 4 never saw it');
  });

  test('dp-start-rank: each rank reads its own engine="S+i" series of the /metrics page', async () => {
    // a vLLM node of ranks 4 and 5: its /metrics names engine indexes 4 and 5
    const series = (engine: number, running: number, waiting: number) => [
      `vllm:num_requests_running{engine="${engine}",model_name="m"} ${running}.0`,
      `vllm:num_requests_waiting{engine="${engine}",model_name="m"} ${waiting}.0`,
      `vllm:kv_cache_usage_perc{engine="${engine}",model_name="m"} 0.5`,
    ];
    const page = [...series(4, 3, 1), ...series(5, 7, 2)].join('\n');
    const engine = await listening(
      createServer((req, res) => {
        req.resume();
        if (req.url === '/metrics') return void res.writeHead(200, { 'content-type': 'text/plain' }).end(`${page}\n`);
        if (req.url === '/v1/models')
          return void res
            .writeHead(200, { 'content-type': 'application/json' })
            .end(JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model' }] }));
        res.writeHead(200).end();
      }),
    );
    cleanup.push(() => engine.close());
    const router = new KVAwareRouter();
    await listeningGateway({
      router,
      workers: [{ id: 'v', url: engine.url, dpSize: 2, dpStartRank: 4 }],
      metricsIntervalMs: 20,
    });
    const read = (id: string) => {
      const w = router.listWorkers().find((x) => x.id === id)!;
      return { running: w.runningRequests, waiting: w.waitingRequests };
    };
    await until(() => read('v#4').running > 0 && read('v#5').running > 0, 'both ranks scraped');
    assert.deepEqual(read('v#4'), { running: 3, waiting: 1 });
    assert.deepEqual(read('v#5'), { running: 7, waiting: 2 });
  });

  test("LoRA: a request naming an adapter (from the engine's /v1/models) matches the adapter's blocks only", async () => {
    const e = await new MockEngine({
      loraModules: ['sql'],
      blockSize: 4,
      events: 'tcp://127.0.0.1:*',
      replay: 'tcp://127.0.0.1:*',
    }).start();
    cleanup.push(() => e.close());
    const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise', speculativeBlocks: 0 });
    const base = await listeningGateway({
      router,
      tokenize: 'engine',
      kvEvents: true,
      workers: [
        {
          id: 'w',
          url: `http://127.0.0.1:${e.port}`,
          events: e.eventsEndpoint,
          replay: e.replayEndpoint,
          models: ['mock'],
        },
      ],
    });
    const prompt = words(60, 2);
    await until(
      async () => (await post(base, '/v1/completions', { model: 'sql', prompt, max_tokens: 1 })).status === 200,
      'the adapter to be known',
    );
    await until(
      async () => ((await (await post(base, '/v1/route', { model: 'sql', prompt })).json()) as Json).cachedTokens > 0,
      "the adapter's events",
    );
    const base_ = (await (await post(base, '/v1/route', { model: 'mock', prompt })).json()) as Json;
    assert.equal(base_.cachedTokens, 0, "the base model holds none of the adapter's blocks");
  });

  test("--block-hash vllm: requests are keyed by vLLM's own hash; stores whose chain the router never saw still match", async () => {
    const e = await new MockEngine({ blockSize: 4, blockHash: 'vllm', pythonHashSeed: '0' }).start();
    cleanup.push(() => e.close());
    const router = new KVAwareRouter({
      blockSize: 4,
      indexMode: 'precise',
      speculativeBlocks: 0,
      blockHash: 'vllm',
      pythonHashSeed: '0',
    });
    const pub = await new KvEventPublisher({ endpoint: 'tcp://127.0.0.1:*' }).start();
    cleanup.push(() => pub.close());
    const base = await listeningGateway({
      router,
      tokenize: 'engine',
      kvEvents: true,
      workers: [{ id: 'w', url: `http://127.0.0.1:${e.port}`, events: pub.endpoint }],
    });
    const prompt = words(40, 3);
    const tokens = mockTokenize(prompt);
    // the engine's store of blocks 2.. of the prompt, whose parent (block 1) the router never saw stored
    const { VllmBlockHasher } = await import('../../src/core/vllm-block-hash.js');
    const { BlockHashes } = await import('../../src/core/hashing.js');
    const keys = new VllmBlockHasher('0').hashBlocks(tokens, 4, {}, new BlockHashes());
    const stored = blockStored({
      blockHashes: [keys.toBigInt(2), keys.toBigInt(3)],
      parentBlockHash: keys.toBigInt(1),
      tokenIds: tokens.slice(8, 16),
      blockSize: 4,
    });
    await until(async () => {
      await pub.publish({ ts: Date.now() / 1000, events: [stored], dataParallelRank: 0 });
      return ((await (await post(base, '/v1/route', { prompt })).json()) as Json).cachedTokens === 16;
    }, 'blocks 1-3 (the parent proven by the store)');
  });

  test('--tokenize engine forwards model, tools and chat_template_kwargs to /tokenize of a worker serving the model', async () => {
    const a = await new MockEngine({ model: 'alpha' }).start();
    const b = await new MockEngine({ model: 'beta' }).start();
    cleanup.push(
      () => a.close(),
      () => b.close(),
    );
    const router = new KVAwareRouter({ blockSize: 4 });
    const base = await listeningGateway({
      router,
      tokenize: 'engine',
      workers: [
        { id: 'a', url: `http://127.0.0.1:${a.port}`, models: ['alpha'] },
        { id: 'b', url: `http://127.0.0.1:${b.port}`, models: ['beta'] },
      ],
    });
    const messages = [{ role: 'user', content: 'weather?' }];
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }];
    const plain = (await (await post(base, '/v1/route', { model: 'beta', messages })).json()) as Json;
    const withTools = (await (
      await post(base, '/v1/route', {
        model: 'beta',
        messages,
        tools,
        chat_template_kwargs: { enable_thinking: false },
      })
    ).json()) as Json;
    const expected = (await (
      await post(`http://127.0.0.1:${b.port}`, '/tokenize', {
        model: 'beta',
        messages,
        tools,
        chat_template_kwargs: { enable_thinking: false },
      })
    ).json()) as Json;
    assert.equal(withTools.promptTokens, expected.count, 'the tools and kwargs reached /tokenize');
    assert.ok(withTools.promptTokens > plain.promptTokens);
    assert.equal(withTools.worker, 'b');
  });

  test('skipped KV events are counted per worker and reason in /metrics', async () => {
    const { pub, base } = await gatewayOnPublisher({ encoding: 'array' });
    const wrongSize = blockStored({
      blockHashes: [1n],
      parentBlockHash: null,
      tokenIds: [1, 2, 3, 4, 5, 6, 7, 8],
      blockSize: 8,
    });
    await until(async () => {
      await pub.publish({ ts: Date.now() / 1000, events: [wrongSize], dataParallelRank: 0 });
      return /contextforge_kv_events_skipped_total\{worker="w",reason="block_size"\} [1-9]/.test(
        await (await fetch(`${base}/metrics`)).text(),
      );
    }, 'the skip counter');
  });

  test('a worker listed without dp-size takes every batch of its endpoint whatever its rank (one API server per rank)', async () => {
    // vLLM with --data-parallel-rank 3 (external load balancing, one pod per rank) stamps its
    // batches with rank 3; listed as a plain worker, its stream is its own
    const { pub, base } = await gatewayOnPublisher();
    const stored = blockStored({ blockHashes: [1n], parentBlockHash: null, tokenIds: [1, 2, 3, 4], blockSize: 4 });
    const workers = async () =>
      (
        (await (
          await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${adminToken}` } })
        ).json()) as Json
      ).workers as Json[];
    await until(async () => {
      await pub.publish({ ts: Date.now() / 1000, events: [stored], dataParallelRank: 3 });
      return ((await workers())[0].kvEvents?.batches ?? 0) > 0;
    }, 'a batch of rank 3 applied');
    const w = (await workers())[0];
    assert.equal(w.kvEvents.unknownRanks, 0);
    assert.ok(w.indexEntries > 0, 'its blocks are indexed');
  });

  test('with dp-size, a batch of a rank the worker does not have is skipped, counted as unknown_rank and logged once', async () => {
    const logs: string[] = [];
    const { pub, base } = await gatewayOnPublisher({}, { dpSize: 2 }, { log: (m) => logs.push(m) });
    await until(async () => {
      await pub.publish({ ts: Date.now() / 1000, events: [], dataParallelRank: 5 });
      return /contextforge_kv_events_skipped_total\{worker="w#0",reason="unknown_rank"\} ([2-9]|\d\d)/.test(
        await (await fetch(`${base}/metrics`)).text(),
      );
    }, 'two batches counted under unknown_rank');
    const lines = logs.filter((l) => /rank 5/.test(l));
    assert.equal(lines.length, 1, `logged once: ${logs.join(' | ')}`);
    assert.match(lines[0], /dp-size/);
  });

  test("with dp-size, a batch stamped with another rank than its port's is skipped as unknown_rank, not applied to that rank", async () => {
    // vLLM publishes each rank's events on its own port (the events port + rank): rank 1's
    // entries are cleared when rank 1's stream breaks, so a batch of rank 1 arriving on rank 0's
    // port must not write into them
    const logs: string[] = [];
    const { pub, base } = await gatewayOnPublisher({}, { dpSize: 2 }, { log: (m) => logs.push(m) });
    const stored = blockStored({ blockHashes: [1n], parentBlockHash: null, tokenIds: [1, 2, 3, 4], blockSize: 4 });
    await until(async () => {
      await pub.publish({ ts: Date.now() / 1000, events: [stored], dataParallelRank: 1 });
      return /contextforge_kv_events_skipped_total\{worker="w#0",reason="unknown_rank"\} ([2-9]|\d\d)/.test(
        await (await fetch(`${base}/metrics`)).text(),
      );
    }, 'two batches counted under unknown_rank');
    const workers = (
      (await (
        await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${adminToken}` } })
      ).json()) as Json
    ).workers as Json[];
    for (const w of workers) assert.equal(w.indexEntries, 0, `${w.id} holds nothing`);
    const lines = logs.filter((l) => /rank 1/.test(l) && /unknown_rank/.test(l));
    assert.equal(lines.length, 1, `logged once: ${logs.join(' | ')}`);
    assert.match(lines[0], /port/);
  });

  test('with dp-size, a batch stamped with a negative rank is unknown_rank, logged once, not a malformed batch', async () => {
    const logs: string[] = [];
    const { pub, base } = await gatewayOnPublisher({}, { dpSize: 2 }, { log: (m) => logs.push(m) });
    let metrics = '';
    await until(async () => {
      await pub.publish({ ts: Date.now() / 1000, events: [], dataParallelRank: -3 });
      metrics = await (await fetch(`${base}/metrics`)).text();
      return /contextforge_kv_events_skipped_total\{worker="w#0",reason="unknown_rank"\} ([2-9]|\d\d)/.test(metrics);
    }, 'two batches counted under unknown_rank');
    assert.doesNotMatch(metrics, /reason="malformed_batch"/);
    const lines = logs.filter((l) => /rank -3/.test(l));
    assert.equal(lines.length, 1, `logged once: ${logs.join(' | ')}`);
    assert.match(lines[0], /dp-size/);
  });

  test('a prompt given as token ids is hashed as those tokens in every tokenize mode', async () => {
    const { ChatTokenizer } = await import('../../src/engines/chat-tokenizer.js');
    const promptTokenizer = ChatTokenizer.load(new URL('../fixtures/tokenizer/', import.meta.url).pathname);
    for (const tokenize of ['text', 'tokenizer', 'engine'] as const) {
      const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
      const base = await listeningGateway({
        router,
        tokenize,
        promptTokenizer,
        workers: [{ id: 'a', url: 'http://127.0.0.1:1' }],
      });
      const events = [
        {
          type: 'BlockStored',
          block_hashes: [1, 2],
          parent_block_hash: null,
          token_ids: [5, 6, 7, 8, 9, 10, 11, 12],
          block_size: 4,
          lora_id: null,
          medium: 'GPU',
          lora_name: null,
        },
      ];
      assert.equal((await post(base, '/admin/events', { worker: 'a', events })).status, 200);
      const r = (await (await post(base, '/v1/route', { prompt: [5, 6, 7, 8, 9, 10, 11, 12, 13] })).json()) as Json;
      assert.equal(r.cachedTokens, 8, tokenize);
      assert.equal(r.promptTokens, 9, tokenize);
    }
  });

  test('tokenizer mode routes a chat with an image on its text instead of refusing it', async () => {
    const { ChatTokenizer } = await import('../../src/engines/chat-tokenizer.js');
    const promptTokenizer = ChatTokenizer.load(new URL('../fixtures/tokenizer/', import.meta.url).pathname);
    const router = new KVAwareRouter({ blockSize: 4 });
    const base = await listeningGateway({
      router,
      tokenize: 'tokenizer',
      promptTokenizer,
      workers: [{ id: 'a', url: 'http://127.0.0.1:1' }],
    });
    const messages = [
      {
        role: 'user',
        content: [
          { type: 'text', text: 'what is in this picture?' },
          { type: 'image_url', image_url: { url: 'http://example.com/cat.png' } },
        ],
      },
    ];
    const res = await post(base, '/v1/route', { messages });
    assert.equal(res.status, 200);
    assert.equal(((await res.json()) as Json).worker, 'a');
  });
});
