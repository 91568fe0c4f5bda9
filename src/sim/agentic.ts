import { createRng, randInt } from '../core/rng.js';
import type { TraceRequest } from './trace.js';

/**
 * A seeded generator of long-context coding-agent traces (`agentic:N[:SEED]`): N sessions of
 * an agent working in a repository, each turn re-sending the whole conversation so far.
 *
 * - Every prompt starts with one system prompt and tool definitions shared by all sessions,
 *   then the session's own repository context and first instruction (≈ 10–16k tokens in all).
 * - Each turn appends the model's last answer (a tool call or a file edit, log-normal around
 *   250 tokens) and the tool's result (file reads, command output: log-normal around 2,500
 *   tokens, up to 40,000), so prompts grow by a few thousand tokens a turn; one turn in eight
 *   is a new user message instead. Sessions run 15–60 turns.
 * - When a session's context passes its compaction threshold (160k–400k tokens, drawn per
 *   session) the agent compacts: the next prompt is the shared prefix, the repository context
 *   and a summary, and the conversation grows again from there.
 * - Now and then (4% of turns) the agent starts 1–3 sub-agents in parallel: each forks the
 *   session's whole context so far, adds its task, and runs 3–10 turns of its own; the
 *   session's next turn waits for all of them and carries their reports.
 * - Think time between a turn's answer and the next request: tool runs of 0.5–20 s, a user's
 *   reply of 10–120 s; the answer itself is estimated at 1 s + 25 ms per output token (the
 *   trace is open-loop: arrival times are fixed when it is generated).
 * - Sessions start with exponential gaps (mean 45 s), so tens of them overlap.
 * Blocks are 64 tokens; hash ids are prefix-chained (equal id ⇒ equal prefix): full blocks
 * keep their ids from turn to turn, a prompt's partial last block is always new.
 */
export interface AgenticTraceOptions {
  sessions: number;
  seed?: number;
  blockSize?: number;
  /** Mean gap between session starts (ms). */
  meanSessionGapMs?: number;
}

/** The token stream of one conversation, cut into blocks with stable ids. */
class Context {
  constructor(
    public full: number[],
    public partial: number,
    private readonly fresh: () => number,
    private readonly blockSize: number,
  ) {}

  get tokens(): number {
    return this.full.length * this.blockSize + this.partial;
  }

  append(tokens: number): void {
    let left = tokens;
    while (left > 0) {
      const take = Math.min(left, this.blockSize - this.partial);
      this.partial += take;
      left -= take;
      if (this.partial === this.blockSize) {
        this.full.push(this.fresh());
        this.partial = 0;
      }
    }
  }

  /** Hash ids of a prompt of this context: its full blocks, then a new id for the partial one. */
  hashIds(): number[] {
    return this.partial > 0 ? [...this.full, this.fresh()] : [...this.full];
  }

  fork(): Context {
    return new Context([...this.full], this.partial, this.fresh, this.blockSize);
  }
}

function logNormal(rng: () => number, median: number, sigma: number): number {
  // Box–Muller
  const u = Math.max(1e-12, rng());
  const v = rng();
  return median * Math.exp(sigma * Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v));
}

export function generateAgenticTrace(options: AgenticTraceOptions): TraceRequest[] {
  const o = { seed: 1, blockSize: 64, meanSessionGapMs: 45_000, ...options };
  if (!Number.isInteger(o.sessions) || o.sessions < 1)
    throw new RangeError(`sessions must be a positive integer, got ${o.sessions}`);
  if (!Number.isInteger(o.blockSize) || o.blockSize < 1)
    throw new RangeError(`blockSize must be a positive integer, got ${o.blockSize}`);
  if (!(o.meanSessionGapMs >= 0) || !Number.isFinite(o.meanSessionGapMs))
    throw new RangeError(`meanSessionGapMs must be a finite number >= 0, got ${o.meanSessionGapMs}`);
  const rng = createRng((o.seed * 2_654_435_761 + 17) >>> 0);
  const bs = o.blockSize;
  let nextId = 1;
  const fresh = () => nextId++;
  const out: TraceRequest[] = [];

  // the shared system prompt and tool definitions: whole blocks, common to every session
  const systemTokens = Math.round(randInt(rng, 8_000, 10_000) / bs) * bs;
  const system = new Context([], 0, fresh, bs);
  system.append(systemTokens);

  const answerMs = (output: number) => 1000 + 25 * output;
  const outputLength = () => Math.min(8_000, Math.max(20, Math.round(logNormal(rng, 250, 1.0))));
  const toolResult = () => Math.min(40_000, Math.max(50, Math.round(logNormal(rng, 2_500, 1.1))));

  const emit = (ctx: Context, at: number, output: number, sessionId: string, step: number, agentRole: string) => {
    out.push({
      index: 0,
      timestamp: Math.round(at),
      inputLength: ctx.tokens,
      outputLength: output,
      hashIds: ctx.hashIds(),
      blockSize: bs,
      sessionId,
      step,
      agentRole,
    });
  };

  let start = 0;
  for (let s = 0; s < o.sessions; s++) {
    const sessionId = `agent-${s}`;
    const repoTokens = randInt(rng, 500, 4_000);
    const base = system.fork();
    base.append(repoTokens);
    let ctx = base.fork();
    ctx.append(randInt(rng, 100, 2_000)); // the first instruction
    const turns = randInt(rng, 15, 60);
    const compactAt = randInt(rng, 160_000, 400_000);
    let at = start;
    let sub = 0;
    for (let t = 0; t < turns; t++) {
      const output = outputLength();
      emit(ctx, at, output, sessionId, t, 'main');
      at += answerMs(output);
      ctx.append(output);
      if (rng() < 0.04 && t < turns - 1) {
        // sub-agents fork the whole context so far and run in parallel; the session waits
        const count = randInt(rng, 1, 3);
        let back = at;
        let reports = 0;
        for (let k = 0; k < count; k++, sub++) {
          const child = ctx.fork();
          child.append(randInt(rng, 200, 1_500)); // its task
          let cat = at + randInt(rng, 200, 1_000);
          const childTurns = randInt(rng, 3, 10);
          for (let ct = 0; ct < childTurns; ct++) {
            const cout = outputLength();
            emit(child, cat, cout, `${sessionId}/sub-${sub}`, ct, 'subagent');
            cat += answerMs(cout);
            child.append(cout);
            if (ct < childTurns - 1) {
              child.append(toolResult());
              cat += randInt(rng, 500, 20_000);
            }
          }
          back = Math.max(back, cat);
          reports += randInt(rng, 300, 2_000);
        }
        ctx.append(reports);
        at = back + randInt(rng, 200, 2_000);
      } else if (rng() < 0.125) {
        ctx.append(randInt(rng, 20, 1_500)); // the user says something new
        at += randInt(rng, 10_000, 120_000);
      } else {
        ctx.append(toolResult());
        at += randInt(rng, 500, 20_000);
      }
      if (ctx.tokens > compactAt) {
        // compaction: the conversation is replaced by a summary after the repository context
        ctx = base.fork();
        ctx.append(randInt(rng, 3_000, 8_000));
      }
    }
    start += Math.round(-Math.log(1 - rng()) * o.meanSessionGapMs);
  }
  out.sort((a, b) => a.timestamp - b.timestamp);
  out.forEach((r, i) => (r.index = i));
  return out;
}
