import { runAgentWorkload, type AgentWorkloadResult } from '../../sim/agent-workload.js';
import { formatTable, pct } from '../format.js';
import { checkPolicyNames, policyList } from '../options.js';

export interface DemoFlags {
  workers: number;
  workflows: number;
  seed: number;
  policies: string;
  json?: boolean;
}

/** `demo` with its flags parsed: the workload under each policy, side by side on stdout. */
export async function runDemo(opts: DemoFlags): Promise<void> {
  const results: AgentWorkloadResult[] = [];
  const policies = policyList(opts.policies);
  checkPolicyNames(policies);
  for (const policy of policies) {
    results.push(await runAgentWorkload(policy, { workers: opts.workers, workflows: opts.workflows, seed: opts.seed }));
  }
  if (opts.json) {
    process.stdout.write(`${JSON.stringify({ workload: 'agent-workflows', ...opts, results })}\n`);
    return;
  }
  process.stdout.write(renderDemo(results, opts));
}

function renderDemo(
  results: AgentWorkloadResult[],
  opts: { workers: number; workflows: number; seed: number },
): string {
  const out: string[] = [];
  out.push(
    `${opts.workflows} workflows (retriever → summarizer → critic → responder) over shared documents, ` +
      `${opts.workers} workers, 2 CLA groups, background load rising 0.10 → 0.75 (seed ${opts.seed})\n`,
  );
  out.push(
    formatTable(
      [
        'policy',
        'requests',
        'anchor hits',
        'token hit rate',
        'step continuity',
        'sent to load ≥ 0.95',
        'mean confidence',
      ],
      results.map((r) => [
        r.policy,
        String(r.requests),
        pct(r.anchorHitRatio),
        pct(r.tokenHitRatio),
        pct(r.stepContinuity),
        String(r.overloadedPicks),
        r.meanConfidence.toFixed(3),
      ]),
    ),
  );
  out.push('\nper worker: requests assigned (mean load / peak load)\n');
  const workers = results[0]?.assignments.map((_, i) => `w${i}`) ?? [];
  out.push(
    formatTable(
      ['policy', ...workers],
      results.map((r) => [
        r.policy,
        ...r.assignments.map((n, i) => `${n} (${r.meanLoad[i].toFixed(2)} / ${r.peakLoad[i].toFixed(2)})`),
      ]),
    ),
  );
  out.push('\ndecisions by rule\n');
  out.push(
    results
      .map(
        (r) =>
          `  ${r.policy}: ${Object.entries(r.decisionsByReason)
            .map(([k, n]) => `${k} ${n}`)
            .join(', ')}`,
      )
      .join('\n'),
  );
  out.push(
    "\n\nanchor hits and token hit rate come from the workers' own caches, not from the router's belief; " +
      "confidence is each policy's own estimate (seed: a fixed value per rule; cost: the estimated cached fraction).\n",
  );
  return out.join('\n');
}
