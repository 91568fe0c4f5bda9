import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { createGunzip } from 'node:zlib';

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
  model?: string;
}

export class TraceFormatError extends RangeError {
  constructor(
    readonly line: number,
    message: string,
  ) {
    super(`trace line ${line + 1}: ${message}`);
    this.name = 'TraceFormatError';
  }
}

/** Parses one Mooncake JSONL line; throws TraceFormatError naming the line and field. */
export function parseTraceLine(text: string, index: number, defaultBlockSize = 512): TraceRequest {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new TraceFormatError(index, 'not valid JSON');
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw))
    throw new TraceFormatError(index, 'not a JSON object');
  const r = raw as Record<string, unknown>;
  const num = (key: string, required: boolean): number | undefined => {
    const v = r[key];
    if (v === undefined || v === null) {
      if (required) throw new TraceFormatError(index, `missing "${key}"`);
      return undefined;
    }
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0)
      throw new TraceFormatError(index, `"${key}" must be a non-negative number`);
    return v;
  };
  const timestamp = num('timestamp', true)!;
  const inputLength = num('input_length', true)!;
  const outputLength = num('output_length', true)!;
  const hashIds = r.hash_ids;
  if (!Array.isArray(hashIds) || hashIds.some((h) => typeof h !== 'number' || !Number.isSafeInteger(h) || h < 0)) {
    throw new TraceFormatError(index, '"hash_ids" must be an array of non-negative integers');
  }
  const blockSize = num('block_size', false) ?? defaultBlockSize;
  if (!Number.isInteger(blockSize) || blockSize < 1)
    throw new TraceFormatError(index, '"block_size" must be a positive integer');
  const req: TraceRequest = { index, timestamp, inputLength, outputLength, hashIds: hashIds as number[], blockSize };
  if (r.session_id !== undefined) {
    if (typeof r.session_id !== 'string' && typeof r.session_id !== 'number')
      throw new TraceFormatError(index, '"session_id" must be a string');
    req.sessionId = String(r.session_id);
  }
  const step = num('step', false);
  if (step !== undefined) req.step = step;
  const cla = num('cla_group', false);
  if (cla !== undefined) {
    if (!Number.isInteger(cla)) throw new TraceFormatError(index, '"cla_group" must be an integer');
    req.claGroup = cla;
  }
  if (r.agent_role !== undefined) {
    if (typeof r.agent_role !== 'string') throw new TraceFormatError(index, '"agent_role" must be a string');
    req.agentRole = r.agent_role;
  }
  if (r.anchors !== undefined) {
    const ids = r.anchors;
    const lengths = r.anchor_lengths;
    if (!Array.isArray(ids) || !Array.isArray(lengths) || ids.length !== lengths.length) {
      throw new TraceFormatError(index, '"anchors" and "anchor_lengths" must be arrays of equal length');
    }
    req.anchors = ids.map((id, k) => {
      const t = lengths[k];
      if (typeof t !== 'number' || !Number.isInteger(t) || t < 0)
        throw new TraceFormatError(index, `"anchor_lengths[${k}]" must be a non-negative integer`);
      return { id: String(id), tokens: t };
    });
  }
  if (r.isolate !== undefined) {
    if (typeof r.isolate !== 'boolean') throw new TraceFormatError(index, '"isolate" must be a boolean');
    req.isolate = r.isolate;
  }
  if (r.model !== undefined) {
    if (typeof r.model !== 'string') throw new TraceFormatError(index, '"model" must be a string');
    req.model = r.model;
  }
  return req;
}

/** Reads a Mooncake JSONL trace (optionally .gz), blank lines skipped, sorted by timestamp (stable). */
export async function loadMooncakeTrace(path: string, defaultBlockSize = 512): Promise<TraceRequest[]> {
  const input = path.endsWith('.gz') ? createReadStream(path).pipe(createGunzip()) : createReadStream(path);
  const requests: TraceRequest[] = [];
  let index = 0;
  for await (const line of createInterface({ input, crlfDelay: Infinity })) {
    if (line.trim()) requests.push(parseTraceLine(line, index, defaultBlockSize));
    index++;
  }
  return sortByArrival(requests);
}

export function sortByArrival(requests: TraceRequest[]): TraceRequest[] {
  return requests
    .map((r, i) => [r, i] as const)
    .sort((a, b) => a[0].timestamp - b[0].timestamp || a[1] - b[1])
    .map(([r]) => r);
}
