/**
 * A stream's events are bounded in size. Before anything reached the client, the stream's first
 * event is held whole (past the 1 MiB held back of any event, its bytes drawn from the answer
 * budget) up to the bound of an event: one that grows past it without ending is the engine's
 * failure, retried elsewhere with nothing sent. After that, an event past the bound cuts the
 * stream with the gateway's error event and data: [DONE]. A first event the answer budget cannot
 * hold passes through, its first-byte deadline running on until an event ends.
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { BodyBudget } from '../../src/server/body-budget.js';
import type { ForwardOutcome } from '../../src/server/forward.js';
import type { FailureReason } from '../../src/server/metrics.js';
import { badFirstGateway, fakeEngine, sample } from '../faults/harness.js';
import { forwardTo, SlowClientResponse } from '../helpers/forward-stand-in.js';
import { until } from '../helpers/wait.js';

const MiB = 1024 * 1024;
const DONE = 'data: [DONE]\n\n';
const MID_STREAM_ERROR =
  'data: {"error":{"message":"the engine failed mid-stream","type":"server_error","param":null,"code":null}}\n\n';
/** The start of an event whose content never ends. */
const ENDLESS_START = 'data: {"choices":[{"index":0,"delta":{"content":"';

/** A client's response that keeps the count of what reached it and its last bytes, not megabytes of it. */
class CountingResponse extends SlowClientResponse {
  bytes = 0;
  private tail = '';
  override write(chunk: Buffer | string): boolean {
    this.bytes += chunk.length;
    this.tail = (this.tail + chunk.toString().slice(-512)).slice(-512);
    return !this.full;
  }
  override end(chunk?: Buffer | string): this {
    if (chunk !== undefined) this.write(chunk);
    this.ended = true;
    this.writableFinished = true;
    return this;
  }
  override text(): string {
    return this.tail;
  }
}

/** The outcome, or 'pending' when it has not come within `ms`. */
function within(outcome: Promise<ForwardOutcome>, ms: number): Promise<ForwardOutcome | 'pending'> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<'pending'>((resolve) => (timer = setTimeout(() => resolve('pending'), ms)));
  return Promise.race([outcome, deadline]).finally(() => clearTimeout(timer));
}

test('a first event that grows past the bound of an event without ending: nothing reaches the client, the attempt fails to be retried', async () => {
  const res = new CountingResponse();
  res.full = false;
  const budget = new BodyBudget(256 * MiB);
  let incomplete = 0;
  let committed = 0;
  const failed: FailureReason[] = [];
  const { h, outcome, aborted } = forwardTo(res, undefined, {
    answerBudget: budget,
    onIncomplete: () => incomplete++,
    onCommitted: () => committed++,
    onFailed: (reason) => failed.push(reason),
  });
  h.onData!(Buffer.from(ENDLESS_START));
  const piece = Buffer.alloc(256 * 1024, 'x');
  let sent = 0;
  let held = 0;
  // bounded: the old gateway passed it on from 1 MiB on, and would take it for ever
  while (aborted() === undefined && sent < 80 * MiB) {
    h.onData!(piece);
    sent += piece.length;
    held = Math.max(held, budget.used);
    assert.equal(res.bytes, 0, `nothing reaches the client (${sent} bytes of the event sent)`);
  }
  assert.ok(aborted(), 'the engine request is aborted');
  assert.ok(sent > 60 * MiB && sent <= 64 * MiB + piece.length, `the bound is 64 MiB (aborted after ${sent} bytes)`);
  assert.ok(held > 60 * MiB, `the held event draws on the answer budget (${held} bytes at most)`);
  // undici reports the abort
  h.onError!(aborted()!);
  assert.equal(await outcome, 'retry');
  assert.equal(committed, 0, 'the answer was never committed');
  assert.equal(incomplete, 1, 'counted as an answer the client could not read');
  assert.deepEqual(failed, ['malformed']);
  assert.equal(budget.used, 0, 'its bytes went back to the budget');
  assert.equal(res.bytes, 0);
});

test('a first event larger than the 1 MiB held back reaches the client whole once it ends, and is judged as the first event', async () => {
  for (const json of [true, false]) {
    const res = new SlowClientResponse();
    res.full = false;
    const budget = new BodyBudget(256 * MiB);
    let incomplete = 0;
    const { h, outcome, aborted } = forwardTo(res, undefined, {
      answerBudget: budget,
      onIncomplete: () => incomplete++,
    });
    // a 5 MiB first event (prompt_logprobs of a long prompt, say)
    const content = 'y'.repeat(5 * MiB);
    const event = json ? `data: {"prompt_logprobs":"${content}"}\n\n` : `data: ${content}\n\n`;
    for (let at = 0; at < event.length - 2; at += 128 * 1024)
      h.onData!(Buffer.from(event.slice(at, Math.min(at + 128 * 1024, event.length - 2))));
    assert.equal(res.written.length, 0, `json ${json}: nothing reaches the client before the event ends`);
    assert.ok(budget.used > 4 * MiB, `json ${json}: the held event draws on the answer budget`);
    h.onData!(Buffer.from('\n\n'));
    if (json) {
      assert.equal(res.text(), event, 'the first event reaches the client whole');
      assert.equal(budget.used, 0, 'its bytes went back to the budget once sent');
      h.onData!(Buffer.from(DONE));
      assert.equal(await outcome, 'done');
      assert.equal(res.text(), event + DONE);
    } else {
      // a first event that is not JSON is no answer, however large
      assert.ok(aborted(), 'the engine request is aborted');
      h.onError!(aborted()!);
      assert.equal(await outcome, 'retry');
      assert.equal(res.written.length, 0);
      assert.equal(incomplete, 1);
      assert.equal(budget.used, 0);
    }
  }
});

