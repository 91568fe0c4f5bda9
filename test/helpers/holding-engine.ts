import { createServer, type ServerResponse } from 'node:http';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type GatewayOptions } from '../../src/server/gateway.js';
import { listening } from './listening.js';

/** What the stand-in engine answers a completion with. */
export const COMPLETION = JSON.stringify({
  id: 'cmpl-1',
  object: 'text_completion',
  model: 'm',
  choices: [{ index: 0, text: 'ok', finish_reason: 'stop', logprobs: null }],
  usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
});

/**
 * A stand-in vLLM engine whose HTTP server answers while its engine does not: /health answers
 * 200 and /metrics the lines `page()` gives at each scrape (their times in `scrapes`,
 * performance.now()), and a completion is answered at once (after `onAnswer()`) unless
 * `holding()` says so when its body has arrived: then it waits in `held` until `answerHeld()`
 * or its client leaves.
 */
export async function holdingEngine(options: {
  page: () => readonly string[];
  holding: () => boolean;
  onAnswer?: () => void;
}) {
  const held = new Set<ServerResponse>();
  const scrapes: number[] = [];
  const server = createServer((req, res) => {
    if (req.url === '/health') return void res.writeHead(200).end();
    if (req.url === '/metrics') {
      scrapes.push(performance.now());
      return void res.writeHead(200, { 'content-type': 'text/plain' }).end(`${options.page().join('\n')}\n`);
    }
    req.resume();
    req.on('end', () => {
      if (options.holding()) {
        held.add(res);
        res.on('close', () => held.delete(res));
        return;
      }
      options.onAnswer?.();
      res.writeHead(200, { 'content-type': 'application/json' }).end(COMPLETION);
    });
  });
  const { url, close } = await listening(server);
  return {
    url,
    held,
    scrapes,
    /** Answers every completion held so far. */
    answerHeld() {
      for (const res of held) res.writeHead(200, { 'content-type': 'application/json' }).end(COMPLETION);
    },
    close,
  };
}

/**
 * A round-robin gateway listening on a free loopback port over stand-in engines (`workers`),
 * scraping their /metrics every 50 ms and polling no /health, its log lines kept in `logs`.
 * `options` add to (or replace) the gateway's options, such as a stall timeout.
 */
export async function gatewayOverEngines(
  workers: Array<{ id: string; url: string }>,
  options: Omit<Partial<GatewayOptions>, 'router' | 'workers'> = {},
) {
  const router = new KVAwareRouter({ policy: 'round-robin' });
  const logs: string[] = [];
  const gateway = await createGateway({
    router,
    workers,
    metricsIntervalMs: 50,
    healthCheckIntervalMs: 0,
    log: (m) => logs.push(m),
    ...options,
  });
  const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 });
  /** A one-token completion of `prompt`: its status, the worker that answered, and its body. */
  const complete = (prompt: string) =>
    fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt, max_tokens: 1 }),
    }).then(async (r) => ({ status: r.status, worker: r.headers.get('x-contextforge-worker'), body: await r.text() }));
  const inFlight = (id: string) => router.listWorkers().find((w) => w.id === id)!.inFlightRequests;
  /** The value on the gateway's /metrics page of `series` (name and labels as written), if it has it. */
  const metric = async (series: string) => {
    const page = await (await fetch(`${base}/metrics`)).text();
    const line = page.split('\n').find((l) => l.startsWith(`${series} `));
    return line === undefined ? undefined : Number(line.slice(series.length + 1));
  };
  const stalls = (id: string) => metric(`contextforge_worker_stalls_total{worker="${id}"}`);
  return { gateway, router, base, logs, complete, inFlight, metric, stalls };
}
