import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { KvEventSubscriber } from '../../src/engines/kv-events/subscriber.js';
import { MockEngine, mockTokenize, offsetEndpointPort } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { until } from '../helpers/wait.js';

const closers: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

async function engine(options: ConstructorParameters<typeof MockEngine>[0] = {}) {
  const e = await new MockEngine({ decodeTokS: 2000, ...options }).start();
  closers.push(() => e.close());
  return e;
}
const post = (e: MockEngine, path: string, body: unknown) =>
  fetch(`http://127.0.0.1:${e.port}${path}`, {
    method: 'POST',
    body: typeof body === 'string' ? body : JSON.stringify(body),
    headers: { 'content-type': 'application/json' },
  });

// response bodies are checked field by field below
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = Record<string, any>;
const read = async (res: Response | Promise<Response>) => (await (await res).json()) as Json;
const words = (n: number, seed = 0) => Array.from({ length: n }, (_, i) => `w${(i * 7 + seed) % 997}`).join(' ');

describe('mock engine: OpenAI API', () => {
  test('models, completions, chat with streaming and the usage chunk, tokenize', async () => {
    const e = await engine();
    const models = await read(fetch(`http://127.0.0.1:${e.port}/v1/models`));
    assert.equal(models.data[0].id, 'mock');

    const c = await read(post(e, '/v1/completions', { model: 'mock', prompt: 'Hello world, again.', max_tokens: 4 }));
    assert.equal(c.object, 'text_completion');
    assert.equal(c.usage.completion_tokens, 4);
    assert.equal(c.choices[0].finish_reason, 'length');

    const tok = await read(post(e, '/tokenize', { prompt: 'Hello world, again.' }));
    assert.deepEqual(tok.tokens, mockTokenize('Hello world, again.'));
    assert.equal(c.usage.prompt_tokens, tok.count);

    const byIds = await read(post(e, '/v1/completions', { prompt: tok.tokens, max_tokens: 1 }));
    assert.equal(byIds.usage.prompt_tokens, tok.count);

    const res = await post(e, '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
    });
    assert.equal(res.headers.get('content-type'), 'text/event-stream');
    const events = (await res.text()).split('\n\n').filter(Boolean);
    assert.equal(events[events.length - 1], 'data: [DONE]');
    const chunks = events.slice(0, -1).map((ev) => JSON.parse(ev.slice(6)));
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    const usage = chunks[chunks.length - 1];
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.usage.completion_tokens, 5);
    const text = chunks.map((ch) => ch.choices[0]?.delta?.content ?? '').join('');
    assert.equal(text, 'tok0 tok1 tok2 tok3 tok4 ');
  });

  test('a repeated prompt finds its prefix cached', async () => {
    const e = await engine({ blockSize: 16 });
    const prompt = words(400);
    const first = await read(post(e, '/v1/completions', { prompt, max_tokens: 1 }));
    const second = await read(post(e, '/v1/completions', { prompt, max_tokens: 1 }));
    assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(second.usage.prompt_tokens_details.cached_tokens, Math.floor(first.usage.prompt_tokens / 16) * 16);
    const salted = await read(post(e, '/v1/completions', { prompt, max_tokens: 1, cache_salt: 'tenant-b' }));
    assert.equal(salted.usage.prompt_tokens_details.cached_tokens, 0, 'a different cache_salt shares nothing');
    // null is no salt, as vLLM reads it (Optional[str]): the unsalted prefix is found
    const unsalted = await read(post(e, '/v1/completions', { prompt, max_tokens: 1, cache_salt: null }));
    assert.equal(unsalted.usage.prompt_tokens_details.cached_tokens, second.usage.prompt_tokens_details.cached_tokens);
  });

  test('a client that disconnects takes its request out of the engine', async () => {
    const e = await engine({ decodeTokS: 50 });
    const ac = new AbortController();
    const res = await fetch(`http://127.0.0.1:${e.port}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: 'long story', max_tokens: 5000, stream: true }),
      signal: ac.signal,
    });
    const reader = res.body!.getReader();
    await reader.read(); // the first token arrived: the request is running
    const running = async () =>
      /vllm:num_requests_running\{[^}]*\} (\d+)/.exec(
        await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text(),
      )![1];
    assert.equal(await running(), '1');
    ac.abort();
    await until(async () => (await running()) === '0', 'the engine to drop the request');
  });

  test('bad requests get a 4xx JSON error and the engine stays up', async () => {
    const e = await engine({ maxBodyBytes: 1000 });
    const cases: Array<[string, unknown, number, RegExp]> = [
      ['/v1/completions', '{not json', 400, /not valid JSON/],
      ['/v1/completions', [1, 2], 400, /JSON object/],
      ['/v1/completions', { prompt: '' }, 400, /prompt is empty/],
      ['/v1/completions', { prompt: 'x', max_tokens: 0 }, 400, /max_tokens/],
      ['/v1/completions', { prompt: 'x', model: 'other' }, 404, /does not exist/],
      // a model that is not a string, even one no String() can print, is the client's mistake (vLLM: 400)
      ['/v1/completions', { prompt: 'x', model: { toString: 1 } }, 400, /model must be a string/],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], model: 5 }, 400, /model must be a string/],
      ['/tokenize', { prompt: 'x', model: { toString: 1 } }, 400, /model must be a string/],
      ['/v1/completions', { prompt: { a: 1 } }, 400, /prompt must be/],
      ['/v1/chat/completions', { messages: [] }, 400, /messages/],
      ['/v1/chat/completions', { messages: [{ content: 'x' }] }, 400, /role/],
      ['/v1/completions', { prompt: 'x', cache_salt: 5 }, 400, /cache_salt/],
      ['/v1/completions', { prompt: 'x'.repeat(2000) }, 413, /over 1000 bytes/],
      ['/v1/nope', {}, 404, /no route/],
    ];
    for (const [path, body, status, message] of cases) {
      const res = await post(e, path, body);
      assert.equal(res.status, status, `${path} ${JSON.stringify(body).slice(0, 40)}`);
      const err = (await res.json()) as Json;
      assert.match(err.error.message, message);
    }
    assert.equal((await fetch(`http://127.0.0.1:${e.port}/health`)).status, 200);
  });

  test("an adapter unloaded at run time is listed and served no more, with vLLM's 404", async () => {
    const e = await engine({ loraModules: ['sql', 'chat-v2'] });
    const ids = async () =>
      ((await read(fetch(`http://127.0.0.1:${e.port}/v1/models`))).data as Json[]).map((m) => m.id);
    assert.equal((await post(e, '/v1/completions', { model: 'sql', prompt: 'x', max_tokens: 1 })).status, 200);
    const unloaded = await post(e, '/v1/unload_lora_adapter', { lora_name: 'sql' });
    assert.equal(unloaded.status, 200);
    assert.match(await unloaded.text(), /Success: LoRA adapter 'sql' removed/);
    assert.deepEqual(await ids(), ['mock', 'chat-v2']);
    for (const stream of [false, true]) {
      const res = await post(e, '/v1/completions', { model: 'sql', prompt: 'x', max_tokens: 1, stream });
      assert.equal(res.status, 404);
      assert.deepEqual(await res.json(), {
        error: { message: 'The model `sql` does not exist.', type: 'NotFoundError', param: 'model', code: 404 },
      });
    }
    assert.equal((await post(e, '/v1/completions', { model: 'chat-v2', prompt: 'x', max_tokens: 1 })).status, 200);
    assert.equal((await post(e, '/v1/unload_lora_adapter', { lora_name: 'sql' })).status, 404, 'not loaded');
    assert.equal((await post(e, '/v1/unload_lora_adapter', {})).status, 400, 'no name');
  });
});

