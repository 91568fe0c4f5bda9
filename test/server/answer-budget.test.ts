/**
 * The gathered-answer budget: complete JSON answers are gathered (so a failure before their end
 * can be retried) only while the process-wide budget can take their bytes; one it cannot take
 * passes through as it comes, and every byte goes back once the answer is written or fails.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway } from '../../src/server/gateway.js';
import { fakeEngine } from '../faults/harness.js';
import { resolveServe } from '../helpers/serve-config.js';
import { until } from '../helpers/wait.js';

const KiB = 1024;
/** Room for one of the answers below, not two. */
const ANSWER_BUDGET = 1024 * KiB;
const ANSWER_BYTES = 768 * KiB;

/** A JSON answer of exactly `bytes` bytes. */
const jsonOf = (bytes: number) => {
  const head = '{"id":"cmpl","text":"';
  const tail = '"}';
  return `${head}${'a'.repeat(bytes - head.length - tail.length)}${tail}`;
};

test('an answer the gathered-answer budget cannot take passes through as it comes, and the budget returns to 0', async () => {
  const body = jsonOf(ANSWER_BYTES);
  // each answer: its headers and two thirds of its body, the rest once the test says so
  const finishes: (() => void)[] = [];
  const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    // the gateway's own request for the model list: answered 404
    if (req.url !== '/v1/completions') return void res.writeHead(404).end();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(ANSWER_BYTES) });
      const cut = Math.floor((ANSWER_BYTES * 2) / 3);
      res.write(body.slice(0, cut));
      finishes.push(() => res.end(body.slice(cut)));
    });
  });
  const router = new KVAwareRouter();
  const gateway = await createGateway({
    router,
    workers: [{ id: 'e0', url: engine.url }],
    metricsIntervalMs: 0,
    healthCheckIntervalMs: 0,
    bufferedAnswerLimit: ANSWER_BUDGET,
  });
  const metric = async (name: string) =>
    (await gateway.metrics.metrics()).split('\n').find((l) => l.startsWith(`${name} `));
  try {
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    const ask = (prompt: string) => {
      const answer = { status: 0, text: undefined as string | undefined };
      const done = fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt, max_tokens: 1 }),
      }).then(async (res) => {
        answer.status = res.status;
        answer.text = await res.text();
      });
      return { answer, done };
    };
    const first = ask('first');
    await until(() => finishes.length === 1, 'the engine answering the first request');
    await until(() => gateway.answerBudget.used === ANSWER_BYTES, 'the first answer charged whole to the budget');
    assert.equal(
      await metric('contextforge_gathered_answer_bytes_held'),
      `contextforge_gathered_answer_bytes_held ${ANSWER_BYTES}`,
    );
    assert.equal(first.answer.status, 0, 'the first answer is gathered: nothing reached its client yet');

    const second = ask('second');
    // the budget cannot take the second answer: its headers reach the client while the engine still sends it
    await until(() => second.answer.status !== 0, 'the second answer passing through before its end');
    assert.equal(second.answer.status, 200);
    assert.equal(first.answer.status, 0, 'the first answer still gathered');
    assert.equal(gateway.answerBudget.used, ANSWER_BYTES, 'the second answer took nothing');

    for (const finish of finishes.splice(0)) finish();
    await Promise.all([first.done, second.done]);
    assert.equal(first.answer.text, body);
    assert.equal(second.answer.text, body);
    await until(() => gateway.answerBudget.used === 0, 'the budget back to 0');
    assert.equal(await metric('contextforge_gathered_answer_bytes_held'), 'contextforge_gathered_answer_bytes_held 0');
    assert.equal(
      await metric('contextforge_gathered_answer_bytes_limit'),
      `contextforge_gathered_answer_bytes_limit ${ANSWER_BUDGET}`,
    );
    assert.equal(
      await metric('contextforge_gathered_answer_budget_passthroughs_total'),
      'contextforge_gathered_answer_budget_passthroughs_total 1',
    );
  } finally {
    for (const finish of finishes.splice(0)) finish();
    await gateway.close();
    await engine.close();
  }
});

test('a gathered answer gives its bytes back when it fails or its client leaves', async () => {
  for (const ending of ['engine dies', 'client leaves'] as const) {
    let answered: (() => void) | undefined;
    const engine = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      // the gateway's own request for the model list: answered 404
      if (req.url !== '/v1/completions') return void res.writeHead(404).end();
      req.on('end', () => {
        // chunked, no length: charged chunk by chunk
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write('{"id":"cmpl","text":"');
        res.write('a'.repeat(64 * KiB), () => answered?.());
        if (ending === 'engine dies') setImmediate(() => res.socket?.destroy());
      });
    });
    const gateway = await createGateway({
      router: new KVAwareRouter(),
      workers: [{ id: 'e0', url: engine.url }],
      metricsIntervalMs: 0,
      healthCheckIntervalMs: 0,
      maxRetries: 0,
      bufferedAnswerLimit: ANSWER_BUDGET,
    });
    const ac = new AbortController();
    try {
      const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
      const seen = new Promise<void>((r) => (answered = r));
      const res = fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: ending, max_tokens: 1 }),
        signal: ac.signal,
      }).catch((err: Error) => err);
      await seen;
      if (ending === 'client leaves') {
        await until(() => gateway.answerBudget.used > 0, 'the answer gathered');
        ac.abort();
      }
      await res;
      await until(() => gateway.answerBudget.used === 0, `the budget back to 0 (${ending})`);
    } finally {
      ac.abort();
      await gateway.close();
      await engine.close();
    }
  }
});

test('--buffered-answer-limit: 256 MiB by default, at least 1 KiB, from a flag or the environment', async () => {
  assert.equal(resolveServe([]).config.bufferedAnswerLimit, 256 * 1024 * 1024);
  assert.equal(resolveServe(['--buffered-answer-limit', '33554432']).config.bufferedAnswerLimit, 32 * 1024 * 1024);
  assert.equal(resolveServe([], { CONTEXTFORGE_BUFFERED_ANSWER_LIMIT: '2048' }).config.bufferedAnswerLimit, 2048);
  assert.throws(
    () => resolveServe(['--buffered-answer-limit', '10']),
    /--buffered-answer-limit must be >= 1024 \(got 10\)/,
  );
  await assert.rejects(
    createGateway({ router: new KVAwareRouter(), bufferedAnswerLimit: 0 }),
    /^RangeError: bufferedAnswerLimit must be a positive integer number of bytes \(got 0\)$/,
  );
});
