import type { ServerResponse } from 'node:http';
import type { EngineRequest } from '../../engine-model/index.js';
import { json, sse } from './http.js';
import type { RankCore } from './rank-core.js';

/** A request in the engine and the client waiting for it. */
export interface Pending {
  request: EngineRequest;
  res: ServerResponse;
  stream: boolean;
  includeUsage: boolean;
  chat: boolean;
  core: RankCore;
  model: string;
  id: string;
  created: number;
  promptTokens: number;
  produced: number;
  cachedTokens: number;
  done: boolean;
}

/** Counts `n` more output tokens and, when streaming, sends them as one chunk. */
export function emitTokens(p: Pending, n: number): void {
  const text = Array.from({ length: n }, (_, k) => `tok${(p.produced + k) % 1000} `).join('');
  p.produced += n;
  if (!p.stream) return;
  const choice = p.chat
    ? {
        index: 0,
        delta: p.produced === n ? { role: 'assistant', content: text } : { content: text },
        finish_reason: null,
      }
    : { index: 0, text, finish_reason: null };
  sse(p.res, {
    id: p.id,
    object: p.chat ? 'chat.completion.chunk' : 'text_completion',
    created: p.created,
    model: p.model,
    choices: [choice],
  });
}

/** Ends the response: the last chunk, the usage chunk and [DONE] when streaming, else the whole completion. */
export function sendFinal(p: Pending): void {
  const usage = {
    prompt_tokens: p.promptTokens,
    completion_tokens: p.produced,
    total_tokens: p.promptTokens + p.produced,
    prompt_tokens_details: { cached_tokens: p.cachedTokens },
  };
  if (p.stream) {
    const last = p.chat
      ? { index: 0, delta: {}, finish_reason: 'length' }
      : { index: 0, text: '', finish_reason: 'length' };
    sse(p.res, {
      id: p.id,
      object: p.chat ? 'chat.completion.chunk' : 'text_completion',
      created: p.created,
      model: p.model,
      choices: [last],
    });
    if (p.includeUsage)
      sse(p.res, {
        id: p.id,
        object: p.chat ? 'chat.completion.chunk' : 'text_completion',
        created: p.created,
        model: p.model,
        choices: [],
        usage,
      });
    p.res.end('data: [DONE]\n\n');
    return;
  }
  const text = Array.from({ length: p.produced }, (_, k) => `tok${k % 1000} `).join('');
  json(p.res, 200, {
    id: p.id,
    object: p.chat ? 'chat.completion' : 'text_completion',
    created: p.created,
    model: p.model,
    choices: [
      p.chat
        ? { index: 0, message: { role: 'assistant', content: text }, finish_reason: 'length' }
        : { index: 0, text, finish_reason: 'length' },
    ],
    usage,
  });
}
