import { MAX_CONTENT_ANCHORS } from '../core/router/options-schema.js';
import { DEFAULT_MAX_ID_BYTES, longerThanUtf8Bytes } from '../core/validate.js';
import { MAX_TRACE_REQUESTS, tooManyRecords, traceBlockCounter, TraceFormatError, traceLines } from './trace-lines.js';

export { MAX_TRACE_BLOCKS, MAX_TRACE_LINE_CHARS, MAX_TRACE_REQUESTS, TraceFormatError } from './trace-lines.js';

/**
 * One request of a trace (docs/architecture.md §6): Mooncake JSONL with every optional field. Hash ids
 * name blocks of `blockSize` tokens and are prefix-chained (equal id ⇒ equal prefix).
 */
export interface TraceRequest {
  /** 0-based line index in the trace file (what --assignments reports). */
  index: number;
  /** Arrival, ms from the start of the trace. */
  timestamp: number;
  inputLength: number;
  outputLength: number;
  hashIds: number[];
  blockSize: number;
  sessionId?: string;
  step?: number;
  claGroup?: number;
  agentRole?: string;
  /** Content anchors (position-independent chunks) and their token lengths. */
  anchors?: Array<{ id: string; tokens: number }>;
  isolate?: boolean;
  /**
   * The model the request names: its KV is the model's own, as vLLM keys a LoRA adapter's blocks
   * by the adapter (the simulated router is told it as `lora`). Every simulated worker serves
   * every model.
   */
  model?: string;
}

/**
 * Most tokens a trace request's prompt or output may have (16M, far past any served context):
 * an engine refuses longer ones anyway, and the prefix blocks a trace implies stay bounded.
 */
export const MAX_TRACE_REQUEST_TOKENS = 16 * 1024 * 1024;

/**
 * Longest id a trace line may give (`session_id`, `agent_role`, `model`, an anchor), in UTF-8
 * bytes: a router's default `maxIdBytes`. The simulated router takes ids a few times longer, so
 * that the seed's anchor built from one (`session:` and the model before it) still fits.
 */
export const MAX_TRACE_ID_BYTES = DEFAULT_MAX_ID_BYTES;

/**
 * Parses one Mooncake JSONL line; throws TraceFormatError naming the file (`source`), the line
 * and the field.
 */
