import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fmix32 } from '../core/hashing.js';
import { MAX_CONTENT_ANCHORS } from '../core/router/options-schema.js';
import { DECIMAL } from '../core/validate.js';
import { escapeUnprintable, quotedText } from '../core/shown-text.js';
import { heldBlocks, longTraceId, MAX_TRACE_REQUEST_TOKENS, sortByArrival, type TraceRequest } from './trace.js';
import { MAX_TRACE_REQUESTS, tooManyRecords, traceBlockCounter, TraceFormatError, traceLines } from './trace-lines.js';

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

/** The components whose chunk lengths a side file lists. */
type ChunkComponent = Exclude<keyof typeof RAGPULSE_FILES, 'trace'>;

/** Every component a request's `hash_ids` may list, in the order the side files are numbered. */
const CHUNK_COMPONENTS: readonly ChunkComponent[] = [
  'sys_prompt',
  'passages_ids',
  'history',
  'user_input',
  'web_search',
];

/** `path`, or `path.gz` when only that exists. */
const traceFile = (path: string): string => (existsSync(path) ? path : `${path}.gz`);

/**
 * The files loadRagpulse reads in `dir` (each of RAGPULSE_FILES, or its `.gz` when only that
 * exists), and for each `.gz` read the name it would read in its place were that made: an
 * output must be none of them.
 */
export function ragpulseFiles(dir: string): Array<{ file: string; shadows?: string }> {
  const names = [RAGPULSE_FILES.trace, ...CHUNK_COMPONENTS.map((c) => RAGPULSE_FILES[c][0])];
  return names.flatMap((name) => {
    const path = join(dir, name);
    const file = traceFile(path);
    return file === path ? [{ file }] : [{ file }, { file: path, shadows: file }];
  });
}

/**
 * The lines of `path` (or `path.gz`), blank ones skipped, each with the file read (`source`: the
 * name a malformed line's error gives, its directory included); a missing file, or one of more
 * than MAX_TRACE_REQUESTS lines (`records`), is a RangeError naming it.
 */
async function* lines(path: string, records: string): AsyncGenerator<{ text: string; index: number; source: string }> {
  const file = traceFile(path);
  if (!existsSync(file)) throw new RangeError(`RAGPulse: missing ${escapeUnprintable(path)}`);
  let count = 0;
  for await (const line of traceLines(file, file)) {
    if (!line.text.trim()) continue;
    if (count++ === MAX_TRACE_REQUESTS) throw tooManyRecords(file, records);
    yield { ...line, source: file };
  }
}

/** A JSON object of one line, or a TraceFormatError naming the file and line. */
function objectOf(text: string, index: number, source: string): Record<string, unknown> {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new TraceFormatError(index, 'not valid JSON', source);
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw))
    throw new TraceFormatError(index, 'not a JSON object', source);
  return raw as Record<string, unknown>;
}

const isId = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
const isTokens = (v: unknown): v is number =>
  typeof v === 'number' && Number.isInteger(v) && v >= 0 && v <= MAX_TRACE_REQUEST_TOKENS;

