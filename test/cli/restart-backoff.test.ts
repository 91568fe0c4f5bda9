import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RestartBackoff } from '../../src/cli/commands/serve-processes.js';

/** A RestartBackoff on a clock the test moves. */
function backoffAt(): { backoff: RestartBackoff; advance: (ms: number) => void } {
  let now = 1_000_000;
  return { backoff: new RestartBackoff(() => now), advance: (ms) => (now += ms) };
}

test('a process that served 10 s or more is replaced at once', () => {
  const { backoff, advance } = backoffAt();
  backoff.listening(1);
  advance(10_000);
  assert.deepEqual(backoff.exited(1), { delayMs: 0, servedMs: 10_000 });
  backoff.listening(2);
  advance(3_600_000);
  assert.deepEqual(backoff.exited(2), { delayMs: 0, servedMs: 3_600_000 });
});

test('a process that exits soon after it starts serving waits, twice as long each time, up to 10 s', () => {
  const { backoff, advance } = backoffAt();
  const delays: number[] = [];
  for (let id = 1; id <= 10; id++) {
    backoff.listening(id);
    advance(500);
    const { delayMs, servedMs } = backoff.exited(id);
    assert.equal(servedMs, 500);
    delays.push(delayMs);
    advance(delayMs);
  }
  assert.deepEqual(delays, [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]);
});

test('exits before serving and soon after serving add to one pause', () => {
  const { backoff, advance } = backoffAt();
  assert.deepEqual(backoff.exited(1), { delayMs: 100, servedMs: undefined });
  backoff.listening(2);
  advance(9_999);
  assert.deepEqual(backoff.exited(2), { delayMs: 200, servedMs: 9_999 });
  assert.deepEqual(backoff.exited(3), { delayMs: 400, servedMs: undefined });
});

test('a process listening on a second port still counts from its first', () => {
  const { backoff, advance } = backoffAt();
  backoff.listening(1);
  advance(6_000);
  backoff.listening(1);
  advance(6_000);
  assert.deepEqual(backoff.exited(1), { delayMs: 0, servedMs: 12_000 });
});

test('the pause starts again once a process that started serving after the last failure has served 10 s', () => {
  const { backoff, advance } = backoffAt();
  backoff.listening(1); // serves throughout
  advance(1_000);
  assert.deepEqual(
    [2, 3, 4].map((id) => backoff.exited(id).delayMs),
    [100, 200, 400],
  );
  advance(20_000);
  // process 1 has served 21 s, but since before the failures: they still add up
  assert.equal(backoff.exited(5).delayMs, 800);
  backoff.listening(6);
  advance(9_999);
  // 6 has served under 10 s
  assert.equal(backoff.exited(7).delayMs, 1600);
  backoff.listening(8);
  advance(10_000);
  // 8 has served 10 s since the last failure
  assert.equal(backoff.exited(9).delayMs, 100);
  assert.equal(backoff.exited(10).delayMs, 200);
  // a process that started after the last failure, served long and stopped resets it too
  backoff.listening(11);
  advance(20_000);
  assert.equal(backoff.exited(11).delayMs, 0);
  assert.equal(backoff.exited(12).delayMs, 100);
});