test('after the first event, an event past the bound cuts the stream with the error event and data: [DONE]; a 50 MB one passes', async () => {
  for (const size of [50_000_000, Infinity]) {
    const res = new CountingResponse();
    res.full = false;
    const failed: FailureReason[] = [];
    const { h, outcome, aborted } = forwardTo(res, undefined, { onFailed: (reason) => failed.push(reason) });
    const first = 'data: {"n":0}\n\n';
    h.onData!(Buffer.from(first));
    h.onData!(Buffer.from(ENDLESS_START));
    const piece = Buffer.alloc(256 * 1024, 'x');
    let sent = first.length + ENDLESS_START.length;
    while (aborted() === undefined && sent - first.length < Math.min(size, 80 * MiB)) {
      h.onData!(piece);
      sent += piece.length;
      if (aborted() === undefined && sent - first.length > MiB)
        assert.equal(res.bytes, sent, 'past the 1 MiB held back, the event passes as it comes');
    }
    if (size !== Infinity) {
      assert.equal(aborted(), undefined, 'a 50 MB event is within the bound');
      h.onData!(Buffer.from(`"}}]}\n\n${DONE}`));
      assert.equal(await outcome, 'done');
      assert.ok(res.text().endsWith(`"}}]}\n\n${DONE}`));
      continue;
    }
    assert.ok(aborted(), 'the engine request is aborted');
    assert.ok(sent - first.length <= 64 * MiB + piece.length, `cut at the bound (${sent} bytes sent)`);
    assert.equal(await outcome, 'cut');
    assert.deepEqual(failed, ['malformed']);
    assert.ok(res.ended, "the client's response ended");
    assert.ok(
      res.text().endsWith(`x\n\n${MID_STREAM_ERROR}${DONE}`),
      `the error event, an event of its own, then data: [DONE]: …${res.text().slice(-200)}`,
    );
    // undici reports the abort: nothing more is written
    const bytes = res.bytes;
    h.onError!(aborted()!);
    assert.equal(h.onData!(piece), false);
    assert.equal(res.bytes, bytes);
  }
});

test('a first event the answer budget cannot hold passes through, and its first-byte deadline runs on until an event ends', async () => {
  const res = new CountingResponse();
  res.full = false;
  let budgetFull = 0;
  let overdue = 0;
  const failed: FailureReason[] = [];
  const { h, outcome, aborted } = forwardTo(res, undefined, {
    answerBudget: new BodyBudget(1024),
    onAnswerBudgetFull: () => budgetFull++,
    onFirstByteOverdue: () => overdue++,
    onFailed: (reason) => failed.push(reason),
    firstByteTimeoutMs: 300,
    interChunkTimeoutMs: 600_000,
  });
  h.onData!(Buffer.from(ENDLESS_START));
  const piece = Buffer.alloc(256 * 1024, 'x');
  for (let i = 0; i < 8; i++) h.onData!(piece);
  assert.ok(res.bytes > MiB, 'past the 1 MiB held back it passes through as it comes');
  assert.equal(budgetFull, 1);
  // the old gateway put the deadline of the next event (600 s) in place of the first-byte deadline
  await until(() => aborted() !== undefined, 'the first-byte deadline to abort the engine request');
  // undici reports the abort
  h.onError!(aborted()!);
  assert.equal(await within(outcome, 10_000), 'cut', 'cut by the first-byte deadline');
  assert.deepEqual(failed, ['timeout']);
  assert.equal(overdue, 0, 'no overdue first byte: the answer had been committed');
  assert.ok(res.text().endsWith(`x\n\n${MID_STREAM_ERROR}${DONE}`), res.text().slice(-200));
});

test('an engine that never ends its first event: the request is answered by another worker, the failure counted as malformed', async (t) => {
  const bad = await fakeEngine((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(ENDLESS_START);
      const piece = Buffer.alloc(64 * 1024, 'x');
      // as fast as the gateway reads, until it closes the connection
      const more = (): void => {
        while (!res.destroyed && res.write(piece));
        if (!res.destroyed) res.once('drain', more);
      };
      res.on('close', () => res.off('drain', more));
      more();
    });
  });
  const g = await badFirstGateway(bad.url, true, {
    timeouts: { firstByteTimeoutMs: 60_000, interChunkTimeoutMs: 60_000 },
  });
  t.after(async () => {
    await g.close();
    await bad.close();
  });
  const res = await fetch(`${g.base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'p', max_tokens: 3, stream: true }),
    signal: AbortSignal.timeout(30_000),
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('x-contextforge-worker'), 'good');
  const text = await res.text();
  assert.ok(text.endsWith(DONE), text.slice(-200));
  assert.doesNotMatch(text, /xxxx|"error"/);
  const metrics = g.gateway.metrics;
  assert.equal(await sample(metrics, 'contextforge_upstream_failures_total{worker="bad",reason="malformed"}'), 1);
  assert.equal(await sample(metrics, 'contextforge_stream_failures_total'), 0);
  assert.equal(g.router.getStats().inFlightRequests, 0);
});
