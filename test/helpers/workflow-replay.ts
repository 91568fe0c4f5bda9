import { createServer } from 'node:net';
import { promptText } from '../../src/sim/workflows.js';
import type { TraceRequest } from '../../src/sim/trace.js';

/** What a replay of a workflow trace saw: the engines' own cache hits, failures, each workflow's workers. */
export class ReplayTally {
  private cached = 0;
  private prompt = 0;
  failed = 0;
  readonly workerOf = new Map<string, Set<string>>();

  /** Sends one trace request (a chat step with its workflow headers) to a gateway and counts its answer. */
  async send(base: string, r: TraceRequest): Promise<void> {
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-workflow-id': r.sessionId!,
        'x-workflow-step': String(r.step),
        'x-agent-role': r.agentRole!,
        ...(r.isolate ? { 'x-kv-isolate': '1' } : {}),
      },
      body: JSON.stringify({ model: 'mock', messages: [{ role: 'user', content: promptText(r) }], max_tokens: 8 }),
    }).catch(() => undefined);
    if (!res || res.status !== 200) {
      this.failed++;
      await res?.arrayBuffer();
      return;
    }
    const body = (await res.json()) as {
      usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } };
    };
    this.cached += body.usage.prompt_tokens_details?.cached_tokens ?? 0;
    this.prompt += body.usage.prompt_tokens;
    // judge steps are isolated on purpose: they reuse nothing, wherever they run
    if (!r.isolate) {
      const set = this.workerOf.get(r.sessionId!) ?? new Set<string>();
      set.add(res.headers.get('x-contextforge-worker')!);
      this.workerOf.set(r.sessionId!, set);
    }
  }

  /** Token-weighted hit rate as the engines reported it. */
  get hitRate(): number {
    return this.prompt > 0 ? this.cached / this.prompt : 0;
  }

  /** Workflows whose (non-isolated) steps ran on more than one engine. */
  split(): string[] {
    return [...this.workerOf].filter(([, s]) => s.size > 1).map(([id]) => id);
  }
}

/** A TCP port nothing listens on now. */
export async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}
