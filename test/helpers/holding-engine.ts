import { createServer, type ServerResponse } from 'node:http';
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
