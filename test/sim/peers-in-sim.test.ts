import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import { seedAnchor } from '../../src/sim/scenarios.js';
import { simulate } from '../../src/sim/simulator.js';
import { loadMooncakeTrace } from '../../src/sim/trace.js';
import { generateWorkflowTrace } from '../../src/sim/workflows.js';

const head = await loadMooncakeTrace(
  fileURLToPath(new URL('../fixtures/mooncake-conversation-head300.jsonl', import.meta.url)),
);

describe('peers in the simulator', () => {
  test("seed: its caller's anchor is the workflow, else the first block", () => {
    assert.equal(
      seedAnchor({
        index: 0,
        timestamp: 0,
        inputLength: 10,
        outputLength: 1,
        hashIds: [7, 8],
        blockSize: 16,
        sessionId: 'wf-3',
      }),
      'session:wf-3',
    );
    assert.equal(
      seedAnchor({ index: 0, timestamp: 0, inputLength: 10, outputLength: 1, hashIds: [7, 8], blockSize: 16 }),
      'block:7',
    );
    assert.equal(
      seedAnchor({ index: 0, timestamp: 0, inputLength: 10, outputLength: 1, hashIds: [], blockSize: 16 }),
      undefined,
    );
    // at light load every step of a workflow (but the isolated judge) stays on the workflow's worker
    const trace = generateWorkflowTrace({ workflows: 40, seed: 3 });
    const r = simulate(trace, { workers: 4, policy: 'seed', speed: 0.2, engine: { kvTokens: 2_000_000 } });
    const byWorkflow = new Map<string, Set<number>>();
    for (const o of r.outcomes) {
      const req = trace[o.request];
      if (req.isolate) continue;
      const set = byWorkflow.get(req.sessionId!) ?? new Set<number>();
      set.add(o.worker);
      byWorkflow.set(req.sessionId!, set);
    }
    const together = [...byWorkflow.values()].filter((s) => s.size === 1).length;
    assert.ok(together >= 0.9 * byWorkflow.size, `${together} of ${byWorkflow.size} workflows on one worker`);
  });

  test("llmd and llmd-affinity scrape at llm-d's refresh interval (50 ms) unless told otherwise; others at 200 ms", () => {
    const trace = head.slice(0, 40);
    const gaps = (policy: string, extra: object = {}) => {
      const times: number[] = [];
      simulate(trace, { workers: 2, policy, ...extra, onScrape: (t, w) => void (w === 0 && times.push(t)) });
      return times[2] - times[1];
    };
    assert.equal(gaps('llmd'), 50);
    assert.equal(gaps('cost'), 200);
    assert.equal(gaps('llmd', { router: { policyOptions: { llmd: { scrapeIntervalMs: 120 } } } }), 120);
    assert.equal(gaps('llmd', { scrapeIntervalMs: 300 }), 300);
    assert.equal(gaps('llmd-affinity'), 50);
    assert.equal(
      gaps('llmd-affinity', { router: { policyOptions: { 'llmd-affinity': { scrapeIntervalMs: 120 } } } }),
      120,
    );
  });
});
