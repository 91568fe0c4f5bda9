import assert from 'node:assert/strict';
import { test } from 'node:test';
import { checkTimeouts, DEFAULT_TIMEOUTS, FirstByteDeadlines, MAX_TIMER_MS } from '../../src/server/timeouts.js';
import { resolveServe } from '../helpers/serve-config.js';

test('checkTimeouts fills in the defaults and names a timeout that is not a positive integer', () => {
  assert.deepEqual(checkTimeouts(undefined), DEFAULT_TIMEOUTS);
  assert.deepEqual(checkTimeouts({ headersTimeoutMs: 5, requestTimeoutMs: undefined }), {
    ...DEFAULT_TIMEOUTS,
    headersTimeoutMs: 5,
  });
  assert.throws(() => checkTimeouts({ firstByteTimeoutMs: 0 }), {
    name: 'RangeError',
    message: 'timeouts.firstByteTimeoutMs must be >= 1 (got 0)',
  });
  assert.throws(() => checkTimeouts({ interChunkTimeoutMs: 2.5 }), {
    name: 'TypeError',
    message: /^timeouts\.interChunkTimeoutMs must be an integer/,
  });
  assert.throws(() => checkTimeouts({ idleMs: 5 } as never), {
    name: 'RangeError',
    message: /^timeouts\.idleMs is not a known key/,
  });
});

test('serve takes its timeout settings from the same declaration as the gateway', () => {
  // one declaration: the gateway's range and default reach the flag
  assert.throws(() => resolveServe(['--first-byte-timeout-ms', '0']), /first-byte-timeout-ms.*>= 1/);
  assert.equal(resolveServe([]).config.upstreamTimeoutMs, DEFAULT_TIMEOUTS.interChunkTimeoutMs);
  assert.equal(resolveServe([]).config.maxAnchors, 128);
});

test('the first-byte deadline is twice the usual time plus the allowance, capped', () => {
  const d = new FirstByteDeadlines(1000, 5000);
  assert.equal(d.deadlineMs('w0'), 1000);
  d.observe('w0', 400);
  assert.equal(d.deadlineMs('w0'), 1800);
  d.observe('w0', 1400); // 400 + 0.2 × 1000 = 600
  assert.equal(d.deadlineMs('w0'), 2200);
  d.observe('w0', 100_000);
  assert.equal(d.deadlineMs('w0'), 5000);
  d.forget('w0');
  assert.equal(d.deadlineMs('w0'), 1000);
});

test('a first-byte deadline waited out teaches the worker that it takes at least that long, capped as the deadline is', () => {
  const d = new FirstByteDeadlines(1000, 20_000);
  d.waitedAtLeast('w0', 1000);
  assert.equal(d.deadlineMs('w0'), 3000, 'at least 1 s usually: twice that plus the allowance');
  // a burst of attempts that all waited the same deadline teaches no more than one did
  d.waitedAtLeast('w0', 1000);
  assert.equal(d.deadlineMs('w0'), 3000);
  d.waitedAtLeast('w0', 3000);
  assert.equal(d.deadlineMs('w0'), 7000);
  // a wait shorter than the usual time teaches nothing; answers bring the mean back down
  d.waitedAtLeast('w0', 500);
  assert.equal(d.deadlineMs('w0'), 7000);
  d.observe('w0', 1000); // 3000 + 0.2 × (1000 - 3000) = 2600
  assert.equal(d.deadlineMs('w0'), 6200);
  d.waitedAtLeast('w0', 50_000);
  assert.equal(d.deadlineMs('w0'), 20_000, 'never past the cap');
  assert.equal(d.deadlineMs('w1'), 1000, "another worker's deadline is its own");
});

test('a first byte overdue that counts against the worker drops what it learned while the whole fleet stalled', () => {
  const d = new FirstByteDeadlines(10_000, 300_000);
  // the whole fleet stalled: each wait, with nothing served anywhere, teaches a longer deadline
  const learned: number[] = [];
  for (let i = 0; i < 5; i++) {
    d.overdue('w0', d.deadlineMs('w0'), false);
    learned.push(d.deadlineMs('w0'));
  }
  assert.deepEqual(learned, [30_000, 70_000, 150_000, 300_000, 300_000]);
  // the fleet serves again and w0 still does not answer: its wait is its own failure, and it is
  // waited for no longer than a worker not yet heard, not the stall's 300 s
  d.overdue('w0', d.deadlineMs('w0'), true);
  assert.equal(d.deadlineMs('w0'), 10_000);
  d.overdue('w0', d.deadlineMs('w0'), true);
  assert.equal(d.deadlineMs('w0'), 10_000);
});

test('a client connection outlasts the inter-chunk timeout: an answer it waits for is not cut under it', () => {
  // an inter-chunk timeout past the default connection timeout raises it when it is not given
  assert.equal(checkTimeouts({ interChunkTimeoutMs: 600_000 }).connectionTimeoutMs, 630_000);
  assert.equal(checkTimeouts({ interChunkTimeoutMs: MAX_TIMER_MS }).connectionTimeoutMs, MAX_TIMER_MS);
  assert.equal(checkTimeouts({ connectionTimeoutMs: 1000, interChunkTimeoutMs: 999 }).connectionTimeoutMs, 1000);
  assert.throws(() => checkTimeouts({ connectionTimeoutMs: 1000 }), {
    name: 'RangeError',
    message: /^timeouts\.connectionTimeoutMs \(1000\) must be more than timeouts\.interChunkTimeoutMs \(300000\)/,
  });
  // serve: the same, naming the flags
  assert.throws(
    () => resolveServe(['--connection-timeout-ms', '1000']),
    /^RangeError: --connection-timeout-ms \(1000\) must be more than --upstream-timeout-ms \(300000\)/,
  );
  assert.throws(
    () => resolveServe(['--upstream-timeout-ms', '400000'], { CONTEXTFORGE_CONNECTION_TIMEOUT_MS: '330000' }),
    /--connection-timeout-ms \(330000\) must be more than --upstream-timeout-ms \(400000\)/,
  );
  const raised = resolveServe(['--upstream-timeout-ms', '600000']);
  assert.equal(raised.config.connectionTimeoutMs, 630_000);
  assert.equal(raised.resolved.values.connectionTimeoutMs, 630_000, '--print-config shows what is used');
  assert.equal(
    resolveServe(['--connection-timeout-ms', '2000', '--upstream-timeout-ms', '1000']).config.connectionTimeoutMs,
    2000,
  );
});
