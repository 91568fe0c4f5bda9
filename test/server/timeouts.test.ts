import assert from 'node:assert/strict';
import { test } from 'node:test';
import { checkTimeouts, DEFAULT_TIMEOUTS, FirstByteDeadlines } from '../../src/server/timeouts.js';
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
