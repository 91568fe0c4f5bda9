import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { ChatTokenizer } from '../../src/engines/chat-tokenizer.js';
import { KvEventApplier } from '../../src/engines/kv-events/applier.js';
import { KvEventSubscriber } from '../../src/engines/kv-events/subscriber.js';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { settled, until } from '../helpers/wait.js';

const cleanup: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanup.reverse()) await c();
});
const adminToken = 'test-admin-token';
const post = (base: string, path: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${base}${path}`, {
    method: 'POST',
    body: JSON.stringify(body),
    headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}`, ...headers },
  });

test("--tokenize engine: requests are hashed from the engine's token ids and meet its KV events", async () => {
  const engine = await new MockEngine({ events: 'tcp://127.0.0.1:*', replay: 'tcp://127.0.0.1:*' }).start();
  cleanup.push(() => engine.close());
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise', speculativeBlocks: 0 });
  const applier = new KvEventApplier(router);
  const gateway = await createGateway({
    router,
    workers: [{ id: 'm0', url: `http://127.0.0.1:${engine.port}` }],
    applier,
    tokenize: 'engine',
    adminToken,
  });
  cleanup.push(() => gateway.close());
  const sub = new KvEventSubscriber({
    workerId: 'm0',
    endpoint: engine.eventsEndpoint,
    replayEndpoint: engine.replayEndpoint,
    applier,
  }).start();
  cleanup.push(() => sub.close());
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const messages = [
    { role: 'system', content: Array.from({ length: 200 }, (_, i) => `rule${i}`).join(' ') },
    { role: 'user', content: 'go' },
  ];
  const first = (await (await post(base, '/v1/chat/completions', { messages, max_tokens: 1 })).json()) as {
    usage: { prompt_tokens: number };
  };
  // with no speculation, only the engine's events can tell the router what is cached
  const expected = Math.floor(first.usage.prompt_tokens / 16) * 16;
  const predicted = async () =>
    ((await (await post(base, '/v1/route', { messages })).json()) as { cachedTokens: number }).cachedTokens;
  assert.equal(await settled(predicted, (n) => n === expected), expected);
});

