import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MAX_TIMER_MS } from '../../src/server/timeouts.js';
import { slowProbeGraceMs } from '../../src/server/worker-connections.js';

test("a slow probe's grace, twice the health-check interval, stays within a timer's reach", () => {
  assert.equal(slowProbeGraceMs(2000), 4000);
  assert.equal(slowProbeGraceMs(100), 1000);
  // the longest interval serve takes: twice it would fire at once (Node runs a longer timer after 1 ms)
  assert.equal(slowProbeGraceMs(MAX_TIMER_MS), MAX_TIMER_MS);
  assert.equal(slowProbeGraceMs(2 ** 30), MAX_TIMER_MS);
});

test("a slow probe's grace lasts at least one probe round: an interval, then a probe that may take its whole timeout", () => {
  // the defaults: a 2 s interval and a 5 s probe timeout; the next probe answers up to 7 s after the last ended
  assert.equal(slowProbeGraceMs(2000, 5000), 7250);
  assert.equal(slowProbeGraceMs(100, 500), 1000);
  assert.equal(slowProbeGraceMs(10_000, 5000), 20_000);
  assert.equal(slowProbeGraceMs(MAX_TIMER_MS, 5000), MAX_TIMER_MS);
});
