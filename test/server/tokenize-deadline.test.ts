/**
 * `--tokenize tokenizer` on worker threads: a prompt the tokenizer is very slow on (a long run of
 * spaces: HuggingFace BPE takes microseconds per character of it) must not hold its thread, and
 * every request queued behind it, for as long as it takes. Past the deadline its thread is
 * replaced, the request is routed on its text, and the requests behind it are tokenized by the
 * replacement. A request whose client leaves while it waits for a thread is never tokenized and
 * counts as the client's leaving (499).
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { MockEngine } from '../../src/engines/mock-engine.js';
import { TokenizerPool } from '../../src/engines/tokenizer-pool.js';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { until } from '../helpers/wait.js';

const cleanup: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanup.reverse()) await c();
});
const tokenizerDir = new URL('../fixtures/tokenizer/', import.meta.url).pathname;

const complete = (base: string, prompt: string, signal?: AbortSignal) =>
  fetch(`${base}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ prompt, max_tokens: 1 }),
    headers: { 'content-type': 'application/json' },
    signal,
  });

async function metric(gateway: Gateway, name: string): Promise<number | undefined> {
  const page = (await gateway.app.inject({ method: 'GET', url: '/metrics' })).body;
  const line = page.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.slice(name.length + 1));
}

async function start(timeoutMs: number) {
  const engine = await new MockEngine().start();
  cleanup.push(() => engine.close());
  const pool = await TokenizerPool.start({ path: tokenizerDir, threads: 1, timeoutMs });
  cleanup.push(() => pool.close());
  const gateway = await createGateway({
    router: new KVAwareRouter({ blockSize: 16 }),
    workers: [{ id: 'm0', url: `http://127.0.0.1:${engine.port}` }],
    tokenize: 'tokenizer',
    promptTokenizer: pool,
    adminToken: 'test-admin-token',
  });
  cleanup.push(() => gateway.close());
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  return { pool, gateway, base };
}

test('a prompt past the tokenize deadline is routed on its text, and the request queued behind it does not wait for it', async () => {
  const { pool, gateway, base } = await start(200);
  // seconds of tokenizing on the only thread
  const slow = complete(base, ' '.repeat(400_000));
  await until(() => pool.stats().pending === 1, 'the slow prompt to reach the pool');
  const small = await complete(base, 'hi');
  // answered while the slow prompt was never finished: its thread was replaced, not waited for
  assert.equal(small.status, 200, await small.clone().text());
  assert.equal(pool.stats().completed, 1, 'only the small request was tokenized');
  assert.equal(pool.stats().timedOut, 1);
  const answer = await slow;
  assert.equal(answer.status, 200, await answer.clone().text());
  assert.equal(await metric(gateway, 'contextforge_tokenizer_timed_out_total'), 1);
  assert.equal(await metric(gateway, 'contextforge_tokenizer_thread_restarts_total'), 1);
  assert.equal(await metric(gateway, 'contextforge_tokenizer_completed_total'), 1);
  assert.equal(await metric(gateway, 'contextforge_tokenizer_pending'), 0);
});

test('a request whose client leaves while it waits for a tokenizer thread is never tokenized and counts as 499', async () => {
  const { pool, gateway, base } = await start(60_000);
  // keeps the only thread busy for a while
  const busy = complete(base, ' '.repeat(60_000));
  await until(() => pool.stats().pending === 1, 'the busy prompt to reach the pool');
  const client = new AbortController();
  const left = complete(base, 'gone before its turn', client.signal);
  await until(() => pool.stats().pending === 2, 'the second request to wait for the thread');
  client.abort();
  await assert.rejects(left, (e: Error) => e.name === 'AbortError');
  await until(() => pool.stats().aborted === 1, 'the pool to drop the request');
  assert.equal((await busy).status, 200);
  await until(() => pool.stats().pending === 0, 'the thread to skip the dropped request');
  assert.equal(pool.stats().completed, 1, 'the dropped request was never tokenized');
  await until(
    async () => (await metric(gateway, 'contextforge_requests_total{path="/v1/completions",status="499"}')) === 1,
    'the request to be counted as its client leaving',
  );
  assert.equal(await metric(gateway, 'contextforge_tokenizer_aborted_total'), 1);
});
