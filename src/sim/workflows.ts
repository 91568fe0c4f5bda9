import { createRng, randInt, zipfIndex } from '../core/rng.js';
import type { TraceRequest } from './trace.js';

/**
 * A seeded generator of multi-agent workflow traces: pipelines of roles (retriever →
 * summarizer → critic → responder by default) over shared documents. Each step's prompt is
 * a shared system prompt, the workflow's document, and the outputs of its earlier steps;
 * the critic is a judge (isolated: it must not reuse other requests' KV). Workflows start in
 * bursts and belong to CLA groups. Hash ids are prefix-chained as in Mooncake traces.
 */
export interface WorkflowTraceOptions {
  workflows: number;
  seed?: number;
  blockSize?: number;
  documents?: number;
  roles?: readonly string[];
  judgeRoles?: readonly string[];
  claGroups?: number;
  /** Mean gap between bursts of workflow starts (ms). */
  meanBurstGapMs?: number;
  /** Most workflows starting together. */
  maxBurst?: number;
}

export function generateWorkflowTrace(options: WorkflowTraceOptions): TraceRequest[] {
  const o = {
    seed: 1,
    blockSize: 64,
    documents: 24,
    roles: ['retriever', 'summarizer', 'critic', 'responder'],
    judgeRoles: ['critic'],
    claGroups: 2,
    meanBurstGapMs: 1500,
    maxBurst: 6,
    ...options,
  };
  const rng = createRng(o.seed);
  let nextId = 1;
  const fresh = (n: number) => Array.from({ length: n }, () => nextId++);
  // per CLA group a system prompt; per document a run of blocks that follows it
  const system = Array.from({ length: o.claGroups }, () => fresh(8));
  const docs = Array.from({ length: o.documents }, () => randInt(rng, 20, 80));
  const docBlocks = new Map<string, number[]>();
  const docOf = (group: number, d: number) => {
    const key = `${group}:${d}`;
    if (!docBlocks.has(key)) docBlocks.set(key, fresh(docs[d]));
    return docBlocks.get(key)!;
  };

  const out: TraceRequest[] = [];
  let t = 0;
  let w = 0;
  while (w < o.workflows) {
    const burst = Math.min(o.workflows - w, randInt(rng, 1, o.maxBurst));
    for (let b = 0; b < burst; b++, w++) {
      const group = randInt(rng, 0, o.claGroups - 1);
      const d = zipfIndex(rng, o.documents, 1.1);
      const prefix = [...system[group], ...docOf(group, d)];
      let history: number[] = [];
      let at = t + randInt(rng, 0, 200);
      o.roles.forEach((role, step) => {
        const instructionTokens = randInt(rng, 20, o.blockSize - 1);
        const ids = [...prefix, ...history, ...fresh(1)]; // the last, partial block is new
        const outputLength = randInt(rng, 80, 400);
        out.push({
          index: 0,
          timestamp: at,
          inputLength: (ids.length - 1) * o.blockSize + instructionTokens,
          outputLength,
          hashIds: ids,
          blockSize: o.blockSize,
          sessionId: `wf-${w}`,
          step,
          claGroup: group,
          agentRole: role,
          ...(o.judgeRoles.includes(role) ? { isolate: true } : {}),
        });
        // the next step sees this step's instruction and output as new full blocks
        history = [...history, ...fresh(Math.ceil((instructionTokens + outputLength) / o.blockSize))];
        at += randInt(rng, 1500, 4000);
      });
    }
    t += Math.round(-Math.log(1 - rng()) * o.meanBurstGapMs);
  }
  out.sort((a, b) => a.timestamp - b.timestamp);
  out.forEach((r, i) => (r.index = i));
  return out;
}

/** A prompt text whose blocks are shared exactly where the trace's hash ids are (for HTTP replays). */
export function promptText(r: TraceRequest): string {
  return r.hashIds
    .map((id) => `section ${id}: ` + Array.from({ length: 12 }, (_, k) => `w${(id * 31 + k) % 991}`).join(' '))
    .join('\n');
}
