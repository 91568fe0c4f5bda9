// The README's API example, runnable: node --import tsx examples/quickstart.ts
import { KVAwareRouter } from '../src/index.js';

const router = new KVAwareRouter({ policy: 'cost' }); // or 'seed'
router.registerWorker('gpu-0');
router.registerWorker('gpu-1', { claGroups: [1] });

await router.updateWorkerState('gpu-0', 0.35, { claGroup: 0 });
const d = await router.selectWorker('doc-42', { claGroup: 0, workflowId: 'wf-7', workflowStep: 0, tokenLength: 4096 });
console.log(d);
await router.broadcastNewBlocks('doc-42', ['blk-1', 'blk-2'], d.targetWorkerId);

const again = await router.selectWorker('doc-42', {
  claGroup: 0,
  workflowId: 'wf-7',
  workflowStep: 1,
  tokenLength: 4096,
});
console.log(again);
console.log(router.getWorkerForAnchor('doc-42'));
router.drainWorker('gpu-1');
router.removeWorker('gpu-1');
console.log(JSON.stringify(router.getStats(), null, 2));
