import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { PrefillSharing } from '../../src/state/prefill-sharing.js';
import { RecordingStateStore } from '../helpers/recording-state-store.js';

test('a prefill the router reads off the engine goes to the other replicas, for followed decisions only', () => {
  const router = new KVAwareRouter({ blockSize: 16, indexMode: 'precise' });
  router.registerWorker('w0');
  const store = new RecordingStateStore();
  const prefilled = store.prefilled;
  const sharing = new PrefillSharing(router, store);
  const tokens = (family: number) => Array.from({ length: 64 }, (_, i) => family * 1000 + i);
  const storeAll = (t: number[]) => router.applyStored('w0', router.hashTokens(t));

  const followed = router.route({ tokens: tokens(1) }, { share: true, firstTokenReported: false });
  sharing.follow(followed.ticket, followed.shared!);
  const forgotten = router.route({ tokens: tokens(2) }, { share: true, firstTokenReported: false });
  sharing.follow(forgotten.ticket, forgotten.shared!);
  sharing.forget(forgotten.ticket);
  // not followed at all (a streamed answer's first byte tells the others itself)
  router.route({ tokens: tokens(3) }, { share: true, firstTokenReported: false });
  assert.equal(sharing.size, 1);

  storeAll(tokens(1));
  storeAll(tokens(2));
  storeAll(tokens(3));
  assert.deepEqual(prefilled, [followed.shared]);
  router.release(followed.ticket);
  sharing.forget(followed.ticket);
  assert.equal(sharing.size, 0);

  sharing.close();
  const late = router.route({ tokens: tokens(4) }, { share: true, firstTokenReported: false });
  sharing.follow(late.ticket, late.shared!);
  storeAll(tokens(4));
  assert.equal(prefilled.length, 1, 'closed: no longer listening');
});
