// The README's route() example, runnable: node --import tsx examples/route.ts
import { KVAwareRouter } from '../src/index.js';

const systemPromptTokens = Array.from({ length: 2048 }, (_, i) => (i * 7919) % 150_000);
const promptTokens = [...systemPromptTokens, ...Array.from({ length: 252 }, (_, i) => 1000 + i)];

const router = new KVAwareRouter({ policy: 'cost', blockSize: 16, indexMode: 'precise' });
router.registerWorker('gpu-0');
router.registerWorker('gpu-1');
// precise mode: what the engines report storing (the KV-event subscriber calls this)
router.applyStored('gpu-1', router.hashTokens(systemPromptTokens));

const r = router.route({ tokens: promptTokens, workflowId: 'wf-7', workflowStep: 1 }, { explain: true });
console.log({
  workerId: r.workerId,
  cachedTokens: r.cachedTokens,
  promptTokens: r.promptTokens,
  confidence: r.confidence,
  reason: r.reason,
  ticket: r.ticket,
});
console.log(JSON.stringify(r.explain, null, 1));
router.markPrefillDone(r.ticket); // first token seen
router.release(r.ticket); // done, failed or abandoned
