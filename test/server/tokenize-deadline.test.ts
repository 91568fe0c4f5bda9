/**
 * `--tokenize tokenizer` on worker threads: a prompt the tokenizer is very slow on (a long run of
 * spaces: HuggingFace BPE takes microseconds per character of it) must not hold its thread, and
 * every request queued behind it, for as long as it takes. Each request has a deadline from its
 * arrival, its wait for a thread included: past it the request is routed on its text, whatever is
 * queued ahead of it; a thread that works on one request that long is replaced, and the requests
 * that come later are tokenized by the replacement. A request whose client leaves while it waits
 * for a thread is never tokenized and counts as the client's leaving (499).
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

test('prompts past the tokenize deadline are routed on their text, and a request queued behind them waits for its own deadline only', async () => {
  const { pool, gateway, base } = await start(1000);
  // tens of seconds of tokenizing each, on the only thread
  const slow = [complete(base, ` ${' '.repeat(1_000_000)}`), complete(base, `.${' '.repeat(1_000_000)}`)];
  await until(() => pool.stats().pending === 2, 'the slow prompts to reach the pool');
  const small = await complete(base, 'hi');
  // answered at its deadline, before the second slow prompt was tokenized (or its thread stopped)
  assert.equal(small.status, 200, await small.clone().text());
  for (const answer of await Promise.all(slow)) assert.equal(answer.status, 200, await answer.clone().text());
  // the first slow prompt timed out on the thread, the second and the small one while waiting
  assert.deepEqual([pool.stats().timedOut, pool.stats().timedOutWaiting, pool.stats().completed], [1, 2, 0]);
  await until(() => pool.stats().threadRestarts === 1, 'the thread to be replaced');
  // the replacement skips the two that timed out waiting, and tokenizes what comes next
  await until(
    async () => (await complete(base, 'after')).status === 200 && pool.stats().completed === 1,
    'the replacement to tokenize a request',
  );
  assert.equal(await metric(gateway, 'contextforge_tokenizer_timed_out_total'), 1);
  assert.equal(await metric(gateway, 'contextforge_tokenizer_thread_restarts_total'), 1);
  assert.equal(await metric(gateway, 'contextforge_tokenizer_completed_total'), 1);
  await until(async () => (await metric(gateway, 'contextforge_tokenizer_pending')) === 0, 'nothing left pending');
  // each request that came while the replacement loaded the tokenizer counts as timed out waiting
  const waited = pool.stats().timedOutWaiting;
  assert.ok(waited >= 2);
  assert.equal(await metric(gateway, 'contextforge_tokenizer_timed_out_waiting_total'), waited);
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