test("--tokenize tokenizer: the model's tokenizer and chat template in process; the gateway subscribes to KV events itself", async () => {
  const tokenizerDir = new URL('../fixtures/tokenizer/', import.meta.url).pathname;
  // the engine tokenizes with the same tokenizer.json, as a real engine serving that model would
  const engine = await new MockEngine({
    events: 'tcp://127.0.0.1:*',
    replay: 'tcp://127.0.0.1:*',
    tokenizer: ChatTokenizer.load(tokenizerDir),
  }).start();
  cleanup.push(() => engine.close());
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise', speculativeBlocks: 0 });
  const promptTokenizer = ChatTokenizer.load(tokenizerDir);
  const gateway = await createGateway({
    router,
    tokenize: 'tokenizer',
    promptTokenizer,
    kvEvents: true,
    adminToken,
    cachedTokensHeader: true,
    workers: [
      {
        id: 'm0',
        url: `http://127.0.0.1:${engine.port}`,
        events: engine.eventsEndpoint,
        replay: engine.replayEndpoint,
      },
    ],
  });
  cleanup.push(() => gateway.close());
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const messages = [
    {
      role: 'system',
      content: Array.from({ length: 120 }, (_, i) => `The router keeps rule ${i} of the block index.`).join(' '),
    },
    { role: 'user', content: 'Which worker?' },
  ];
  const first = (await (await post(base, '/v1/chat/completions', { messages, max_tokens: 1 })).json()) as {
    usage: { prompt_tokens: number };
  };
  assert.equal(
    first.usage.prompt_tokens,
    promptTokenizer.tokenize({ messages }).length,
    'router and engine count the same tokens',
  );
  const workers = async () =>
    (await (await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${adminToken}` } })).json()) as {
      workers: Array<{ indexEntries: number; kvEvents: { batches: number } | null }>;
    };
  await until(async () => (await workers()).workers[0].kvEvents!.batches > 0, 'the first KV-event batch');
  // the next turn: its prefix is the first request's prompt, which only the engine's events announced
  const next = [...messages, { role: 'assistant', content: 'w1' }, { role: 'user', content: 'Again, please.' }];
  const expected = Math.floor(first.usage.prompt_tokens / 16) * 16;
  const predicted = async () =>
    ((await (await post(base, '/v1/route', { messages: next })).json()) as { cachedTokens: number }).cachedTokens;
  assert.equal(await settled(predicted, (n) => n === expected), expected);
  const second = await post(base, '/v1/chat/completions', { messages: next, max_tokens: 1 });
  const body = (await second.json()) as { usage: { prompt_tokens_details?: { cached_tokens: number } } };
  assert.equal(
    Number(second.headers.get('x-contextforge-cached-tokens')),
    body.usage.prompt_tokens_details?.cached_tokens,
    'predicted = what the engine reused',
  );
  assert.ok(promptTokenizer.stats.segmentHits >= 2, 'the earlier messages came from the segment cache');
});

test('/admin/events applies KV events given as JSON', async () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
  const gateway = await createGateway({
    router,
    workers: [
      { id: 'a', url: 'http://127.0.0.1:1' },
      { id: 'b', url: 'http://127.0.0.1:2' },
    ],
    adminToken,
  });
  cleanup.push(() => gateway.close());
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const events = [
    {
      type: 'BlockStored',
      block_hashes: ['18364758544493064720', 2],
      parent_block_hash: null,
      token_ids: [1, 2, 3, 4, 5, 6, 7, 8],
      block_size: 4,
      lora_id: null,
      medium: 'GPU',
      lora_name: null,
    },
    { type: 'BlockRemoved', block_hashes: ['0x2'], medium: 'GPU' },
  ];
  const res = await post(base, '/admin/events', { worker: 'b', events });
  assert.equal(res.status, 200);
  const { applied } = (await res.json()) as { applied: { storedBlocks: number; removedBlocks: number } };
  assert.deepEqual([applied.storedBlocks, applied.removedBlocks], [2, 1]);
  const d = (await (await post(base, '/v1/route', { prompt: [1, 2, 3, 4, 5, 6, 7, 8] })).json()) as {
    worker: string;
    cachedTokens: number;
  };
  assert.deepEqual([d.worker, d.cachedTokens], ['b', 4]);
  for (const [body, message] of [
    [{ worker: 'zz', events }, /known worker/],
    [{ worker: 'b', events: 'x' }, /must be an array/],
    [{ worker: 'b', events: [{ type: 'AllBlocksCleared' }, 7] }, /events\[1\] must be an object/],
  ] as const) {
    const bad = await post(base, '/admin/events', body);
    assert.equal(bad.status, 400);
    assert.match(((await bad.json()) as { error: { message: string } }).error.message, message);
  }
  // one unreadable event is skipped with its reason; the others apply
  const mixed = await post(base, '/admin/events', {
    worker: 'b',
    events: [{ type: 'Nope' }, { type: 'AllBlocksCleared' }],
  });
  assert.equal(mixed.status, 200);
  const out = (await mixed.json()) as {
    applied: { cleared: number };
    skipped: Array<{ index: number; reason: string; message: string }>;
  };
  assert.equal(out.applied.cleared, 1);
  assert.deepEqual(
    out.skipped.map((x) => [x.index, x.reason]),
    [[0, 'unknown_type']],
  );
  assert.match(out.skipped[0].message, /unknown event type "Nope"/);
});

test('/admin/events: a bad hash string skips its own event as a bad_field; the events around it apply', async () => {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
  const gateway = await createGateway({ router, workers: [{ id: 'b', url: 'http://127.0.0.1:2' }], adminToken });
  cleanup.push(() => gateway.close());
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  const stored = (hash: unknown, parent: unknown = null) => ({
    type: 'BlockStored',
    block_hashes: [hash],
    parent_block_hash: parent,
    token_ids: [1, 2, 3, 4],
    block_size: 4,
  });
  const bad = ['-5', '0x', '1e5', '18446744073709551616', '12ab', ''];
  const res = await post(base, '/admin/events', {
    worker: 'b',
    events: [
      stored('0x10'),
      ...bad.map((h) => stored(h)),
      stored('17', '-1'),
      stored(1.5), // a bad number, skipped the same way
      { type: 'BlockRemoved', block_hashes: ['0x10', '1e5'] },
      stored('18446744073709551615'),
    ],
  });
  assert.equal(res.status, 200);
  const out = (await res.json()) as {
    applied: { storedBlocks: number; removedBlocks: number };
    skipped: Array<{ index: number; reason: string; message: string }>;
  };
  assert.deepEqual(
    out.skipped.map((x) => [x.index, x.reason]),
    [1, 2, 3, 4, 5, 6, 7, 8, 9].map((i) => [i, 'bad_field']),
  );
  assert.match(out.skipped[0].message, /^events\[1\]\.block_hashes\[0\] must be .*decimal\/0x-hex string below 2\^64/);
  assert.match(out.skipped[6].message, /^events\[7\]\.parent_block_hash must be/);
  assert.match(out.skipped[8].message, /^events\[9\]\.block_hashes\[1\] must be/);
  assert.equal(out.applied.storedBlocks, 2, 'the events before and after the bad ones apply');
  assert.equal(out.applied.removedBlocks, 0, 'a removal with one bad hash removes nothing');
});

/** BlockStored events of one block each, `n` of them, hashes from 1, token ids from `firstToken` on. */
const oneBlockStores = (n: number, firstToken = 0) =>
  Array.from({ length: n }, (_, i) => ({
    type: 'BlockStored',
    block_hashes: [i + 1],
    parent_block_hash: null,
    token_ids: [0, 1, 2, 3].map((k) => firstToken + 4 * i + k),
    block_size: 4,
  }));

/** Calls `look` at every turn of the event loop until `done` resolves. */
async function everyTurn<T>(done: Promise<T>, look: () => void): Promise<T> {
  let running = true;
  const turn = () => {
    if (!running) return;
    look();
    setImmediate(turn);
  };
  setImmediate(turn);
  try {
    return await done;
  } finally {
    running = false;
  }
}

/** A gateway with an applier (precise mode, blocks of 4) and one worker `b`, listening; closed after the file. */
async function eventsGateway() {
  const router = new KVAwareRouter({ blockSize: 4, indexMode: 'precise' });
  const applier = new KvEventApplier(router);
  const gateway = await createGateway({
    router,
    applier,
    workers: [{ id: 'b', url: 'http://127.0.0.1:2' }],
    adminToken,
  });
  cleanup.push(() => gateway.close());
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return { router, applier, gateway, base };
}

test('/admin/events: a large list applies in slices, the event loop turning between them; the answer covers it all', async () => {
  const { applier, base } = await eventsGateway();
  const events: unknown[] = oneBlockStores(20_000);
  events[15_000] = { type: 'Nope' };
  const seen = new Set<number>();
  const res = await everyTurn(post(base, '/admin/events', { worker: 'b', events }), () =>
    seen.add(applier.trackedBlocks('b')),
  );
  assert.equal(res.status, 200);
  const out = (await res.json()) as {
    applied: { storedBlocks: number };
    skipped: Array<{ index: number; reason: string; message: string }>;
  };
  assert.equal(out.applied.storedBlocks, 19_999);
  assert.deepEqual(
    out.skipped.map((x) => [x.index, x.reason]),
    [[15_000, 'unknown_type']],
  );
  assert.match(out.skipped[0].message, /events\[15000\]/);
  assert.equal(applier.trackedBlocks('b'), 19_999);
  const partly = [...seen].filter((n) => n > 0 && n < 19_999);
  assert.ok(partly.length >= 2, `the loop turned while the list was partly applied: saw ${[...seen].join(', ')}`);
});

test('/admin/events: a worker removed while its list applies, and added again under its id, takes nothing more of it', async () => {
  const { router, applier, gateway, base } = await eventsGateway();
  let replaced = false;
  const res = await everyTurn(post(base, '/admin/events', { worker: 'b', events: oneBlockStores(20_000) }), () => {
    if (replaced || applier.trackedBlocks('b') === 0) return;
    replaced = true;
    gateway.removeWorker('b');
    gateway.addWorker({ id: 'b', url: 'http://127.0.0.1:2' });
  });
  assert.ok(replaced, 'the worker was replaced while its list applied');
  assert.equal(res.status, 409);
  assert.match(((await res.json()) as { error: { message: string } }).error.message, /removed while its events/);
  assert.equal(applier.trackedBlocks('b'), 0, 'the new worker holds nothing of the list');
  assert.equal(router.route({ tokens: [0, 1, 2, 3] }, { dryRun: true }).cachedTokens, 0);
});

test('/admin/events: lists posted at once for one worker each apply in full, or, past 16 waiting, are answered 429 naming the worker', async () => {
  const { base } = await eventsGateway();
  // lists of 20,000 events apply over several turns, so many wait at once: how many depends on
  // how the bodies arrive (posted-events.test.ts refuses one deterministically)
  const posts = Array.from({ length: 24 }, (_, i) =>
    post(base, '/admin/events', { worker: 'b', events: oneBlockStores(20_000, 100_000 * i) }),
  );
  const answers = await Promise.all(
    posts.map(async (p) => {
      const res = await p;
      return { status: res.status, retryAfter: res.headers.get('retry-after'), body: (await res.json()) as unknown };
    }),
  );
  const refused = answers.filter((a) => a.status === 429);
  assert.deepEqual(
    answers.filter((a) => a.status !== 200 && a.status !== 429),
    [],
  );
  for (const a of refused) {
    assert.equal(a.retryAfter, '1');
    const error = (a.body as { error: { param: string; message: string } }).error;
    assert.equal(error.param, 'worker');
    assert.match(error.message, /lists of events for worker 'b' are waiting/);
  }
  const accepted = answers.filter((a) => a.status === 200);
  assert.ok(accepted.length >= 16, `at least the 16 that may wait were taken (${accepted.length})`);
  for (const a of accepted)
    assert.equal((a.body as { applied: { storedBlocks: number } }).applied.storedBlocks, 20_000, 'applied in full');
  // the queue drained: the next post is taken
  const next = await post(base, '/admin/events', { worker: 'b', events: oneBlockStores(1, 9_000_000) });
  assert.equal(next.status, 200);
});
