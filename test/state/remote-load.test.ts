import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { decodeLoadSnapshot, encodeLoadEntry } from '../../src/state/redis-wire.js';
import { MAX_REMOTE_LOAD } from '../../src/core/router/in-flight.js';
import { MAX_WORKERS } from '../../src/core/worker-registry.js';
import {
  MAX_REMOTE_AMOUNT,
  MAX_REMOTE_REPLICAS,
  MAX_REPLICA_ID_LENGTH,
  RemoteLoad,
} from '../../src/state/remote-load.js';

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

  test('reconcile() replaces a tally that disagrees with the snapshot, and leaves one that agrees', () => {
    const r = new RemoteLoad({ hasWorker: (id) => id !== 'gone' });
    r.decided('a', 'w1', 300);
    r.decided('a', 'w2', 50);
    const snapshot = (entries: Record<string, string>) => decodeLoadSnapshot(entries);
    // the same work, with entries this router would leave out (an unknown worker, an empty one)
    const same = snapshot({
      w1: encodeLoadEntry(1, 300, 0),
      w2: encodeLoadEntry(1, 50, 0),
      w3: '0,0,0',
      gone: '9,9,9',
    });
    assert.equal(r.reconcile('a', same), false);
    assert.equal(r.corrected, 0);
    assert.equal(r.unknownWorkers, 0, 'comparing counts nothing');
    // a forged change under a's id: the snapshot wins
    r.replace('a', snapshot({ w1: encodeLoadEntry(5000, 1e8, 1e8) }));
    assert.equal(r.reconcile('a', same), true);
    assert.equal(r.corrected, 1);
    assert.deepEqual(r.sum('w1'), { inFlightRequests: 1, queuedPrefillTokens: 300, activeDecodeTokens: 0 });
    assert.deepEqual(r.sum('w2'), { inFlightRequests: 1, queuedPrefillTokens: 50, activeDecodeTokens: 0 });
    // a tally holding a worker the snapshot does not: the snapshot (no work) wins
    r.decided('a', 'w3', 7);
    assert.equal(r.reconcile('a', same), true);
    assert.deepEqual(r.sum('w3'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
    // a replica not tallied is not started by it
    assert.equal(r.reconcile('b', same), false);
    assert.equal(r.has('b'), false);
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

  test('tallies are kept only for workers this router has; one registered later counts from the next messages', () => {
    const workers = new Set(['w1']);
    const r = new RemoteLoad({ hasWorker: (id) => workers.has(id) });
    assert.equal(r.decided('a', 'w1', 10), true);
    // any well-formed id another replica names, none of them here
    for (let i = 0; i < 1000; i++) assert.equal(r.decided('a', `not-here-${i}`, 10), false);
    r.seed('b', decodeLoadSnapshot({ w1: encodeLoadEntry(1, 5, 0), w9: encodeLoadEntry(3, 30, 0) }));
    r.replace('c', decodeLoadSnapshot({ w9: encodeLoadEntry(2, 20, 0) }));
    assert.equal(r.unknownWorkers, 1002);
    assert.deepEqual(
      [...r.entries()].map(([replica, id]) => `${replica}/${id}`),
      ['a/w1', 'b/w1'],
    );
    // w9 registered here: what the others had on it before is not counted, what follows is
    workers.add('w9');
    assert.deepEqual(r.sum('w9'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
    assert.equal(r.decided('b', 'w9', 7), true);
    assert.deepEqual(r.sum('w9'), { inFlightRequests: 1, queuedPrefillTokens: 7, activeDecodeTokens: 0 });
    // and what a replica seeded from now on says of it
    r.seed('d', decodeLoadSnapshot({ w9: encodeLoadEntry(2, 20, 0) }));
    assert.deepEqual(r.sum('w9'), { inFlightRequests: 3, queuedPrefillTokens: 27, activeDecodeTokens: 0 });
    // removed here: its tallies are forgotten, so it starts from nothing if it comes back
    workers.delete('w9');
    assert.equal(r.forgetUnknownWorkers(), true);
    assert.equal(r.forgetUnknownWorkers(), false);
    workers.add('w9');
    assert.deepEqual(r.sum('w9'), { inFlightRequests: 0, queuedPrefillTokens: 0, activeDecodeTokens: 0 });
    assert.equal(r.refused, 0);
  });

  test('a tally back to nothing is forgotten', () => {
    const r = new RemoteLoad();
    for (let i = 0; i < 100; i++) r.decided('a', `w${i}`, 10);
    r.prefilled('a', 'w0', 10, 40);
    for (let i = 0; i < 100; i++) r.released('a', `w${i}`, 10, i === 0 ? 40 : undefined);
    assert.equal([...r.entries()].length, 0);
    assert.equal(r.has('a'), true);
  });

  test(`past ${MAX_REMOTE_REPLICAS} replicas, or a replica id past ${MAX_REPLICA_ID_LENGTH} characters, the rest is refused, counted and said once`, () => {
    const said: string[] = [];
    const r = new RemoteLoad({ hasWorker: (id) => id === 'w1', onRefused: (why) => said.push(why) });
    for (let i = 0; i < MAX_REMOTE_REPLICAS; i++) assert.equal(r.decided(`r${i}`, 'w1', 1), true);
    assert.equal(r.decided('one-too-many', 'w1', 1), false);
    assert.equal(r.seed('another', decodeLoadSnapshot({ w1: encodeLoadEntry(1, 1, 0) })), false);
    assert.equal(r.replace('and-another', decodeLoadSnapshot({ w1: encodeLoadEntry(1, 1, 0) })), false);
    assert.equal(r.size, MAX_REMOTE_REPLICAS);
    assert.equal(r.has('one-too-many'), false);
    assert.deepEqual(r.sum('w1'), {
      inFlightRequests: MAX_REMOTE_REPLICAS,
      queuedPrefillTokens: MAX_REMOTE_REPLICAS,
      activeDecodeTokens: 0,
    });
    // those tallied still move
    assert.equal(r.released('r0', 'w1', 1, undefined), true);
    assert.equal(r.refused, 3);
    assert.equal(said.length, 1);
    assert.match(said[0], /one-too-many.*256 replicas/);
    // one dropped (it stopped heartbeating): a new one takes its place
    r.drop('r1');
    assert.equal(r.decided('one-too-many', 'w1', 1), true);
    r.clear();
    assert.equal(r.decided('x'.repeat(MAX_REPLICA_ID_LENGTH + 1), 'w1', 1), false);
    assert.equal(r.decided('x'.repeat(MAX_REPLICA_ID_LENGTH), 'w1', 1), true);
    assert.equal(r.refused, 4);
  });

  test(`one replica's work on more than ${MAX_WORKERS} workers (what a router holds) is refused past them`, () => {
    // the relay's tally: no registry to keep to
    const r = new RemoteLoad();
    for (let i = 0; i < MAX_WORKERS; i++) assert.equal(r.decided('a', `w${i}`, 1), true);
    assert.equal(r.decided('a', 'one-more', 1), false);
    assert.equal(r.decided('b', 'one-more', 1), true);
    assert.equal(r.refused, 1);
    // a worker whose work ended makes room
    r.released('a', 'w0', 1, undefined);
    assert.equal(r.decided('a', 'one-more', 1), true);
    const big = new Map(
      Array.from({ length: MAX_WORKERS + 5 }, (_, i) => [`w${i}`, { requests: 1, prefill: 1, decode: 0 }]),
    );
    assert.equal(r.replace('c', big), true);
    assert.equal([...r.entries()].filter(([replica]) => replica === 'c').length, MAX_WORKERS);
    assert.equal(r.refused, 6);
  });
});
