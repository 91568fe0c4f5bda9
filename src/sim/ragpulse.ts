import { createReadStream, existsSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { createGunzip } from 'node:zlib';
import { fmix32 } from '../core/hashing.js';
import { sortByArrival, TraceFormatError, type TraceRequest } from './trace.js';

/**
 * RAGPulse (flashserve/RAGPulse; format in bench/traces/SOURCE.md): each request lists
 * component chunk ids (sys_prompt, passages_ids, history, web_search, user_input) whose token
 * lengths are in five side files. The simulator reads it as:
 * - prefix blocks: the system-prompt chunks, then the history chunks, as one token stream cut
 *   into blocks of `blockSize` tokens; only full blocks count (a block that would reach into
 *   what follows the prefix is not cached), so at most the real prefix tokens can hit; a
 *   block's id chains every chunk id up to it and its offset, so equal ids mean equal
 *   prefixes;
 * - content anchors: the retrieved passages (position-independent reuse, CacheBlend-style);
 * - web search results and the user input: new tokens, never cached.
 * Timestamps are seconds (as strings) in an unsorted file; they become sorted milliseconds.
 */
export const RAGPULSE_FILES = {
  trace: '0_trace.jsonl',
  sys_prompt: ['1_sys_prompt.jsonl', 'sys_prompt_id'],
  passages_ids: ['2_passages.jsonl', 'passage_id'],
  history: ['3_history.jsonl', 'history_id'],
  user_input: ['4_user_input.jsonl', 'user_input_id'],
  web_search: ['5_web_search.jsonl', 'web_search_id'],
} as const;

async function* lines(path: string): AsyncGenerator<string> {
  const gz = `${path}.gz`;
  const file = existsSync(path) ? path : gz;
  if (!existsSync(file)) throw new RangeError(`RAGPulse: missing ${path}`);
  const input = file.endsWith('.gz') ? createReadStream(file).pipe(createGunzip()) : createReadStream(file);
  for await (const line of createInterface({ input, crlfDelay: Infinity })) if (line.trim()) yield line;
}

export async function loadRagpulse(dir: string, blockSize = 64): Promise<TraceRequest[]> {
  const lengths: Record<string, Map<number, number>> = {};
  for (const component of ['sys_prompt', 'passages_ids', 'history', 'user_input', 'web_search'] as const) {
    const [file, key] = RAGPULSE_FILES[component];
    const m = new Map<number, number>();
    for await (const line of lines(join(dir, file))) {
      const r = JSON.parse(line) as Record<string, number>;
      m.set(r[key], r.token_length);
    }
    lengths[component] = m;
  }
  const requests: TraceRequest[] = [];
  let index = 0;
  for await (const line of lines(join(dir, RAGPULSE_FILES.trace))) {
    let r: {
      timestamp: string | number;
      input_length: number;
      output_length: number;
      hash_ids: Record<string, number[]>;
      session_id?: string;
    };
    try {
      r = JSON.parse(line);
    } catch {
      throw new TraceFormatError(index, 'not valid JSON');
    }
    const ids = r.hash_ids ?? {};
    const hashIds = prefixBlockIds(ids, lengths, blockSize);
    const anchors = (ids.passages_ids ?? []).map((id) => ({
      id: `passage-${id}`,
      tokens: lengths.passages_ids.get(id) ?? 0,
    }));
    requests.push({
      index,
      timestamp: Number(r.timestamp) * 1000,
      inputLength: r.input_length,
      outputLength: r.output_length,
      hashIds,
      blockSize,
      sessionId: r.session_id,
      anchors,
    });
    index++;
  }
  return sortByArrival(requests);
}

/**
 * Ids of the full blocks of the prompt prefix (system-prompt chunks, then history chunks):
 * chunk lengths from the side files (a missing id counts one block), block i covering tokens
 * [i × blockSize, (i + 1) × blockSize) of that stream. The id mixes a chain over every chunk
 * id entered so far with the block's end offset inside its chunk: two requests share block i
 * exactly when their chunk sequences agree up to it.
 */
export function prefixBlockIds(
  ids: Record<string, number[]>,
  lengths: Record<string, Map<number, number>>,
  blockSize: number,
): number[] {
  const out: number[] = [];
  let chain = 0x2545f491;
  let filled = 0; // tokens of the current block so far
  for (const component of ['sys_prompt', 'history'] as const) {
    for (const id of ids[component] ?? []) {
      const tokens = Math.max(0, lengths[component].get(id) ?? blockSize);
      chain = fmix32(chain ^ Math.imul(id + 1, 0x9e3779b1) ^ (component === 'history' ? 0x5bd1e995 : 0));
      let offset = 0;
      while (offset < tokens) {
        const take = Math.min(blockSize - filled, tokens - offset);
        offset += take;
        filled += take;
        if (filled === blockSize) {
          const lo = fmix32(chain ^ Math.imul(offset + 1, 0x85ebca6b)) >>> 0;
          out.push((fmix32(chain ^ lo) & 0x1fffff) * 4294967296 + lo);
          filled = 0;
        }
      }
    }
  }
  return out;
}
