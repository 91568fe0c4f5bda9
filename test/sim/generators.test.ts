import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { computeBounds } from '../../src/sim/bounds.js';
import { loadRagpulse, prefixBlockIds } from '../../src/sim/ragpulse.js';
import { simulate } from '../../src/sim/simulator.js';
import { generateWorkflowTrace } from '../../src/sim/workflows.js';

test('the workflow generator is seeded and makes pipelines of roles over shared documents', () => {
  const a = generateWorkflowTrace({ workflows: 30, seed: 5 });
  assert.deepEqual(a, generateWorkflowTrace({ workflows: 30, seed: 5 }));
  assert.notDeepEqual(a, generateWorkflowTrace({ workflows: 30, seed: 6 }));
  assert.equal(a.length, 120);
  const wf = a.filter((r) => r.sessionId === 'wf-0').sort((x, y) => x.step! - y.step!);
  assert.deepEqual(
    wf.map((r) => r.agentRole),
    ['retriever', 'summarizer', 'critic', 'responder'],
  );
  assert.equal(wf[2].isolate, true); // the critic is a judge
  // each step extends the previous step's prefix (minus its partial last block)
  for (let s = 1; s < wf.length; s++)
    assert.deepEqual(wf[s].hashIds.slice(0, wf[s - 1].hashIds.length - 1), wf[s - 1].hashIds.slice(0, -1));
  for (const r of a) assert.equal(r.hashIds.length, Math.ceil(r.inputLength / r.blockSize));
  for (let i = 1; i < a.length; i++) assert.ok(a[i].timestamp >= a[i - 1].timestamp);
});

test('workflow continuity: cost keeps more steps of a workflow on one worker than round-robin', () => {
  const trace = generateWorkflowTrace({ workflows: 80, seed: 9 });
  const continuity = (policy: string) => {
    const r = simulate(trace, { workers: 4, policy });
    const workerOf = new Map(r.outcomes.map((o) => [o.request, o.worker]));
    let same = 0;
    let steps = 0;
    const last = new Map<string, number>();
    for (const req of [...trace].sort((x, y) => x.timestamp - y.timestamp)) {
      const worker = workerOf.get(req.index)!;
      if (req.isolate) continue;
      const prev = last.get(req.sessionId!);
      if (prev !== undefined) {
        steps++;
        if (prev === worker) same++;
      }
      last.set(req.sessionId!, worker);
    }
    return same / steps;
  };
  assert.ok(continuity('cost') > continuity('round-robin') + 0.2);
});

test('RAGPulse: prefix blocks from system prompt and history, passages as content anchors', async () => {
  const dir = fileURLToPath(new URL('../fixtures/ragpulse-sample', import.meta.url));
  assert.ok(existsSync(dir));
  const t = await loadRagpulse(dir);
  assert.equal(t.length, 40);
  for (let i = 1; i < t.length; i++) assert.ok(t[i].timestamp >= t[i - 1].timestamp, 'sorted by time');
  assert.equal(t.filter((r) => r.anchors!.length > 0).length, 33); // 7 of the 40 retrieved no passage
  assert.ok(t.every((r) => r.anchors!.every((a) => a.id.startsWith('passage-') && a.tokens > 0)));
  assert.ok(t.every((r) => r.hashIds.length > 0 && r.blockSize === 64));
  // requests sharing a system prompt share their first blocks
  const firsts = new Set(t.map((r) => r.hashIds[0]));
  assert.ok(firsts.size < t.length);
  // only full blocks of the system prompt and history: user input and web text never count
  // as cached (the prefix blocks stay within the prompt less its passages, web text and input)
  for (const r of t) {
    const passages = r.anchors!.reduce((a, x) => a + x.tokens, 0);
    assert.ok(r.hashIds.length * 64 <= r.inputLength - passages, `request ${r.index}`);
  }
  // with content anchors, the bound counts passages seen before
  const withPassages = computeBounds(t).infiniteCacheHitRate;
  const prefixOnly = computeBounds(t.map((r) => ({ ...r, anchors: undefined }))).infiniteCacheHitRate;
  // the fixture's bounds, pinned: 28.1% from prefix blocks alone, 40.4% with reused passages
  assert.equal(Number(prefixOnly.toFixed(4)), 0.2813);
  assert.equal(Number(withPassages.toFixed(4)), 0.4036);
});

test('RAGPulse prefix blocks: full 64-token blocks of the system-prompt + history stream, chained', () => {
  const lengths = {
    sys_prompt: new Map([[1, 100]]),
    history: new Map([
      [7, 50],
      [8, 50],
    ]),
  };
  const a = prefixBlockIds({ sys_prompt: [1], history: [7] }, lengths, 64);
  const b = prefixBlockIds({ sys_prompt: [1], history: [8] }, lengths, 64);
  const c = prefixBlockIds({ sys_prompt: [1] }, lengths, 64);
  assert.equal(a.length, 2); // 150 tokens: 2 full blocks, the last 22 tokens are not cached
  assert.equal(c.length, 1); // 100 tokens: 1 full block
  assert.equal(a[0], b[0]);
  assert.equal(a[0], c[0]);
  assert.notEqual(a[1], b[1], 'block 1 spans the system prompt and a different history chunk');
  assert.ok(a.every((id) => Number.isSafeInteger(id) && id >= 0));
});
