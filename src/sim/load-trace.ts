import { existsSync, statSync } from 'node:fs';
import { MAX_SEED } from '../core/rng.js';
import { quotedText, shownText } from '../core/shown-text.js';
import { basename, join } from 'node:path';
import { generateAgenticTrace } from './agentic.js';
import { loadRagpulse, ragpulseFiles } from './ragpulse.js';
import { loadMooncakeTrace, ReplayError, type TraceRequest } from './trace.js';
import { generateWorkflowTrace } from './workflows.js';

/** Most workflows `workflows:N` generates: 4 requests each, so ~40,000 requests at most. */
export const MAX_TRACE_WORKFLOWS = 10_000;
/** Most sessions `agentic:N` generates: ~60 requests of ~1,500 blocks each, so ~30,000 requests at most. */
export const MAX_TRACE_AGENTIC_SESSIONS = 500;
/** Generator seeds are 32-bit: larger ones would only repeat smaller ones. */
const MAX_TRACE_SEED = MAX_SEED;

/** N and SEED of a `KIND:N[:SEED]` generated-trace spec, each checked against its range. */
function generatorSpec(kind: string, spec: string, max: number): { n: number; seed: number } {
  const m = /^[a-z]+:(\d+)(?::(\d+))?$/.exec(spec);
  if (!m) throw new RangeError(`--trace ${kind}:N[:SEED] needs whole numbers N and SEED, got ${quotedText(spec)}`);
  const n = Number(m[1]);
  if (n < 1 || n > max) throw new RangeError(`--trace ${kind}:N needs N from 1 to ${max}, got ${m[1]}`);
  const seed = Number(m[2] ?? 1);
  if (seed > MAX_TRACE_SEED)
    throw new RangeError(`--trace ${kind}:N:SEED needs SEED from 0 to ${MAX_TRACE_SEED}, got ${m[2]}`);
  return { n, seed };
}

/**
 * Loads a trace by name: a Mooncake JSONL file (optionally .gz); a RAGPulse directory (with
 * 0_trace.jsonl and its side files, optionally .gz); `workflows:N[:SEED]`, a generated
 * multi-agent workload of N workflows (N up to MAX_TRACE_WORKFLOWS); or `agentic:N[:SEED]`,
 * N generated long-context coding-agent sessions (N up to MAX_TRACE_AGENTIC_SESSIONS).
 * A spec out of range is a RangeError naming `--trace`.
 */
export async function loadTrace(spec: string): Promise<{ name: string; requests: TraceRequest[] }> {
  if (spec.startsWith('workflows:')) {
    const { n, seed } = generatorSpec('workflows', spec, MAX_TRACE_WORKFLOWS);
    return { name: spec, requests: generateWorkflowTrace({ workflows: n, seed }) };
  }
  if (spec.startsWith('agentic:')) {
    const { n, seed } = generatorSpec('agentic', spec, MAX_TRACE_AGENTIC_SESSIONS);
    return { name: spec, requests: generateAgenticTrace({ sessions: n, seed }) };
  }
  if (!existsSync(spec)) throw new RangeError(`--trace: no such file: ${shownText(spec)}`);
  if (statSync(spec).isDirectory()) {
    if (isRagpulseDir(spec)) {
      return { name: basename(spec), requests: await loadRagpulse(spec) };
    }
    throw new RangeError(`--trace: ${shownText(spec)} is a directory without a RAGPulse 0_trace.jsonl`);
  }
  return { name: basename(spec), requests: await loadMooncakeTrace(spec) };
}

/** Whether `spec` names a RAGPulse directory (with its 0_trace.jsonl, or .gz). */
const isRagpulseDir = (spec: string): boolean =>
  existsSync(join(spec, '0_trace.jsonl')) || existsSync(join(spec, '0_trace.jsonl.gz'));

/**
 * The files loadTrace reads for `spec` when they are not `spec` itself: a RAGPulse directory's
 * (ragpulseFiles); undefined for a file, which is read as named, and [] for a generated trace.
 * An output must be none of them.
 */
export function traceFiles(spec: string): Array<{ file: string; shadows?: string }> | undefined {
  if (spec.startsWith('workflows:') || spec.startsWith('agentic:')) return [];
  try {
    if (statSync(spec).isDirectory()) return isRagpulseDir(spec) ? ragpulseFiles(spec) : [];
  } catch {
    // no such file: loadTrace says so
  }
  return undefined;
}

/**
 * `replay()`, with a trace that cannot be replayed as given (a ReplayError: its span at the
 * speed, its answers past it) named as --trace gave it: `--trace traces/a.jsonl: the trace
 * spans …`. The ReplayError's message names the requests at fault by their line alone.
 */
export function namingTrace<T>(spec: string, replay: () => T): T {
  try {
    return replay();
  } catch (err) {
    if (err instanceof ReplayError) throw new RangeError(`--trace ${shownText(spec)}: ${err.message}`, { cause: err });
    throw err;
  }
}