export async function loadRagpulse(dir: string, blockSize = 64): Promise<TraceRequest[]> {
  // by component name: a key of a request's hash_ids is looked up here only once it is known to be one
  const lengths = new Map<ChunkComponent, Map<number, number>>();
  for (const component of CHUNK_COMPONENTS) {
    const [file, key] = RAGPULSE_FILES[component];
    const m = new Map<number, number>();
    // the line that listed each id, while its file is read: an id listed again names it
    const lineOf = new Map<number, number>();
    for await (const { text, index, source } of lines(join(dir, file), 'chunk lengths')) {
      const r = objectOf(text, index, source);
      if (!isId(r[key])) throw new TraceFormatError(index, `"${key}" must be a non-negative integer`, source);
      if (!isTokens(r.token_length))
        throw new TraceFormatError(
          index,
          `"token_length" must be a whole number of tokens from 0 to ${MAX_TRACE_REQUEST_TOKENS}`,
          source,
        );
      // one id listed twice with two lengths: which the trace means cannot be told
      const known = m.get(r[key]);
      if (known !== undefined && known !== r.token_length)
        throw new TraceFormatError(
          index,
          `"${key}" ${r[key]} is listed with "token_length" ${r.token_length}, and with ${known} on line ${lineOf.get(r[key])! + 1}`,
          source,
        );
      m.set(r[key], r.token_length);
      lineOf.set(r[key], index);
    }
    lengths.set(component, m);
  }
  const chunkLengths = (component: ChunkComponent): Map<number, number> => lengths.get(component)!;
  const path = join(dir, RAGPULSE_FILES.trace);
  const requests: TraceRequest[] = [];
  const countBlocks = traceBlockCounter(traceFile(path));
  for await (const line of lines(path, 'requests')) {
    const r = objectOf(line.text, line.index, line.source);
    const fail = (message: string) => new TraceFormatError(line.index, message, line.source);
    // seconds as a string of decimal digits ("82", "1.5", "1e3"): Number() would also read
    // "0x10" as 16 and "0b1" as 1, numbers the trace does not hold
    const timestamp = typeof r.timestamp === 'string' && DECIMAL.test(r.timestamp) ? Number(r.timestamp) : r.timestamp;
    if (typeof timestamp !== 'number' || !Number.isFinite(timestamp) || timestamp < 0)
      throw fail(
        `"timestamp" must be a non-negative number of seconds, in decimal digits${typeof r.timestamp === 'string' ? `, got ${quotedText(r.timestamp)}` : ''}`,
      );
    // a request has at least one prompt token (as in a Mooncake trace)
    for (const [key, min] of [
      ['input_length', 1],
      ['output_length', 0],
    ] as const)
      if (!isTokens(r[key]) || r[key] < min)
        throw fail(`"${key}" must be a whole number of tokens from ${min} to ${MAX_TRACE_REQUEST_TOKENS}`);
    const inputLength = r.input_length as number;
    const ids = r.hash_ids ?? {};
    if (ids === null || typeof ids !== 'object' || Array.isArray(ids)) throw fail('"hash_ids" must be an object');
    for (const [key, list] of Object.entries(ids)) {
      // the format has these five components and no other: another key (a misspelt one, or
      // "constructor" or "__proto__") names chunks no side file gives a length of, and were it
      // skipped, its chunks would be left out of the request without a word
      const component = CHUNK_COMPONENTS.find((c) => c === key);
      if (component === undefined)
        throw fail(
          `"hash_ids" has the key ${quotedText(key)}, which is no RAGPulse component (${CHUNK_COMPONENTS.join(', ')})`,
        );
      if (!Array.isArray(list) || !list.every(isId))
        throw fail(`"hash_ids.${component}" must be an array of non-negative integers`);
      // a chunk its side file does not list has no length: counted as a guess (one block, no
      // passage tokens), it gave figures of a trace that is not the one read
      const known = chunkLengths(component);
      const unknown = (list as number[]).find((id) => !known.has(id));
      if (unknown !== undefined)
        throw fail(
          `"hash_ids.${component}" names chunk ${unknown}, which ${RAGPULSE_FILES[component][0]} does not list`,
        );
    }
    // the router takes a workflow id only non-empty: an empty one is refused here, not mid-replay
    if (r.session_id !== undefined && (typeof r.session_id !== 'string' || r.session_id === ''))
      throw fail('"session_id" must be a non-empty string');
    const longSession = typeof r.session_id === 'string' ? longTraceId(r.session_id, 'session_id') : undefined;
    if (longSession !== undefined) throw fail(longSession);
    const chunks = ids as Partial<Record<ChunkComponent, number[]>>;
    // the simulated router takes at most this many (its maxContentAnchors): refused here, before
    // its blocks are worked out, not mid-replay
    const passageCount = chunks.passages_ids?.length ?? 0;
    if (passageCount > MAX_CONTENT_ANCHORS)
      throw fail(
        `"hash_ids.passages_ids" names ${passageCount} passages, more than the ${MAX_CONTENT_ANCHORS} a request may name`,
      );
    const hashIds = prefixBlockIds(
      chunks,
      { sys_prompt: chunkLengths('sys_prompt'), history: chunkLengths('history') },
      blockSize,
      Math.floor(Math.max(1, inputLength) / blockSize),
    );
    const passages = chunkLengths('passages_ids');
    const anchors = (chunks.passages_ids ?? []).map((id) => ({
      id: `passage-${id}`,
      tokens: passages.get(id) ?? 0,
    }));
    const req: TraceRequest = {
      // the 0-based line in the file, blank lines included, as a Mooncake trace numbers it
      index: line.index,
      timestamp: timestamp * 1000,
      inputLength,
      outputLength: r.output_length as number,
      hashIds,
      blockSize,
      sessionId: r.session_id,
      anchors,
    };
    countBlocks(line.index, heldBlocks(req));
    // passages are part of the prompt (as a Mooncake trace's anchor_lengths): more of them than
    // the prompt holds would count cached tokens the request never sent
    const anchorTokens = anchors.reduce((a, x) => a + x.tokens, 0);
    if (anchorTokens > inputLength)
      throw fail(
        `its passages (hash_ids.passages_ids, lengths from ${RAGPULSE_FILES.passages_ids[0]}) add up to ${anchorTokens} tokens, more than "input_length" (${inputLength})`,
      );
    // nor may the chunks together: the system prompt and history past the prompt were cut
    // short without a word, and so were the prefix blocks that can hit
    const sums = CHUNK_COMPONENTS.map((c) => {
      const known = chunkLengths(c);
      return (chunks[c] ?? []).reduce((a, id) => a + known.get(id)!, 0);
    });
    const chunkTokens = sums.reduce((a, b) => a + b, 0);
    if (chunkTokens > inputLength)
      throw fail(
        `its chunks (lengths from the side files) add up to ${chunkTokens} tokens (${CHUNK_COMPONENTS.map((c, i) => `${c} ${sums[i]}`).join(', ')}), more than "input_length" (${inputLength})`,
      );
    requests.push(req);
  }
  return sortByArrival(requests);
}

/**
 * Ids of the full blocks of the prompt prefix (system-prompt chunks, then history chunks):
 * chunk lengths from the side files (an unknown id is refused when the trace is read), block i covering tokens
 * [i × blockSize, (i + 1) × blockSize) of that stream. The id mixes a chain over every chunk
 * id entered so far with the block's end offset inside its chunk: two requests share block i
 * exactly when their chunk sequences agree up to it. At most `maxBlocks` ids (a prefix longer
 * than the prompt cannot be cached beyond the prompt).
 */
export function prefixBlockIds(
  ids: Partial<Record<'sys_prompt' | 'history', readonly number[]>>,
  lengths: Readonly<Record<'sys_prompt' | 'history', ReadonlyMap<number, number>>>,
  blockSize: number,
  maxBlocks = Infinity,
): number[] {
  const out: number[] = [];
  let chain = 0x2545f491;
  let filled = 0; // tokens of the current block so far
  for (const component of ['sys_prompt', 'history'] as const) {
    for (const id of ids[component] ?? []) {
      const tokens = Math.max(0, lengths[component].get(id) ?? blockSize);
      chain = fmix32(chain ^ Math.imul(id + 1, 0x9e3779b1) ^ (component === 'history' ? 0x5bd1e995 : 0));
      let offset = 0;
      while (offset < tokens && out.length < maxBlocks) {
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