describe('mock engines → KV events → router index', () => {
  test("the router's index equals what each engine holds, through evictions and a restart", async () => {
    const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
    const applier = new KvEventApplier(router);
    const engines: MockEngine[] = [];
    const subs: KvEventSubscriber[] = [];
    for (const id of ['e0', 'e1']) {
      // small caches so that requests evict each other's blocks
      const e = await engine({ blockSize: 16, kvBlocks: 64, events: 'tcp://127.0.0.1:*', replay: 'tcp://127.0.0.1:*' });
      router.registerWorker(id);
      const s = new KvEventSubscriber({
        workerId: id,
        endpoint: e.eventsEndpoint,
        replayEndpoint: e.replayEndpoint,
        applier,
      }).start();
      closers.push(() => s.close());
      engines.push(e);
      subs.push(s);
    }
    // no wait for the subscriptions to settle: a subscriber that joins late replays from seq 0
    const matches = (k: number) => {
      const mine = applier.trackedEngineHashes(`e${k}`).sort();
      const theirs = engines[k].cacheListing().sort();
      return mine.length === theirs.length && mine.every((h, i) => h === theirs[i]);
    };
    for (let i = 0; i < 24; i++) {
      const k = i % 2;
      await read(post(engines[k], '/v1/completions', { prompt: `${words(60, i % 5)} ${words(40, i)}`, max_tokens: 2 }));
    }
    await until(() => matches(0) && matches(1), 'the index to match both engines');
    assert.ok(engines[0].cacheListing().length > 0);
    assert.ok(subs[0].stats.applied.removedBlocks > 0, 'evictions were applied too');
    assert.equal(subs[0].stats.malformed + subs[1].stats.malformed, 0);

    // e0 dies and comes back on the same endpoints with an empty cache
    const { eventsEndpoint, replayEndpoint, port } = engines[0];
    await engines[0].close();
    // the same ports again, retried while the closed sockets still hold them
    let restarted: MockEngine | undefined;
    await until(async () => {
      restarted = await engine({
        port,
        blockSize: 16,
        kvBlocks: 64,
        events: eventsEndpoint,
        replay: replayEndpoint,
      }).catch((err: Error) => {
        if (/in use/i.test(err.message)) return undefined;
        throw err;
      });
      return restarted !== undefined;
    }, 'the closed engine to free its ports');
    engines[0] = restarted!;
    await read(post(engines[0], '/v1/completions', { prompt: words(50, 99), max_tokens: 2 }));
    await until(() => subs[0].stats.disconnects >= 1 && matches(0), 'the restarted engine to be rebuilt');
    assert.ok(matches(1));
  });
});