export function parseTraceLine(text: string, index: number, defaultBlockSize = 512, source = 'trace'): TraceRequest {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new TraceFormatError(index, 'not valid JSON', source);
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw))
    throw new TraceFormatError(index, 'not a JSON object', source);
  const r = raw as Record<string, unknown>;
  const num = (key: string, required: boolean): number | undefined => {
    const v = r[key];
    if (v === undefined || v === null) {
      if (required) throw new TraceFormatError(index, `missing "${key}"`, source);
      return undefined;
    }
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0)
      throw new TraceFormatError(index, `"${key}" must be a non-negative number`, source);
    return v;
  };
  const timestamp = num('timestamp', true)!;
  const tokens = (key: string, min: number): number => {
    const v = num(key, true)!;
    if (!Number.isInteger(v) || v < min || v > MAX_TRACE_REQUEST_TOKENS)
      throw new TraceFormatError(
        index,
        `"${key}" must be a whole number of tokens from ${min} to ${MAX_TRACE_REQUEST_TOKENS}`,
        source,
      );
    return v;
  };
  // a request has at least one prompt token; an output of 0 tokens is served as the one token
  // an engine always produces (the first, which ends the prefill)
  const inputLength = tokens('input_length', 1);
  const outputLength = tokens('output_length', 0);
  const hashIds = r.hash_ids;
  if (!Array.isArray(hashIds) || hashIds.some((h) => typeof h !== 'number' || !Number.isSafeInteger(h) || h < 0)) {
    throw new TraceFormatError(index, '"hash_ids" must be an array of non-negative integers', source);
  }
  const lineBlockSize = num('block_size', false);
  const blockSize = lineBlockSize ?? defaultBlockSize;
  if (!Number.isInteger(blockSize) || blockSize < 1 || blockSize > MAX_TRACE_REQUEST_TOKENS)
    throw new TraceFormatError(
      index,
      `"block_size" must be a whole number of tokens from 1 to ${MAX_TRACE_REQUEST_TOKENS}`,
      source,
    );
  const req: TraceRequest = { index, timestamp, inputLength, outputLength, hashIds: hashIds as number[], blockSize };
  // The fields below reach the router's request check (readRouteFields) as they are read here:
  // whatever it would refuse mid-replay is refused now, naming the line and the trace's field.
  if (r.session_id !== undefined) req.sessionId = traceId(r.session_id, 'session_id', index, source);
  if (r.step !== undefined && r.step !== null) {
    if (typeof r.step !== 'number' || !Number.isInteger(r.step) || r.step < 0)
      throw new TraceFormatError(index, '"step" must be a non-negative integer', source);
    req.step = r.step;
  }
  const cla = num('cla_group', false);
  if (cla !== undefined) {
    if (!Number.isInteger(cla)) throw new TraceFormatError(index, '"cla_group" must be an integer', source);
    req.claGroup = cla;
  }
  if (r.agent_role !== undefined) {
    // the router refuses an empty role (request.agentRole)
    if (typeof r.agent_role !== 'string' || r.agent_role === '')
      throw new TraceFormatError(index, '"agent_role" must be a non-empty string', source);
    req.agentRole = traceId(r.agent_role, 'agent_role', index, source);
  }
  if (r.anchors !== undefined) {
    const ids = r.anchors;
    const lengths = r.anchor_lengths;
    if (!Array.isArray(ids) || !Array.isArray(lengths) || ids.length !== lengths.length) {
      throw new TraceFormatError(index, '"anchors" and "anchor_lengths" must be arrays of equal length', source);
    }
    // the simulated router takes at most this many (its maxContentAnchors): refused here, not mid-replay
    if (ids.length > MAX_CONTENT_ANCHORS)
      throw new TraceFormatError(
        index,
        `"anchors" names ${ids.length} anchors, more than the ${MAX_CONTENT_ANCHORS} a request may name`,
        source,
      );
    req.anchors = ids.map((id, k) => {
      const t = lengths[k];
      if (typeof t !== 'number' || !Number.isInteger(t) || t < 0)
        throw new TraceFormatError(index, `"anchor_lengths[${k}]" must be a non-negative integer`, source);
      return { id: traceId(id, `anchors[${k}]`, index, source), tokens: t };
    });
    // passages are part of the prompt: more of them than the prompt holds would count cached
    // tokens the request never sent
    const anchorTokens = req.anchors.reduce((a, x) => a + x.tokens, 0);
    if (anchorTokens > inputLength)
      throw new TraceFormatError(
        index,
        `"anchor_lengths" add up to ${anchorTokens} tokens, more than "input_length" (${inputLength})`,
        source,
      );
  }
  checkBlockCount(req, lineBlockSize !== undefined, source);
  if (r.isolate !== undefined) {
    if (typeof r.isolate !== 'boolean') throw new TraceFormatError(index, '"isolate" must be a boolean', source);
    req.isolate = r.isolate;
  }
  if (r.model !== undefined) {
    if (typeof r.model !== 'string' || r.model === '')
      throw new TraceFormatError(index, '"model" must be a non-empty string', source);
    req.model = traceId(r.model, 'model', index, source);
  }
  return req;
}

/**
 * The hash ids a prompt of `inputLength` tokens, `anchorTokens` of them in content anchors, has
 * in blocks of `blockSize` tokens: one per block, the last partial block included
 * (ceil(input_length / block_size), as in the Mooncake traces). With anchors the ids may name
 * the whole prompt or only the part outside the anchors, so any count from the one to the other.
 */
function blockCountRange(inputLength: number, anchorTokens: number, blockSize: number): [number, number] {
  return [Math.ceil((inputLength - anchorTokens) / blockSize), Math.ceil(inputLength / blockSize)];
}

/**
 * Refuses a request whose hash ids are not one per block of its prompt (blockCountRange), give
 * or take one: a trace written in blocks of another size than it declares (or than the default,
 * when it declares none) would replay with every prefix the wrong length. One id more or fewer
 * is read: trace writers round the last block differently (floor, or `n // size + 1`), and a
 * count one off moves no prefix. The message names the counts and, when one would explain them
 * exactly, a block size that fits (a power of two if one does).
 */
