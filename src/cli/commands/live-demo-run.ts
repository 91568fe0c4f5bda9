import { setMaxListeners } from 'node:events';
import { KVAwareRouter } from '../../core/router/index.js';
import { KvEventApplier } from '../../engines/kv-events/applier.js';
import { KvEventSubscriber } from '../../engines/kv-events/subscriber.js';
import { MockEngine } from '../../engines/mock-engine.js';
import { createGateway } from '../../server/gateway.js';
import { DEFAULT_REQUEST_LIMITS, routerIdBytes } from '../../server/request-limits.js';
import { generateWorkflowTrace, promptText } from '../../sim/workflows.js';
import type { TraceRequest } from '../../sim/trace.js';
import { formatTable, pct } from '../format.js';
import { percentile } from '../../sim/percentile.js';

/**
 * The full demo (`npm start`): 4 mock engines and the router in this process, a multi-agent
 * workload replayed through HTTP with the official openai client, once per policy on fresh
 * engines; hit rate (as the engines report it) and time to first token, side by side.
 */
interface DemoResult {
  policy: string;
  requests: number;
  hitRate: number;
  ttftMeanMs: number;
  ttftP90Ms: number;
  perWorker: Record<string, number>;
}

async function runPolicy(
  policy: string,
  trace: TraceRequest[],
  workers: number,
  speed: number,
  signal: AbortSignal,
  progress: (done: number) => void,
): Promise<DemoResult> {
  const engines: MockEngine[] = [];
  const subs: KvEventSubscriber[] = [];
  let gateway: Awaited<ReturnType<typeof createGateway>> | undefined;
  const router = new KVAwareRouter({
    policy,
    blockSize: 16,
    indexMode: 'precise',
    // the gateway below runs at the default limits: the ids they let through pass the router
    maxIdBytes: routerIdBytes(DEFAULT_REQUEST_LIMITS.maxIdBytes),
  });
  const applier = new KvEventApplier(router);
  try {
    for (let i = 0; i < workers; i++)
      engines.push(
        await new MockEngine({
          kvBlocks: 2048,
          prefillTokS: 20_000,
          decodeTokS: 400,
          events: 'tcp://127.0.0.1:*',
          replay: 'tcp://127.0.0.1:*',
        }).start(),
      );
    gateway = await createGateway({
      router,
      applier,
      tokenize: 'engine',
      workers: engines.map((e, i) => ({ id: `engine-${i}`, url: `http://127.0.0.1:${e.port}` })),
    });
    engines.forEach((e, i) =>
      subs.push(
        new KvEventSubscriber({
          workerId: `engine-${i}`,
          endpoint: e.eventsEndpoint,
          replayEndpoint: e.replayEndpoint,
          applier,
        }).start(),
      ),
    );
    const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
    // the openai client is a development dependency: loaded only when the demo runs
    const { default: OpenAI } = await import('openai');
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'demo', maxRetries: 0 });
    let cached = 0;
    let prompt = 0;
    let done = 0;
    const ttfts: number[] = [];
    const perWorker: Record<string, number> = {};
    const start = performance.now();
    const t0 = trace[0].timestamp;
    await Promise.all(
      trace.map(async (r) => {
        const due = (r.timestamp - t0) / speed - (performance.now() - start);
        if (due > 0) {
          // an abortable wait: Ctrl-C must not sit out the rest of the schedule
          await new Promise<void>((res) => {
            const t = setTimeout(res, due);
            signal.addEventListener('abort', () => (clearTimeout(t), res()), { once: true });
          });
        }
        if (signal.aborted) return;
        const sent = performance.now();
        const { data: stream, response } = await client.chat.completions
          .create(
            {
              model: 'mock',
              messages: [{ role: 'user', content: promptText(r) }],
              max_tokens: Math.min(64, r.outputLength),
              stream: true,
              stream_options: { include_usage: true },
            },
            {
              headers: {
                'x-workflow-id': r.sessionId ?? '',
                'x-workflow-step': String(r.step ?? 0),
                'x-agent-role': r.agentRole ?? '',
                ...(r.isolate ? { 'x-kv-isolate': '1' } : {}),
              },
              signal,
            },
          )
          .withResponse();
        let first = true;
        for await (const chunk of stream) {
          if (first && chunk.choices.length > 0) {
            ttfts.push(performance.now() - sent);
            first = false;
          }
          if (chunk.usage) {
            cached += chunk.usage.prompt_tokens_details?.cached_tokens ?? 0;
            prompt += chunk.usage.prompt_tokens;
          }
        }
        const w = response.headers.get('x-contextforge-worker') ?? '?';
        perWorker[w] = (perWorker[w] ?? 0) + 1;
        progress(++done);
      }),
    );
    ttfts.sort((a, b) => a - b);
    return {
      policy,
      requests: done,
      hitRate: prompt > 0 ? cached / prompt : 0,
      ttftMeanMs: ttfts.reduce((a, b) => a + b, 0) / Math.max(1, ttfts.length),
      ttftP90Ms: ttfts.length > 0 ? percentile(ttfts, 90) : 0,
      perWorker,
    };
  } finally {
    await gateway?.close();
    for (const s of subs) await s.close();
    for (const e of engines) await e.close();
  }
}

