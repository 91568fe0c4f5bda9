import { LRUCache } from 'lru-cache';
import { KVAwareRouter } from '../core/router/index.js';
import { createRng, randInt, zipfIndex } from '../core/rng.js';

/**
 * A scripted multi-agent workload replayed through the core router (`contextforge-router demo`, `npm run demo:core`).
 *
 * Workflows run retriever → summarizer → critic → responder over shared documents. Each
 * step's prompt is the document plus the workflow's history so far, so a step is cheap where
 * the document or the previous step's context is already cached. Workers keep a ground-truth
 * KV cache (least-recently-used, bounded in tokens, keyed by CLA group because KV made under
 * one group is not reusable by another); the router only sees what the seed API tells it:
 * loads, CLA groups and the blocks each request left behind. Background load rises over the
 * run so that VRAM pressure comes into play.
 */
export interface AgentWorkloadOptions {
  workers?: number;
  workflows?: number;
  documents?: number;
  /** Tokens of KV each worker can hold. */
  kvTokensPerWorker?: number;
  /** Tokens of in-flight prompt that make a worker's load 1. */
  loadTokensPerWorker?: number;
  blockSize?: number;
  seed?: number;
}

export const AGENT_ROLES = ['retriever', 'summarizer', 'critic', 'responder'] as const;

export interface AgentWorkloadResult {
  policy: string;
  requests: number;
  /** Requests whose anchor's KV really was on the chosen worker. */
  anchorHitRatio: number;
  /** Cached prompt tokens / prompt tokens, from the workers' ground truth. */
  tokenHitRatio: number;
  /** Steps after the first that ran on the same worker as the previous step. */
  stepContinuity: number;
  /** Requests sent to a worker whose last reported load was at or above 0.95 (saturated). */
  overloadedPicks: number;
  /** Mean of the router's confidence over all decisions. */
  meanConfidence: number;
  /** Requests per worker, in worker order. */
  assignments: number[];
  meanLoad: number[];
  peakLoad: number[];
  decisionsByReason: Record<string, number>;
}

interface Request {
  workflow: number;
  step: number;
  doc: number;
  claGroup: number;
  promptTokens: number;
  outputTokens: number;
}

interface InFlight {
  worker: number;
  tokens: number;
  doneAt: number;
}

const DEFAULTS: Required<AgentWorkloadOptions> = {
  workers: 4,
  workflows: 80,
  documents: 12,
  kvTokensPerWorker: 48_000,
  loadTokensPerWorker: 40_000,
  blockSize: 16,
  seed: 7,
};

function buildWorkflows(o: Required<AgentWorkloadOptions>): { docs: number[]; steps: Request[][]; starts: number[] } {
  const rng = createRng(o.seed);
  const docs = Array.from({ length: o.documents }, () => randInt(rng, 1500, 6000));
  const steps: Request[][] = [];
  const starts: number[] = [];
  let tick = 0;
  for (let w = 0; w < o.workflows; w++) {
    const doc = zipfIndex(rng, o.documents, 1.1);
    const claGroup = rng() < 0.25 ? 1 : 0;
    let history = 0;
    const wf: Request[] = [];
    for (let s = 0; s < AGENT_ROLES.length; s++) {
      const instructions = randInt(rng, 100, 300);
      const outputTokens = randInt(rng, 150, 500);
      wf.push({ workflow: w, step: s, doc, claGroup, promptTokens: docs[doc] + history + instructions, outputTokens });
      history += instructions + outputTokens;
    }
    steps.push(wf);
    starts.push(tick);
    tick += rng() < 0.5 ? 0 : 1; // bursts: often two workflows start together
  }
  return { docs, steps, starts };
}