function checkBlockCount(req: TraceRequest, declared: boolean, source: string): void {
  const n = req.hashIds.length;
  const anchorTokens = (req.anchors ?? []).reduce((a, x) => a + x.tokens, 0);
  const fits = (size: number) => {
    const [low, high] = blockCountRange(req.inputLength, anchorTokens, size);
    return low <= n && n <= high;
  };
  const [low, high] = blockCountRange(req.inputLength, anchorTokens, req.blockSize);
  // no id at all for a prompt with blocks outside its anchors is no rounding
  if (Math.max(low - 1, low > 0 ? 1 : 0) <= n && n <= high + 1) return;
  let other: string | undefined;
  for (let size = 1; size <= MAX_TRACE_REQUEST_TOKENS && other === undefined; size *= 2)
    if (fits(size)) other = `a block size of ${size}`;
  if (other === undefined && anchorTokens === 0 && n > 0) {
    // ceil(input / size) == n exactly for input / n <= size < input / (n − 1)
    const min = Math.ceil(req.inputLength / n);
    const max =
      n === 1 ? MAX_TRACE_REQUEST_TOKENS : Math.min(MAX_TRACE_REQUEST_TOKENS, Math.ceil(req.inputLength / (n - 1)) - 1);
    if (min === max) other = `a block size of ${min}`;
    else if (min < max) other = `a block size from ${min} to ${max}`;
  }
  const prompt = anchorTokens > 0 ? ` (${anchorTokens} of them in "anchors")` : '';
  const at = declared ? `"block_size" ${req.blockSize}` : `the default block size ${req.blockSize}`;
  const needs = low === high ? `${high}` : `from ${low} to ${high}`;
  const hint = other === undefined ? '' : ` (${other} would fit${declared ? '' : ': set "block_size" on every line'})`;
  throw new TraceFormatError(
    req.index,
    `"hash_ids" has ${n} ${n === 1 ? 'entry' : 'entries'} but "input_length" ${req.inputLength}${prompt} at ${at} needs ${needs}${hint}`,
    source,
  );
}

/**
 * An id of a trace (a workflow, a content anchor) as the router takes it: a non-empty string,
 * or a number (Mooncake-style traces number them) as its decimal text.
 */
function traceId(value: unknown, key: string, index: number, source: string): string {
  if ((typeof value === 'string' && value !== '') || typeof value === 'number') {
    const id = String(value);
    // checked here, naming the line: the simulated router would stop the replay midway
    const long = longTraceId(id, key);
    if (long !== undefined) throw new TraceFormatError(index, long, source);
    return id;
  }
  throw new TraceFormatError(index, `"${key}" must be a non-empty string or a number`, source);
}

/** What is wrong with an id a trace line gives as `key` when it is past MAX_TRACE_ID_BYTES, else undefined. */
export function longTraceId(id: string, key: string): string | undefined {
  return longerThanUtf8Bytes(id, MAX_TRACE_ID_BYTES)
    ? `"${key}" must be at most ${MAX_TRACE_ID_BYTES} bytes of UTF-8, got ${id.length} characters`
    : undefined;
}

/** The blocks a request counts against MAX_TRACE_BLOCKS: its hash ids, then each anchor's ceil(tokens / block size). */
export function heldBlocks(req: TraceRequest): number {
  let blocks = req.hashIds.length;
  for (const a of req.anchors ?? []) blocks += Math.ceil(a.tokens / req.blockSize);
  return blocks;
}

/**
 * The distinct blocks a router told of every request of `requests` would index, counted no
 * further than `most` + 1 (the sets stay at most `most` entries: a caller bounding memory needs no
 * more than that). The router keys a block by the request's model and CLA group, so a hash id
 * counts once in each of those it is sent under; an isolated request's blocks are salted for it
 * alone and count every time; a content anchor counts its largest size once in each.
 */
export function distinctTraceBlocks(requests: readonly TraceRequest[], most: number): number {
  const ids = new Map<string, Set<number>>();
  const anchorBlocks = new Map<string, number>();
  let total = 0;
  for (const r of requests) {
    if (r.isolate) {
      total += heldBlocks(r);
      if (total > most) return most + 1;
      continue;
    }
    const space = `${r.model ?? ''}\u0000${r.claGroup ?? ''}`;
    let seen = ids.get(space);
    if (seen === undefined) ids.set(space, (seen = new Set()));
    for (const h of r.hashIds) {
      if (seen.has(h)) continue;
      if (total >= most) return most + 1;
      seen.add(h);
      total++;
    }
    for (const a of r.anchors ?? []) {
      const key = `${space}\u0000${a.id}`;
      const blocks = Math.ceil(a.tokens / r.blockSize);
      const counted = anchorBlocks.get(key) ?? 0;
      if (blocks <= counted) continue;
      total += blocks - counted;
      if (total > most) return most + 1;
      anchorBlocks.set(key, blocks);
    }
  }
  return total;
}

