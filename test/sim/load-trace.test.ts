import assert from 'node:assert/strict';
import { test } from 'node:test';
import { loadTrace, MAX_TRACE_AGENTIC_SESSIONS, MAX_TRACE_WORKFLOWS } from '../../src/sim/load-trace.js';
import { generateWorkflowTrace } from '../../src/sim/workflows.js';

test('workflows:N[:SEED] generates N workflows with the seed', async () => {
  const t = await loadTrace('workflows:3:7');
  assert.equal(t.name, 'workflows:3:7');
  assert.deepEqual(t.requests, generateWorkflowTrace({ workflows: 3, seed: 7 }));
});

test('generated-trace specs out of range are RangeErrors naming --trace and the bound', async () => {
  assert.equal(MAX_TRACE_WORKFLOWS, 10_000);
  assert.equal(MAX_TRACE_AGENTIC_SESSIONS, 500);
  const cases: Array<[string, RegExp]> = [
    ['workflows:0', /^--trace workflows:N needs N from 1 to 10000, got 0$/],
    ['workflows:10001', /^--trace workflows:N needs N from 1 to 10000, got 10001$/],
    ['workflows:99999999999999999999999', /^--trace workflows:N needs N from 1 to 10000/],
    ['agentic:0', /^--trace agentic:N needs N from 1 to 500, got 0$/],
    ['agentic:501', /^--trace agentic:N needs N from 1 to 500, got 501$/],
    ['workflows:2:4294967296', /^--trace workflows:N:SEED needs SEED from 0 to 4294967295, got 4294967296$/],
    ['agentic:2:99999999999999999999', /^--trace agentic:N:SEED needs SEED from 0 to 4294967295/],
    ['workflows:ten', /^--trace workflows:N\[:SEED\] needs whole numbers N and SEED, got 'workflows:ten'$/],
    ['agentic:-3', /^--trace agentic:N\[:SEED\] needs whole numbers N and SEED, got 'agentic:-3'$/],
  ];
  for (const [spec, message] of cases) await assert.rejects(loadTrace(spec), { name: 'RangeError', message }, spec);
});
