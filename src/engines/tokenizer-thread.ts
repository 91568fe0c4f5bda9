/**
 * One thread of the TokenizerPool: loads the model's tokenizer once and answers tokenize
 * requests from the gateway's event loop, so rendering and tokenizing a long conversation
 * never stalls the proxying of other requests. Token ids go back as a transferred
 * Uint32Array (no copy).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { ChatTokenizer } from './chat-tokenizer.js';
import type { TokenizeJob, TokenizeNotice, TokenizeReply, TokenizerThreadData } from './tokenizer-pool.js';

const port = parentPort!;
const data = workerData as TokenizerThreadData;
/** 1 at a request's slot once its client left: it is skipped. */
const cancelled = new Int32Array(data.cancelled);
let tokenizer: ChatTokenizer;
try {
  tokenizer = ChatTokenizer.load(data.path, {
    chatTemplate: data.chatTemplate,
    chatTemplateSource: data.chatTemplateSource,
    rendering: data.rendering,
    cacheEntries: data.cacheEntries,
    source: data.source,
  });
  port.postMessage({ ready: true });
} catch (err) {
  port.postMessage({ ready: false, error: (err as Error).message });
  process.exit(1);
}

port.on('message', (job: TokenizeJob) => {
  if (Atomics.load(cancelled, job.slot) === 1) {
    port.postMessage({ skipped: job.id } satisfies TokenizeNotice);
    return;
  }
  // delivered while this thread works: the pool's deadline for the request runs from here
  port.postMessage({ started: job.id } satisfies TokenizeNotice);
  let reply: TokenizeReply;
  try {
    const ids = job.chat
      ? tokenizer.tokenizeChatRequest(job.chat)
      : tokenizer.tokenize(job.request, job.addSpecialTokens);
    const tokens = Uint32Array.from(ids);
    reply = { id: job.id, tokens };
    port.postMessage(reply, [tokens.buffer]);
  } catch (err) {
    reply = { id: job.id, error: (err as Error).message, errorName: (err as Error).name };
    port.postMessage(reply);
  }
});