/**
 * Reads a Mooncake JSONL trace (optionally .gz; LF, CRLF or CR line ends, an optional BOM), blank
 * lines skipped, sorted by timestamp (stable). A malformed line is a TraceFormatError naming it;
 * a file of more than MAX_TRACE_REQUESTS requests is a RangeError naming it, and one of more
 * than MAX_TRACE_BLOCKS blocks a TraceFormatError naming it and the line that passes the limit
 * (read no further).
 */
export async function loadMooncakeTrace(path: string, defaultBlockSize = 512): Promise<TraceRequest[]> {
  const requests: TraceRequest[] = [];
  const countBlocks = traceBlockCounter(path);
  for await (const { text, index } of traceLines(path, path)) {
    if (!text.trim()) continue;
    if (requests.length === MAX_TRACE_REQUESTS) throw tooManyRecords(path);
    const req = parseTraceLine(text, index, defaultBlockSize, path);
    // the engines have one block size: a line with another is refused here, naming the file
    const first = requests[0];
    if (first !== undefined && req.blockSize !== first.blockSize)
      throw new TraceFormatError(
        index,
        `"block_size" ${req.blockSize} differs from ${first.blockSize} (line ${first.index + 1}): a trace has one block size`,
        path,
      );
    countBlocks(index, heldBlocks(req));
    requests.push(req);
  }
  return sortByArrival(requests);
}

export function sortByArrival(requests: TraceRequest[]): TraceRequest[] {
  return requests
    .map((r, i) => [r, i] as const)
    .sort((a, b) => a[0].timestamp - b[0].timestamp || a[1] - b[1])
    .map(([r]) => r);
}

/** Longest stretch of simulated time a replay may cover (31 days): the simulator scrapes every worker all along it. */
export const MAX_SIMULATED_SPAN_MS = 31 * 24 * 3_600_000;

/**
 * A trace that cannot be replayed as given (checkReplayable, or a replay that runs past
 * MAX_SIMULATED_SPAN_MS). Its message names the requests at fault by their trace line, not the
 * trace: a command that read the trace from a file puts the file's name before it.
 */
export class ReplayError extends RangeError {}

/** A span of simulated time as messages show it: its milliseconds and its days. */
export function spanText(ms: number): string {
  return `${ms} ms (${(ms / 86_400_000).toFixed(1)} days)`;
}

/**
 * Checks that a trace can be replayed as given: timestamps finite and in order (as
 * sortByArrival leaves them), one block size throughout (the engines have one), and, given a
 * `speed`, the whole trace within MAX_SIMULATED_SPAN_MS at it. A ReplayError names the first
 * request at fault; `what` names the requests checked in it ('the trace', or a part of it).
 */
export function checkReplayable(trace: readonly TraceRequest[], speed?: number, what = 'the trace'): void {
  if (trace.length === 0) return;
  const first = trace[0];
  const at = (r: TraceRequest) => `trace line ${r.index + 1}`;
  let prev = first.timestamp;
  for (const r of trace) {
    if (!Number.isFinite(r.timestamp) || r.timestamp < prev)
      throw new ReplayError(`${at(r)}: timestamp ${r.timestamp} is not finite or comes before ${prev}: sort the trace`);
    prev = r.timestamp;
    if (r.blockSize !== first.blockSize)
      throw new ReplayError(
        `${at(r)}: block size ${r.blockSize} differs from ${first.blockSize} (${at(first)}): a trace has one block size`,
      );
  }
  if (speed === undefined) return;
  const span = (prev - first.timestamp) / speed;
  if (!(span <= MAX_SIMULATED_SPAN_MS))
    throw new ReplayError(
      `${what} spans ${spanText(span)} at speed ×${speed}, more than the ${MAX_SIMULATED_SPAN_MS} ms (31 days) a replay may cover`,
    );
}
