import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { sharePrefillReads } from '../../src/state/prefill-sharing.js';
import { RecordingStateStore } from '../helpers/recording-state-store.js';

test('a prefill the router reads off the engine goes to the other replicas, for shared decisions only', () => {
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
  router.registerWorker('w0');
  const store = new RecordingStateStore();
  const prefilled = store.prefilled;
  const stop = sharePrefillReads(router, store);
  const tokens = (family: number) => Array.from({ length: 64 }, (_, i) => family * 1000 + i);
  const storeAll = (t: number[]) => router.applyStored('w0', router.hashTokens(t));

  const shared = router.route({ tokens: tokens(1) }, { share: true, firstTokenReported: false });
  // released before its prefill was read: nothing to tell
  const released = router.route({ tokens: tokens(2) }, { share: true, firstTokenReported: false });
  router.release(released.ticket);
  // not shared (one replica), or streamed (its first byte tells the others itself)
  router.route({ tokens: tokens(3) }, { firstTokenReported: false });
  const streamed = router.route({ tokens: tokens(5) }, { share: true });

  storeAll(tokens(1));
  storeAll(tokens(2));
  storeAll(tokens(3));
  storeAll(tokens(5));
  assert.deepEqual(prefilled, [shared.shared]);
  router.markPrefillDone(streamed.ticket);
  assert.equal(prefilled.length, 1, 'a reported first token is the caller’s to tell');

  stop();
  router.route({ tokens: tokens(4) }, { share: true, firstTokenReported: false });
  storeAll(tokens(4));
  assert.equal(prefilled.length, 1, 'stopped: no longer listening');
});
