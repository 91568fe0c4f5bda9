import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';

const POLICIES = [
  'cost',
  'round-robin',
  'random',
  'least-loaded',
  'power-of-two',
  'dynamo',
  'llmd',
  'sglang',
  'smg',
  'llmd-affinity',
  'consistent-hash',
] as const;

describe('a dry run shows the decision the next request gets', () => {
  for (const policy of POLICIES)
    test(policy, () => {
      const r = new KVAwareRouter({ policy, blockSize: 4 });
      for (let i = 0; i < 4; i++) r.registerWorker(`w${i}`);
      for (let i = 0; i < 12; i++) {
        const request = { tokens: Array.from({ length: 16 }, (_, k) => 1000 * i + k) };
        // asked twice: a dry run moves no rotation and draws no random number for good
        const shown = r.route(request, { dryRun: true });
        assert.equal(r.route(request, { dryRun: true }).workerId, shown.workerId, `request ${i}, asked again`);
        const routed = r.route(request);
        assert.equal(routed.workerId, shown.workerId, `request ${i}`);
        r.release(routed.ticket);
      }
    });
});