export async function runAgentWorkload(
  policy: string,
  options: AgentWorkloadOptions = {},
): Promise<AgentWorkloadResult> {
  const o = { ...DEFAULTS, ...options };
  const { docs, steps, starts } = buildWorkflows(o);
  const router = new KVAwareRouter({ policy, numWorkers: o.workers, blockSize: o.blockSize });
  const ids = Array.from({ length: o.workers }, (_, i) => `w${i}`);
  // half the fleet serves CLA group 0, the rest group 1
  ids.forEach((id, i) => router.registerWorker(id, { claGroups: [i < o.workers / 2 ? 0 : 1] }));
  // each worker's ground-truth KV: key → tokens, bounded in tokens, least recently used evicted first
  const truth = ids.map(
    () =>
      new LRUCache<string, number>({ maxSize: o.kvTokensPerWorker, sizeCalculation: (tokens) => Math.max(1, tokens) }),
  );

  let inflight: InFlight[] = [];
  const loadSum = new Array<number>(o.workers).fill(0);
  const peak = new Array<number>(o.workers).fill(0);
  const assignments = new Array<number>(o.workers).fill(0);
  const lastWorker = new Array<number>(o.workflows).fill(-1);
  const nextStep = new Array<number>(o.workflows).fill(0);
  const readyAt = [...starts];
  const loads = new Array<number>(o.workers).fill(0);
  let overloadedPicks = 0;
  let requests = 0,
    anchorHits = 0,
    cached = 0,
    prompt = 0,
    continued = 0,
    laterSteps = 0,
    confidence = 0;
  let ticks = 0;
  const rampTicks = starts[starts.length - 1] + AGENT_ROLES.length * 4;

  for (let tick = 0; nextStep.some((s) => s < AGENT_ROLES.length); tick++) {
    // finished work leaves the workers; loads reach the router as a metrics scrape would
    inflight = inflight.filter((f) => f.doneAt > tick);
    const background = 0.1 + 0.65 * Math.min(1, tick / rampTicks); // other tenants, rising
    for (let w = 0; w < o.workers; w++) {
      let tokens = 0;
      for (const f of inflight) if (f.worker === w) tokens += f.tokens;
      const load = Math.min(1, background + tokens / o.loadTokensPerWorker);
      loads[w] = load;
      loadSum[w] += load;
      peak[w] = Math.max(peak[w], load);
      await router.updateWorkerState(ids[w], load);
    }
    ticks++;

    for (let wf = 0; wf < o.workflows; wf++) {
      if (nextStep[wf] >= AGENT_ROLES.length || readyAt[wf] > tick) continue;
      const req = steps[wf][nextStep[wf]++];
      // step 0 retrieves a shared document; later steps extend the workflow's own context
      const anchor = req.step === 0 ? `doc:${req.doc}` : `wf:${wf}`;
      const d = await router.selectWorker(anchor, {
        claGroup: req.claGroup,
        workflowId: `wf:${wf}`,
        workflowStep: req.step,
        tokenLength: req.promptTokens,
      });
      const w = ids.indexOf(d.targetWorkerId);
      if (w < 0) throw new Error(`router returned no worker for workflow ${wf} step ${req.step}`);

      const cache = truth[w];
      const docKey = `${req.claGroup}:doc:${req.doc}`;
      const ctxKey = `${req.claGroup}:wf:${wf}`;
      const docHit = (cache.get(docKey) ?? 0) > 0 ? docs[req.doc] : 0;
      const ctxHit = Math.min(cache.get(ctxKey) ?? 0, req.promptTokens);
      const hitTokens = Math.max(docHit, ctxHit);
      anchorHits += (req.step === 0 ? docHit : ctxHit) > 0 ? 1 : 0;
      cached += hitTokens;
      prompt += req.promptTokens;
      confidence += d.confidence;
      requests++;
      assignments[w]++;
      if (loads[w] >= 0.95) overloadedPicks++;
      if (req.step > 0) {
        laterSteps++;
        if (lastWorker[wf] === w) continued++;
      }
      lastWorker[wf] = w;

      // the engine now holds the document and the whole context, and says so
      const contextTokens = req.promptTokens + req.outputTokens;
      cache.set(docKey, docs[req.doc]);
      cache.set(ctxKey, contextTokens);
      await router.broadcastNewBlocks(
        anchor,
        blockIds(anchor, req.step === 0 ? docs[req.doc] : contextTokens, o.blockSize),
        d.targetWorkerId,
      );

      // prefill of uncached tokens and the decode take time; the next step waits for it
      const busyTicks = 1 + Math.ceil((req.promptTokens - hitTokens) / 4000) + Math.ceil(req.outputTokens / 400);
      inflight.push({ worker: w, tokens: req.promptTokens, doneAt: tick + busyTicks });
      readyAt[wf] = tick + busyTicks;
    }
  }

  const round = (x: number) => Math.round(x * 10_000) / 10_000;
  return {
    policy,
    requests,
    anchorHitRatio: round(anchorHits / requests),
    tokenHitRatio: round(cached / prompt),
    stepContinuity: round(continued / laterSteps),
    overloadedPicks,
    meanConfidence: round(confidence / requests),
    assignments,
    meanLoad: loadSum.map((s) => round(s / ticks)),
    peakLoad: peak.map(round),
    decisionsByReason: Object.fromEntries(Object.entries(router.getStats().decisionsByReason).filter(([, n]) => n > 0)),
  };
}

function blockIds(anchor: string, tokens: number, blockSize: number): string[] {
  return Array.from({ length: Math.floor(tokens / blockSize) }, (_, i) => `${anchor}#${i}`);
}