/** A mock engine whose rank r publishes on basePort + r: consecutive ports, found by trying. */
async function dpEngine(options: ConstructorParameters<typeof MockEngine>[0]) {
  for (let attempt = 0; ; attempt++) {
    const base = 20_000 + Math.floor(Math.random() * 30_000);
    try {
      return await engine({ ...options, events: `tcp://127.0.0.1:${base}`, replay: `tcp://127.0.0.1:${base + 1000}` });
    } catch (err) {
      if (attempt > 20) throw err;
    }
  }
}

describe('mock engine: data parallel, LoRA, vLLM block hashes', () => {
  test('--data-parallel-size: each rank its own cache and event port (port + rank); X-data-parallel-rank picks the rank', async () => {
    const e = await dpEngine({ dataParallelSize: 2, blockSize: 4 });
    const [p0, p1] = e.eventsEndpoints.map((ep) => Number(/:(\d+)$/.exec(ep)![1]));
    assert.equal(p1, p0 + 1);
    const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
    router.registerWorker('w#0');
    router.registerWorker('w#1');
    const applier = new KvEventApplier(router);
    const subscribers: KvEventSubscriber[] = [];
    for (const [r, ep] of e.eventsEndpoints.entries()) {
      const replayEndpoint = offsetEndpointPort(e.replayEndpoint, r);
      const s = new KvEventSubscriber({
        workerId: `w#${r}`,
        endpoint: ep,
        replayEndpoint,
        applier,
        dataParallel: { rank: r, size: 2 },
      }).start();
      subscribers.push(s);
      closers.push(() => s.close());
    }
    const prompt = words(40, 3);
    const send = (rank: number) =>
      fetch(`http://127.0.0.1:${e.port}/v1/completions`, {
        method: 'POST',
        body: JSON.stringify({ prompt, max_tokens: 1 }),
        headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) },
      });
    // the SUB sockets join late (PUB/SUB): send until rank 1's blocks arrive
    await until(async () => {
      await (await send(1)).json();
      return applier.trackedBlocks('w#1') > 0;
    }, "rank 1's events");
    assert.equal(applier.trackedBlocks('w#0'), 0, 'rank 0 computed nothing');
    // each rank's port carries its own rank's batches only
    assert.ok(subscribers.every((s) => s.stats.unknownRanks === 0));
    assert.equal(e.cacheListing(1).length, Math.floor(mockTokenize(prompt).length / 4), "the prompt's full blocks");
    assert.equal(e.cacheListing(0).length, 0);
    const bad = await send(2);
    assert.equal(bad.status, 400);
    assert.match(((await bad.json()) as Json).error.message, /X-data-parallel-rank must be an integer from 0 to 1/);
    const metrics = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text();
    assert.match(metrics, /vllm:num_requests_running\{model_name="mock",engine="1"\} 0/);
  });

  test('--data-parallel-start-rank: cores are the global ranks S…, on the port + rank; the header names the i-th', async () => {
    const e = await dpEngine({ dataParallelSize: 2, dataParallelStartRank: 4 });
    const configured = Number(/:(\d+)$/.exec(e.eventsEndpoints[0])![1]) - 4;
    assert.deepEqual(
      e.eventsEndpoints.map((ep) => Number(/:(\d+)$/.exec(ep)![1]) - configured),
      [4, 5],
    );
    const send = (header: string) =>
      fetch(`http://127.0.0.1:${e.port}/v1/completions`, {
        method: 'POST',
        body: JSON.stringify({ prompt: words(40, 5), max_tokens: 1 }),
        headers: { 'content-type': 'application/json', 'x-data-parallel-rank': header },
      });
    assert.equal((await send('1')).status, 200);
    assert.equal(e.cacheListing(0).length, 0);
    assert.ok(e.cacheListing(1).length > 0, 'the second core (rank 5) took it');
    const metrics = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text();
    assert.match(metrics, /vllm:prefix_cache_queries_total\{model_name="mock",engine="5"\} [1-9]/);
    assert.match(metrics, /vllm:prefix_cache_queries_total\{model_name="mock",engine="4"\} 0/);
    assert.equal((await send('5')).status, 400, 'the header is an index, not the global rank');
    assert.throws(() => new MockEngine({ dataParallelStartRank: -1 }), /dataParallelStartRank must be an integer/);
  });

  test('--lora-modules: adapters listed with their parent; their blocks keyed by lora_name', async () => {
    const e = await engine({
      loraModules: ['sql', 'chat-v2'],
      blockSize: 4,
      events: 'tcp://127.0.0.1:*',
      replay: 'tcp://127.0.0.1:*',
    });
    const models = await read(fetch(`http://127.0.0.1:${e.port}/v1/models`));
    assert.deepEqual(
      models.data.map((m: Json) => [m.id, m.parent]),
      [
        ['mock', null],
        ['sql', 'mock'],
        ['chat-v2', 'mock'],
      ],
    );
    const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
    router.registerWorker('w0');
    const applier = new KvEventApplier(router);
    const s = new KvEventSubscriber({
      workerId: 'w0',
      endpoint: e.eventsEndpoint,
      replayEndpoint: e.replayEndpoint,
      applier,
    }).start();
    closers.push(() => s.close());
    const prompt = words(40, 5);
    await until(async () => {
      await read(post(e, '/v1/completions', { model: 'sql', prompt, max_tokens: 1 }));
      return applier.trackedBlocks('w0') > 0;
    }, "the adapter's events");
    const tokens = mockTokenize(prompt);
    assert.equal(
      router.route({ tokens, lora: 'sql' }, { dryRun: true }).cachedTokens,
      Math.floor(tokens.length / 4) * 4,
    );
    assert.equal(router.route({ tokens }, { dryRun: true }).cachedTokens, 0);
    assert.equal(router.route({ tokens, lora: 'chat-v2' }, { dryRun: true }).cachedTokens, 0);
    assert.equal((await post(e, '/v1/completions', { model: 'nope', prompt, max_tokens: 1 })).status, 404);
  });

  test('blockHash vllm: the engine publishes vLLM sha256_cbor hashes; a router in vllm hash mode keys them directly', async () => {
    const { VllmBlockHasher } = await import('../../src/core/vllm-block-hash.js');
    const { BlockHashes } = await import('../../src/core/hashing.js');
    const e = await engine({ blockSize: 4, events: 'tcp://127.0.0.1:*', blockHash: 'vllm', pythonHashSeed: '0' });
    const prompt = words(24, 9);
    await read(post(e, '/v1/completions', { prompt, max_tokens: 1, cache_salt: 'tenant-a' }));
    const tokens = mockTokenize(prompt);
    const expected = new VllmBlockHasher('0').hashBlocks(tokens, 4, { cacheSalt: 'tenant-a' }, new BlockHashes());
    const listing = new Set(e.cacheListing());
    for (let i = 0; i < expected.length; i++) assert.ok(listing.has(expected.toBigInt(i).toString()), `block ${i}`);
  });

  test('prefixCachingHashAlgo: a vllm-mode router with the same algorithm indexes the stores, another skips them as hash_mismatch', async () => {
    const { VLLM_HASH_ALGOS } = await import('../../src/core/vllm-block-hash.js');
    for (const [i, algo] of VLLM_HASH_ALGOS.entries()) {
      const other = VLLM_HASH_ALGOS[(i + 1) % VLLM_HASH_ALGOS.length];
      const e = await engine({
        blockSize: 4,
        events: 'tcp://127.0.0.1:*',
        blockHash: 'vllm',
        pythonHashSeed: '0',
        prefixCachingHashAlgo: algo,
      });
      const subscribed = (routerAlgo: typeof algo) => {
        const router = new KVAwareRouter({
          blockSize: 4,
          indexMode: 'precise',
          blockHash: 'vllm',
          pythonHashSeed: '0',
          prefixCachingHashAlgo: routerAlgo,
        });
        router.registerWorker('w0');
        const applier = new KvEventApplier(router);
        const logs: string[] = [];
        const log = (m: string) => logs.push(m);
        const s = new KvEventSubscriber({ workerId: 'w0', endpoint: e.eventsEndpoint, applier, log }).start();
        closers.push(() => s.close());
        return { router, applier, s, logs };
      };
      const same = subscribed(algo);
      const mismatched = subscribed(other);
      // a new prompt each time: the SUB sockets join late (PUB/SUB, no replay endpoint here), and
      // a prompt the engine holds already stores nothing again, so a batch missed is never resent
      const posted: string[] = [];
      const full = (p: string) => Math.floor(mockTokenize(p).length / 4) * 4;
      let prompt: string | undefined;
      await until(async () => {
        const p = words(24, 11 + i + 50 * posted.length);
        posted.push(p);
        await read(post(e, '/v1/completions', { prompt: p, max_tokens: 1 }));
        prompt = posted.find(
          (q) => same.router.route({ tokens: mockTokenize(q) }, { dryRun: true }).cachedTokens === full(q),
        );
        return prompt !== undefined && (mismatched.s.stats.applied.skipped.hash_mismatch ?? 0) > 0;
      }, `the ${algo} engine's stores at both routers`);
      assert.ok(prompt !== undefined);
      const tokens = mockTokenize(prompt);
      assert.equal(
        same.router.route({ tokens }, { dryRun: true }).cachedTokens,
        Math.floor(tokens.length / 4) * 4,
        algo,
      );
      assert.equal(mismatched.router.getStats().index.entries, 0, `${other} router, ${algo} engine`);
      assert.equal(mismatched.router.route({ tokens }, { dryRun: true }).cachedTokens, 0, `${other} router`);
      // the log names every cause: the algorithm and seed, and vLLM hashing at another step than its block
      const told = mismatched.logs.find((l) => l.includes('hash_mismatch'));
      assert.ok(told !== undefined, mismatched.logs.join('\n'));
      assert.match(told, /--prefix-caching-hash-algo/);
      assert.match(told, /PYTHONHASHSEED/);
      assert.match(told, /cache_salt/);
      assert.match(told, /hybrid/);
      assert.match(told, /prefix_match_unit/);
      assert.match(told, /--decode-context-parallel-size/);
      assert.equal(same.logs.filter((l) => l.includes('hash_mismatch')).length, 0, 'nothing to tell where they match');
    }
  });
});
