import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { PrefixSharers } from '../../src/core/policies/prefix-sharers.js';

describe('prefix sharers', () => {
  test('counts the in-flight requests sharing a prefix per worker, until each is released', () => {
    const s = new PrefixSharers();
    s.record(42, 0, 1);
    s.record(42, 0, 2);
    s.record(42, 1, 3);
    s.record(7, 0, 4);
    assert.equal(s.on(42, 0), 2);
    assert.equal(s.on(42, 1), 1);
    assert.equal(s.on(7, 0), 1);
    assert.equal(s.on(42, 2), 0);
    s.release(1);
    assert.equal(s.on(42, 0), 1);
    // released twice, or a ticket never recorded: nothing changes
    s.release(1);
    s.release(99);
    assert.equal(s.on(42, 0), 1);
    s.release(2);
    s.release(3);
    assert.equal(s.on(42, 0), 0);
    assert.equal(s.on(42, 1), 0);
    assert.equal(s.on(7, 0), 1);
  });

  test('an untracked request (ticket 0) or one without a prefix (key 0) is not counted', () => {
    const s = new PrefixSharers();
    s.record(42, 0, 0);
    s.record(0, 0, 5);
    assert.equal(s.on(42, 0), 0);
    assert.equal(s.on(0, 0), 0);
    s.release(5);
    assert.equal(s.on(0, 0), 0);
  });

  test('a ticket that takes an older one’s slot releases it first: the count never leaks', () => {
    const s = new PrefixSharers();
    s.record(42, 0, 1);
    // 16,384 tickets later the same slot is reused
    s.record(42, 1, 1 + (1 << 14));
    assert.equal(s.on(42, 0), 0, 'the older ticket stops counting');
    assert.equal(s.on(42, 1), 1);
    // releasing the older ticket now does not take the newer one's count
    s.release(1);
    assert.equal(s.on(42, 1), 1);
    s.release(1 + (1 << 14));
    assert.equal(s.on(42, 1), 0);
  });

  test('a removed worker forgets its requests, and a later release of them changes nothing', () => {
    const s = new PrefixSharers();
    s.record(42, 3, 1);
    s.record(42, 3, 2);
    s.record(42, 4, 3);
    s.removeWorker(3);
    assert.equal(s.on(42, 3), 0);
    assert.equal(s.on(42, 4), 1);
    s.record(42, 3, 4);
    s.release(1);
    assert.equal(s.on(42, 3), 1, 'the new request on the reused slot still counts');
  });
});
