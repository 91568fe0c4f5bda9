import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';

// Produced by scripts/gen-seed-fixture.py from the seed itself (python3 on
// reference/seed/kv_aware_router.py); regenerate with `npm run seed-fixture`.
interface Op {
  op: 'register' | 'select' | 'update' | 'broadcast' | 'get' | 'stats';
  worker?: string;
  anchor?: string;
  claGroup?: number;
  workflowStep?: number;
  tokenLength?: number;
  load?: number;
  blockIds?: string[];
  expect?: unknown;
}
interface Script {
  options: { enableClaAffinity: boolean; enableAnchorLocality: boolean };
  ops: Op[];
}
const fixture = JSON.parse(readFileSync(new URL('../fixtures/seed-parity.json', import.meta.url), 'utf8')) as {
  scripts: Script[];
};

test('fixture holds enough seed answers to mean something', () => {
  assert.ok(fixture.scripts.length >= 50);
  const reasons = new Set<number>();
  for (const s of fixture.scripts) {
    for (const op of s.ops) if (op.op === 'select') reasons.add((op.expect as { confidence: number }).confidence);
  }
  // every seed rule (0.9 locality, 0.75 CLA, 0.5 least-loaded, 0 no worker) is exercised
  assert.deepEqual([...reasons].sort(), [0, 0.5, 0.75, 0.9]);
});

test("policy 'seed' matches the seed on every decision and stats snapshot", async () => {
  let checked = 0;
  for (const [si, script] of fixture.scripts.entries()) {
    const router = new KVAwareRouter({ numWorkers: 4, policy: 'seed', ...script.options });
    for (const [oi, op] of script.ops.entries()) {
      const where = `script ${si} op ${oi} (${op.op})`;
      switch (op.op) {
        case 'register':
          router.registerWorker(op.worker!);
          break;
        case 'select': {
          const d = await router.selectWorker(op.anchor!, {
            claGroup: op.claGroup ?? null,
            workflowStep: op.workflowStep ?? null,
            tokenLength: op.tokenLength ?? 0,
          });
          assert.deepEqual(d, op.expect, where);
          checked++;
          break;
        }
        case 'update':
          await router.updateWorkerState(op.worker!, op.load!, {
            claGroup: op.claGroup ?? null,
            workflowStep: op.workflowStep ?? null,
          });
          break;
        case 'broadcast':
          await router.broadcastNewBlocks(op.anchor!, op.blockIds!, op.worker!);
          break;
        case 'get':
          assert.equal(router.getWorkerForAnchor(op.anchor!) ?? null, op.expect, where);
          checked++;
          break;
        case 'stats': {
          const s = router.getStats();
          const seedView = {
            numWorkers: s.numWorkers,
            anchorsTracked: s.anchorsTracked,
            claAffinityEnabled: s.claAffinityEnabled,
            anchorLocalityEnabled: s.anchorLocalityEnabled,
            workerLoads: s.workerLoads,
          };
          assert.deepEqual(seedView, op.expect, where);
          // registration order is part of the seed's behaviour: compare it too
          assert.deepEqual(
            Object.keys(s.workerLoads),
            Object.keys((op.expect as { workerLoads: object }).workerLoads),
            where,
          );
          checked++;
          break;
        }
      }
    }
  }
  assert.ok(checked > 2000, `compared ${checked} results`);
});
