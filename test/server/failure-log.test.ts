import assert from 'node:assert/strict';
import { test } from 'node:test';
import { FailureLog } from '../../src/server/failure-log.js';

test("an engine's failures are logged once per worker and kind a window, the next line counting the rest", () => {
  const lines: string[] = [];
  let now = 1_000;
  const log = new FailureLog(
    (m) => lines.push(m),
    () => now,
    10_000,
  );
  log.failed('w1', 'timeout', 'before-answer', 'req-1', 'retried');
  assert.deepEqual(lines, ['worker w1 failed request "req-1" before its answer (timeout): retried']);
  for (let i = 0; i < 5; i++) log.failed('w1', 'timeout', 'before-answer', `req-${i + 2}`, 'retried');
  assert.equal(lines.length, 1, 'the same kind within the window is counted, not logged');
  // another worker, another reason, another phase: each its own line
  log.failed('w2', 'timeout', 'before-answer', undefined, 'answered with an error');
  log.failed('w1', 'reset', 'before-answer', undefined, 'retried');
  log.failed('w1', 'timeout', 'mid-answer', 'req-9', 'cut');
  assert.deepEqual(lines.slice(1), [
    'worker w2 failed request before its answer (timeout): answered with an error',
    'worker w1 failed request before its answer (reset): retried',
    'worker w1 broke off the answer to request "req-9" after it reached the client (timeout): cut',
  ]);
  now += 10_000;
  log.failed('w1', 'timeout', 'before-answer', 'req-10', 'retried');
  assert.equal(
    lines.at(-1),
    'worker w1 failed request "req-10" before its answer (timeout): retried (and 5 more like it since the last line)',
  );
  // a request id is shown as a JSON string: no line breaks or control characters reach the log
  log.failed('w3', 'timeout', 'before-answer', 'a\nb\u001b[31m', 'retried');
  assert.equal(lines.at(-1), 'worker w3 failed request "a\\nb\\u001b[31m" before its answer (timeout): retried');
  // a clock set back starts a new window rather than muting the worker
  now -= 60_000;
  log.failed('w1', 'timeout', 'before-answer', undefined, 'retried');
  assert.match(lines.at(-1)!, /^worker w1 failed request before its answer \(timeout\): retried$/);
});
