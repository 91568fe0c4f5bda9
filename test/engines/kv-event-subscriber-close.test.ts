/**
 * A worker's removal closes its KV-event subscriber: every socket and file descriptor it opened
 * is released, whatever state it was in (connected, replaying, retrying an engine that is not
 * there, refused its endpoint, never started). ZeroMQ releases a closed socket on its reaper
 * thread; closing the socket's observer before the socket once left that thread blocked for
 * good (zeromq/zeromq.js#716): no socket was released after, a few descriptors a cycle, until
 * ZeroMQ's max_sockets refused every new one.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { test } from 'node:test';
import { subscriberCyclesInProcess } from '../helpers/subscriber-cycles.js';

// descriptors are counted in /proc/self/fd: elsewhere the test is skipped, but not in CI, which
// must run it
const countable = existsSync('/proc/self/fd');
const skip = !countable && process.env.CI !== 'true' ? 'no /proc/self/fd to count open descriptors' : false;

/** Descriptors a closed subscriber may leave behind in all, whatever the number of cycles. */
const SLACK = 8;

test('subscribers opened and closed in every state leave no socket or descriptor behind', { skip }, async () => {
  const cycles = 60;
  const r = await subscriberCyclesInProcess(cycles, SLACK, 10_000);
  assert.ok(
    r.after <= r.before + SLACK,
    `${r.after - r.before} descriptors more after ${cycles} subscribers (${r.states.join(', ')}) were opened and closed: ${r.before} before, ${r.after} after`,
  );
  assert.ok(r.exited, 'the process exits of itself once done');
});
