import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConnectionSlots, MAX_ENGINE_CONNECTIONS } from '../../src/server/connection-slots.js';
import { until } from '../helpers/wait.js';

test('a request waits for a free connection in order, and one withdrawn leaves the wait at once', async () => {
  const slots = new ConnectionSlots(2);
  const started: string[] = [];
  const take = (name: string) =>
    slots.take(
      () => started.push(name),
      () => {},
    );
  assert.equal(take('a')(), false, 'a request that started has nothing to withdraw');
  take('b');
  const withdrawC = take('c');
  take('d');
  assert.deepEqual(started, ['a', 'b']);
  assert.equal(slots.queued, 2);
  assert.equal(withdrawC(), true);
  assert.equal(slots.queued, 1, 'the withdrawn request waits no more');
  assert.equal(withdrawC(), false);
  slots.release();
  await until(() => started.length === 3, 'the next waiting request to start');
  assert.deepEqual(started, ['a', 'b', 'd']);
  assert.equal(slots.inUse, 2);
  assert.equal(slots.queued, 0);
  slots.release();
  slots.release();
  await until(() => slots.inUse === 0, 'the connections to be free');
  // with a free connection and nobody waiting, a request starts at once
  take('e');
  assert.deepEqual(started, ['a', 'b', 'd', 'e']);
});

test('the connections kept to one engine are a whole number from 1 to the maximum', () => {
  for (const bad of [0, -1, 1.5, Number.NaN, MAX_ENGINE_CONNECTIONS + 1])
    assert.throws(() => new ConnectionSlots(bad), RangeError);
  assert.equal(new ConnectionSlots(MAX_ENGINE_CONNECTIONS).capacity, MAX_ENGINE_CONNECTIONS);
});

test('withdrawing every waiting request tells each, and starts none of them', async () => {
  const slots = new ConnectionSlots(1);
  const started: string[] = [];
  const withdrawn: string[] = [];
  const take = (name: string) =>
    slots.take(
      () => started.push(name),
      () => withdrawn.push(name),
    );
  take('a');
  const withdrawB = take('b');
  take('c');
  slots.withdrawAll();
  assert.deepEqual(withdrawn, ['b', 'c']);
  assert.equal(slots.queued, 0);
  assert.equal(withdrawB(), false, 'a withdrawn request has nothing left to withdraw');
  slots.release();
  await until(() => slots.inUse === 0, 'the connection to be free');
  assert.deepEqual(started, ['a'], 'no withdrawn request starts when the connection is free');
});

test('a take that does not wait gets a free connection at once, or nothing and no place in the wait', async () => {
  const slots = new ConnectionSlots(2);
  const started: string[] = [];
  assert.equal(slots.tryTake(), true);
  assert.equal(slots.inUse, 1);
  slots.take(
    () => started.push('a'),
    () => {},
  );
  assert.equal(slots.tryTake(), false, 'every connection is taken');
  assert.equal(slots.queued, 0, 'a take that does not wait leaves nothing waiting');
  slots.take(
    () => started.push('b'),
    () => {},
  );
  assert.deepEqual(started, ['a']);
  slots.release();
  await until(() => started.length === 2, 'the waiting request to start');
  assert.equal(slots.tryTake(), false, 'the freed connection went to the waiting request');
  slots.release();
  slots.release();
  await until(() => slots.inUse === 0, 'the connections to be free');
  assert.equal(slots.tryTake(), true);
  assert.equal(slots.inUse, 1);
});