export interface LiveDemoFlags {
  workflows: number;
  workers: number;
  speed: number;
  json?: boolean;
}

/** `live-demo` with its flags parsed: the warm-up, then each policy's run, and the comparison on stdout. */
export async function runLiveDemo(o: LiveDemoFlags): Promise<void> {
  const trace = generateWorkflowTrace({ workflows: o.workflows, seed: 11 });
  const ac = new AbortController();
  setMaxListeners(0, ac.signal); // every in-flight request listens to it
  const onSigint = () => {
    process.stderr.write('\nstopping…\n');
    ac.abort();
  };
  process.once('SIGINT', onSigint);
  const results: DemoResult[] = [];
  try {
    // an untimed pass of a few workflows per policy first: the first pass through the gateway
    // and the engines is the slowest whichever policy runs it (code not yet compiled by the
    // JIT), and would be charged to the policy that happens to run first
    const warmUp = generateWorkflowTrace({ workflows: Math.min(8, o.workflows), seed: 12 });
    for (const policy of ['cost', 'round-robin']) {
      if (ac.signal.aborted) break;
      process.stderr.write(`${policy}: warming up (${warmUp.length} requests, not counted)\n`);
      await runPolicy(policy, warmUp, o.workers, o.speed, ac.signal, () => {});
    }
    for (const policy of ['cost', 'round-robin']) {
      if (ac.signal.aborted) break;
      const quarter = Math.max(1, Math.ceil(trace.length / 4));
      const r = await runPolicy(policy, trace, o.workers, o.speed, ac.signal, (done) => {
        // a live counter on a terminal; a line per quarter in logs
        if (process.stderr.isTTY) process.stderr.write(`\r${policy}: ${done}/${trace.length} requests`);
        else if (done % quarter === 0 || done === trace.length)
          process.stderr.write(`${policy}: ${done}/${trace.length} requests\n`);
      });
      if (process.stderr.isTTY) process.stderr.write('\n');
      results.push(r);
    }
  } catch (err) {
    if (!ac.signal.aborted) throw err;
  } finally {
    process.off('SIGINT', onSigint);
  }
  if (ac.signal.aborted) {
    process.exitCode = 130;
    return;
  }
  if (o.json)
    return void process.stdout.write(
      `${JSON.stringify({ workflows: o.workflows, requests: trace.length, workers: o.workers, results })}\n`,
    );
  process.stdout.write(
    `${o.workflows} multi-agent workflows (${trace.length} requests) through the router to ${o.workers} mock engines, over HTTP with the openai client\n\n` +
      formatTable(
        ['policy', 'requests', 'hit rate (engines)', 'TTFT mean ms', 'TTFT p90 ms', 'requests per engine'],
        results.map((r) => [
          r.policy,
          String(r.requests),
          pct(r.hitRate),
          r.ttftMeanMs.toFixed(1),
          r.ttftP90Ms.toFixed(1),
          Object.entries(r.perWorker)
            .sort()
            .map(([k, v]) => `${k.replace('engine-', 'e')}:${v}`)
            .join(' '),
        ]),
      ) +
      '\n',
  );
}
