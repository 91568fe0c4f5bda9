import { existsSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import { generateAgenticTrace } from './agentic.js';
import { loadRagpulse } from './ragpulse.js';
import { loadMooncakeTrace, type TraceRequest } from './trace.js';
import { generateWorkflowTrace } from './workflows.js';

/**
 * Loads a trace by name: a Mooncake JSONL file (optionally .gz); a RAGPulse directory (with
 * 0_trace.jsonl and its side files, optionally .gz); `workflows:N[:SEED]`, a generated
 * multi-agent workload of N workflows; or `agentic:N[:SEED]`, N generated long-context
 * coding-agent sessions.
 */
export async function loadTrace(spec: string): Promise<{ name: string; requests: TraceRequest[] }> {
  const gen = /^workflows:(\d+)(?::(\d+))?$/.exec(spec);
  if (gen) {
    const workflows = Number(gen[1]);
    if (workflows < 1) throw new RangeError('--trace workflows:N needs N >= 1');
    return { name: spec, requests: generateWorkflowTrace({ workflows, seed: Number(gen[2] ?? 1) }) };
  }
  const agentic = /^agentic:(\d+)(?::(\d+))?$/.exec(spec);
  if (agentic) {
    const sessions = Number(agentic[1]);
    // each session is ~60 requests of ~1,500 blocks: 500 sessions is already ~30,000 requests
    if (sessions < 1 || sessions > 500) throw new RangeError('--trace agentic:N needs N from 1 to 500');
    return { name: spec, requests: generateAgenticTrace({ sessions, seed: Number(agentic[2] ?? 1) }) };
  }
  if (!existsSync(spec)) throw new RangeError(`--trace: no such file: ${spec}`);
  if (statSync(spec).isDirectory()) {
    if (existsSync(join(spec, '0_trace.jsonl')) || existsSync(join(spec, '0_trace.jsonl.gz'))) {
      return { name: basename(spec), requests: await loadRagpulse(spec) };
    }
    throw new RangeError(`--trace: ${spec} is a directory without a RAGPulse 0_trace.jsonl`);
  }
  return { name: basename(spec), requests: await loadMooncakeTrace(spec) };
}
