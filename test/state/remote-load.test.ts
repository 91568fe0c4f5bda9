import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { decodeLoadSnapshot, encodeLoadEntry } from '../../src/state/redis-wire.js';
import { MAX_REMOTE_LOAD } from '../../src/core/router/in-flight.js';
import { MAX_REMOTE_AMOUNT, RemoteLoad } from '../../src/state/remote-load.js';

describe('RemoteLoad', () => {
  test('decisions and releases move one replica’s tally; the sum covers every replica', () => {
    const r = new RemoteLoad();
    assert.equal(r.decided('a', 'w1', 300), true);
    assert.equal(r.decided('a', 'w1', 200), true);
    assert.equal(r.decided('b', 'w1', 50), true);
    assert.equal(r.decided('b', 'w2', 70), true);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 3, queuedPrefillTokens: 550, activeDecodeTokens: 0 });
    assert.deepEqual(r.sum('w2'), { inFlightRequests: 1, queuedPrefillTokens: 70, activeDecodeTokens: 0 });
    r.released('a', 'w1', 300, undefined);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 2, queuedPrefillTokens: 250, activeDecodeTokens: 0 });
    assert.deepEqual(r.sum('unknown'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
  });

  test('a release without its decision never drives a tally below zero', () => {
    const r = new RemoteLoad();
    r.decided('a', 'w1', 10);
    r.released('a', 'w1', 10, undefined);
    r.released('a', 'w1', 500, undefined);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
    r.decided('a', 'w1', 40);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 1, queuedPrefillTokens: 40, activeDecodeTokens: 0 });
  });

  test('prefill-done moves a request’s tokens from queued prefill to decode; its release takes the decode off', () => {
    const r = new RemoteLoad();
    r.decided('a', 'w1', 300);
    r.decided('a', 'w1', 200);
    assert.equal(r.prefilled('a', 'w1', 300, 1000), true);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 2, queuedPrefillTokens: 200, activeDecodeTokens: 1000 });
    // the prefilled request ends: its decode tokens leave, the other request's prefill stays
    assert.equal(r.released('a', 'w1', 300, 1000), true);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 1, queuedPrefillTokens: 200, activeDecodeTokens: 0 });
    // the other one ends before its first token: its prefill leaves
    r.released('a', 'w1', 200, undefined);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
  });

  test('a non-finite change is ignored and changes nothing', () => {
    const r = new RemoteLoad();
    r.decided('a', 'w1', 10);
    assert.equal(r.decided('a', 'w1', Number.NaN), false);
    assert.equal(r.decided('a', 'w1', Number.POSITIVE_INFINITY), false);
    assert.equal(r.has('c'), false);
    assert.equal(r.decided('c', 'w1', Number.NaN), false);
    assert.equal(r.has('c'), false);
    assert.equal(r.prefilled('a', 'w1', 10, Number.NaN), false);
    assert.equal(r.released('a', 'w1', 10, Number.NEGATIVE_INFINITY), false);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 1, queuedPrefillTokens: 10, activeDecodeTokens: 0 });
  });

  test('snapshots seed replicas not heard from yet, never over a tally messages started', () => {
    const r = new RemoteLoad();
    r.decided('a', 'w1', 10);
    r.seed('a', decodeLoadSnapshot({ w1: encodeLoadEntry(9, 900, 90) }));
    r.seed('b', decodeLoadSnapshot({ w1: encodeLoadEntry(2, 64, 512), w2: '1,2', w3: '1,-5,0', w4: 'x,1,1' }));
    assert.equal(r.has('b'), true);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 3, queuedPrefillTokens: 74, activeDecodeTokens: 512 });
    // malformed and negative snapshot entries are left out
    assert.deepEqual(r.sum('w2'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
    assert.deepEqual(r.sum('w3'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
    assert.deepEqual(r.sum('w4'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
  });

  test('replicas that stopped heartbeating are dropped with their requests; clear forgets all', () => {
    const r = new RemoteLoad();
    r.decided('a', 'w1', 10);
    r.decided('b', 'w1', 20);
    r.decided('c', 'w1', 40);
    assert.equal(r.retain(new Set(['a', 'c'])), true);
    assert.equal(r.has('b'), false);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 2, queuedPrefillTokens: 50, activeDecodeTokens: 0 });
    assert.equal(r.retain(new Set(['a', 'c', 'unseen'])), false);
    r.clear();
    assert.equal(r.has('a'), false);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
  });

  test('a sum past what the router takes is clamped to MAX_REMOTE_LOAD, and counted', () => {
    const r = new RemoteLoad();
    // each amount in range, their sum over replicas (and over messages of one) past it
    for (const replica of ['a', 'b', 'c']) assert.equal(r.decided(replica, 'w1', MAX_REMOTE_AMOUNT), true);
    r.decided('a', 'w1', MAX_REMOTE_AMOUNT);
    r.add('a', 'w2', 1e300, 7, 1e300); // a snapshot entry (the relay's) is only checked to be finite
    assert.equal(r.clamped, 0);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 4, queuedPrefillTokens: MAX_REMOTE_LOAD, activeDecodeTokens: 0 });
    assert.equal(r.clamped, 1);
    assert.deepEqual(r.sum('w2'), {
      inFlightRequests: MAX_REMOTE_LOAD,
      queuedPrefillTokens: 7,
      activeDecodeTokens: MAX_REMOTE_LOAD,
    });
    assert.equal(r.clamped, 2);
    assert.deepEqual(r.sum('w3'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
    assert.equal(r.clamped, 2);
  });

  test('snapshot entries of ids the router would refuse are left out; __proto__ is an id like any other', () => {
    const hash = JSON.parse(
      JSON.stringify({
        ['x'.repeat(257)]: '1,1,1',
        '\uD800': '1,1,1',
        '': '1,1,1',
        ['__proto__']: '1,2,3',
        constructor: '4,5,6',
        bad: 5,
      }),
    ) as Record<string, string>;
    hash['x'.repeat(256)] = '7,8,9';
    const load = decodeLoadSnapshot(hash);
    assert.deepEqual([...load.keys()].sort(), ['__proto__', 'constructor', 'x'.repeat(256)].sort());
    assert.deepEqual(load.get('__proto__'), { requests: 1, prefill: 2, decode: 3 });
  });
});
